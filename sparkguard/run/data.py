"""The DataFrames of a run: pinned source, transform, shadow, target; and their comparisons."""

from __future__ import annotations

import importlib
import re
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from pyspark.errors import AnalysisException, ParseException
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, AtomicType, DataType, StringType, StructType

from sparkguard import delta_ops
from sparkguard.errors import SparkguardError, first_line
from sparkguard.plan.enums import CheckType, Promotion
from sparkguard.plan.model import Transform
from sparkguard.plan.window_spec import BUCKET_COLUMN
from sparkguard.reconcile.edge import EDGE_GATE, keys_outside_window
from sparkguard.reconcile.engine import columns_of, reconcile, row_hash, table_fingerprint
from sparkguard.reconcile.hashing import column
from sparkguard.reconcile.spec import schema_contract_gates, spec_for_target, unknown_columns
from sparkguard.reconcile.verdicts import GateResult, ReconcileResult
from sparkguard.run.context import RunContext, RunState, TargetState
from sparkguard.run.labels import set_job_label
from sparkguard.spark_types import holds_unordered, same_field_names, sql_type
from sparkguard.sql import UnsafeSQLError, query_only, quote_column

__all__ = ["TransformResultError", "as_shadow", "bucketed", "fingerprints", "job", "print_gates",
           "reconcile_part", "reference_df", "shadow_df", "source_df", "target_df", "target_rules",
           "transform"]

# Spark's metadata key for a CHAR/VARCHAR column read as a string, and a CHAR's length
_CHAR_KEY = "__CHAR_VARCHAR_TYPE_STRING"
_LIMITED = re.compile(r"(var)?char\((\d+)\)", re.IGNORECASE)  # group 1 set for a VARCHAR


class TransformResultError(SparkguardError):
    """Raised when a transform callable returns something other than a DataFrame.

    It surfaces once the run holds its locks and paused publish: a runtime failure (exit 3)
    that leaves publish paused, not a plan error.
    """


def job(ctx: RunContext, state: RunState, desc: str) -> None:
    """Label this thread's next Spark jobs: group ``sparkguard-<run id>``, ``desc`` per stage."""
    group = f"sparkguard-{state.run_id}" if state.run_id else f"sparkguard-plan-{ctx.plan.name}"
    set_job_label(ctx.spark, group, desc)


def source_df(ctx: RunContext, state: RunState, partitions: Sequence[object]) -> DataFrame:
    """The source at the pinned version, restricted to ``partitions``."""
    if state.source_df is None:
        state.source_df = (
            delta_ops.read_version(ctx.spark, ctx.source, state.source_version)
            if state.source_version is not None else delta_ops.read_table(ctx.spark, ctx.source))
    return state.source_df.filter(ctx.window.pred(partitions))


def shadow_df(ctx: RunContext, st: TargetState, partitions: Sequence[object]) -> DataFrame:
    """The shadow's rows of ``partitions``; with ``match_target_schema: false``, its columns
    named as the target's (a shadow an earlier version wrote may spell them otherwise)."""
    return _target_spelling(ctx, st, delta_ops.read_table(ctx.spark, st.shadow)
                            .filter(ctx.window.pred(partitions)))


def target_df(ctx: RunContext, st: TargetState, partitions: Sequence[object],
              version: int | None = None) -> DataFrame:
    return _target_at(ctx, st, version).filter(ctx.window.pred(partitions))


def _target_at(ctx: RunContext, st: TargetState, version: int | None) -> DataFrame:
    """The whole target, at ``version`` (None: the current one)."""
    return (delta_ops.read_version(ctx.spark, st.ref, version) if version is not None
            else delta_ops.read_table(ctx.spark, st.ref))


def as_shadow(ctx: RunContext, st: TargetState, target: DataFrame) -> DataFrame:
    """``target`` (rows of the target) without its identity columns, as the shadow holds them:
    the target keeps those values for the keys it holds and generates them for new keys."""
    return target_rules(ctx, st).without_identity(target)


def transform(ctx: RunContext, state: RunState, st: TargetState, partitions: Sequence[object],
              tag: str) -> tuple[DataFrame, list[str]]:
    """The target's recomputation for ``partitions``, and the temp views it uses."""
    df, views = _compute(ctx, state, st.spec.transform, f"{st.spec.label}: transform",
                         partitions, tag)
    checks = target_rules(ctx, st)
    assert st.char_lengths is not None
    return _with_generated(_char_padded(_target_spelling(ctx, st, df), st.char_lengths),
                           checks.generated, st.generated_types), views


