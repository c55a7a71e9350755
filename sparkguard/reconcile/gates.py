"""Pure verdict building: from per-partition aggregate rows to PartitionStats and GateResults."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from sparkguard.plan.model import Aggregation, NanRule
from sparkguard.reconcile.spec import MetricSpec, ReconcileSpec, ThresholdSpec, unknown_column_reason
from sparkguard.reconcile.verdicts import (
    EXACT,
    NONFINITE_KINDS,
    GateResult,
    PartitionStats,
    deviation,
    fold_partial,
    judge,
    within,
)

__all__ = ["SIDES", "build_gates", "combine_metric", "metric_value", "utc_instant"]

SIDES = ("source", "shadow", "target")
_EPOCH_DAY = dt.date(1970, 1, 1).toordinal()
_EPOCH_UTC = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def metric_value(agg: Aggregation, parts: Mapping[str, Any]) -> Any:
    """Final metric value from combined partials ``sum``, ``count``, ``min``, ``max``, ``cd``."""
    if agg is Aggregation.SUM:
        return parts.get("sum")
    if agg is Aggregation.COUNT:
        return parts.get("count") or 0
    if agg is Aggregation.MIN:
        return parts.get("min")
    if agg is Aggregation.MAX:
        return parts.get("max")
    if agg is Aggregation.COUNT_DISTINCT:
        return parts.get("cd")  # None: not counted (a partition of a window-only metric)
    total, count = parts.get("sum"), parts.get("count") or 0
    if total is None or count == 0:
        return None
    if isinstance(total, int | Decimal) and not isinstance(total, bool):  # exact, as sums are
        return EXACT.divide(Decimal(total), Decimal(count))
    return float(total) / count


def combine_metric(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Combine per-partition partials into window partials (sum/count add, min/max fold)."""
    out: dict[str, Any] = {"sum": None, "count": 0, "min": None, "max": None, "cd": None,
                           "overflow": 0, **dict.fromkeys(NONFINITE_KINDS, 0)}
    for r in rows:
        for how in ("sum", "min", "max"):
            out[how] = fold_partial(how, out[how], r.get(how))
        out["count"] += r.get("count") or 0
        for kind in (*NONFINITE_KINDS, "overflow"):
            out[kind] += r.get(kind) or 0
        if r.get("cd") is not None:
            out["cd"] = (out["cd"] or 0) + r["cd"]
    return out


def _num(v: Any) -> float | int | Decimal | None:
    """A metric value as a number: timestamps in epoch seconds (exact to the microsecond), dates
    in days, so that min/max of time columns compare (an absolute threshold is then in seconds
    or days). A naive datetime is a ``timestamp_ntz``, compared as wall-clock time."""
    if v is None:
        return None
    if isinstance(v, dt.datetime):
        epoch = _EPOCH_UTC if v.tzinfo is not None else _EPOCH_UTC.replace(tzinfo=None)
        return Decimal(_micros(v - epoch)).scaleb(-6)
    if isinstance(v, dt.date):
        return v.toordinal() - _EPOCH_DAY
    return v if isinstance(v, int | Decimal) else float(v)  # exact ones subtract exactly


def utc_instant(micros: int | None) -> dt.datetime | None:
    """A ``timestamp``'s ``unix_micros`` as an aware UTC datetime (whatever the driver's zone)."""
    return None if micros is None else _EPOCH_UTC + dt.timedelta(microseconds=int(micros))


def _micros(d: dt.timedelta) -> int:
    return (d.days * 86400 + d.seconds) * 1_000_000 + d.microseconds


def _comparable(v: Any) -> bool:
    """Numbers, decimals, dates and timestamps compare by deviation; anything else (strings)
    only by equality."""
    return v is None or (isinstance(v, int | float | Decimal | dt.date) and not isinstance(v, bool))


