"""Level 2: the one aggregation that classifies every key (kind of change, duplicate) and folds
it to a handful of groups per partition, which the driver folds to one row per partition.

Names with a leading underscore are internal to ``sparkguard.reconcile``.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Mapping, Sequence
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from sparkguard.reconcile.hashing import _LOW32, _pack_flags, column
from sparkguard.reconcile.layout import (
    _BUCKETS,
    _H,
    _N,
    _TAG,
    _TAG_KEY,
    _TAG_SOURCE,
    SHADOW,
    SOURCE,
    TARGET,
    _fold,
    _fold_how,
    _Layout,
)
from sparkguard.reconcile.project import _group_columns, _l1_aggs, _overflowed, _project
from sparkguard.reconcile.spec import ReconcileSpec
from sparkguard.reconcile.verdicts import fold_partial

__all__: list[str] = []


def _close(a: Column, b: Column, atol: float, rtol: float) -> Column:
    """Null-safe float equality within ``atol + rtol * |b|``; NaN equals NaN, -0.0 equals 0.0,
    an infinity equals only itself."""
    both_nan = F.isnan(a) & F.isnan(b)
    inf = F.lit(float("inf"))
    finite = (F.abs(a) < inf) & (F.abs(b) < inf)  # false for NaN too (NaN sorts above inf)
    within = finite & (F.abs(a - b) <= F.lit(atol) + F.lit(rtol) * F.abs(b))
    return F.coalesce(a.eqNullSafe(b) | both_nan | within, F.lit(False))


def _column_flags(spec: ReconcileSpec, lay: _Layout) -> dict[str, Column]:
    """Per compared column: whether it differs, over a level-1 row whose key has one row on each
    side (the xor of two equal hashes is zero)."""
    flags: dict[str, Column] = {}
    for j, c in enumerate(lay.exact):
        packed = F.col(f"__sg_c{j // 2}")
        half = F.shiftright(packed, 32) if j % 2 == 0 else packed.bitwiseAND(F.lit(_LOW32))
        flags[c] = half != 0
    for j, c in enumerate(lay.floats):
        flags[c] = ~_close(F.col(f"__sg_f{j}_{SHADOW}"), F.col(f"__sg_f{j}_{TARGET}"),
                           spec.float_abs_tolerance, spec.float_rel_tolerance)
    return flags


# level-2 kinds of a level-1 row (a key, or a source/extra-key group)
_K_NONE, _K_INSERT, _K_DELETE, _K_CHANGE, _K_SAME, _K_AMBIGUOUS = range(6)
_K_COUNTS = {_K_INSERT: "inserted", _K_DELETE: "deleted", _K_CHANGE: "changed",
             _K_SAME: "unchanged", _K_AMBIGUOUS: "ambiguous"}
_K_SAMPLED = {_K_INSERT: "insert", _K_DELETE: "delete", _K_CHANGE: "change"}


def _l2_frame(spec: ReconcileSpec, lay: _Layout, l1: DataFrame) -> DataFrame:
    """Level 2: level-1 rows classified once (kind of change, duplicate or not), then grouped by
    (partition, tag, kind, duplicate) -- a handful of groups per partition whose aggregates are
    plain sums, mins and maxes, folded per partition on the driver by :func:`_fold_groups`.
    One conditional aggregate per verdict and sample slot would cost ~0.5 s more at 2 M keys."""
    tag, n = (F.col(_TAG) if lay.tagged else F.lit(_TAG_KEY).cast("byte")), F.col(_N)
    is_key = tag == _TAG_KEY
    n1, n2 = n.bitwiseAND(F.lit(_LOW32)), F.shiftright(n, 32)
    kind, flags = F.lit(_K_NONE), {}
    if lay.has_target:
        flags = _column_flags(spec, lay)
        differs = functools.reduce(operator.or_, flags.values(), F.lit(False))
        if lay.exact:
            differs = differs | (F.col(_H) != 0)
        both = (n1 == 1) & (n2 == 1)
        kind = (F.when(~is_key, _K_NONE).when(n2 == 0, _K_INSERT).when(n1 == 0, _K_DELETE)
                .when(both & differs, _K_CHANGE).when(both, _K_SAME).otherwise(_K_AMBIGUOUS))
    dup = (F.when(is_key, n1 > 1).when(tag == _TAG_SOURCE, F.lit(lay.source_keyed) & (n > 1))
           .otherwise(n > 1))
    value, bucket = _sample_value(lay)
    sampled = kind.isin(list(_K_SAMPLED)) | dup
    changed = list(flags.values())
    bits = _pack_flags(changed)
    partials = [c for c in l1.columns if c.startswith(("__sg_m", "__sg_z"))]
    classified = l1.select(
        column(lay.p).alias(lay.p), tag.alias("__sg_t"), kind.cast("byte").alias("__sg_k"),
        dup.alias("__sg_d"), n1.alias("__sg_n1"), n2.alias("__sg_n2"),
        *[F.when(kind == _K_CHANGE, b).alias(f"__sg_x{i}") for i, b in enumerate(bits)],
        F.when(sampled, value).alias("__sg_v"), bucket.alias("__sg_b"), *partials)
    aggs = [F.count(F.lit(1)).alias("__sg_cnt"), F.sum("__sg_n1").alias("__sg_n1"),
            F.sum("__sg_n2").alias("__sg_n2")]
    if lay.has_target:  # keys of the shadow the target holds more than once: a MERGE would
        # match (and update) every one of those rows
        aggs.append(F.sum(F.when((F.col("__sg_n1") > 0) & (F.col("__sg_n2") > 1), 1)
                          .otherwise(0)).alias("__sg_dt"))
    aggs += [F.sum(F.shiftright(F.col(f"__sg_x{j // 62}"), j % 62).bitwiseAND(F.lit(1)))
             .alias(f"chg_{j}") for j in range(len(changed))]
    aggs += [_fold_partial(c) for c in partials]
    aggs += [F.min(F.when(F.col("__sg_b") == b, F.col("__sg_v"))).alias(f"__sg_s{b}")
             for b in range(_BUCKETS)]
    return classified.groupBy(lay.p, "__sg_t", "__sg_k", "__sg_d").agg(*aggs)


def _fold_partial(name: str) -> Column:
    """A level-1 partial folded; a wide decimal's sums (whole and fractional parts) with
    ``try_sum``, its overflow count adding the groups whose fold overflows here."""
    if name.endswith("_ovf"):
        base = name[:-len("_ovf")]
        return (F.sum(name) + _overflowed(F.col(f"{base}_sum_wi"))
                + _overflowed(F.col(f"{base}_sum_wf"))).alias(name)
    if name.endswith(("_sum_wi", "_sum_wf")):
        return F.try_sum(name).alias(name)
    return _fold(name)


def _fold_groups(lay: _Layout, groups: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The level-2 groups folded to one row per partition: row, duplicate and change counts,
    metric partials, and the smallest sampled key per kind and bucket."""
    out: dict[Any, dict[str, Any]] = {}
    for g in groups:
        r = out.setdefault(g[lay.p], {lay.p: g[lay.p]})
        tag, kind, dup, cnt = g["__sg_t"], g["__sg_k"], g["__sg_d"], int(g["__sg_cnt"])
        n1, n2 = int(g["__sg_n1"] or 0), int(g["__sg_n2"] or 0)
        counts: dict[str, int] = {}
        kinds: list[str] = []
        if tag == _TAG_KEY:
            counts = {"rows_shadow": n1, "rows_target": n2,
                      "dup_target": int(g.get("__sg_dt") or 0)}
            if kind in _K_COUNTS:
                counts[_K_COUNTS[kind]] = cnt
            kinds = [_K_SAMPLED[kind]] if kind in _K_SAMPLED else []
            if dup:
                counts["dup_shadow"] = cnt
                kinds.append("dup_shadow")
        elif tag == _TAG_SOURCE:
            counts = {"rows_source": n1 + (n2 << 32), "dup_source": cnt if dup else 0}
            kinds = ["dup_source"] if dup else []
        elif dup:  # an extra duplicate-key set
            counts = {f"__sg_e{tag}": cnt}
        for name, v in counts.items():
            r[name] = r.get(name, 0) + v
        for name, v in g.items():
            if name.startswith(("__sg_m", "__sg_z", "chg_")):
                r[name] = fold_partial(_fold_how(name), r.get(name), v)
        for k in kinds:
            for b in range(_BUCKETS):
                slot = f"__sg_s_{k}_{b}"
                r[slot] = fold_partial("min", r.get(slot), g[f"__sg_s{b}"])
    return list(out.values())