def _target_spelling(ctx: RunContext, st: TargetState, df: DataFrame) -> DataFrame:
    """With ``match_target_schema: false``, ``df`` with each output column named as the target
    column it is written into, which Delta's writes find whatever the case: the shadow, its
    gates, the change preview and the check after the promotion then compare the columns the
    promotion writes. Two output columns of one name but for case are left as they are."""
    if st.spec.contract.match_target_schema:
        return df
    target_rules(ctx, st)
    names, lowered = st.column_names, [c.lower() for c in df.columns]
    renamed = {c: names[c.lower()] for c in df.columns
               if c.lower() in names and names[c.lower()] != c and lowered.count(c.lower()) == 1}
    return df.withColumnsRenamed(renamed) if renamed else df


def _with_generated(df: DataFrame, generated: Sequence[tuple[str, str]],
                    types: dict[str, DataType]) -> DataFrame:
    """``df`` with each generated column it leaves out (no output column of that name in any
    case) computed from its expression, as Delta computes it at the write. One whose expression
    does not resolve on ``df`` is left out: the schema gate and its own gate say why."""
    have = {c.lower() for c in df.columns}
    omitted = {}
    for c, e in generated:
        if c.lower() not in have and _unresolved(df, e) is None:
            omitted[c] = F.expr(e).cast(types[c])
    return df.withColumns(omitted) if omitted else df


def target_rules(ctx: RunContext, st: TargetState) -> delta_ops.WriteChecks:
    """The target's CHAR(n) lengths, CHECK constraints and generated columns, read once per
    run (not per slice) into ``st``; ``write_checks`` is set last, as the mark that the rest is
    there (wave writers read it from several threads)."""
    if st.write_checks is None:
        schema = delta_ops.read_table(ctx.spark, st.ref).schema
        checks = delta_ops.write_checks(ctx.spark, st.ref)
        st.char_lengths = _char_lengths(schema)
        identity = {c.lower() for c in checks.identity_columns}  # left out, as written
        st.column_names = {f.name.lower(): f.name for f in schema.fields
                           if f.name.lower() not in identity}
        st.generated_types = {f.name: f.dataType for f in schema.fields
                              if f.name in dict(checks.generated)}
        st.write_checks = checks
    return st.write_checks


def _char_lengths(target: StructType) -> dict[str, int]:
    """The target's ``CHAR(n)`` columns and their ``n``."""
    return {f.name: int(m.group(2)) for f in target.fields
            if (m := _LIMITED.fullmatch(str(f.metadata.get(_CHAR_KEY, "")))) and not m.group(1)}


def _char_padded(df: DataFrame, chars: dict[str, int]) -> DataFrame:
    """``df`` with the values of the target's ``CHAR(n)`` columns (``chars``) padded to ``n``
    with spaces, as Delta stores them and Spark reads them back: the shadow, the gates and the
    verification then see the values the target will hold. Longer values are left for Delta to
    refuse."""
    cols = [c for c in df.columns if c in chars
            and isinstance(df.schema[c].dataType, StringType)]
    if not cols:
        return df
    return df.withColumns({c: F.when(F.length(column(c)) < chars[c],
                                     F.rpad(column(c), chars[c], " ")).otherwise(column(c))
                           for c in cols})


def reference_df(ctx: RunContext, state: RunState, st: TargetState,
                 partitions: Sequence[object], tag: str) -> tuple[DataFrame, list[str]] | None:
    """The rows this target's checks compare the shadow with (``validation.reference``, computed
    like a transform: ``{source}``, ``{window}``, ``{shadow:NAME}``), and the temp views it
    uses; None when the checks compare with the source of truth."""
    ref = st.spec.validation.reference if st.spec.validation else None
    if ref is None:
        return None
    return _compute(ctx, state, ref, f"{st.spec.label}: validation.reference", partitions,
                    f"{tag}_ref")


def _compute(ctx: RunContext, state: RunState, tr: Transform, what: str,
             partitions: Sequence[object], tag: str) -> tuple[DataFrame, list[str]]:
    src = source_df(ctx, state, partitions)
    if tr.callable:
        mod_name, fn_name = tr.callable.split(":")
        fn = getattr(importlib.import_module(mod_name), fn_name)
        df = fn(ctx.spark, src, list(partitions))
        if not isinstance(df, DataFrame):
            raise TransformResultError(
                f"{what}.callable {tr.callable} returned "
                f"{type(df).__name__}, not a pyspark DataFrame; nothing was promoted and publish "
                "stays paused. Return the recomputed rows as a DataFrame, then re-run the same "
                "command")
        return df, []
    assert tr.sql is not None
    view = f"__sg_src_{re.sub(r'[^A-Za-z0-9]', '_', state.run_id)}_{tag}"
    src.createOrReplaceTempView(view)
    views = [view]
    sql = tr.sql.replace("{source}", f"`{view}`").replace("{window}", ctx.window.pred(partitions))
    for label, other in state.targets.items():
        token = "{shadow:" + label + "}"
        if token in sql:
            oview = f"{view}_up_{label}"
            shadow_df(ctx, other, partitions).createOrReplaceTempView(oview)
            views.append(oview)
            sql = sql.replace(token, f"`{oview}`")
    return ctx.spark.sql(query_only(sql)), views


