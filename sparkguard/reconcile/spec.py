"""What to reconcile, derived from a plan without Spark; plus the schema contract (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from sparkguard.plan.model import (
    Aggregation,
    BackfillPlan,
    CheckType,
    Contract,
    NanRule,
    Promotion,
    TargetSpec,
)
from sparkguard.plan.window_spec import BUCKET_COLUMN
from sparkguard.reconcile.verdicts import GateResult
from sparkguard.sql import PartitionType

__all__ = [
    "ColumnInfo",
    "MetricSpec",
    "ReconcileSpec",
    "ThresholdSpec",
    "schema_contract_gates",
    "spec_for_target",
    "unknown_column_reason",
    "unknown_columns",
]


@dataclass(frozen=True)
class ThresholdSpec:
    """Percent and/or absolute tolerance; both None means exact."""

    percent: float | None = None
    absolute: float | None = None

    def describe(self) -> str:
        parts = []
        if self.percent is not None:
            parts.append(f"<= {self.percent:g}%")
        if self.absolute is not None:
            parts.append(f"<= {self.absolute:g} abs")
        return " and ".join(parts) or "exact"


@dataclass(frozen=True)
class MetricSpec:
    """One aggregate compared between source and shadow."""

    name: str
    aggregation: Aggregation
    source_expr: str
    shadow_expr: str
    threshold: ThresholdSpec
    per_partition: bool = False
    nan: NanRule = NanRule.FAIL
    drift: ThresholdSpec | None = None  # a gate on the move from the current target to the shadow


@dataclass(frozen=True)
class ReconcileSpec:
    """Everything the engine needs; built from a plan target by :func:`spec_for_target`."""

    partition_column: str
    partition_type: PartitionType
    business_keys: tuple[str, ...]
    row_count: ThresholdSpec | None = ThresholdSpec(percent=0.0)
    row_count_per_partition: bool = False
    duplicate_check: ThresholdSpec | None = ThresholdSpec(absolute=0.0)
    metrics: tuple[MetricSpec, ...] = ()
    not_null: tuple[str, ...] = ()
    float_abs_tolerance: float = 1e-9
    float_rel_tolerance: float = 1e-9
    ignore_trailing_spaces: bool = False
    sample_size: int = 10
    key_source: bool = False
    extra_duplicate_keys: tuple[tuple[str, ...], ...] = field(default=())
    # each extra key set's own threshold, by position; missing ones are exact (0 duplicates)
    extra_duplicate_thresholds: tuple[ThresholdSpec, ...] = field(default=())
    # the promotion matches target rows on the business keys (MERGE): a key of the shadow held
    # more than once by the target's window fails the ``merge_target_keys`` gate
    merge_keys: bool = False
    # what the target's Delta table checks on each written row (CHECK constraints, generated
    # columns) as (gate name, expression a shadow row must make true); a row where it is false
    # or null counts against its gate
    constraints: tuple[tuple[str, str], ...] = ()

    def extra_duplicate_threshold(self, cols: tuple[str, ...]) -> ThresholdSpec:
        """The threshold of the extra duplicate check on ``cols``."""
        for keys, thr in zip(self.extra_duplicate_keys, self.extra_duplicate_thresholds,
                             strict=False):
            if keys == cols:
                return thr
        return ThresholdSpec(absolute=0.0)


def spec_for_target(plan: BackfillPlan, target: TargetSpec, key_source: bool = False) -> ReconcileSpec:
    """Translate the plan's validation checks for one target into a ReconcileSpec."""
    if plan.window_column is not None:  # grouped by the bucket label the run adds to each side
        pcol, ptype = BUCKET_COLUMN, PartitionType.STRING
    else:
        assert plan.partitioning is not None, "guard ensures partitioning is set"
        pcol, ptype = plan.partitioning.column, plan.partitioning.type
    row_count: ThresholdSpec | None = None
    per_partition_rc = False
    dup: ThresholdSpec | None = None
    extra_dups: list[tuple[str, ...]] = []
    extra_thresholds: list[ThresholdSpec] = []
    metrics: list[MetricSpec] = []
    grouping = set(target.business_keys) | {pcol}
    for check in plan.checks_for(target):
        thr = ThresholdSpec(check.threshold_percent, check.threshold_absolute)
        if check.type is CheckType.ROW_COUNT_PARITY:
            row_count = thr
            per_partition_rc = check.per_partition
        elif check.type is CheckType.DUPLICATE_CHECK:
            if thr.percent is None and thr.absolute is None:
                thr = ThresholdSpec(absolute=0.0)
            cols = tuple(check.key_columns or target.business_keys)
            if set(cols) | {pcol} == grouping:
                dup = thr
                # a key repeated in two buckets counts too; so in two partitions when a MERGE
                # promotes, which matches on the business keys alone
                # (or when the plan says the keys are unique across the table)
                if plan.window_column is not None or (pcol not in cols and (
                        check.table_wide or target.promotion is not Promotion.REPLACE_WHERE)):
                    extra_dups.append(cols)
                    extra_thresholds.append(thr)
            else:  # its own threshold; the business keys keep theirs (default: exact)
                extra_dups.append(cols)
                extra_thresholds.append(thr)
                dup = dup or ThresholdSpec(absolute=0.0)
        elif check.type is CheckType.METRIC_RECONCILIATION:
            name = check.metric or f"metric_{len(metrics) + 1}"
            src = check.source_expr or check.shadow_expr or name
            shd = check.shadow_expr or check.source_expr or name
            drift = None
            if check.drift_threshold_percent is not None or check.drift_threshold_absolute is not None:
                drift = ThresholdSpec(check.drift_threshold_percent, check.drift_threshold_absolute)
            metrics.append(MetricSpec(name, check.aggregation, src, shd, thr, check.per_partition,
                                      check.nan, drift))
    keys = tuple(target.business_keys)
    if target.promotion is not Promotion.REPLACE_WHERE and keys and pcol not in keys:
        # a MERGE matches on the business keys alone: a key twice in the shadow's window
        # fails it at the commit (or is inserted twice), so the check across the window is
        # exact whatever threshold, key_columns (the partition column too, say) or none the
        # duplicate_check gives
        dup = dup or ThresholdSpec(absolute=0.0)
        same = [i for i, cols in enumerate(extra_dups) if set(cols) == set(keys)]
        for i in same:
            extra_thresholds[i] = ThresholdSpec(absolute=0.0)
        if not same:
            extra_dups.append(keys)
            extra_thresholds.append(ThresholdSpec(absolute=0.0))
    not_null = tuple(dict.fromkeys([*target.contract.not_null,
                                    *(c.name for c in target.contract.columns if not c.nullable)]))
    return ReconcileSpec(
        partition_column=pcol,
        partition_type=ptype,
        business_keys=tuple(target.business_keys),
        row_count=row_count,
        row_count_per_partition=per_partition_rc,
        duplicate_check=dup,
        metrics=tuple(metrics),
        not_null=not_null,
        key_source=key_source,
        extra_duplicate_keys=tuple(extra_dups),
        extra_duplicate_thresholds=tuple(extra_thresholds),
        merge_keys=target.promotion is not Promotion.REPLACE_WHERE,
    )


