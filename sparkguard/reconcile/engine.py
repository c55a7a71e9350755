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
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sparkguard.plan.model import Aggregation, NanRule
from sparkguard.reconcile.gates import build_gates
from sparkguard.reconcile.spec import ColumnInfo, ReconcileSpec
from sparkguard.reconcile.verdicts import EXACT, ChangePreview, ReconcileResult, fold_partial

__all__ = ["columns_of", "reconcile", "row_hash", "table_fingerprint"]

SOURCE, SHADOW, TARGET = 0, 1, 2
_SIDE_NAMES = {SOURCE: "source", SHADOW: "shadow", TARGET: "target"}
_TAG, _N, _H = "__sg_tag", "__sg_n", "__sg_h"
_TAG_KEY, _TAG_SOURCE = 0, 1          # keyed shadow/target rows; source rows
_TARGET_ONE = 1 << 32                 # a target row counts in the high half of __sg_n
_LOW32 = 0xFFFFFFFF
_BUCKETS = 4                          # sample keys kept per partition and kind
_KINDS = ("insert", "delete", "change", "dup_shadow", "dup_source")
_FLOATS = (T.FloatType, T.DoubleType)
_INTEGRAL = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)


def columns_of(df: DataFrame) -> list[ColumnInfo]:
    """Schema as ColumnInfo (names, simple type strings, nullability)."""
    return [ColumnInfo(f.name, f.dataType.simpleString(), f.nullable) for f in df.schema.fields]


# -- hashing -----------------------------------------------------------------------------------

def _has_map(dt: T.DataType) -> bool:
    if isinstance(dt, T.MapType):
        return True
    if isinstance(dt, T.StructType):
        return any(_has_map(f.dataType) for f in dt.fields)
    if isinstance(dt, T.ArrayType):
        return _has_map(dt.elementType)
    return False


def _hashable(df: DataFrame, name: str, rtrim: bool = False) -> Column:
    """The column as a value Spark can hash: maps become entries sorted by key, variants JSON."""
    col, dt = F.col(name), df.schema[name].dataType
    if isinstance(dt, T.MapType) and not _has_map(dt.keyType) and not _has_map(dt.valueType):
        return F.array_sort(F.map_entries(col))
    if _has_map(dt) or type(dt).__name__ == "VariantType":
        return F.to_json(col)
    if rtrim and isinstance(dt, T.StringType):
        return F.rtrim(col)
    return col


def _pack_flags(flags: Sequence[Column]) -> list[Column]:
    """Boolean columns as bit masks, 62 to a long (bit ``i % 62`` of long ``i // 62``)."""
    return [functools.reduce(operator.add, [F.when(f, F.lit(1 << i)).otherwise(F.lit(0))
                                            for i, f in enumerate(flags[start:start + 62])])
            .cast("long") for start in range(0, len(flags), 62)]


def _null_mask(cols: Sequence[str]) -> list[Column]:
    """Bit masks of null flags so (null, 1) and (1, null) hash apart."""
    return _pack_flags([F.col(c).isNull() for c in cols])


def row_hash(df: DataFrame, cols: Sequence[str], rtrim: bool = False) -> Column:
    """64-bit hash of the given columns' values, null-position aware (Spark hashes -0.0 as 0.0
    and every NaN alike)."""
    if not cols:
        return F.lit(0).cast("long")
    return F.xxhash64(*[_hashable(df, c, rtrim) for c in cols], *_null_mask(cols))


def _column_hash(df: DataFrame, name: str, rtrim: bool) -> Column:
    """32-bit hash of one column, null distinct from every value."""
    return F.hash(_hashable(df, name, rtrim), F.col(name).isNull()).cast("long")


def _packed_hashes(df: DataFrame, cols: Sequence[str], rtrim: bool) -> list[Column]:
    """Column hashes two to a long: high half for the first, low half for the second."""
    out = []
    for i in range(0, len(cols), 2):
        hi = F.shiftleft(_column_hash(df, cols[i], rtrim), 32)
        if i + 1 < len(cols):
            hi = hi.bitwiseOR(_column_hash(df, cols[i + 1], rtrim).bitwiseAND(F.lit(_LOW32)))
        out.append(hi.alias(f"__sg_c{i // 2}"))
    return out


def table_fingerprint(df: DataFrame) -> dict[str, int]:
    """Order-independent content hash of a DataFrame: row count and two 32-bit-half sums."""
    cols = sorted(df.columns)
    h = row_hash(df, cols)
    row = df.select(h.alias("h")).agg(
        F.count(F.lit(1)).alias("rows"),
        F.sum(F.col("h").bitwiseAND(F.lit(_LOW32))).alias("lo"),
        F.sum(F.shiftrightunsigned(F.col("h"), 32)).alias("hi"),
    ).first()
    assert row is not None
    return {"rows": int(row["rows"]), "lo": int(row["lo"] or 0), "hi": int(row["hi"] or 0)}