def reconcile_part(ctx: RunContext, state: RunState, st: TargetState,
                   partitions: Sequence[object], scope: str, target_version: int | None = None,
                   preview: bool = False) -> ReconcileResult:
    """Gates of the shadow against the source (or the target's ``validation.reference``), per
    partition; the change preview against the target only with ``preview`` (the full
    window's)."""
    shadow = shadow_df(ctx, st, partitions)
    target = target_df(ctx, st, partitions, target_version)
    schema = schema_contract_gates(columns_of(shadow), columns_of(target), st.spec.contract,
                                   target_rules(ctx, st).identity_columns,
                                   written_as_is=st.spec.promotion == Promotion.REPLACE_WHERE)
    constraints, unresolved = _constraints(ctx, st, shadow, target)
    target = as_shadow(ctx, st, target)
    schema += unresolved
    spec = replace(spec_for_target(ctx.plan, st.spec), constraints=constraints)
    missing = unknown_columns(spec.business_keys, shadow.columns)
    if missing:  # nothing to pair rows by: the schema gates and this one say why
        return ReconcileResult(scope=scope, partitions=(), gates=(*schema, GateResult(
            gate="business_keys_in_recomputation", check_type="schema_contract", passed=False,
            measured=len(missing), threshold=0, expected=0,
            reason="; ".join(f"business key {k!r} is not a column of the recomputed rows: " + (
                f"it has {near!r} (names match exactly, case included)" if near else
                "no such column") for k, near in missing.items())
            + "; fix business_keys or the transform's column names")))
    tag = re.sub(r"[^A-Za-z0-9]", "_", f"{st.spec.label}_{scope}")
    reference = reference_df(ctx, state, st, partitions, tag)
    against = reference[0] if reference else source_df(ctx, state, partitions)
    try:
        res = reconcile(spec, shadow=bucketed(ctx, shadow), target=bucketed(ctx, target),
                        source=bucketed(ctx, against),
                        partitions=list(partitions), scope=scope, preview=preview)
    finally:
        for v in reference[1] if reference else []:
            ctx.spark.catalog.dropTempView(v)
    edge = edge_gates(ctx, st, partitions, target_version, shadow) if preview else []
    return ReconcileResult(scope=res.scope, partitions=res.partitions,
                           gates=(*res.gates, *schema, *edge), preview=res.preview,
                           duplicate_sample=res.duplicate_sample)


def edge_gates(ctx: RunContext, st: TargetState, partitions: Sequence[object],
               version: int | None, shadow: DataFrame | None = None) -> list[GateResult]:
    """The full window's ``keys_outside_window`` gate (``reconcile.edge``) of each
    ``duplicate_check`` with ``table_wide: true``, read at the target's version the window was
    read at; none for keys that include every window column (the date and the hour of a
    ``date_hour`` window): a key outside the window then differs from every key inside."""
    w = ctx.window
    hour = w.range.hour_column if w.range is not None else None
    spot = {c.lower() for c in (w.column, hour) if c}  # where a row is in the window
    sets = []
    for check in ctx.plan.checks_for(st.spec):
        keys = tuple(check.key_columns or st.spec.business_keys)
        if check.type is CheckType.DUPLICATE_CHECK and check.table_wide and keys \
                and not spot <= {k.lower() for k in keys} and keys not in sets:
            sets.append(keys)
    if not sets:
        return []
    shadow = shadow if shadow is not None else shadow_df(ctx, st, partitions)
    outside = as_shadow(ctx, st, _target_at(ctx, st, version).filter(
        f"NOT coalesce(({w.pred(partitions)}), false)"))
    where = [c for name in (w.column, hour) if name for c in outside.columns
             if c.lower() == name.lower()]
    named = tuple(st.spec.business_keys)
    return [keys_outside_window(keys, shadow, outside, where,
                                gate=EDGE_GATE if keys == named else f"{EDGE_GATE}[{','.join(keys)}]")
            for keys in sets]


