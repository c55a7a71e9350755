"""The reconciliation engine: every gate and the change preview from one fused aggregation.

Per side, one scan projects (partition, keys, side, 64-bit row hash, per-column 32-bit hashes,
float columns, metric inputs, null flags). One aggregation by (partition, key) folds the sides
together; a second, tiny one by partition yields every count. Only a bounded sample of
differing keys is ever brought to the driver.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sparkguard.plan.model import Aggregation
from sparkguard.reconcile.gates import SIDES, build_gates
from sparkguard.reconcile.spec import ColumnInfo, ReconcileSpec
from sparkguard.reconcile.verdicts import ChangePreview, ReconcileResult

__all__ = ["columns_of", "reconcile", "table_fingerprint"]

_FLOATS = (T.FloatType, T.DoubleType)
_SIDE = "__sg_side"
_SRC = "__sg_src"
_HASH = "__sg_h"


def columns_of(df: DataFrame) -> list[ColumnInfo]:
    """Schema as ColumnInfo (names, simple type strings, nullability)."""
    return [ColumnInfo(f.name, f.dataType.simpleString(), f.nullable) for f in df.schema.fields]


def _hashable(df: DataFrame, name: str) -> Column:
    col = F.col(name)
    dt = df.schema[name].dataType
    if isinstance(dt, T.MapType) or type(dt).__name__ == "VariantType":
        return F.to_json(col)
    return col


def _null_mask(cols: Sequence[str]) -> list[Column]:
    """Bit masks of null flags (62 columns per long) so (null, 1) and (1, null) hash apart."""
    masks = []
    for start in range(0, len(cols), 62):
        chunk = cols[start:start + 62]
        terms = [F.when(F.col(c).isNull(), F.lit(1 << i)).otherwise(F.lit(0))
                 for i, c in enumerate(chunk)]
        masks.append(functools.reduce(operator.add, terms).cast("long"))
    return masks


def row_hash(df: DataFrame, cols: Sequence[str]) -> Column:
    """64-bit hash of the given columns' values, null-position aware."""
    if not cols:
        return F.lit(0).cast("long")
    return F.xxhash64(*[_hashable(df, c) for c in cols], *_null_mask(cols))


def table_fingerprint(df: DataFrame) -> dict[str, int]:
    """Order-independent content hash of a DataFrame: row count and two 32-bit-half sums."""
    cols = sorted(df.columns)
    h = row_hash(df, cols)
    row = df.select(h.alias("h")).agg(
        F.count(F.lit(1)).alias("rows"),
        F.sum(F.col("h").bitwiseAND(F.lit(0xFFFFFFFF))).alias("lo"),
        F.sum(F.shiftrightunsigned(F.col("h"), 32)).alias("hi"),
    ).first()
    assert row is not None
    return {"rows": int(row["rows"]), "lo": int(row["lo"] or 0), "hi": int(row["hi"] or 0)}


def _partials(agg: Aggregation, col: Column, prefix: str) -> list[Column]:
    if agg is Aggregation.COUNT_DISTINCT:
        return [F.count(col).alias(f"{prefix}_count")]
    out = [F.count(col).alias(f"{prefix}_count")]
    if agg in (Aggregation.SUM, Aggregation.AVG):
        out.append(F.sum(col).alias(f"{prefix}_sum"))
    if agg is Aggregation.MIN:
        out.append(F.min(col).alias(f"{prefix}_min"))
    if agg is Aggregation.MAX:
        out.append(F.max(col).alias(f"{prefix}_max"))
    return out


def _combine(agg: Aggregation, prefix: str) -> list[Column]:
    out = [F.sum(f"{prefix}_count").alias(f"{prefix}_count")]
    if agg in (Aggregation.SUM, Aggregation.AVG):
        out.append(F.sum(f"{prefix}_sum").alias(f"{prefix}_sum"))
    if agg is Aggregation.MIN:
        out.append(F.min(f"{prefix}_min").alias(f"{prefix}_min"))
    if agg is Aggregation.MAX:
        out.append(F.max(f"{prefix}_max").alias(f"{prefix}_max"))
    return out


def _close(a: Column, b: Column, atol: float, rtol: float) -> Column:
    """Null-safe float equality with tolerance; NaN equals NaN, -0.0 equals 0.0."""
    both_nan = F.isnan(a) & F.isnan(b)
    within = F.abs(a - b) <= F.lit(atol) + F.lit(rtol) * F.abs(b)
    return (a.isNull() & b.isNull()) | both_nan | (
        a.isNotNull() & b.isNotNull() & ~F.isnan(a) & ~F.isnan(b) & within)