# -- what to compute ---------------------------------------------------------------------------

@dataclass(frozen=True)
class _Layout:
    """Which columns each side contributes; decided from the schemas, without a job."""

    p: str
    keys: tuple[str, ...]
    key_types: tuple[T.DataType, ...]
    exact: tuple[str, ...]
    floats: tuple[str, ...]
    not_compared: tuple[str, ...]
    has_source: bool
    has_target: bool
    source_keyed: bool
    integral_key: bool
    alt_dups: tuple[tuple[int, tuple[str, ...]], ...]  # (tag, columns): extra duplicate-key sets
    distinct: tuple[tuple[int, int], ...]  # (count_distinct metric, side) with a resolved input
    metric_types: tuple[tuple[int, int, T.DataType], ...]  # (metric, side, type of its input)

    @property
    def tagged(self) -> bool:
        """Whether rows need a tag column: only source rows and extra duplicate-key rows differ
        in kind."""
        return self.has_source or bool(self.alt_dups)

    def metric_type(self, i: int, side: int) -> T.DataType | None:
        return next((t for mi, s, t in self.metric_types if (mi, s) == (i, side)), None)

    def shared(self, i: int) -> bool:
        """Shadow and target feed metric ``i`` through one column (same type on both sides)."""
        shadow = self.metric_type(i, SHADOW)
        return self.has_target and shadow is not None and shadow == self.metric_type(i, TARGET)

    def decimal_scale(self, i: int, side: int) -> int | None:
        """Scale of a decimal of up to 18 digits that metric ``i`` sums as two longs: Spark's own
        decimal sum widens to 28 digits, which it stores as bytes and updates slowly."""
        dt = self.metric_type(i, side)
        if isinstance(dt, T.DecimalType) and dt.precision <= 18:
            return dt.scale
        return None


def _layout(spec: ReconcileSpec, shadow: DataFrame, target: DataFrame | None,
            source: DataFrame | None) -> _Layout:
    p, keys = spec.partition_column, tuple(spec.business_keys)
    exact: list[str] = []
    floats: list[str] = []
    not_compared: list[str] = []
    if target is not None:
        ttypes = {f.name: f.dataType for f in target.schema.fields}
        for f in shadow.schema.fields:
            if f.name in (p, *keys):
                continue
            if ttypes.get(f.name) != f.dataType:
                not_compared.append(f.name)
            elif isinstance(f.dataType, _FLOATS):
                floats.append(f.name)
            else:
                exact.append(f.name)
        not_compared += [c for c in ttypes if c not in shadow.columns and c not in (p, *keys)]
    frames = {SOURCE: source, SHADOW: shadow, TARGET: target}
    sides = [s for s, df in frames.items() if df is not None]
    alt_dups = tuple((tag, tuple(cols))
                     for tag, cols in enumerate(spec.extra_duplicate_keys, _TAG_SOURCE + 1))
    metric_types: list[tuple[int, int, T.DataType]] = []
    for side in sides:
        df = frames[side]
        assert df is not None
        exprs = [m.source_expr if side == SOURCE else m.shadow_expr for m in spec.metrics]
        metric_types += [(i, side, t) for i, t in enumerate(_types_of(df, exprs)) if t is not None]
    distinct = tuple((i, s) for i, s, _ in metric_types
                     if spec.metrics[i].aggregation is Aggregation.COUNT_DISTINCT)
    integral = len(keys) == 1 and isinstance(shadow.schema[keys[0]].dataType, _INTEGRAL)
    return _Layout(p, keys, tuple(shadow.schema[k].dataType for k in keys), tuple(exact),
                   tuple(floats), tuple(not_compared), source is not None, target is not None,
                   spec.key_source and source is not None, integral, alt_dups,
                   distinct, tuple(metric_types))


def _types_of(df: DataFrame, exprs: Sequence[str]) -> list[T.DataType | None]:
    """Result types of SQL expressions over ``df`` (analysis only, no job); None where one does
    not resolve -- e.g. a metric over a column the target does not have yet."""
    if not exprs:
        return []
    try:
        return [f.dataType for f in df.select(*[F.expr(e) for e in exprs]).schema.fields]
    except AnalysisException:
        out: list[T.DataType | None] = []
        for e in exprs:
            try:
                out.append(df.select(F.expr(e)).schema.fields[0].dataType)
            except AnalysisException:
                out.append(None)
        return out