@dataclass(frozen=True)
class ColumnInfo:
    """A column's name, Spark SQL type string and nullability."""

    name: str
    type: str
    nullable: bool


def unknown_columns(names: Sequence[str], columns: Sequence[str]) -> dict[str, str | None]:
    """Each of ``names`` that is not exactly one of ``columns``, with the column it matches in
    another case (None: no such column)."""
    folded = {c.lower(): c for c in columns}
    return {n: folded.get(n.lower()) for n in names if n not in columns}


def unknown_column_reason(name: str, near: str | None, where: str) -> str:
    """Why a not-null contract names no column of ``where``."""
    hint = f"it has {near!r} (names match exactly, case included)" if near else "no such column"
    return f"not_null names column {name!r}, which {where} does not have: {hint}"


def _norm_type(t: str) -> str:
    return t.replace(" ", "").lower()


# Integers Delta writes into a wider integer column as they are (Parquet stores all three as
# INT32): (the shadow's type, the target's)
_INT_INTO_WIDER = {("tinyint", "smallint"), ("tinyint", "int"), ("smallint", "int")}


def _written_unchanged(shadow_type: str, target_type: str) -> bool:
    got, want = _norm_type(shadow_type), _norm_type(target_type)
    return got == want or (got, want) in _INT_INTO_WIDER


