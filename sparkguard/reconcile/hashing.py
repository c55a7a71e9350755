"""Row and column hashes, and a DataFrame's order-independent content fingerprint.

Names with a leading underscore are internal to ``sparkguard.reconcile``.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sparkguard.reconcile.spec import ColumnInfo
from sparkguard.spark_types import (
    EXACT_JSON,
    holds_collated,
    holds_type,
    holds_unordered,
    in_binary,
    variants_as_text,
    variants_as_text_type,
)
from sparkguard.sql import quote_column

__all__ = ["column", "columns_of", "row_hash", "table_fingerprint"]

_LOW32 = 0xFFFFFFFF


def columns_of(df: DataFrame) -> list[ColumnInfo]:
    """Schema as ColumnInfo (names, simple type strings, nullability)."""
    return [ColumnInfo(f.name, f.dataType.simpleString(), f.nullable) for f in df.schema.fields]


def column(name: str) -> Column:
    """A column by its exact name: a dot, a space or a backquote is part of the name."""
    return F.col(quote_column(name))


def _hashable(df: DataFrame, name: str, rtrim: bool = False) -> Column:
    """The column as a value Spark can hash: maps become entries sorted by key, which like
    arrays and structs keep their shape (:func:`_shaped`: ``{"a": null, "b": "c"}`` and
    ``{"a": "b", "c": null}`` hash apart); variants become their JSON text wherever they are
    (a SQL null stays null), maps nested in others JSON; collated text hashes in
    ``UTF8_BINARY``."""
    col, dt = column(name), df.schema[name].dataType
    if holds_collated(dt):  # by its characters, not its collation key
        dt = in_binary(dt)
        col = col.cast(dt)
    if holds_type(dt, T.VariantType):
        col, dt = variants_as_text(col, dt), variants_as_text_type(dt)
    if isinstance(dt, T.MapType) and not holds_unordered(dt.keyType) \
            and not holds_unordered(dt.valueType):
        entries = T.ArrayType(T.StructType([T.StructField("key", dt.keyType),
                                            T.StructField("value", dt.valueType)]))
        return _shaped(F.array_sort(F.map_entries(col)), entries)
    if holds_unordered(dt):
        return F.to_json(col, EXACT_JSON)
    if isinstance(dt, (T.ArrayType, T.StructType)):
        return _shaped(col, dt)
    if rtrim and isinstance(dt, T.StringType):
        return F.rtrim(col)
    return col


def _shaped(col: Column, dt: T.DataType) -> Column:
    """An array or struct with its shape made hashable: Spark's hashes skip null elements and
    fields and hash no lengths, so ``["a", null]`` and ``["a"]``, or ``[[1, 2], [3]]`` and
    ``[[1], [2, 3]]``, would hash alike. Each array carries its size, each element and field
    a null flag."""
    if isinstance(dt, T.ArrayType):
        return F.struct(F.size(col), F.transform(col, lambda x: _flagged(x, dt.elementType)))
    if isinstance(dt, T.StructType):
        return F.struct(*[_flagged(col.getField(f.name), f.dataType) for f in dt.fields])
    return col


def _flagged(col: Column, dt: T.DataType) -> Column:
    return F.struct(col.isNull(), _shaped(col, dt))


def _pack_flags(flags: Sequence[Column]) -> list[Column]:
    """Boolean columns as bit masks, 62 to a long (bit ``i % 62`` of long ``i // 62``)."""
    return [functools.reduce(operator.add, [F.when(f, F.lit(1 << i)).otherwise(F.lit(0))
                                            for i, f in enumerate(flags[start:start + 62])])
            .cast("long") for start in range(0, len(flags), 62)]


def _null_mask(cols: Sequence[str]) -> list[Column]:
    """Bit masks of null flags so (null, 1) and (1, null) hash apart."""
    return _pack_flags([column(c).isNull() for c in cols])


def row_hash(df: DataFrame, cols: Sequence[str], rtrim: bool = False) -> Column:
    """64-bit hash of the given columns' values, null-position aware (Spark hashes -0.0 as 0.0
    and every NaN alike)."""
    if not cols:
        return F.lit(0).cast("long")
    return F.xxhash64(*[_hashable(df, c, rtrim) for c in cols], *_null_mask(cols))


def _column_hash(df: DataFrame, name: str, rtrim: bool) -> Column:
    """32-bit hash of one column, null distinct from every value."""
    return F.hash(_hashable(df, name, rtrim), column(name).isNull()).cast("long")


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