def _metric_parts(agg: Aggregation) -> tuple[str, ...]:
    """Partial aggregates a metric needs: every one is a sum, min or max, so partials fold."""
    return {Aggregation.SUM: ("sum",), Aggregation.COUNT: ("count",),
            Aggregation.AVG: ("sum", "count"), Aggregation.MIN: ("min",),
            Aggregation.MAX: ("max",), Aggregation.COUNT_DISTINCT: ()}[agg]


def _fold_how(name: str) -> str:
    """How a partial column folds: ``min``, ``max``, or ``sum`` (counts, sums, null counts)."""
    return "max" if name.endswith("_max") else "min" if name.endswith("_min") else "sum"


def _fold(name: str) -> Column:
    """A level-1 column folded in Spark (the driver folds level-2 groups with ``fold_partial``)."""
    fn = {"max": F.max, "min": F.min, "sum": F.sum}[_fold_how(name)]
    return fn(name).alias(name)


def _codes(lay: _Layout, i: int) -> list[str]:
    """Projected-column codes of metric ``i``: per side (``0`` source, ``1`` shadow, ``2`` target),
    or ``s`` for one column shared by shadow and target rows (same input type on both). A side
    where the expression does not resolve has no code (its value stays empty)."""
    if lay.shared(i):
        return [str(SOURCE)] * (lay.metric_type(i, SOURCE) is not None) + ["s"]
    return [str(s) for s in (SOURCE, SHADOW, TARGET) if lay.metric_type(i, s) is not None]


def _code_sides(code: str) -> tuple[int, ...]:
    return (SHADOW, TARGET) if code == "s" else (int(code),)


def _expr_of(spec: ReconcileSpec, i: int, code: str) -> str:
    """Metric ``i``'s input expression for the sides of ``code``."""
    return spec.metrics[i].source_expr if code == str(SOURCE) else spec.metrics[i].shadow_expr


def _float_input(spec: ReconcileSpec, lay: _Layout, i: int, side: int) -> int | None:
    """Index of the compared float column that metric ``i`` sums on ``side``, if its input is
    that column: the level-1 per-side sum that the float comparison keeps serves the metric too,
    so the value is not shuffled twice."""
    m = spec.metrics[i]
    if side == SOURCE or not lay.has_target or m.aggregation not in (Aggregation.SUM,
                                                                     Aggregation.AVG) \
            or m.nan is NanRule.EXCLUDE:  # the compared column's sum keeps its NaN values
        return None
    name = m.shadow_expr.strip().strip("`")
    return lay.floats.index(name) if name in lay.floats else None


_NAN_RULED = (Aggregation.SUM, Aggregation.AVG, Aggregation.MIN, Aggregation.MAX)


def _float_code(lay: _Layout, i: int, code: str) -> bool:
    """Whether metric ``i``'s input for the sides of ``code`` is a float or double (the only
    types that hold NaN and infinities)."""
    return isinstance(lay.metric_type(i, _code_sides(code)[0]), _FLOATS)


def _excluding(spec: ReconcileSpec, lay: _Layout, i: int, code: str) -> bool:
    """Metric ``i`` leaves NaN and infinite inputs out of its value on the sides of ``code``."""
    m = spec.metrics[i]
    return m.nan is NanRule.EXCLUDE and m.aggregation in _NAN_RULED and _float_code(lay, i, code)


def _count_bit(spec: ReconcileSpec, lay: _Layout, i: int, code: str) -> tuple[str, str, str]:
    """The flag a count (or an average's count) of metric ``i`` sums: non-null inputs, or
    finite ones where the metric excludes NaN and infinities."""
    kind = "finite" if _excluding(spec, lay, i, code) else "count"
    return kind, _expr_of(spec, i, code), code


def _bits(spec: ReconcileSpec, lay: _Layout) -> list[tuple[str, str, str]]:
    """One-bit inputs, packed 62 to a long: (``null``, not-null column, ``1``), (``count``,
    expression, code) -- a count (and an average's count) needs only whether its input is null,
    and metrics counting one expression share its bit -- (``finite``, ...) for the counts of
    metrics excluding NaN and infinities, and (``nonfinite``, ...) where a sum, average, min or
    max has a float input: its NaN and infinite rows are counted on every side."""
    bits = [("null", c, "1") for c in spec.not_null]
    for i, m in enumerate(spec.metrics):
        for code in _codes(lay, i):
            if m.aggregation in (Aggregation.COUNT, Aggregation.AVG):
                bits.append(_count_bit(spec, lay, i, code))
            if m.aggregation in _NAN_RULED and _float_code(lay, i, code):
                bits.append(("nonfinite", _expr_of(spec, i, code), code))
    return list(dict.fromkeys(bits))


def _nonfinite(value: Column) -> Column:
    """NaN, +inf or -inf (false for null)."""
    return F.coalesce(F.isnan(value) | (F.abs(value) == F.lit(float("inf"))), F.lit(False))