def reconcile(spec: ReconcileSpec, *, shadow: DataFrame, target: DataFrame | None = None,
              source: DataFrame | None = None, partitions: Sequence[object] | None = None,
              scope: str = "window") -> ReconcileResult:
    """Reconcile ``shadow`` against ``source`` (gates) and ``target`` (change preview).

    All three are already restricted to the slice or window by the caller. ``partitions``
    lists the partitions expected, so empty ones still get a row.
    """
    p, keys = spec.partition_column, list(spec.business_keys)
    key_cols = [p, *keys]
    # columns compared between shadow and target: common names with identical types
    not_compared: list[str] = []
    compare: list[str] = []
    if target is not None:
        ttypes = {f.name: f.dataType for f in target.schema.fields}
        for f in shadow.schema.fields:
            if f.name in key_cols:
                continue
            if f.name in ttypes and ttypes[f.name] == f.dataType:
                compare.append(f.name)
            else:
                not_compared.append(f.name)
        not_compared += [c for c in ttypes if c not in shadow.columns and c not in key_cols]
    floats = [c for c in compare if isinstance(shadow.schema[c].dataType, _FLOATS)]
    exact = [c for c in compare if c not in floats]

    def project(df: DataFrame, side: int) -> DataFrame:
        sel: list[Column] = [F.col(p).alias(p)]
        keyed = side != 0 or spec.key_source
        for k in keys:
            sel.append(F.col(k).alias(k) if keyed else F.lit(None).cast(shadow.schema[k].dataType).alias(k))
        sel += [F.lit(side).alias(_SIDE), F.lit(side == 0).alias(_SRC)]
        if side != 0 and target is not None:
            sel.append(row_hash(df, exact).alias(_HASH))
            sel += [F.hash(_hashable(df, c), F.col(c).isNull()).alias(f"__c_{c}") for c in exact]
            sel += [F.col(c).cast("double").alias(f"__f_{c}") for c in floats]
        for i, m in enumerate(spec.metrics):
            expr = m.source_expr if side == 0 else m.shadow_expr
            sel.append(F.expr(expr).alias(f"__m{i}_{SIDES[side]}"))
        if side == 1:
            sel += [F.col(c).isNull().cast("int").alias(f"__n_{c}") for c in spec.not_null]
        return df.select(*sel)

    parts = [project(shadow, 1)]
    if source is not None:
        parts.append(project(source, 0))
    if target is not None:
        parts.append(project(target, 2))
    union = functools.reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), parts)

    side = F.col(_SIDE)
    l1_aggs: list[Column] = [F.sum(F.when(side == s, 1).otherwise(0)).alias(f"n{s}") for s in (0, 1, 2)]
    if target is not None:
        l1_aggs += [F.max(F.when(side == s, F.col(_HASH))).alias(f"h{s}") for s in (1, 2)]
        l1_aggs += [F.max(F.when(side == s, F.col(f"__c_{c}"))).alias(f"c{s}_{c}")
                    for c in exact for s in (1, 2)]
        l1_aggs += [F.max(F.when(side == s, F.col(f"__f_{c}"))).alias(f"f{s}_{c}")
                    for c in floats for s in (1, 2)]
    present = {0: source is not None, 1: True, 2: target is not None}
    for i, m in enumerate(spec.metrics):
        for s in (0, 1, 2):
            if present[s]:
                l1_aggs += _partials(m.aggregation, F.col(f"__m{i}_{SIDES[s]}"), f"m{i}_{SIDES[s]}")
    l1_aggs += [F.sum(f"__n_{c}").alias(f"null_{c}") for c in spec.not_null]
    l1 = union.groupBy(p, *keys, _SRC).agg(*l1_aggs)
    try:
        l1 = l1.persist(StorageLevel.MEMORY_AND_DISK)
        cached = True
    except Exception:  # e.g. serverless compute refuses caching; recompute instead
        cached = False

    try:
        return _verdicts(spec, l1, shadow, target, source, partitions, scope, exact, floats,
                         not_compared, union)
    finally:
        if cached:
            l1.unpersist()