def _sample_value(lay: _Layout) -> tuple[Column, Column]:
    """(value kept for a sampled key, its bucket): the key itself when it is one integral column
    (so the fetch can push ``key IN (...)`` down), else a 64-bit hash of the keys."""
    kh = F.xxhash64(*[column(k) for k in lay.keys])
    value = column(lay.keys[0]).cast("long") if lay.integral_key else kh
    return value, F.pmod(kh, F.lit(_BUCKETS))


def _verdict_frame(spec: ReconcileSpec, lay: _Layout, shadow: DataFrame, target: DataFrame | None,
                   source: DataFrame | None) -> DataFrame:
    """The one aggregation: level-1 groups per key folded to one row per partition."""
    parts = [_project(spec, lay, shadow, SHADOW)]
    if target is not None:
        parts.append(_project(spec, lay, target, TARGET))
    group = _group_columns(lay)
    folded_source = None
    if source is not None:
        src = _project(spec, lay, source, SOURCE)
        if lay.source_keyed or lay.alt_dups:  # their columns are group columns
            parts.append(src)
        else:  # unkeyed: Spark folds the source map-side to one row per partition
            folded_source = src.groupBy(*group).agg(*_l1_aggs(spec, lay, src.columns))
    union = functools.reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), parts)
    if not lay.alt_dups:
        # unique keys do not shrink in a map-side fold: shuffle the narrow rows as they are
        union = union.repartition(lay.p, *lay.keys)
    l1 = union.groupBy(*group).agg(*_l1_aggs(spec, lay, union.columns))
    if folded_source is not None:
        l1 = l1.unionByName(folded_source, allowMissingColumns=True)
    return _l2_frame(spec, lay, l1)

