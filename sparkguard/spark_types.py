"""What a Spark type holds, for the columns ``<=>``, hashing and the driver cannot take as they
are (maps, variants), wherever they are nested."""

from __future__ import annotations

from pyspark.sql import types as T

__all__ = ["holds_type", "holds_unordered"]


def holds_type(dtype: T.DataType, *kinds: type[T.DataType]) -> bool:
    """Whether ``dtype`` is, or holds in an array, map or struct, a type of ``kinds``."""
    if isinstance(dtype, kinds):
        return True
    if isinstance(dtype, T.ArrayType):
        return holds_type(dtype.elementType, *kinds)
    if isinstance(dtype, T.MapType):
        return holds_type(dtype.keyType, *kinds) or holds_type(dtype.valueType, *kinds)
    if isinstance(dtype, T.StructType):
        return any(holds_type(f.dataType, *kinds) for f in dtype.fields)
    return False


def holds_unordered(dtype: T.DataType) -> bool:
    """A map or a variant anywhere: ``<=>`` compares neither, so they compare as JSON."""
    return holds_type(dtype, T.MapType, T.VariantType)