def _constraints(ctx: RunContext, st: TargetState, shadow: DataFrame, target: DataFrame
                 ) -> tuple[tuple[tuple[str, str], ...], list[GateResult]]:
    """The target's CHECK constraints, generated columns and CHAR/VARCHAR lengths the shadow's
    rows are counted against, and a failed gate for each whose expression does not resolve on
    the shadow. One naming an identity column is left to Delta, which checks it at the write:
    the shadow has no identity values to count it on (a passed gate says so)."""
    rules = target_rules(ctx, st)
    identity = rules.identity_columns
    nulls = {c: F.lit(None).cast(target.schema[c].dataType) for c in identity
             if c in target.columns and c not in shadow.columns}
    with_identity = shadow.withColumns(nulls) if nulls else shadow
    ok: list[tuple[str, str]] = []
    noted: list[GateResult] = []
    casts = ([] if st.spec.contract.match_target_schema
             or st.spec.promotion == Promotion.REPLACE_WHERE
             else _cast_losses(target, shadow, identity))
    for gate, expr in (*rules.gates(), *_length_limits(target.schema, shadow.columns),
                       *_nested_not_null(target.schema, shadow.columns), *casts):
        problem = _unresolved(shadow, expr)
        if problem is None:
            ok.append((gate, expr))
            continue
        left = bool(identity) and _unresolved(with_identity, expr) is None
        noted.append(GateResult(
            gate=gate, check_type="table_constraint", passed=left, measured=None, threshold=0,
            expected=0, reason=(
                f"not counted on the shadow: {expr} names an identity column "
                f"({', '.join(identity)}), whose values the target generates; Delta checks it "
                "on every row the promotion writes" if left else
                f"the target checks {expr} on every row written, which does not resolve on the "
                f"recomputed rows: {problem}; output the columns it names")))
    return tuple(ok), noted


def _length_limits(target: StructType, shadow: Sequence[str]) -> list[tuple[str, str]]:
    """A gate per top-level ``CHAR(n)`` or ``VARCHAR(n)`` column of the target that the shadow
    holds (one it leaves out is written as null, which passes): Delta refuses a longer value at
    the promotion's commit, after the whole shadow was built (CHAR values are padded to ``n``
    before this counts them). A name SQL cannot spell is left to Delta, and so are lengths
    inside structs, arrays and maps."""
    held = {c.lower() for c in shadow}
    out = []
    for f in target.fields:
        m = _LIMITED.fullmatch(str(f.metadata.get(_CHAR_KEY, "")))
        if m is None or f.name.lower() not in held:
            continue
        try:
            c = quote_column(f.name)
        except UnsafeSQLError:
            continue
        kind = "varchar" if m.group(1) else "char"
        out.append((f"{kind}_length[{f.name}]", f"{c} IS NULL OR length({c}) <= {m.group(2)}"))
    return out


def _nested_not_null(target: StructType, shadow: Sequence[str]) -> list[tuple[str, str]]:
    """A gate per NOT NULL field inside a struct column of the target that the shadow holds
    (``addr STRUCT<city: STRING NOT NULL>``): Delta refuses a null there at the promotion's
    commit, after the whole shadow was built, a null struct around it included (Delta 4.0
    reads the field through it); the shadow's own schema, written by Delta, is nullable
    throughout, so nothing else counts them. Fields inside arrays and maps, and names SQL
    cannot spell, are left to Delta."""
    held = {c.lower() for c in shadow}
    out: list[tuple[str, str]] = []

    def walk(dtype: DataType, path: list[str], shown: str) -> None:
        if not isinstance(dtype, StructType):
            return
        for f in dtype.fields:
            try:
                here = [*path, quote_column(f.name)]
            except UnsafeSQLError:
                continue
            name = f"{shown}.{here[-1] if '.' in f.name else f.name}"  # a.b vs `a.b`
            if not f.nullable:
                out.append((f"nested_not_null[{name}]", f"{'.'.join(here)} IS NOT NULL"))
            walk(f.dataType, here, name)

    for f in target.fields:
        if f.name.lower() in held and isinstance(f.dataType, StructType):
            try:
                walk(f.dataType, [quote_column(f.name)], f.name)
            except UnsafeSQLError:
                continue
    return out


