"""What one reconciliation computes, decided from the schemas without a job: the sides and
their tags, compared columns, metric inputs and the one-bit flags the projection packs.

Names with a leading underscore are internal to ``sparkguard.reconcile``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sparkguard.plan.model import Aggregation, NanRule
from sparkguard.reconcile.spec import ReconcileSpec
from sparkguard.reconcile.verdicts import NONFINITE_KINDS
from sparkguard.spark_types import as_nullable
from sparkguard.sql import column_named

__all__ = ["NONFINITE_KINDS", "SHADOW", "SOURCE", "TARGET"]

SOURCE, SHADOW, TARGET = 0, 1, 2
_SIDE_NAMES = {SOURCE: "source", SHADOW: "shadow", TARGET: "target"}
_TAG, _N, _H = "__sg_tag", "__sg_n", "__sg_h"
_TAG_KEY, _TAG_SOURCE = 0, 1          # keyed shadow/target rows; source rows
_TARGET_ONE = 1 << 32                 # a target row counts in the high half of __sg_n
_BUCKETS = 4                          # sample keys kept per partition and kind
_KINDS = ("insert", "delete", "change", "dup_shadow", "dup_source")
_FLOATS = (T.FloatType, T.DoubleType)
_INTEGRAL = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)


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

    def instant(self, i: int, side: int) -> bool:
        """Metric ``i``'s input on ``side`` is a ``timestamp`` (an instant): its min and max are
        taken over ``unix_micros``, since pyspark turns a timestamp into a naive datetime in the
        driver's OS time zone. A ``timestamp_ntz`` stays a wall-clock value."""
        return isinstance(self.metric_type(i, side), T.TimestampType)

    def collated(self, i: int, side: int) -> bool:
        """Metric ``i``'s input on ``side`` is a string with a collation other than binary
        (``UTF8_LCASE``, say): its min and max are taken in binary (code point) order, the
        order the driver folds groups and partitions in, so every side agrees."""
        dt = self.metric_type(i, side)
        return isinstance(dt, T.StringType) and \
            getattr(dt, "collation", "UTF8_BINARY") != "UTF8_BINARY"

    def wide_decimal(self, i: int, side: int) -> bool:
        """Metric ``i``'s input on ``side`` is a decimal of more than 18 digits: its sum is
        taken as whole and fractional parts (``project._decimal_parts``)."""
        dt = self.metric_type(i, side)
        return isinstance(dt, T.DecimalType) and dt.precision > 18

    def split_sum_scale(self, i: int, side: int) -> int | None:
        """Scale of an input that metric ``i`` sums as two long halves, exactly: a decimal of up
        to 18 digits (Spark's own decimal sum widens to 28 digits, stored as bytes and updated
        slowly), or 0 for an integral or instant (``unix_micros``) input, whose plain long sum
        wraps silently past 2**63 with ``spark.sql.ansi.enabled`` off (and fails with it on:
        the micros of some 5,000 timestamps already pass it)."""
        dt = self.metric_type(i, side)
        if isinstance(dt, T.DecimalType) and dt.precision <= 18:
            return dt.scale
        if isinstance(dt, (*_INTEGRAL, T.TimestampType)):
            return 0
        return None


def _layout(spec: ReconcileSpec, shadow: DataFrame, target: DataFrame | None,
            source: DataFrame | None) -> _Layout:
    p, keys = spec.partition_column, tuple(spec.business_keys)
    exact: list[str] = []
    floats: list[str] = []
    not_compared: list[str] = []
    if target is not None:
        # compared as values: nested nullability and field metadata differ between a target
        # and its Delta-written shadow without the values differing
        ttypes = {f.name: as_nullable(f.dataType) for f in target.schema.fields}
        for f in shadow.schema.fields:
            if f.name in (p, *keys):
                continue
            if ttypes.get(f.name) != as_nullable(f.dataType):
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
    name = column_named(m.shadow_expr)
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
    """One-bit inputs, packed 62 to a long: (``null``, not-null column, ``1``), (``violates``,
    table constraint, ``1``), (``count``,
    expression, code) -- a count (and an average's count) needs only whether its input is null,
    and metrics counting one expression share its bit -- (``finite``, ...) for the counts of
    metrics excluding NaN and infinities, and (``nan``, ...), (``posinf``, ...), (``neginf``, ...)
    where a sum, average, min or max has a float input: its NaN, +inf and -inf rows are counted
    apart on every side."""
    bits = [("null", c, "1") for c in spec.not_null]
    bits += [("violates", expr, "1") for _gate, expr in spec.constraints]
    for i, m in enumerate(spec.metrics):
        for code in _codes(lay, i):
            if m.aggregation in (Aggregation.COUNT, Aggregation.AVG):
                bits.append(_count_bit(spec, lay, i, code))
            if m.aggregation in _NAN_RULED and _float_code(lay, i, code):
                bits += [(kind, _expr_of(spec, i, code), code) for kind in NONFINITE_KINDS]
    return list(dict.fromkeys(bits))