def _flag(kind: str, what: str) -> Column:
    if kind == "null":
        return F.col(what).isNull()
    value = F.expr(what)
    if kind == "nonfinite":
        return _nonfinite(value)
    if kind == "finite":
        return value.isNotNull() & ~_nonfinite(value)
    return value.isNotNull()


def _metric_inputs(spec: ReconcileSpec, lay: _Layout, side: int) -> list[Column]:
    """The side's metric values (one column per metric feeds its sum, min or max) and its bit
    flags."""
    cols: list[Column] = []
    for i, m in enumerate(spec.metrics):
        if m.aggregation in (Aggregation.COUNT, Aggregation.COUNT_DISTINCT):
            continue
        code = next((c for c in _codes(lay, i) if side in _code_sides(c)), None)
        if code is None or _float_input(spec, lay, i, side) is not None:
            continue
        value = F.expr(_expr_of(spec, i, code))
        if _excluding(spec, lay, i, code):
            value = F.when(~_nonfinite(value), value)
        scale = lay.decimal_scale(i, side)
        if scale is not None and "sum" in _metric_parts(m.aggregation):
            value = (value * F.lit(10 ** scale)).cast("long")  # exact: at most 18 digits
        cols.append(value.alias(f"__sg_v{i}_{code}"))
    bits = _bits(spec, lay)
    flags = [(pos, _flag(kind, what))
             for pos, (kind, what, code) in enumerate(bits) if side in _code_sides(code)]
    for block in range(0, len(bits), 62):
        terms = [F.when(is_set, F.lit(1 << (pos - block))).otherwise(F.lit(0))
                 for pos, is_set in flags if block <= pos < block + 62]
        if terms:
            cols.append(functools.reduce(operator.add, terms).cast("long").alias(f"__sg_b{block // 62}"))
    return cols


def _project(spec: ReconcileSpec, lay: _Layout, df: DataFrame, side: int) -> DataFrame:
    """The one projection of a side: only what the aggregation needs."""
    keyed = side != SOURCE or lay.source_keyed
    cols: list[Column] = [F.col(lay.p).alias(lay.p)]
    for k, kt in zip(lay.keys, lay.key_types, strict=True):
        cols.append(F.col(k).alias(k) if keyed else F.lit(None).cast(kt).alias(k))
    if lay.tagged:
        cols.append(F.lit(_TAG_KEY if side != SOURCE else _TAG_SOURCE).cast("byte").alias(_TAG))
    cols.append(F.lit(_TARGET_ONE if side == TARGET else 1).cast("long").alias(_N))
    rtrim = spec.ignore_trailing_spaces
    if side != SOURCE and lay.has_target:
        if lay.exact:
            cols.append(row_hash(df, lay.exact, rtrim).alias(_H))
            cols += _packed_hashes(df, lay.exact, rtrim)
        cols += [F.col(c).cast("double").alias(f"__sg_f{j}") for j, c in enumerate(lay.floats)]
    cols += _metric_inputs(spec, lay, side)
    if side != SHADOW or not lay.alt_dups:
        return df.select(*cols)
    extra = [F.col(c).alias(f"__sg_a{tag}_{j}") for tag, what in lay.alt_dups
             for j, c in enumerate(what)]
    return _expand(lay, df.select(*cols, *extra), len(cols))


def _expand(lay: _Layout, projected: DataFrame, n_base: int) -> DataFrame:
    """One more shadow row per extra duplicate-key set, generated from the same scan: the side
    is still read once."""
    types = {f.name: f.dataType for f in projected.schema.fields}
    names = list(projected.columns)
    base, extra = names[:n_base], names[n_base:]

    def variant(values: Mapping[str, Column]) -> Column:
        return F.struct(*[values.get(n, F.lit(None).cast(types[n])).alias(n) for n in names])

    rows = [variant({n: F.col(n) for n in base})]
    for tag, _what in lay.alt_dups:
        # the partition is left empty: a key set outside (partition, keys) is unique across the
        # window, so its duplicates are counted over the window, not per partition
        values: dict[str, Column] = {_TAG: F.lit(tag).cast("byte"), _N: F.lit(1).cast("long"),
                                     lay.p: F.lit(None).cast(types[lay.p])}
        values.update({n: F.col(n) for n in extra if n.startswith(f"__sg_a{tag}_")})
        rows.append(variant(values))
    return projected.select(F.explode(F.array(*rows)).alias("__sg_row")).select("__sg_row.*")


# -- level 1 and level 2 -----------------------------------------------------------------------

def _group_columns(lay: _Layout) -> list[str]:
    cols = [lay.p, *lay.keys, *([_TAG] if lay.tagged else [])]
    for tag, what in lay.alt_dups:
        cols += [f"__sg_a{tag}_{j}" for j in range(len(what))]
    return cols


