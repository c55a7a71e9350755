"""``sparkguard plan init``: read the target and source tables and draft a plan.

Reads schemas and ``DESCRIBE DETAIL``, a bounded sample of distinct partition values (string
and int partitions only), and aggregate counts over the window: rows per window partition on
each side, nulls and NaNs per target column, and distinct keys per candidate. Nothing is
collected beyond those aggregates, nothing is written to any table, and nothing is approved.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import Column as SparkColumn
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sparkguard import delta_ops
from sparkguard.draft.decide import (
    SOURCE,
    Column,
    KeyCandidate,
    KeyEvidence,
    Layout,
    day_format,
    identity_transform,
    key_candidates,
    measures,
    refuse,
    window_column,
    window_days,
)
from sparkguard.draft.render import Draft, render_draft
from sparkguard.errors import PlanError, PlanProblem
from sparkguard.plan.fields import LABEL_RE
from sparkguard.plan.loader import load_plan_text
from sparkguard.plan.model import PlanValueError, TargetSpec, Transform
from sparkguard.spark_types import field_names, same_field_names, sql_type
from sparkguard.sql import (
    IDENTIFIER_RE,
    RESERVED_PREFIX,
    PartitionType,
    TableRef,
    UnsafeSQLError,
    has_control,
    reserved_names,
    window_predicate,
)

__all__ = ["DraftRequest", "draft_plan", "infer_draft"]

_SAMPLE_VALUES = 20
_BATCH = 8
_CONTRACT_TYPE = r"^[A-Za-z][A-Za-z0-9_ ,()<>:]{0,199}$"


@dataclass(frozen=True)
class DraftRequest:
    """The ``plan init`` arguments, already resolved (datasets) and parsed (bounds)."""

    source: str
    target: str
    start: dt.datetime
    end: dt.datetime
    transform_sql: str | None = None
    transform_callable: str | None = None
    name: str | None = None
    owner: str | None = None
    reason: str | None = None


def _columns(schema: T.StructType) -> list[Column]:
    out = []
    for f in schema.fields:
        md = dict(f.metadata or {})
        try:
            as_sql = sql_type(f.dataType)
        except UnsafeSQLError:  # a nested name with a control character: never cast
            as_sql = ""
        out.append(Column(f.name, f.dataType.simpleString(), f.nullable,
                          str(md.get("comment") or ""), as_sql))
    return out


def _reordered(target: T.StructType, source: T.StructType) -> set[str]:
    """Target columns the source holds with other struct field names or order: a CAST, which
    Spark applies by position, would put values under the wrong fields."""
    src = {f.name: f.dataType for f in source.fields}
    return {f.name for f in target.fields
            if f.name in src and src[f.name] != f.dataType
            and not same_field_names(src[f.name], f.dataType)}


def _detail(spark: SparkSession, ref: TableRef, schema: Sequence[Column]) -> Layout:
    row = delta_ops.detail(spark, ref).first()
    info = row.asDict() if row is not None else {}
    return Layout(tuple(info.get("partitionColumns") or ()),
                  tuple(info.get("clusteringColumns") or ()),
                  tuple(c.name for c in schema if c.is_timestamp),
                  tuple(c.name for c in schema if c.base == "date"))


def _open(spark: SparkSession, flag: str, dataset: str) -> tuple[TableRef, DataFrame]:
    ref = TableRef.parse(dataset)
    if not delta_ops.table_exists(spark, ref):
        what, fix = delta_ops.not_delta(spark, ref)
        raise refuse(flag, f"{ref.display!r} {what}", fix)
    df, refused = delta_ops.read_resolved(spark, ref)
    if df is None:
        raise refuse(flag, f"this client's Delta cannot read {ref.display!r}: {refused}",
                     delta_ops.PROTOCOL_REFUSAL_FIX)
    return ref, df


def _label(dataset: str) -> str:
    """The label a plan derives from ``dataset``, made a plain name when it is not one (a
    folder ``2024_orders`` gives ``t_2024_orders``); the draft writes it as the target's name."""
    derived = TargetSpec.model_construct(dataset=dataset, name=None).label
    return derived if LABEL_RE.fullmatch(derived) else f"t_{derived}"[:64]