def _cast_losses(target: DataFrame, shadow: DataFrame, identity: Sequence[str]
                 ) -> list[tuple[str, str]]:
    """With ``match_target_schema: false`` and a MERGE promotion, a gate per column whose type
    is not the target's: the MERGE casts each value to the target's type, and the check after
    the commit compares the two in their common type (a union's), so a row counts when that
    cast would change its value or cannot make it (a float into a decimal, text that is not a
    number, ``'1.50'`` read back as ``1.5``), in a scalar column or inside a struct or an array.
    Every cast is a ``try_cast``: a value out of range is counted, never raised. Maps and
    variants (``<=>`` compares neither), structs whose fields a cast by position would pair
    otherwise than their names, and names SQL cannot spell, are left to that check."""
    types = {f.name.lower(): f for f in target.schema.fields}
    skip = {c.lower() for c in identity}
    out = []
    for f in shadow.schema.fields:
        want = types.get(f.name.lower())
        if (want is None or f.name.lower() in skip
                or want.dataType.simpleString() == f.dataType.simpleString()
                or not all(_castable(t) for t in (want.dataType, f.dataType))
                or not same_field_names(f.dataType, want.dataType)):
            continue
        try:
            c = quote_column(f.name)
            both = shadow.select(F.col(c).alias("v")).unionByName(
                target.select(F.col(quote_column(want.name)).alias("v")))
            common = sql_type(both.schema["v"].dataType)  # analysis only
        except (UnsafeSQLError, AnalysisException):
            continue
        written = f"try_cast({c} AS {sql_type(want.dataType)})"
        out.append((f"cast_to_target[{f.name}]", f"{c} IS NULL OR ({written} IS NOT NULL AND "
                    f"try_cast({written} AS {common}) <=> try_cast({c} AS {common}))"))
    return out


def _castable(dtype: DataType) -> bool:
    """A scalar, or a struct or array of them: ``<=>`` compares it after a cast."""
    return isinstance(dtype, AtomicType) or (
        isinstance(dtype, (StructType, ArrayType)) and not holds_unordered(dtype))


def _unresolved(df: DataFrame, expr: str) -> str | None:
    """Why ``expr`` does not resolve on ``df`` (analysis only: nothing runs); None if it does."""
    try:
        _ = df.select(F.expr(expr)).schema
    except (AnalysisException, ParseException) as exc:
        return first_line(exc)
    return None


def bucketed(ctx: RunContext, df: DataFrame) -> DataFrame:
    """``df`` with the bucket column reconciliation groups by (a ``window_column`` window's
    hour or day label); unchanged for a partition-value window (it groups by the partition)."""
    if ctx.window.range is None:
        return df
    return df.withColumn(BUCKET_COLUMN, F.expr(ctx.window.range.bucket_expr()))


def fingerprints(a: DataFrame, b: DataFrame) -> tuple[dict[str, int], dict[str, int]]:
    """Content hashes of two DataFrames with the same columns, in one Spark job."""
    cols = sorted(a.columns)
    if cols != sorted(b.columns):
        return table_fingerprint(a), table_fingerprint(b)
    picked = [column(c) for c in cols]
    taken = {c.lower() for c in cols}  # a table from before the guard refused such names
    side = next(n for n in ("__sg_side" + "_" * i for i in range(len(cols) + 1))
                if n not in taken)
    both = (a.select(*picked).withColumn(side, F.lit(0))
            .unionByName(b.select(*picked).withColumn(side, F.lit(1))))
    h = row_hash(both, cols)
    rows = {r[side]: r for r in both.select(side, h.alias("h"))
            .groupBy(side).agg(
                F.count(F.lit(1)).alias("rows"),
                F.sum(F.col("h").bitwiseAND(F.lit(0xFFFFFFFF))).alias("lo"),
                F.sum(F.shiftrightunsigned(F.col("h"), 32)).alias("hi")).collect()}

    def one(side: int) -> dict[str, int]:
        r = rows.get(side)
        return ({"rows": int(r["rows"]), "lo": int(r["lo"] or 0), "hi": int(r["hi"] or 0)}
                if r else {"rows": 0, "lo": 0, "hi": 0})

    return one(0), one(1)


def _short(v: Any) -> str:
    s = str(v)
    return s if len(s) <= 40 else s[:37] + "..."


def print_gates(ctx: RunContext, label: str, res: ReconcileResult) -> None:
    for g in res.gates:
        mark = "PASS" if g.passed else "FAIL"
        where = f" [{g.partition}]" if g.partition else ""
        measured = g.measured.get("value") if isinstance(g.measured, dict) and \
            "value" in g.measured else g.measured
        ctx.say(f"  {mark} {label} {g.gate}{where}: measured={_short(measured)} "
                f"expected={_short(g.expected)} threshold={g.threshold} - {g.reason}")