def _side_row(lay: _Layout, side: int) -> Column:
    """Over projected rows: the row comes from ``side`` (a shadow row counts 1 in ``__sg_n``, a
    target row 2**32; source rows carry their own tag)."""
    n = F.col(_N)
    if side == TARGET:
        return n == _TARGET_ONE
    if side == SOURCE:
        return F.col(_TAG) == _TAG_SOURCE
    return (n == 1) & (F.col(_TAG) == _TAG_KEY) if lay.tagged else n == 1


def _l1_aggs(spec: ReconcileSpec, lay: _Layout, columns: Sequence[str]) -> list[Column]:
    """Level-1 aggregates over projected rows (only for the columns present). Equal aggregate
    expressions under two names (a float column's per-side sum serving as a metric's sum, a
    count bit shared by two metrics) are computed once by Spark."""
    aggs: list[Column] = [F.sum(_N).alias(_N)]
    have = set(columns)
    if _H in have:
        aggs.append(F.bit_xor(_H).alias(_H))
    aggs += [F.bit_xor(c).alias(c) for c in columns if c.startswith("__sg_c")]

    def per_side(value: Column, side: int) -> Column:
        return F.when(_side_row(lay, side), value)

    for j in range(len(lay.floats)):
        if f"__sg_f{j}" in have:  # a sum: the one value of a key with one row on the side
            aggs += [F.sum(per_side(F.col(f"__sg_f{j}"), s)).alias(f"__sg_f{j}_{s}")
                     for s in (SHADOW, TARGET)]
    bits = _bits(spec, lay)

    def bit(what: tuple[str, str, str]) -> Column | None:
        """The flag as 0/1, or None where these rows carry no block holding it."""
        pos = bits.index(what)
        if f"__sg_b{pos // 62}" not in have:
            return None
        return F.shiftright(F.col(f"__sg_b{pos // 62}"), pos % 62).bitwiseAND(F.lit(1))

    for i, m in enumerate(spec.metrics):
        for code in _codes(lay, i):
            for s in _code_sides(code):
                name, fj = f"__sg_m{i}_{s}", _float_input(spec, lay, i, s)
                col = f"__sg_f{fj}" if fj is not None else f"__sg_v{i}_{code}"
                if m.aggregation in _NAN_RULED and _float_code(lay, i, code):
                    flag = bit(("nonfinite", _expr_of(spec, i, code), code))
                    if flag is not None:
                        aggs.append(F.sum(per_side(flag, s)).alias(f"{name}_nonfin"))
                for part in _metric_parts(m.aggregation):
                    if part == "count":
                        flag = bit(_count_bit(spec, lay, i, code))
                        if flag is not None:
                            aggs.append(F.sum(per_side(flag, s)).alias(f"{name}_count"))
                        continue
                    if col not in have:
                        continue
                    v = per_side(F.col(col), s)
                    if part == "sum" and lay.decimal_scale(i, s) is not None:
                        aggs += [F.sum(F.shiftright(v, 32)).alias(f"{name}_sum_dhi"),
                                 F.sum(v.bitwiseAND(F.lit(_LOW32))).alias(f"{name}_sum_dlo")]
                    else:
                        fn = {"sum": F.sum, "min": F.min, "max": F.max}[part]
                        aggs.append(fn(v).alias(f"{name}_{part}"))
    for j, c in enumerate(spec.not_null):
        flag = bit(("null", c, "1"))
        if flag is not None:
            aggs.append(F.sum(flag).alias(f"__sg_z{j}"))
    return aggs


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
        F.col(lay.p).alias(lay.p), tag.alias("__sg_t"), kind.cast("byte").alias("__sg_k"),
        dup.alias("__sg_d"), n1.alias("__sg_n1"), n2.alias("__sg_n2"),
        *[F.when(kind == _K_CHANGE, b).alias(f"__sg_x{i}") for i, b in enumerate(bits)],
        F.when(sampled, value).alias("__sg_v"), bucket.alias("__sg_b"), *partials)
    aggs = [F.count(F.lit(1)).alias("__sg_cnt"), F.sum("__sg_n1").alias("__sg_n1"),
            F.sum("__sg_n2").alias("__sg_n2")]
    aggs += [F.sum(F.shiftright(F.col(f"__sg_x{j // 62}"), j % 62).bitwiseAND(F.lit(1)))
             .alias(f"chg_{j}") for j in range(len(changed))]
    aggs += [_fold(c) for c in partials]
    aggs += [F.min(F.when(F.col("__sg_b") == b, F.col("__sg_v"))).alias(f"__sg_s{b}")
             for b in range(_BUCKETS)]
    return classified.groupBy(lay.p, "__sg_t", "__sg_k", "__sg_d").agg(*aggs)


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
            counts = {"rows_shadow": n1, "rows_target": n2}
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
    kh = F.xxhash64(*[F.col(k) for k in lay.keys])
    value = F.col(lay.keys[0]).cast("long") if lay.integral_key else kh
    return value, F.pmod(kh, F.lit(_BUCKETS))