def _transform(req: DraftRequest, target: list[Column], source: list[Column],
               reordered: set[str]) -> tuple[str | None, str | None, list[str]]:
    """(sql, callable, notes) of the drafted transform."""
    try:
        if req.transform_callable is not None:
            Transform(callable=req.transform_callable)
            return None, req.transform_callable, [
                "The given transform (--transform-callable), called as f(spark, source_df, "
                "partitions)."]
        if req.transform_sql is not None:
            sql = Transform(sql=req.transform_sql).sql
            return sql, None, ["The given transform (--transform-sql)."]
    except PlanValueError as exc:
        flag = "--transform-callable" if req.transform_callable else "--transform-sql"
        raise refuse(flag, str(exc), exc.fix) from None
    except ValueError as exc:  # pydantic's ValidationError
        flag = "--transform-callable" if req.transform_callable else "--transform-sql"
        raise refuse(flag, str(exc).splitlines()[-1].strip(), "see templates/backfill-plan.yaml")\
            from None
    drafted = identity_transform(target, source, reordered)
    if len(drafted.unfilled) == len(target):
        raise refuse("--source", "the source has none of the target's columns, so no identity "
                     "recompute can be drafted", "give --transform-sql FILE or "
                     "--transform-callable module:function")
    notes = ["Identity recompute: each target column read from the source column of the same "
             "name.", "Review it: the job that built the target may derive columns differently."]
    if drafted.casts:
        notes.append(f"Cast to the target's type: {'; '.join(drafted.casts)}.")
    missing = [c for c in drafted.unfilled if c not in reordered]
    if missing:
        notes.append(f"FILL IN each {{fill:COLUMN}}: the source has no column "
                     f"{', '.join(missing)}; write the SQL expression computing it.")
    if reordered & set(drafted.unfilled):
        notes.append(f"FILL IN {', '.join(sorted(reordered & set(drafted.unfilled)))}: the "
                     "source's struct fields differ in name or order, and a CAST matches them "
                     "by position; build the struct field by field (named_struct).")
    return drafted.sql, None, notes


def _window_values(tdf: DataFrame, col: str, ptype: PartitionType, days: list[dt.date]
                   ) -> tuple[list[object], str | None]:
    if ptype is PartitionType.DATE:
        return list(days), None
    sample = [r[0] for r in tdf.select(col).where(F.col(col).isNotNull()).distinct()
              .limit(_SAMPLE_VALUES).collect()]
    fmt = day_format(ptype, sample)
    if fmt is None:
        raise refuse("--target", f"the values of partition column {col!r} do not write days "
                     f"(for example {sorted(map(str, sample))[:5]}), so the window cannot be "
                     "derived from --start/--end", "write the plan from "
                     "templates/backfill-plan.yaml and list the partitions")
    texts = [d.strftime(fmt) for d in days]
    return ([int(t) for t in texts] if ptype is PartitionType.INT else list(texts)), fmt


def _rows_per_partition(df: DataFrame, col: str, pred: str) -> dict[str, int]:
    """Rows per window partition: one aggregation, at most one row per window partition."""
    return {(v.isoformat() if isinstance(v, dt.date) else str(v)): int(n)
            for v, n in df.filter(pred).groupBy(col).agg(F.count(F.lit(1))).collect()}


def _non_finite(c: str) -> SparkColumn:
    """Rows where float column ``c`` is NaN or infinite (the metric gate's ``nan`` rule)."""
    return F.sum((F.isnan(F.col(c)) | (F.abs(F.col(c)) == float("inf"))).cast("long"))


def _profile(win: DataFrame, cols: list[Column]) -> tuple[int, dict[str, int], list[str]]:
    """(rows, nulls per column, float columns holding NaN or an infinity) of the window, in one
    aggregation."""
    aggs = [F.count(F.lit(1)).alias("__rows")]
    aggs += [F.count(F.col(c.name)).alias(f"__nn{i}") for i, c in enumerate(cols)]
    aggs += [_non_finite(c.name).alias(f"__nan{i}") for i, c in enumerate(cols) if c.is_float]
    row = win.agg(*aggs).first()
    assert row is not None
    rows = int(row["__rows"])
    nulls = {c.name: rows - int(row[f"__nn{i}"]) for i, c in enumerate(cols)}
    nans = [c.name for i, c in enumerate(cols) if c.is_float and (row[f"__nan{i}"] or 0) > 0]
    return rows, nulls, nans


def _non_finite_in(win: DataFrame, cols: Sequence[Column], names: set[str]) -> list[str]:
    """The float columns among ``names`` holding NaN or an infinity in ``win`` (one
    aggregation; none when no such column)."""
    floats = [c.name for c in cols if c.is_float and c.name in names]
    if not floats:
        return []
    row = win.agg(*[_non_finite(n).alias(f"__nan{i}") for i, n in enumerate(floats)]).first()
    assert row is not None
    return [n for i, n in enumerate(floats) if (row[f"__nan{i}"] or 0) > 0]


