"""The reconciliation engine: every gate and the change preview from one aggregation.

How one reconciliation runs (comparison rules: ``docs/reconciliation.md``):

1. **One scan per side.** Each side is projected once to narrow rows: partition, business
   keys, a side tag, a packed row counter and, for shadow and target, a 64-bit row hash of the
   exactly compared columns, their 32-bit column hashes packed two to a long, the float
   columns, plus metric inputs (a sum over a compared float column reuses that column) and
   one-bit flags (nulls of not-null columns, non-null inputs of counts and averages). No other
   column leaves the scan.
2. **One aggregation.** The projections are unioned and grouped by (partition, keys, tag): a
   shadow row and a target row of the same key land in one group, where the ``bit_xor`` of
   their hashes is zero exactly when the hashes are equal. Every level-1 aggregate is a sum,
   min, max or xor, so the groups fold further (level 2) in the same stage: each key is
   classified once and grouped by (partition, tag, kind of change, duplicate). Those groups --
   a handful per partition, each with a few sample keys -- are all the driver receives; it
   folds them to one row per partition.
3. **Bounded samples.** Before/after rows are read back for at most ``sample_size`` keys from
   at most two partitions (the smallest with differences).

Without extra duplicate keys, rows are shuffled by (partition, keys) without a map-side
combine, which cannot shrink unique keys anyway; extra duplicate-key sets ride along as extra
rows and Spark's map-side combine is kept. ``count_distinct`` metrics are the one exception to
"one scan": their inputs are read again, narrow (partition and input only), and counted per side
for the window, plus per partition only for metrics checked per partition, which costs far less
than carrying them through the wide aggregation.

The stages live in their own modules: ``layout`` (what to compute), ``hashing``, ``project``
(level 0 and 1), ``levels`` (level 2), ``distinct`` and ``samples``; this module runs them and
builds the result.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from decimal import Decimal
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sparkguard.plan.model import Aggregation
from sparkguard.reconcile.distinct import _distinct_counts, _distinct_frame
from sparkguard.reconcile.gates import build_gates, utc_instant
from sparkguard.reconcile.hashing import column, columns_of, row_hash, table_fingerprint
from sparkguard.reconcile.layout import (
    _SIDE_NAMES,
    NONFINITE_KINDS,
    SHADOW,
    SOURCE,
    TARGET,
    _Layout,
    _layout,
)
from sparkguard.reconcile.levels import _fold_groups, _verdict_frame
from sparkguard.reconcile.project import _project as _project  # re-exported: tests reach it here
from sparkguard.reconcile.samples import _change_sample, _dup_sample, _fetch, _pick_samples, same_value
from sparkguard.reconcile.spec import ReconcileSpec, unknown_columns
from sparkguard.reconcile.verdicts import EXACT, ChangePreview, ReconcileResult

__all__ = ["SHADOW", "SOURCE", "TARGET", "columns_of", "reconcile", "row_hash", "same_value",
           "table_fingerprint"]


def reconcile(spec: ReconcileSpec, *, shadow: DataFrame, target: DataFrame | None = None,
              source: DataFrame | None = None, partitions: Sequence[object] | None = None,
              scope: str = "window", preview: bool = True) -> ReconcileResult:
    """Reconcile ``shadow`` against ``source`` (gates) and ``target`` (change preview).

    All three are already restricted to the slice or window by the caller. ``partitions``
    lists the partitions expected, so empty ones still get a row. Gates compare the shadow with
    the source when given, else with the target. With ``preview=False`` the target is not
    read: only its NOT NULL columns join the not-null contract (a slice's gates; the window
    previews the changes). Values compare as documented in
    ``docs/reconciliation.md``: floats within ``float_abs_tolerance + float_rel_tolerance *
    |before|``, NaN equal to NaN, -0.0 equal to 0.0, null equal only to null, decimals,
    timestamps (as instants) and strings (trailing spaces included, unless
    ``ignore_trailing_spaces``) exactly.
    """
    unknown = unknown_columns(spec.not_null, shadow.columns)  # each fails its gate
    spec = _with_target_not_null(spec, shadow, target)
    if not preview:
        if source is None:
            raise ValueError("reconcile without a preview needs a source to gate against")
        target = None
    lay = _layout(spec, shadow, target, source)
    l2 = _verdict_frame(spec, lay, shadow, target, source)
    l2_rows = _fold_groups(lay, [r.asDict() for r in l2.collect()])  # a few per partition
    cd = _distinct_frame(spec, lay, {SOURCE: source, SHADOW: shadow, TARGET: target})
    distinct = _distinct_counts(lay, [r.asDict() for r in cd.collect()] if cd is not None else [])
    return _result(spec, lay, l2_rows, distinct, shadow, target, source, partitions, scope,
                   unknown)


def _with_target_not_null(spec: ReconcileSpec, shadow: DataFrame,
                          target: DataFrame | None) -> ReconcileSpec:
    """Columns NOT NULL in the target must hold no null in the shadow either (checked on values:
    a Delta shadow written from a query has nullable columns whatever the data)."""
    present = [c for c in spec.not_null if c in shadow.columns]  # missing: a failing gate
    extra = [f.name for f in (target.schema.fields if target is not None else [])
             if not f.nullable and f.name in shadow.columns and f.name not in present]
    return replace(spec, not_null=(*present, *extra))



# -- from level-2 rows to the result -----------------------------------------------------------

def _result(spec: ReconcileSpec, lay: _Layout, l2_rows: list[dict[str, Any]],
            distinct: tuple[dict[tuple[int, int], int], dict[tuple[int, int, Any], int]],
            shadow: DataFrame, target: DataFrame | None, source: DataFrame | None,
            partitions: Sequence[object] | None, scope: str,
            unknown_not_null: Mapping[str, str | None]) -> ReconcileResult:
    alt_dups: dict[int, int] = {}
    per_part: dict[Any, dict[str, Any]] = {}
    for r in l2_rows:
        for t, _w in lay.alt_dups:
            alt_dups[t] = alt_dups.get(t, 0) + int(r.get(f"__sg_e{t}") or 0)
        real = any(r.get(k) for k in ("rows_shadow", "rows_target", "rows_source"))
        if r[lay.p] is not None or real:  # else only the window's extra duplicate-key groups
            per_part[r[lay.p]] = r
    wanted = list(partitions) if partitions is not None else []
    order = list(dict.fromkeys([*wanted, *sorted(per_part, key=str)]))
    rows = [_gate_row(spec, lay, part, per_part.get(part, {}), distinct) for part in order]
    extra = {what: alt_dups.get(t, 0) for t, what in lay.alt_dups}
    moved = spread = 0
    if target is not None and spec.merge_keys and any(r.get("deleted") for r in per_part.values()):
        # a key leaving a partition of the target: moved, or held in two partitions
        moved, spread = _key_spread(lay, shadow, target)
    stats, gates = build_gates(spec, rows, source is not None, extra, target is not None,
                               unknown_not_null, spread)
    samples = _pick_samples(lay, per_part, spec.sample_size)
    fetched = _fetch(lay, samples, shadow, target, source)
    preview = None
    if target is not None:
        names = [*lay.exact, *lay.floats]
        chg = {c: 0 for c in names}
        totals = dict.fromkeys(("inserted", "deleted", "changed", "unchanged", "ambiguous"), 0)
        for r in per_part.values():
            for k in totals:
                totals[k] += int(r.get(k) or 0)
            for j, c in enumerate(names):
                chg[c] += int(r.get(f"chg_{j}") or 0)
        preview = ChangePreview(
            inserted=totals["inserted"], deleted=totals["deleted"], changed=totals["changed"],
            unchanged=totals["unchanged"], ambiguous=totals["ambiguous"],
            changed_by_column=chg, not_compared=lay.not_compared,
            sample=_change_sample(spec, lay, samples, fetched), moved=moved)
    dup_sample = _dup_sample(lay, samples, fetched)
    return ReconcileResult(scope=scope, partitions=tuple(stats), gates=tuple(gates),
                           preview=preview, duplicate_sample=dup_sample)


def _key_spread(lay: _Layout, shadow: DataFrame, target: DataFrame) -> tuple[int, int]:
    """Keys of the shadow that the target holds in another partition of the window than the
    shadow does (moved: counted once inserted, once deleted per partition; a MERGE, matching on
    the keys alone, updates them), and keys of the shadow that the target holds more than once
    outside the shadow's own partition: in two or more partitions of the window, or twice in
    one other partition (a MERGE would update every copy into duplicates; a key held twice in
    the shadow's own partition is the per-partition count's, and is not counted again here).
    One join of the shadow's keys to the target's keys counted per partition, only when the
    preview deletes something."""
    def keyed(df: DataFrame, side: str) -> DataFrame:  # names apart: shadow and target may
        # share a lineage (a self-join)
        return df.select(*[column(k).alias(f"__sg_{side}{i}") for i, k in enumerate(lay.keys)],
                         column(lay.p).alias(f"__sg_{side}p"))

    n = range(len(lay.keys))
    on = [F.col(f"__sg_s{i}").eqNullSafe(F.col(f"__sg_t{i}")) for i in n]
    held = keyed(target, "t").groupBy(*[f"__sg_t{i}" for i in n], "__sg_tp").agg(
        F.count(F.lit(1)).alias("__sg_tn"))
    same = F.col("__sg_sp").eqNullSafe(F.col("__sg_tp"))
    twice = F.col("__sg_tn") > 1
    tp = F.struct("__sg_tp")  # a null partition counts
    per_key = (keyed(shadow, "s").join(held, on)
               .groupBy(*[f"__sg_s{i}" for i in n])
               .agg(F.max((~same).cast("int")).alias("m"), F.count_distinct(tp).alias("p"),
                    # partitions holding the key twice, and those of them the shadow holds it
                    # in: more of the first, and one is outside every shadow partition of it
                    F.count_distinct(F.when(twice, tp)).alias("d"),
                    F.count_distinct(F.when(twice & same, tp)).alias("ds")))
    # a key the target holds twice in one of the shadow's own partitions of it is counted
    # there (the per-partition count), not again here
    spread = ((F.col("p") > 1) | (F.col("d") > F.col("ds"))) & (F.col("ds") == 0)
    row = per_key.agg(F.sum("m").alias("moved"),
                      F.sum(spread.cast("int")).alias("spread")).first()
    return (int(row["moved"] or 0), int(row["spread"] or 0)) if row is not None else (0, 0)


def _gate_row(spec: ReconcileSpec, lay: _Layout, part: Any, r: Mapping[str, Any],
              distinct: tuple[Mapping[tuple[int, int], int], Mapping[tuple[int, int, Any], int]]
              ) -> dict[str, Any]:
    """One partition's row in the shape :func:`build_gates` reads."""
    row: dict[str, Any] = {"partition": part}
    for k, src in (("rows_source", "rows_source"), ("rows_shadow", "rows_shadow"),
                   ("rows_target", "rows_target"), ("dup_shadow", "dup_shadow"),
                   ("dup_source", "dup_source"), ("dup_target", "dup_target")):
        row[k] = int(r.get(src) or 0)
    for j, c in enumerate(spec.not_null):
        row[f"null_{c}"] = int(r.get(f"__sg_z{j}") or 0)
    for j, (gate, _expr) in enumerate(spec.constraints):
        row[gate] = int(r.get(f"__sg_zc{j}") or 0)
    if lay.has_target:
        row["changes"] = {k: int(r.get(k) or 0) for k in
                          ("inserted", "deleted", "changed", "unchanged", "ambiguous")}
    for i, m in enumerate(spec.metrics):
        for s in (SOURCE, SHADOW, TARGET):
            name = f"m{i}_{_SIDE_NAMES[s]}"
            low, high = r.get(f"__sg_m{i}_{s}_min"), r.get(f"__sg_m{i}_{s}_max")
            if lay.instant(i, s):  # unix_micros
                low, high = utc_instant(low), utc_instant(high)
            parts = {"count": int(r.get(f"__sg_m{i}_{s}_count") or 0),
                     "sum": _sum_of(lay, r, i, s), "min": low, "max": high, "cd": None,
                     "overflow": int(r.get(f"__sg_m{i}_{s}_ovf") or 0),
                     **{k: int(r.get(f"__sg_m{i}_{s}_{k}") or 0) for k in NONFINITE_KINDS}}
            if m.aggregation is Aggregation.COUNT_DISTINCT and (i, s) in lay.distinct:
                # per partition only where checked per partition: else unknown, not zero
                parts["cd"] = distinct[1].get((i, s, part), 0) if m.per_partition else None
                row[f"{name}_window_cd"] = distinct[0].get((i, s), 0)
            row[name] = parts
    return row


def _sum_of(lay: _Layout, r: Mapping[str, Any], i: int, side: int) -> Any:
    """A metric's sum: Spark's, or rebuilt exactly from the two long sums of its halves (a
    decimal stays a decimal, an integral or instant input gives an int)."""
    name = f"__sg_m{i}_{side}_sum"
    if lay.wide_decimal(i, side):  # its whole and fractional parts, summed apart
        whole, frac = r.get(f"{name}_wi"), r.get(f"{name}_wf")
        if whole is None and frac is None:
            return None
        return EXACT.add(Decimal(whole or 0), Decimal(frac or 0))
    scale = lay.split_sum_scale(i, side)
    if scale is None:
        return r.get(name)
    hi, lo = r.get(f"{name}_dhi"), r.get(f"{name}_dlo")
    if hi is None or lo is None:
        return None
    total = int(hi) * (1 << 32) + int(lo)
    if not isinstance(lay.metric_type(i, side), T.DecimalType):
        return total
    return Decimal(total).scaleb(-scale, EXACT)