# -- the entry point ---------------------------------------------------------------------------

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
    return _result(spec, lay, l2_rows, distinct, shadow, target, source, partitions, scope)


def _with_target_not_null(spec: ReconcileSpec, shadow: DataFrame,
                          target: DataFrame | None) -> ReconcileSpec:
    """Columns NOT NULL in the target must hold no null in the shadow either (checked on values:
    a Delta shadow written from a query has nullable columns whatever the data)."""
    present = [c for c in spec.not_null if c in shadow.columns]  # missing: the schema gate says so
    extra = [f.name for f in (target.schema.fields if target is not None else [])
             if not f.nullable and f.name in shadow.columns and f.name not in present]
    return replace(spec, not_null=(*present, *extra))


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


def _distinct_columns(lay: _Layout) -> dict[tuple[int, int], str]:
    """Column of each (``count_distinct`` metric, side): sides whose input has the same type
    share one, so a metric compared across sides is one distinct aggregate, not one per side
    (each more than one makes Spark expand every row once per distinct column)."""
    names: dict[tuple[int, T.DataType | None], str] = {}
    return {(i, s): names.setdefault((i, lay.metric_type(i, s)), f"__sg_d{len(names)}")
            for i, s in lay.distinct}


def _distinct_frame(spec: ReconcileSpec, lay: _Layout,
                    frames: Mapping[int, DataFrame | None]) -> DataFrame | None:
    """Distinct counts of the ``count_distinct`` metrics over a narrow read of (partition,
    inputs): per side for the window, and per (side, partition) for the metrics checked per
    partition (``per_partition``), as two plain aggregations in one job.

    Grouping sets would give both levels from one read, but expand every row into two and pay
    for it: 3.3 s instead of 0.9 s for the window count alone at 2 M rows per side
    (``bench/reconcile.py``). Kept out of the main aggregation, where every input row would need
    two more wide rows: 15.3 s instead of 11.2 s for the whole reconciliation at 1 M rows.
    """
    if not lay.distinct:
        return None
    cols = _distinct_columns(lay)
    types = {name: lay.metric_type(i, s) or T.NullType() for (i, s), name in cols.items()}
    parts = []
    for side, df in frames.items():
        if df is None or not any(s == side for _i, s in lay.distinct):
            continue
        mine = {name: _expr_of(spec, i, str(side)) for (i, s), name in cols.items() if s == side}
        values = [(F.expr(mine[name]) if name in mine else F.lit(None).cast(dt)).alias(name)
                  for name, dt in types.items()]
        parts.append(df.select(F.lit(side).cast("byte").alias(_TAG), F.col(lay.p).alias(lay.p),
                               *values))
    union = functools.reduce(lambda a, b: a.unionByName(b), parts)
    window = union.groupBy(_TAG).agg(F.lit(1).alias("__sg_g"),
                                     *[F.count_distinct(n).alias(n) for n in types])
    per_part = list(dict.fromkeys(n for (i, _s), n in cols.items() if spec.metrics[i].per_partition))
    if not per_part:
        return window
    by_part = union.groupBy(_TAG, lay.p).agg(F.lit(0).alias("__sg_g"),
                                            *[F.count_distinct(n).alias(n) for n in per_part])
    return window.unionByName(by_part, allowMissingColumns=True)


def _distinct_counts(lay: _Layout, rows: Sequence[Mapping[str, Any]]
                     ) -> tuple[dict[tuple[int, int], int], dict[tuple[int, int, Any], int]]:
    """(window count per (metric, side), partition count per (metric, side, partition))."""
    window: dict[tuple[int, int], int] = {}
    per_part: dict[tuple[int, int, Any], int] = {}
    cols = _distinct_columns(lay)
    for r in rows:
        for i, s in lay.distinct:
            value = r.get(cols[(i, s)])
            if r[_TAG] != s or (value is None and not r["__sg_g"]):
                continue  # another side's row, or a metric counted for the window only
            if r["__sg_g"]:
                window[(i, s)] = int(value or 0)
            else:
                per_part[(i, s, r[lay.p])] = int(value or 0)
    return window, per_part


# -- from level-2 rows to the result -----------------------------------------------------------