def _verify(win: DataFrame, part: str, cands: Sequence[KeyCandidate], across: bool
            ) -> list[KeyEvidence]:
    """Rows, rows with a null key column and distinct (partition, key) per candidate (distinct
    keys with ``across``), as one aggregation."""
    aggs: list[SparkColumn] = [F.count(F.lit(1)).alias("__rows")]
    by = [] if across else [F.col(part)]
    for i, cand in enumerate(cands):
        nulls = functools.reduce(lambda a, b: a | b, [F.col(c).isNull() for c in cand.columns])
        aggs.append(F.sum(nulls.cast("long")).alias(f"__n{i}"))
        aggs.append(F.count_distinct(*by, *[F.col(c) for c in cand.columns]).alias(f"__d{i}"))
    row = win.agg(*aggs).first()
    assert row is not None
    return [KeyEvidence(cand, int(row["__rows"]), int(row[f"__n{i}"] or 0), int(row[f"__d{i}"]),
                        across) for i, cand in enumerate(cands)]


def _find_key(win: DataFrame, part: str, cols: list[Column], label: str,
              left_out: Sequence[str] = (), across: bool = False
              ) -> tuple[tuple[str, ...], list[KeyEvidence], list[str]]:
    """(key, evidence of every candidate tried, candidates not tried); the key unique in each
    partition, or across the window with ``across`` (a MERGE matches on it alone)."""
    singles = key_candidates(cols, label, part)
    tried: list[KeyEvidence] = []
    for batch in [singles[:1], *[singles[i:i + _BATCH] for i in range(1, len(singles), _BATCH)]]:
        if not batch:
            continue
        found = _verify(win, part, batch, across)
        for ev in found:
            tried.append(ev)
            if ev.exact:
                done = {e.candidate for e in tried}
                return ev.candidate.columns, tried, [
                    ", ".join(c.columns) for c in singles if c not in done]
    composites = key_candidates(cols, label, part, composites=True)
    if across:  # a key unique within each partition, with the window column, is one across it
        composites = [KeyCandidate((*c.columns, part), f"{c.why}, with the window column")
                      for c in singles] + composites
    for i in range(0, len(composites), _BATCH):
        found = _verify(win, part, composites[i:i + _BATCH], across)
        for ev in found:
            tried.append(ev)
            if ev.exact:
                return ev.candidate.columns, tried, []
    shown = "; ".join(ev.describe() for ev in tried[:12])
    skipped = (f"; not tried, as a plan's keys take plain names: {list(left_out)[:5]}"
               if left_out else "")
    raise refuse("--target", f"no exact business key in the window ({len(tried)} candidate(s) "
                 f"tried: {shown or 'no column of an exact type'}{skipped})",
                 "deduplicate the target's window, or write the plan from "
                 "templates/backfill-plan.yaml with the key you know")