def _verdicts(spec: ReconcileSpec, l1: DataFrame, shadow: DataFrame, target: DataFrame | None,
              source: DataFrame | None, partitions: Sequence[object] | None, scope: str,
              exact: list[str], floats: list[str], not_compared: list[str],
              union: DataFrame) -> ReconcileResult:
    p, keys = spec.partition_column, list(spec.business_keys)
    n0, n1, n2, src = F.col("n0"), F.col("n1"), F.col("n2"), F.col(_SRC)
    aggs: list[Column] = [
        F.sum("n0").alias("rows_source"), F.sum("n1").alias("rows_shadow"),
        F.sum("n2").alias("rows_target"),
        F.sum(F.when(~src & (n1 > 1), 1).otherwise(0)).alias("dup_shadow"),
        F.sum(F.when(src & (n0 > 1), 1).otherwise(0)).alias("dup_source"),
    ]
    flag_cols: dict[str, Column] = {}
    if target is not None:
        both = (n1 == 1) & (n2 == 1)
        for c in exact:
            flag_cols[c] = F.col(f"c1_{c}") != F.col(f"c2_{c}")
        for c in floats:
            flag_cols[c] = ~_close(F.col(f"f1_{c}"), F.col(f"f2_{c}"),
                                   spec.float_abs_tolerance, spec.float_rel_tolerance)
        any_float = functools.reduce(operator.or_, [flag_cols[c] for c in floats], F.lit(False))
        changed = both & ((F.col("h1") != F.col("h2")) | any_float)
        aggs += [
            F.sum(F.when(~src & (n1 > 0) & (n2 == 0), 1).otherwise(0)).alias("inserted"),
            F.sum(F.when(~src & (n1 == 0) & (n2 > 0), 1).otherwise(0)).alias("deleted"),
            F.sum(F.when(changed, 1).otherwise(0)).alias("changed"),
            F.sum(F.when(both & ~changed, 1).otherwise(0)).alias("unchanged"),
            F.sum(F.when(~src & ((n1 > 1) | (n2 > 1)) & (n1 > 0) & (n2 > 0), 1).otherwise(0))
            .alias("ambiguous"),
        ]
        aggs += [F.sum(F.when(both & flag, 1).otherwise(0)).alias(f"chg_{c}")
                 for c, flag in flag_cols.items()]
    present = {0: source is not None, 1: True, 2: target is not None}
    for i, m in enumerate(spec.metrics):
        for s in (0, 1, 2):
            if present[s]:
                aggs += _combine(m.aggregation, f"m{i}_{SIDES[s]}")
    aggs += [F.sum(f"null_{c}").alias(f"null_{c}") for c in spec.not_null]
    # one row per partition: bounded by the window size
    per_part = {r[p]: r.asDict() for r in l1.groupBy(p).agg(*aggs).collect()}

    cd_window: dict[str, Any] = {}
    cd_part: dict[tuple[object, str], Any] = {}
    cd_metrics = [(i, m) for i, m in enumerate(spec.metrics)
                  if m.aggregation is Aggregation.COUNT_DISTINCT]
    if cd_metrics:
        # distinct counts cannot be folded from per-key partials: one extra aggregation
        cd_aggs = [F.countDistinct(F.col(f"__m{i}_{SIDES[s]}")).alias(f"m{i}_{SIDES[s]}")
                   for i, _ in cd_metrics for s in (0, 1, 2) if present[s]]
        for r in union.groupBy(p).agg(*cd_aggs).collect():
            for name, v in r.asDict().items():
                if name != p:
                    cd_part[(r[p], name)] = v
        for name, v in union.agg(*cd_aggs).first().asDict().items():  # type: ignore[union-attr]
            cd_window[name] = v

    wanted = list(partitions) if partitions is not None else []
    all_parts = list(dict.fromkeys([*wanted, *sorted(per_part, key=str)]))
    rows: list[dict[str, Any]] = []
    for part in all_parts:
        r = per_part.get(part, {})
        row: dict[str, Any] = {"partition": part}
        for k in ("rows_source", "rows_shadow", "rows_target", "dup_shadow", "dup_source"):
            row[k] = r.get(k) or 0
        for c in spec.not_null:
            row[f"null_{c}"] = r.get(f"null_{c}") or 0
        for i, m in enumerate(spec.metrics):
            for s in (0, 1, 2):
                name = f"m{i}_{SIDES[s]}"
                row[name] = {"count": r.get(f"{name}_count") or 0, "sum": r.get(f"{name}_sum"),
                             "min": r.get(f"{name}_min"), "max": r.get(f"{name}_max"),
                             "cd": cd_part.get((part, name))}
                if m.aggregation is Aggregation.COUNT_DISTINCT:
                    row[f"{name}_window_cd"] = cd_window.get(name) or 0
        rows.append(row)

    extra: dict[tuple[str, ...], int] = {}
    for cols in spec.extra_duplicate_keys:
        extra[cols] = int(shadow.groupBy(*cols).count().filter("count > 1").count())

    stats, gates = build_gates(spec, rows, source is not None, extra)

    preview: ChangePreview | None = None
    if target is not None:
        tot = {k: sum(int(per_part[x].get(k) or 0) for x in per_part)
               for k in ("inserted", "deleted", "changed", "unchanged")}
        by_col = {c: sum(int(per_part[x].get(f"chg_{c}") or 0) for x in per_part) for c in flag_cols}
        sample = _change_sample(spec, l1, shadow, target, flag_cols) if (
            tot["inserted"] or tot["deleted"] or tot["changed"]) and spec.sample_size else ()
        preview = ChangePreview(inserted=tot["inserted"], deleted=tot["deleted"],
                                changed=tot["changed"], unchanged=tot["unchanged"],
                                changed_by_column=by_col, sample=sample,
                                not_compared=tuple(not_compared))
    dup_sample: tuple[dict[str, Any], ...] = ()
    if any(s.duplicate_keys_shadow for s in stats):
        dup_sample = tuple(
            {"partition": r[p], "key": {k: r[k] for k in keys}, "rows": int(r["n1"])}
            for r in l1.filter(~F.col(_SRC) & (F.col("n1") > 1))
            .select(p, *keys, "n1").limit(spec.sample_size).collect())
    return ReconcileResult(scope=scope, partitions=tuple(stats), gates=tuple(gates),
                           preview=preview, duplicate_sample=dup_sample)