def _result(spec: ReconcileSpec, lay: _Layout, l2_rows: list[dict[str, Any]],
            distinct: tuple[dict[tuple[int, int], int], dict[tuple[int, int, Any], int]],
            shadow: DataFrame, target: DataFrame | None, source: DataFrame | None,
            partitions: Sequence[object] | None, scope: str) -> ReconcileResult:
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
    stats, gates = build_gates(spec, rows, source is not None, extra, target is not None)
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
            sample=_change_sample(spec, lay, samples, fetched))
    dup_sample = _dup_sample(lay, samples, fetched)
    return ReconcileResult(scope=scope, partitions=tuple(stats), gates=tuple(gates),
                           preview=preview, duplicate_sample=dup_sample)


def _gate_row(spec: ReconcileSpec, lay: _Layout, part: Any, r: Mapping[str, Any],
              distinct: tuple[Mapping[tuple[int, int], int], Mapping[tuple[int, int, Any], int]]
              ) -> dict[str, Any]:
    """One partition's row in the shape :func:`build_gates` reads."""
    row: dict[str, Any] = {"partition": part}
    for k, src in (("rows_source", "rows_source"), ("rows_shadow", "rows_shadow"),
                   ("rows_target", "rows_target"), ("dup_shadow", "dup_shadow"),
                   ("dup_source", "dup_source")):
        row[k] = int(r.get(src) or 0)
    for j, c in enumerate(spec.not_null):
        row[f"null_{c}"] = int(r.get(f"__sg_z{j}") or 0)
    if lay.has_target:
        row["changes"] = {k: int(r.get(k) or 0) for k in
                          ("inserted", "deleted", "changed", "unchanged", "ambiguous")}
    for i, m in enumerate(spec.metrics):
        for s in (SOURCE, SHADOW, TARGET):
            name = f"m{i}_{_SIDE_NAMES[s]}"
            parts = {"count": int(r.get(f"__sg_m{i}_{s}_count") or 0),
                     "sum": _sum_of(lay, r, i, s), "min": r.get(f"__sg_m{i}_{s}_min"),
                     "max": r.get(f"__sg_m{i}_{s}_max"), "cd": None,
                     "nonfinite": int(r.get(f"__sg_m{i}_{s}_nonfin") or 0)}
            if m.aggregation is Aggregation.COUNT_DISTINCT and (i, s) in lay.distinct:
                # per partition only where checked per partition: else unknown, not zero
                parts["cd"] = distinct[1].get((i, s, part), 0) if m.per_partition else None
                row[f"{name}_window_cd"] = distinct[0].get((i, s), 0)
            row[name] = parts
    return row


def _sum_of(lay: _Layout, r: Mapping[str, Any], i: int, side: int) -> Any:
    """A metric's sum: Spark's, or rebuilt exactly from the two long sums of a decimal."""
    name = f"__sg_m{i}_{side}_sum"
    scale = lay.decimal_scale(i, side)
    if scale is None:
        return r.get(name)
    hi, lo = r.get(f"{name}_dhi"), r.get(f"{name}_dlo")
    if hi is None or lo is None:
        return None
    return Decimal(int(hi) * (1 << 32) + int(lo)).scaleb(-scale, EXACT)


# -- samples -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Sample:
    kind: str
    partition: Any
    value: int  # the integral key, or the 64-bit hash of the keys