def _columns_match(shadow: Sequence[ColumnInfo], target: Sequence[ColumnInfo],
                   identity: set[str], written_as_is: bool) -> GateResult:
    """With ``match_target_schema: false``, the names (case-insensitive, as Delta's writes
    resolve them): a promotion writes no column the target lacks, and a column the shadow lacks
    would leave the window's values null or stale, which the check after the promotion refuses.
    ``written_as_is`` (``replace_where``): the types too, as Delta refuses a column of another
    type at the commit. Either way the run would fail at or after its commit; this fails it
    first. (A MERGE casts each value to the target's type: ``cast_to_target`` gates.)"""
    have = {c.name.lower() for c in shadow}
    wanted = {c.name.lower(): c.type for c in target}
    problems = [f"column {c.name!r} missing from the recomputed rows" for c in target
                if c.name.lower() not in have and c.name.lower() not in identity]
    problems += [f"column {c.name!r} not in the target" for c in shadow
                 if c.name.lower() not in wanted and c.name.lower() not in identity]
    typed = [f"column {c.name!r} type {c.type} != target {wanted[c.name.lower()]}"
             for c in shadow if written_as_is and c.name.lower() in wanted
             and c.name.lower() not in identity
             and not _written_unchanged(c.type, wanted[c.name.lower()])]
    why = []
    if problems:
        why.append("; ".join(problems) + " (match_target_schema is off, so types may differ, "
                   "but the promotion writes and checks the target's columns by name)")
    if typed:
        why.append("; ".join(typed) + " (replace_where writes the recomputed columns as they "
                   "are, and Delta refuses a type other than the target's: cast them in the "
                   "transform, or promote with merge, which casts each value)")
    return GateResult(
        gate="columns_match_target", check_type="schema_contract",
        passed=not problems and not typed, measured=len(problems) + len(typed), threshold=0,
        reason=("; ".join(why) if why else "the shadow has the target's columns (" + (
            "and types: replace_where writes them as they are)" if written_as_is else
            "types not compared: match_target_schema is off)")),
        details={"differences": problems + typed})


def schema_contract_gates(shadow: Sequence[ColumnInfo], target: Sequence[ColumnInfo] | None,
                          contract: Contract, identity: Sequence[str] = (),
                          written_as_is: bool = False) -> list[GateResult]:
    """Schema gates: the shadow against the target's schema (with ``match_target_schema: false``
    its column names only) and against the explicit contract.

    Nullability: a non-nullable target column must not become nullable in the shadow *data*;
    that is checked by the not-null gate on values, so here a nullable flag alone only fails
    when the explicit contract says ``nullable: false`` and the data has nulls (engine gate).
    The target's ``identity`` columns are the target's to fill: the shadow must leave them out
    (names compared case-insensitively, as Delta's writes resolve them), whatever the contract.
    ``written_as_is``: the promotion writes the shadow's columns without a cast
    (``replace_where``), so types are compared even with ``match_target_schema: false``.
    """
    gates: list[GateResult] = []
    by_name = {c.name: c for c in shadow}
    lowered = {c.lower() for c in identity}
    output = [c.name for c in shadow if c.name.lower() in lowered]
    if output:
        gates.append(GateResult(
            gate="identity_left_to_target", check_type="schema_contract", passed=False,
            measured=len(output), threshold=0, expected=0,
            reason="; ".join(f"column {c!r} is an identity column of the target, which keeps its "
                             "value for every key it holds and generates one for each new key: "
                             "leave it out of the recomputed rows" for c in output),
            details={"columns": output}))
    if target is not None and contract.match_target_schema:
        problems: list[str] = []
        tnames = {c.name for c in target}
        for col in target:
            got = by_name.get(col.name)
            if col.name.lower() in lowered:
                continue  # the identity gate above
            if got is None:
                problems.append(f"column {col.name!r} missing from the recomputed rows")
            elif _norm_type(got.type) != _norm_type(col.type):
                problems.append(f"column {col.name!r} type {got.type} != target {col.type}")
        problems += [f"column {c.name!r} not in the target" for c in shadow
                     if c.name not in tnames and c.name not in output]
        gates.append(GateResult(
            gate="schema_matches_target", check_type="schema_contract", passed=not problems,
            measured=len(problems), threshold=0,
            reason=("; ".join(problems) if problems else "shadow schema equals the target schema"
                    + (f" but for its identity column(s) {', '.join(identity)}, which the "
                       "target fills" if identity else "")),
            details={"differences": problems}))
    if target is not None and not contract.match_target_schema:
        gates.append(_columns_match(shadow, target, lowered, written_as_is))
    if contract.columns:
        problems = []
        for cc in contract.columns:
            got = by_name.get(cc.name)
            if got is None:
                problems.append(f"contract column {cc.name!r} missing")
            elif _norm_type(got.type) != _norm_type(cc.type):
                problems.append(f"contract column {cc.name!r} type {got.type} != {cc.type}")
        gates.append(GateResult(
            gate="schema_contract", check_type="schema_contract", passed=not problems,
            measured=len(problems), threshold=0,
            reason="shadow satisfies the declared contract" if not problems else "; ".join(problems),
            details={"differences": problems}))
    return gates