def _compare_gate(name: str, check_type: str, expected: Any, measured: Any, thr: ThresholdSpec,
                  what: str, partition: str | None = None) -> GateResult:
    if _comparable(expected) and _comparable(measured):
        exp_n, got_n = _num(expected), _num(measured)
        absolute, percent = deviation(exp_n, got_n)
        ok = within(exp_n, got_n, thr.percent, thr.absolute)
    else:  # strings: equal or not, whatever the threshold
        ok = expected == measured
        absolute, percent = (0.0, 0.0) if ok else (math.inf, math.inf)
    where = f" in partition {partition}" if partition else ""
    verb = "within" if ok else "exceeds"
    if ok and math.isinf(percent):
        verb = "(no percent of 0: the absolute bound decides) within"
    reason = (f"{what}{where}: expected {expected}, got {measured}; deviation {absolute:g} "
              f"({percent:.4g}%) {verb} threshold {thr.describe()}")
    return GateResult(gate=name, check_type=check_type, passed=ok,
                      measured={"value": measured, "abs_diff": absolute, "pct_diff": percent},
                      expected=expected, threshold=thr.describe(), reason=reason,
                      partition=partition)


def build_gates(spec: ReconcileSpec, rows: Sequence[Mapping[str, Any]], has_source: bool,
                extra_duplicates: Mapping[tuple[str, ...], int] | None = None,
                has_target: bool = False, unknown_not_null: Mapping[str, str | None] | None = None,
                target_keys_spread: int = 0) -> tuple[list[PartitionStats], list[GateResult]]:
    """Gates from per-partition rows; with ``has_target``, also the drift gates (current
    target against the shadow) of the metrics that ask for one. ``unknown_not_null``: not-null
    names the shadow has no column for (each with its near match in another case); each fails.
    ``target_keys_spread``: keys of the shadow the target's window holds in two partitions, or
    twice in a partition the shadow does not hold the key in.

    Each row: ``partition`` (str), ``rows_<side>``, ``dup_shadow``, ``dup_source``,
    ``null_<col>``, and for each metric ``m<i>_<side>`` a dict of partials.
    """
    ref = "source" if has_source else "target"
    stats: list[PartitionStats] = []
    for r in rows:
        metrics = {}
        for i, m in enumerate(spec.metrics):
            metrics[m.name] = {s: metric_value(m.aggregation, r.get(f"m{i}_{s}") or {})
                               for s in SIDES}
        stats.append(PartitionStats(
            partition=str(r["partition"]),
            rows_source=int(r.get("rows_source") or 0),
            rows_shadow=int(r.get("rows_shadow") or 0),
            rows_target=int(r.get("rows_target") or 0),
            duplicate_keys_shadow=int(r.get("dup_shadow") or 0),
            duplicate_keys_source=int(r.get("dup_source") or 0),
            metrics=metrics,
            nulls={c: int(r.get(f"null_{c}") or 0) for c in spec.not_null},
            changes=dict(r.get("changes") or {})))
    gates: list[GateResult] = []
    if spec.row_count is not None:
        exp = sum(getattr(s, f"rows_{ref}") for s in stats)
        got = sum(s.rows_shadow for s in stats)
        gates.append(_compare_gate("row_count_parity", "row_count_parity", exp, got,
                                   spec.row_count, f"shadow rows vs {ref} rows"))
        if spec.row_count_per_partition:
            for s in stats:
                gates.append(_compare_gate("row_count_parity", "row_count_parity",
                                           getattr(s, f"rows_{ref}"), s.rows_shadow,
                                           spec.row_count, f"shadow rows vs {ref} rows",
                                           s.partition))
    rows_shadow = sum(s.rows_shadow for s in stats)
    if spec.duplicate_check is not None:
        dups = sum(s.duplicate_keys_shadow for s in stats)
        thr = spec.duplicate_check
        pct = dups / rows_shadow * 100.0 if rows_shadow else 0.0
        ok = _duplicates_ok(dups, rows_shadow, thr)
        keys = ", ".join(spec.business_keys)
        gates.append(GateResult(
            gate="duplicate_check", check_type="duplicate_check", passed=ok,
            measured={"duplicate_keys": dups, "pct_of_rows": pct}, threshold=thr.describe(),
            expected=0,
            reason=(f"{dups} business key(s) ({keys}) occur more than once in the shadow; "
                    f"threshold {thr.describe()}"),
            details={"source_duplicate_keys": sum(s.duplicate_keys_source for s in stats)}))
    if spec.merge_keys and has_target:
        gates.append(_merge_target_keys_gate(spec, rows, target_keys_spread))
    for cols, n in (extra_duplicates or {}).items():
        thr = spec.extra_duplicate_threshold(cols)
        gates.append(GateResult(
            gate=f"duplicate_check[{','.join(cols)}]", check_type="duplicate_check",
            passed=_duplicates_ok(n, rows_shadow, thr), measured={"duplicate_keys": n},
            threshold=thr.describe(), expected=0,
            reason=(f"{n} key(s) ({', '.join(cols)}) occur more than once in the shadow; "
                    f"threshold {thr.describe()}")))
    for i, m in enumerate(spec.metrics):
        gates.extend(_metric_gates(i, m, rows, stats, ref))
        if m.drift is not None and has_target and ref != "target":
            gates.extend(_metric_gates(i, m, rows, stats, "target", drift=True))
    for col in spec.not_null:
        n = sum(s.nulls.get(col, 0) for s in stats)
        gates.append(GateResult(
            gate=f"not_null[{col}]", check_type="nullability_contract", passed=n == 0,
            measured=n, threshold=0, expected=0,
            reason=f"{n} null value(s) in non-null column {col!r} of the shadow"))
    for gate, expr in spec.constraints:
        n = sum(int(r.get(gate) or 0) for r in rows)
        gates.append(GateResult(
            gate=gate, check_type="table_constraint", passed=n == 0, measured=n, threshold=0,
            expected=0, reason=(f"{n} row(s) of the shadow make {expr} false or null: the "
                                "target's Delta table would refuse them at promotion")))
    for col, near in (unknown_not_null or {}).items():
        gates.append(GateResult(
            gate=f"not_null[{col}]", check_type="nullability_contract", passed=False,
            measured=None, threshold=0, expected=0,
            reason=f"{unknown_column_reason(col, near, 'the shadow')}; fix contract.not_null"))
    return stats, gates