def _pick_samples(lay: _Layout, per_part: Mapping[Any, Mapping[str, Any]],
                  size: int) -> list[_Sample]:
    """Up to ``size`` sampled keys from at most two partitions: those covering most kinds of
    difference, smallest first (the fetch reads only those partitions)."""
    if size <= 0:
        return []
    found: dict[Any, list[_Sample]] = {}
    for part, r in per_part.items():
        if part is None:
            continue
        for kind in _KINDS:
            for b in range(_BUCKETS):
                v = r.get(f"__sg_s_{kind}_{b}")
                if v is not None:
                    found.setdefault(part, []).append(_Sample(kind, part, int(v)))

    def size_of(part: Any) -> int:
        r = per_part[part]
        return int(r.get("rows_shadow") or 0) + int(r.get("rows_target") or 0)

    chosen: list[Any] = []
    covered: set[str] = set()
    for _ in range(2):  # greedy: each pick adds the most kinds not yet covered, smallest first
        left = [p for p in found if p not in chosen]
        if not left:
            break
        best = min(left, key=lambda p: (-len({s.kind for s in found[p]} - covered), size_of(p)))
        chosen.append(best)
        covered |= {s.kind for s in found[best]}
    pool = [s for part in chosen for s in found[part]]
    picked: list[_Sample] = []
    for kind in _KINDS:  # round-robin over kinds so every kind shows
        picked += [s for s in pool if s.kind == kind][:max(1, size // len(_KINDS))]
    rest = [s for s in pool if s not in picked]
    return (picked + rest)[:size]


def _key_match(lay: _Layout, samples: Sequence[_Sample]) -> Column:
    values = sorted({s.value for s in samples})
    if lay.integral_key:
        return F.col(lay.keys[0]).cast("long").isin(values)
    return F.xxhash64(*[F.col(k) for k in lay.keys]).isin(values)


def _fetch(lay: _Layout, samples: Sequence[_Sample], shadow: DataFrame, target: DataFrame | None,
           source: DataFrame | None) -> dict[str, list[dict[str, Any]]]:
    """Rows of the sampled keys, per side, in one job: a filtered read of at most two
    partitions, capped at a few rows per key."""
    out: dict[str, list[dict[str, Any]]] = {"shadow": [], "target": [], "source": []}
    if not samples:
        return out
    parts = list(dict.fromkeys(s.partition for s in samples))
    sides = [("shadow", shadow, [s for s in samples if s.kind != "dup_source"]),
             ("target", target, [s for s in samples if s.kind in ("delete", "change")]),
             ("source", source, [s for s in samples if s.kind == "dup_source"])]
    frames = []
    for name, df, mine in sides:
        if df is None or not mine:
            continue
        picked = df.filter(F.col(lay.p).isin(parts) & _key_match(lay, mine))
        frames.append(picked.select(
            F.lit(name).alias("__sg_side"),
            F.xxhash64(*[F.col(k) for k in lay.keys]).alias("__sg_kh"),
            F.struct(*[F.col(c) for c in df.columns]).alias(f"__sg_row_{name}")))
    union = functools.reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), frames)
    # limit then a one-partition exchange: one job, not the incremental scans of collect-limit
    for r in union.limit(8 * len(samples) + 8).repartition(1).collect():
        row = r[f"__sg_row_{r['__sg_side']}"].asDict()
        row["__sg_kh"] = r["__sg_kh"]
        out[r["__sg_side"]].append(row)
    return out


def _rows_for(lay: _Layout, rows: Sequence[Mapping[str, Any]], sample: _Sample) -> list[Mapping[str, Any]]:
    return [r for r in rows if r[lay.p] == sample.partition and _matches(lay, r, sample)]


def _matches(lay: _Layout, row: Mapping[str, Any], sample: _Sample) -> bool:
    if lay.integral_key:
        return row[lay.keys[0]] is not None and int(row[lay.keys[0]]) == sample.value
    return row.get("__sg_kh") == sample.value


def _change_sample(spec: ReconcileSpec, lay: _Layout, samples: Sequence[_Sample],
                   fetched: Mapping[str, list[dict[str, Any]]]) -> tuple[dict[str, Any], ...]:
    out = []
    for s in samples:
        if s.kind not in ("insert", "delete", "change"):
            continue
        after = _rows_for(lay, fetched["shadow"], s)
        before = _rows_for(lay, fetched["target"], s)
        a = dict(after[0]) if after else None
        b = dict(before[0]) if before else None
        ref = a or b or {}
        compared = {*lay.exact, *lay.floats}
        cols = [c for c in (a or {}) if c in compared  # in the table's column order
                if b is not None and not same_value(a.get(c) if a else None, b.get(c), spec)]
        out.append({"partition": s.partition, "key": {k: ref.get(k) for k in lay.keys},
                    "kind": s.kind, "changed_columns": cols,
                    "before": _public(b), "after": _public(a)})
    return tuple(out)


def _dup_sample(lay: _Layout, samples: Sequence[_Sample],
                fetched: Mapping[str, list[dict[str, Any]]]) -> tuple[dict[str, Any], ...]:
    out = []
    for s in samples:
        if s.kind not in ("dup_shadow", "dup_source"):
            continue
        side = "shadow" if s.kind == "dup_shadow" else "source"
        rows = _rows_for(lay, fetched[side], s)
        if rows:
            out.append({"side": side, "partition": s.partition,
                        "key": {k: rows[0].get(k) for k in lay.keys}, "rows": len(rows)})
    return tuple(out)


def _public(row: Mapping[str, Any] | None) -> dict[str, Any] | None:
    return None if row is None else {k: v for k, v in row.items() if not k.startswith("__sg_")}


def same_value(a: Any, b: Any, spec: ReconcileSpec) -> bool:
    """Python twin of the engine's comparison of two values of one column (used for samples)."""
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        if math.isinf(a) or math.isinf(b):
            return a == b
        return a == b or abs(a - b) <= spec.float_abs_tolerance + spec.float_rel_tolerance * abs(b)
    if isinstance(a, str) and isinstance(b, str) and spec.ignore_trailing_spaces:
        return a.rstrip(" ") == b.rstrip(" ")
    if isinstance(a, Decimal) and isinstance(b, Decimal):
        return a == b
    return bool(a == b)