def _change_sample(spec: ReconcileSpec, l1: DataFrame, shadow: DataFrame, target: DataFrame,
                   flag_cols: dict[str, Column]) -> tuple[dict[str, Any], ...]:
    """Before/after rows for a bounded sample of differing keys, from at most two partitions."""
    p, keys = spec.partition_column, list(spec.business_keys)
    n1, n2 = F.col("n1"), F.col("n2")
    changed_any = functools.reduce(operator.or_, flag_cols.values(), F.lit(False)) | (
        F.col("h1") != F.col("h2"))
    kind = (F.when((n1 > 0) & (n2 == 0), "insert").when((n1 == 0) & (n2 > 0), "delete")
            .when((n1 == 1) & (n2 == 1) & changed_any, "change"))
    picked = (l1.filter(~F.col(_SRC)).select(p, *keys, kind.alias("kind"))
              .filter(F.col("kind").isNotNull()).limit(spec.sample_size).collect())
    if not picked:
        return ()
    parts = list(dict.fromkeys(r[p] for r in picked))[:2]
    picked = [r for r in picked if r[p] in parts]
    types = {f.name: f.dataType for f in shadow.schema.fields}
    wanted = functools.reduce(operator.or_, [
        functools.reduce(operator.and_, [F.col(k).eqNullSafe(F.lit(r[k]).cast(types[k]))
                                         for k in [p, *keys]]) for r in picked])
    limit = 4 * len(picked)
    after = {tuple(r[k] for k in [p, *keys]): r.asDict()
             for r in shadow.filter(F.col(p).isin(parts)).filter(wanted).limit(limit).collect()}
    before = {tuple(r[k] for k in [p, *keys]): r.asDict()
              for r in target.filter(F.col(p).isin(parts)).filter(wanted).limit(limit).collect()}
    out = []
    for r in picked:
        key = tuple(r[k] for k in [p, *keys])
        b, a = before.get(key), after.get(key)
        cols = sorted(c for c in (a or {}) if b is not None and c in b and a is not None
                      and not _same(a[c], b[c], spec))
        out.append({"partition": r[p], "key": {k: r[k] for k in keys}, "kind": r["kind"],
                    "changed_columns": cols, "before": b, "after": a})
    return tuple(out)


def _same(a: Any, b: Any, spec: ReconcileSpec) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        if a != a and b != b:  # NaN
            return True
        return abs(a - b) <= spec.float_abs_tolerance + spec.float_rel_tolerance * abs(b)
    return bool(a == b)