def _merge_target_keys_gate(spec: ReconcileSpec, rows: Sequence[Mapping[str, Any]],
                            spread: int) -> GateResult:
    """A MERGE matches on the business keys: a key of the shadow that the target's window holds
    more than once (in the shadow's partition, or in ``spread`` keys' case in two or more
    partitions or twice in another) would update
    every copy, so the target would keep or gain duplicates. Always exact; ``replace_where``
    replaces the window and has no such gate."""
    within = sum(int(r.get("dup_target") or 0) for r in rows)
    n = within + spread
    keys = ", ".join(spec.business_keys)
    where = " and ".join(
        [f"{within} in the shadow's partition"] * bool(within)
        + [f"{spread} in two or more partitions, or twice in another"] * bool(spread))
    return GateResult(
        gate="merge_target_keys", check_type="duplicate_check", passed=n == 0,
        measured={"duplicate_keys": n, "in_one_partition": within, "across_partitions": spread},
        threshold=0, expected=0,
        reason=(f"{n} business key(s) ({keys}) of the shadow occur more than once in the "
                f"target's window ({where}): a MERGE would update every copy and keep (or make) "
                "duplicates. Promote with replace_where, or remove the target's duplicates first"
                if n else f"every business key ({keys}) of the shadow matches at most one row "
                "of the target's window"))


def _duplicates_ok(n: int, rows: int, thr: ThresholdSpec) -> bool:
    """``n`` duplicate keys among ``rows`` shadow rows within ``thr`` (percent of the rows),
    exactly."""
    pct = EXACT.divide(Decimal(n * 100), Decimal(rows)) if rows else Decimal(0)
    return judge(Decimal(n), pct, thr.percent, thr.absolute)


def _metric_gates(i: int, m: MetricSpec, rows: Sequence[Mapping[str, Any]],
                  stats: Sequence[PartitionStats], ref: str, drift: bool = False
                  ) -> list[GateResult]:
    """Metric ``i``'s gates against ``ref``, for the window and (where checked per partition,
    or for drift wherever the partition's value is known) per partition."""
    exp_parts = combine_metric([r.get(f"m{i}_{ref}") or {} for r in rows])
    got_parts = combine_metric([r.get(f"m{i}_shadow") or {} for r in rows])
    if m.aggregation is Aggregation.COUNT_DISTINCT:
        # distinct counts do not add up across partitions; the engine supplies window totals
        exp_parts["cd"] = rows[0].get(f"m{i}_{ref}_window_cd") if rows else 0
        got_parts["cd"] = rows[0].get(f"m{i}_shadow_window_cd") if rows else 0
    label = f"{m.aggregation.value}({m.shadow_expr}) shadow vs {m.aggregation.value}" \
            f"({m.source_expr if ref == 'source' else m.shadow_expr}) {ref}"
    out = _metric_pair(m, ref, label, exp_parts, got_parts, None, drift)
    if m.per_partition or (drift and m.aggregation is not Aggregation.COUNT_DISTINCT):
        for r, s in zip(rows, stats, strict=True):
            out += _metric_pair(m, ref, label, r.get(f"m{i}_{ref}") or {},
                                r.get(f"m{i}_shadow") or {}, s.partition, drift)
    return out