def infer_draft(spark: SparkSession, req: DraftRequest) -> Draft:
    """Read both tables (aggregates only) and decide every field of the draft."""
    tref, tdf = _open(spark, "--target", req.target)
    sref, sdf = _open(spark, "--source", req.source)
    if delta_ops.lock_key(spark, tref) == delta_ops.lock_key(spark, sref):  # its location
        raise refuse("--source", "the source is the target", "recompute from an upstream table")
    tcols, scols = _columns(tdf.schema), _columns(sdf.schema)
    # identity columns are the target's to fill: no key, transform, contract or measure names
    identity = delta_ops.write_checks(spark, tref).identity_columns
    tcols = [c for c in tcols if c.name not in identity]
    # a column named with a dot, a hyphen or a space is recomputed (backquoted in the SQL) but
    # a plan's key, window, not_null and contract fields take plain names only
    plain = [c for c in tcols if IDENTIFIER_RE.fullmatch(c.name)]
    odd = [n for f in tdf.schema.fields for n in (f.name, *field_names(f.dataType))
           if has_control(n) or any(ch in n for ch in "`{}")]
    if odd:
        raise refuse("--target", f"column or field name(s) {odd[:5]!r} hold a control "
                     "character, a backquote or a brace, which a drafted plan cannot show "
                     "safely", "rename the columns, or write the plan from "
                     "templates/backfill-plan.yaml")
    reserved = reserved_names(tdf.columns)
    if reserved:
        raise refuse("--target", f"column(s) {reserved[:5]!r} start with {RESERVED_PREFIX!r}, "
                     "the prefix of sparkguard's own working columns, which the guard refuses "
                     "in a target", "rename those columns (ALTER TABLE ... RENAME COLUMN, with "
                     "column mapping on)")
    layout = _detail(spark, tref, tcols)
    col, ptype = window_column(layout, tcols)
    if not IDENTIFIER_RE.fullmatch(col):
        raise refuse("--target", f"the window column {col!r} is not a plain name (letters, "
                     "digits, '_'), which a plan's partitioning needs",
                     "write the plan from templates/backfill-plan.yaml with a plain-named window "
                     "column")
    days = window_days(req.start, req.end)
    scol = next((c for c in scols if c.name == col), None)
    tbase = next(c for c in tcols if c.name == col).base
    if scol is None or (scol.base != tbase and not (ptype is PartitionType.INT and scol.base in
                                                   ("tinyint", "smallint", "int", "bigint"))):
        got = "has no such column" if scol is None else f"has it as {scol.type}"
        raise refuse("--source", f"the target is partitioned by {col!r} ({tbase}) but the "
                     f"source {got}; both sides are bounded by that column",
                     "give a source with the same partition column")
    values, fmt = _window_values(tdf, col, ptype, days)
    pred = window_predicate(col, ptype, values)
    src_rows = _rows_per_partition(sdf, col, pred)
    tgt_rows = _rows_per_partition(tdf, col, pred)
    shown = [v.isoformat() if isinstance(v, dt.date) else str(v) for v in values]
    if not sum(src_rows.values()):
        raise refuse("--start", f"the source has no rows in the window ({_span(req)})",
                     "choose a window where the source has data")
    missing = [v for v in shown if not src_rows.get(v)]
    if missing:
        raise refuse("--start", f"the source has no rows in {len(missing)} window partition(s) "
                     f"of {len(shown)}: {missing[:10]}; the guard would refuse the plan",
                     "narrow the window to partitions the source has")
    if not sum(tgt_rows.values()):
        raise refuse("--start", f"the target has no rows in the window ({_span(req)}), so no "
                     "business key can be verified on it", "choose a window where the target "
                     "has rows, or write the plan from templates/backfill-plan.yaml")
    win = tdf.filter(pred)
    label = _label(tref.display)
    # a target with an identity column is promoted by a MERGE (render_draft), which matches on
    # the key alone: it must be unique across the window, not only within each partition
    keys, evidence, untried = _find_key(win, col, plain, label,
                                        [c.name for c in tcols if c not in plain],
                                        across=bool(identity))
    rows, nulls, nans = _profile(win, plain)
    # the metric gate fails on NaN or an infinity on either side unless told to exclude them
    nans += [n for n in _non_finite_in(sdf.filter(pred), scols, {c.name for c in plain})
             if n not in nans]
    sql, fn, notes = _transform(req, tcols, scols, _reordered(tdf.schema, sdf.schema))
    contract = [c for c in plain if re.fullmatch(_CONTRACT_TYPE, c.type)]
    return Draft(
        name=req.name or f"backfill-{label.replace('_', '-')}-{req.start:%Y-%m-%d}",
        owner=req.owner, reason=req.reason, source=sref.display, target=tref.display,
        label=label, start=req.start, end=req.end, window_column=col, window_type=ptype,
        day_format=fmt, partitions=values, layout=layout,
        source_layout=_detail(spark, sref, scols), source_rows=src_rows, target_rows=tgt_rows,
        target_columns=contract, keys=keys, evidence=evidence, untried=untried,
        not_null=[c.name for c in plain if rows and nulls[c.name] == 0],
        measures=measures(plain, scols, keys, col, label, nans),
        transform_sql=sql, transform_callable=fn, transform_notes=notes,
        transform_given=req.transform_sql is not None or req.transform_callable is not None,
        contract_skipped=[f"{c.name} ({c.type})" for c in plain if c not in contract],
        names_skipped=[c.name for c in tcols if c not in plain],
        identity_columns=identity)


def _span(req: DraftRequest) -> str:
    return f"[{req.start:%Y-%m-%dT%H:%M:%SZ}, {req.end:%Y-%m-%dT%H:%M:%SZ})"



def draft_plan(spark: SparkSession, req: DraftRequest) -> tuple[str, Draft]:
    """The draft's YAML text and what it was inferred from; the text is checked to load as a
    plan before it is returned (a problem in --name/--owner/--reason is refused here)."""
    draft = infer_draft(spark, req)
    text = render_draft(draft)
    try:
        load_plan_text(text, SOURCE)
    except PlanError as exc:
        flags = {"backfill_plan.name": "--name", "backfill_plan.owner": "--owner",
                 "backfill_plan.reason": "--reason"}
        raise PlanError(SOURCE, [PlanProblem(flags.get(p.path, p.path), p.message, p.value, p.fix)
                                 for p in exc.problems]) from None
    return text, draft
