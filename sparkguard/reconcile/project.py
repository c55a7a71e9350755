"""Level 0 and 1: each side projected once to narrow rows, and the per-key aggregates over them.

Names with a leading underscore are internal to ``sparkguard.reconcile``.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Mapping, Sequence
from decimal import Decimal

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sparkguard.plan.model import Aggregation
from sparkguard.reconcile.hashing import _LOW32, _packed_hashes, column, row_hash
from sparkguard.reconcile.layout import (
    _H,
    _N,
    _NAN_RULED,
    _TAG,
    _TAG_KEY,
    _TAG_SOURCE,
    _TARGET_ONE,
    NONFINITE_KINDS,
    SHADOW,
    SOURCE,
    TARGET,
    _bits,
    _code_sides,
    _codes,
    _count_bit,
    _excluding,
    _expr_of,
    _float_code,
    _float_input,
    _Layout,
    _metric_parts,
)
from sparkguard.reconcile.spec import ReconcileSpec

__all__: list[str] = []


def _nonfinite(value: Column) -> Column:
    """NaN, +inf or -inf (false for null)."""
    return F.coalesce(F.isnan(value) | (F.abs(value) == F.lit(float("inf"))), F.lit(False))


def _flag(kind: str, what: str) -> Column:
    if kind == "null":
        return column(what).isNull()
    value = F.expr(what)
    if kind == "violates":  # as Delta: a row where the constraint is false or null is refused
        return ~F.coalesce(value.cast("boolean"), F.lit(False))
    if kind == "nan":
        return F.coalesce(F.isnan(value), F.lit(False))
    if kind in ("posinf", "neginf"):
        return F.coalesce(value == F.lit(float("inf") if kind == "posinf" else float("-inf")),
                          F.lit(False))
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
        if lay.instant(i, _code_sides(code)[0]):
            value = F.unix_micros(value)
        if lay.collated(i, _code_sides(code)[0]):
            value = F.collate(value, "UTF8_BINARY")
        if _excluding(spec, lay, i, code):
            value = F.when(~_nonfinite(value), value)
        scale = lay.split_sum_scale(i, side)
        if scale is not None and "sum" in _metric_parts(m.aggregation):
            # exact: at most 18 digits
            value = (value * F.lit(10 ** scale) if scale else value).cast("long")
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
    cols: list[Column] = [column(lay.p).alias(lay.p)]
    for k, kt in zip(lay.keys, lay.key_types, strict=True):
        cols.append(column(k).alias(k) if keyed else F.lit(None).cast(kt).alias(k))
    if lay.tagged:
        cols.append(F.lit(_TAG_KEY if side != SOURCE else _TAG_SOURCE).cast("byte").alias(_TAG))
    cols.append(F.lit(_TARGET_ONE if side == TARGET else 1).cast("long").alias(_N))
    rtrim = spec.ignore_trailing_spaces
    if side != SOURCE and lay.has_target:
        if lay.exact:
            cols.append(row_hash(df, lay.exact, rtrim).alias(_H))
            cols += _packed_hashes(df, lay.exact, rtrim)
        cols += [column(c).cast("double").alias(f"__sg_f{j}") for j, c in enumerate(lay.floats)]
    cols += _metric_inputs(spec, lay, side)
    if side != SHADOW or not lay.alt_dups:
        return df.select(*cols)
    extra = [column(c).alias(f"__sg_a{tag}_{j}") for tag, what in lay.alt_dups
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

    rows = [variant({n: column(n) for n in base})]
    for tag, _what in lay.alt_dups:
        # the partition is left empty: a key set outside (partition, keys) is unique across the
        # window, so its duplicates are counted over the window, not per partition
        values: dict[str, Column] = {_TAG: F.lit(tag).cast("byte"), _N: F.lit(1).cast("long"),
                                     lay.p: F.lit(None).cast(types[lay.p])}
        values.update({n: column(n) for n in extra if n.startswith(f"__sg_a{tag}_")})
        rows.append(variant(values))
    return projected.select(F.explode(F.array(*rows)).alias("__sg_row")).select("__sg_row.*")


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


def _overflowed(value: Column) -> Column:
    """1 where the decimal sum of the non-null ``value`` overflowed (``try_sum`` is null), else
    0: an aggregate."""
    return F.when(F.try_sum(value).isNull() & (F.count(value) > 0), F.lit(1)).otherwise(F.lit(0))


def _decimal_parts(value: Column, dtype: T.DataType | None) -> tuple[Column, Column]:
    """A wide decimal split at its decimal point, both parts exact: whole numbers as
    ``decimal(p - s, 0)`` and the signed fraction as ``decimal(s + 1, s)``. Spark sums each
    in a ``decimal(min(38, p - s + 10), 0)`` and a ``decimal(s + 11, s)``, so a running total of large
    values of both signs does not pass 38 digits where the total fits (``try_sum`` over the
    value itself gave up at the column's own range)."""
    assert isinstance(dtype, T.DecimalType)
    frac = value % F.lit(Decimal(1))
    return (value - frac).cast(T.DecimalType(max(1, dtype.precision - dtype.scale), 0)), frac


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
                    for kind in NONFINITE_KINDS:
                        flag = bit((kind, _expr_of(spec, i, code), code))
                        if flag is not None:
                            aggs.append(F.sum(per_side(flag, s)).alias(f"{name}_{kind}"))
                for part in _metric_parts(m.aggregation):
                    if part == "count":
                        flag = bit(_count_bit(spec, lay, i, code))
                        if flag is not None:
                            aggs.append(F.sum(per_side(flag, s)).alias(f"{name}_count"))
                        continue
                    if col not in have:
                        continue
                    v = per_side(F.col(col), s)
                    if part == "sum" and lay.split_sum_scale(i, s) is not None:
                        aggs += [F.sum(F.shiftright(v, 32)).alias(f"{name}_sum_dhi"),
                                 F.sum(v.bitwiseAND(F.lit(_LOW32))).alias(f"{name}_sum_dlo")]
                    elif part == "sum" and lay.wide_decimal(i, s):
                        # null on overflow whatever spark.sql.ansi.enabled; counted, never lost
                        whole, frac = _decimal_parts(v, lay.metric_type(i, s))
                        aggs += [F.try_sum(whole).alias(f"{name}_sum_wi"),
                                 F.try_sum(frac).alias(f"{name}_sum_wf"),
                                 (_overflowed(whole) + _overflowed(frac)).alias(f"{name}_ovf")]
                    else:
                        fn = {"sum": F.sum, "min": F.min, "max": F.max}[part]
                        aggs.append(fn(v).alias(f"{name}_{part}"))
    for j, c in enumerate(spec.not_null):
        flag = bit(("null", c, "1"))
        if flag is not None:
            aggs.append(F.sum(flag).alias(f"__sg_z{j}"))
    for j, (_gate, expr) in enumerate(spec.constraints):
        flag = bit(("violates", expr, "1"))
        if flag is not None:
            aggs.append(F.sum(flag).alias(f"__sg_zc{j}"))
    return aggs