_KIND_LABELS = {"nan": "NaN", "posinf": "+inf", "neginf": "-inf"}


def _by_kind(parts: Mapping[str, Any]) -> dict[str, int]:
    """NaN, +inf and -inf input rows of one side, labelled."""
    return {label: int(parts.get(k) or 0) for k, label in _KIND_LABELS.items()}


def _shown(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{label} {n}" for label, n in counts.items() if n) or "none"


def _metric_pair(m: MetricSpec, ref: str, label: str, exp_parts: Mapping[str, Any],
                 got_parts: Mapping[str, Any], partition: str | None, drift: bool = False
                 ) -> list[GateResult]:
    """The metric's gate (window or one partition) under the NaN rule: with ``nan: fail`` a NaN
    or infinite input on either side fails it; with ``nan: exclude`` the values are over finite
    inputs and the NaN, +inf and -inf row counts get a gate of their own, compared per kind.
    ``drift``: the gate of the move from the current target to the shadow, under the drift
    threshold."""
    name = f"metric_{'drift' if drift else 'reconciliation'}[{m.name}]"
    threshold = m.drift if drift and m.drift is not None else m.threshold
    kind = "metric_drift" if drift else "metric_reconciliation"
    expected = metric_value(m.aggregation, exp_parts)
    measured = metric_value(m.aggregation, got_parts)
    by_kind = {ref: _by_kind(exp_parts), "shadow": _by_kind(got_parts)}
    nonfinite = {side: sum(c.values()) for side, c in by_kind.items()}
    where = f" in partition {partition}" if partition else ""
    overflow = {side: int(parts.get("overflow") or 0)
                for side, parts in ((ref, exp_parts), ("shadow", got_parts))}
    if any(overflow.values()):
        sides = " and ".join(f"the {side} ({n} group(s))" for side, n in overflow.items() if n)
        return [GateResult(
            gate=name, check_type=kind, passed=False,
            measured={"value": measured, "overflowed_groups": overflow}, expected=expected,
            threshold=threshold.describe(), partition=partition,
            reason=(f"{label}{where}: the decimal sum overflowed decimal(38, s) on {sides}, so "
                    f"the total is not known (Spark's sum is null there); sum the expression "
                    f"cast to fewer fractional digits on both sides, e.g. "
                    f"CAST(x AS DECIMAL(38, 6))"))]
    if m.nan is NanRule.EXCLUDE:
        same = by_kind[ref] == by_kind["shadow"]
        ref_expr = m.source_expr if ref == "source" else m.shadow_expr
        counts = GateResult(
            gate=f"{name}.nan_or_infinite_rows", check_type=kind, passed=same,
            measured={"value": by_kind["shadow"]}, expected=by_kind[ref], threshold="exact",
            partition=partition,
            reason=(f"NaN, +inf and -inf rows of {m.shadow_expr} in the shadow "
                    f"({_shown(by_kind['shadow'])}) vs {ref_expr} in the {ref} "
                    f"({_shown(by_kind[ref])}){where}: "
                    f"{'equal' if same else 'differ'} (compared exactly, per kind)"))
        return [_compare_gate(name, kind, expected, measured, threshold,
                              f"{label} (finite values)", partition), counts]
    if not any(nonfinite.values()):
        return [_compare_gate(name, kind, expected, measured, threshold,
                              label, partition)]
    sides = " and ".join(f"the {side} has {n} NaN or infinite input row(s) "
                         f"({_shown(by_kind[side])})" for side, n in nonfinite.items() if n)
    return [GateResult(
        gate=name, check_type=kind, passed=False,
        measured={"value": measured, "nan_or_infinite_rows": nonfinite,
                  "by_kind": by_kind},
        expected=expected, threshold=threshold.describe(), partition=partition,
        reason=(f"{label}{where}: {sides}, so the {m.aggregation.value} is not a number that "
                f"can be compared (a NaN or infinite total hides every other difference); fix "
                f"those rows, or set `nan: exclude` on this check to compare the finite values "
                f"and the NaN/+inf/-inf row counts separately"))]
