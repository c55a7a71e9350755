"""What a Spark type holds, for the columns ``<=>``, hashing and the driver cannot take as they
are (maps, variants), wherever they are nested."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sparkguard.sql import quote_column

__all__ = [
    "EXACT_JSON",
    "as_nullable",
    "collated",
    "exact_json",
    "field_names",
    "holds_collated",
    "holds_type",
    "holds_unordered",
    "in_binary",
    "leaf_fields",
    "map_leaves",
    "same_field_names",
    "sql_type",
    "variants_as_text",
    "variants_as_text_type",
]


# to_json options that keep what a comparison must see: timestamps to the microsecond (the
# default format stops at milliseconds) and null fields (dropped by default)
EXACT_JSON = {"timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX",
              "timestampNTZFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSS", "ignoreNullFields": "false"}


def holds_type(dtype: T.DataType, *kinds: type[T.DataType]) -> bool:
    """Whether ``dtype`` is, or holds in an array, map or struct, a type of ``kinds``."""
    return _holds(dtype, lambda t: isinstance(t, kinds))


def _holds(dtype: T.DataType, test: Callable[[T.DataType], bool]) -> bool:
    if test(dtype):
        return True
    if isinstance(dtype, T.ArrayType):
        return _holds(dtype.elementType, test)
    if isinstance(dtype, T.MapType):
        return _holds(dtype.keyType, test) or _holds(dtype.valueType, test)
    if isinstance(dtype, T.StructType):
        return any(_holds(f.dataType, test) for f in dtype.fields)
    return False


def holds_unordered(dtype: T.DataType) -> bool:
    """A map or a variant anywhere: ``<=>`` compares neither, so they compare as JSON."""
    return holds_type(dtype, T.MapType, T.VariantType)


def collated(dtype: T.DataType) -> bool:
    """Text with a collation other than binary (``UTF8_LCASE``, say): ``<=>`` and ``=`` compare
    it in that collation, blind to a change of case."""
    return isinstance(dtype, T.StringType) and not dtype.isUTF8BinaryCollation()


def holds_collated(dtype: T.DataType) -> bool:
    """Collated text (:func:`collated`) anywhere in ``dtype``."""
    return _holds(dtype, collated)


def in_binary(dtype: T.DataType) -> T.DataType:
    """``dtype`` with every text in ``UTF8_BINARY``: a cast to it compares and hashes text by
    its characters (some Spark builds hash collated text by its collation key, case-blind for
    ``UTF8_LCASE``)."""
    return map_leaves(dtype, lambda t: T.StringType() if collated(t) else t)


def map_leaves(dtype: T.DataType, leaf: Callable[[T.DataType], T.DataType]) -> T.DataType:
    """``dtype`` with ``leaf`` applied to every type that is not an array, map or struct,
    however deeply nested; names, nullability and field metadata kept."""
    if isinstance(dtype, T.ArrayType):
        return T.ArrayType(map_leaves(dtype.elementType, leaf), dtype.containsNull)
    if isinstance(dtype, T.MapType):
        return T.MapType(map_leaves(dtype.keyType, leaf), map_leaves(dtype.valueType, leaf),
                         dtype.valueContainsNull)
    if isinstance(dtype, T.StructType):
        return T.StructType([T.StructField(f.name, map_leaves(f.dataType, leaf), f.nullable,
                                           f.metadata) for f in dtype.fields])
    return leaf(dtype)


def as_nullable(dtype: T.DataType) -> T.DataType:
    """``dtype`` with every nested field, array element and map value nullable and no field
    metadata: what the values are, not the constraints on them (a Delta write makes a shadow's
    whole schema nullable, so a target's ``STRUCT<city: STRING NOT NULL>`` is the same type)."""
    if isinstance(dtype, T.ArrayType):
        return T.ArrayType(as_nullable(dtype.elementType), True)
    if isinstance(dtype, T.MapType):
        return T.MapType(as_nullable(dtype.keyType), as_nullable(dtype.valueType), True)
    if isinstance(dtype, T.StructType):
        return T.StructType([T.StructField(f.name, as_nullable(f.dataType), True)
                             for f in dtype.fields])
    return dtype


def field_names(dtype: T.DataType) -> Iterator[str]:
    """Every struct field name in ``dtype``, however deeply nested (in arrays and maps too)."""
    if isinstance(dtype, T.StructType):
        for f in dtype.fields:
            yield f.name
            yield from field_names(f.dataType)
    elif isinstance(dtype, T.ArrayType):
        yield from field_names(dtype.elementType)
    elif isinstance(dtype, T.MapType):
        yield from field_names(dtype.keyType)
        yield from field_names(dtype.valueType)


def leaf_fields(dtype: T.DataType) -> int:
    """Fields as Spark counts them against ``spark.sql.codegen.maxFields``: a struct's, an
    array's and a map's leaves (a key and a value each); any other type is one."""
    if isinstance(dtype, T.StructType):
        return sum(leaf_fields(f.dataType) for f in dtype.fields)
    if isinstance(dtype, T.ArrayType):
        return leaf_fields(dtype.elementType)
    if isinstance(dtype, T.MapType):
        return leaf_fields(dtype.keyType) + leaf_fields(dtype.valueType)
    if isinstance(dtype, T.UserDefinedType):
        return leaf_fields(dtype.sqlType())
    return 1


def sql_type(dtype: T.DataType) -> str:
    """``dtype`` as Spark SQL type text, struct field names backquoted and kept as they are
    (``simpleString`` leaves them bare: ``struct<zip code:int>`` does not parse)."""
    if isinstance(dtype, T.StructType):
        return "STRUCT<" + ", ".join(f"{quote_column(f.name)}: {sql_type(f.dataType)}"
                                     for f in dtype.fields) + ">"
    if isinstance(dtype, T.ArrayType):
        return f"ARRAY<{sql_type(dtype.elementType)}>"
    if isinstance(dtype, T.MapType):
        return f"MAP<{sql_type(dtype.keyType)}, {sql_type(dtype.valueType)}>"
    return dtype.simpleString().upper()


def same_field_names(a: T.DataType, b: T.DataType) -> bool:
    """Whether ``a`` casts to ``b`` field by field as the names say: Spark casts a struct by
    position, so ``struct<lon, lat>`` to ``struct<lat, lon>`` would swap the values."""
    if isinstance(a, T.StructType) and isinstance(b, T.StructType):
        return len(a.fields) == len(b.fields) and all(
            x.name.lower() == y.name.lower() and same_field_names(x.dataType, y.dataType)
            for x, y in zip(a.fields, b.fields, strict=True))
    if isinstance(a, T.ArrayType) and isinstance(b, T.ArrayType):
        return same_field_names(a.elementType, b.elementType)
    if isinstance(a, T.MapType) and isinstance(b, T.MapType):
        return same_field_names(a.keyType, b.keyType) and same_field_names(a.valueType,
                                                                           b.valueType)
    return not isinstance(a, T.StructType | T.ArrayType | T.MapType) and not isinstance(
        b, T.StructType | T.ArrayType | T.MapType)


def variants_as_text(col: Column, dtype: T.DataType) -> Column:
    """Every variant in the value as its JSON text, wherever it is nested: a SQL null stays
    null and a variant null becomes the text ``null``, which a JSON rendering of the whole
    value would write alike (``[null]``). Its type: :func:`variants_as_text_type`."""
    if isinstance(dtype, T.VariantType):
        return F.to_json(col)
    if not holds_type(dtype, T.VariantType):
        return col
    if isinstance(dtype, T.ArrayType):
        return F.transform(col, lambda x: variants_as_text(x, dtype.elementType))
    if isinstance(dtype, T.MapType):  # a map key is never a variant
        return F.transform_values(col, lambda _k, v: variants_as_text(v, dtype.valueType))
    assert isinstance(dtype, T.StructType)
    rebuilt = F.struct(*[variants_as_text(col.getField(f.name), f.dataType).alias(f.name)
                         for f in dtype.fields])
    return F.when(col.isNull(), F.lit(None)).otherwise(rebuilt)


def variants_as_text_type(dtype: T.DataType) -> T.DataType:
    """The type of :func:`variants_as_text`: ``dtype`` with each variant a string."""
    return map_leaves(dtype, lambda t: T.StringType() if isinstance(t, T.VariantType) else t)


def exact_json(col: Column, dtype: T.DataType) -> Column:
    """A map, a variant or a value holding them as JSON text that tells apart what ``<=>`` on
    the value would: timestamps to the microsecond, null fields kept, a variant null apart from
    a SQL null wherever nested; null for a null value."""
    if isinstance(dtype, T.VariantType):
        return F.to_json(col)
    return F.to_json(variants_as_text(col, dtype), EXACT_JSON)
