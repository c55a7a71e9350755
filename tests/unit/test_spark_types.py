"""Type text and nested names for columns whose fields are named like real JSON: spaces,
dots, mixed case."""

from __future__ import annotations

from pyspark.sql import types as T

from sparkguard.spark_types import (
    collated,
    field_names,
    holds_collated,
    holds_unordered,
    in_binary,
    leaf_fields,
    map_leaves,
    same_field_names,
    sql_type,
)

ADDR = T.StructType([T.StructField("zip code", T.StringType()),
                     T.StructField("City", T.StringType()),
                     T.StructField("geo.lat", T.DecimalType(9, 6))])


def test_sql_type_backquotes_nested_names_and_keeps_their_case() -> None:
    assert sql_type(ADDR) == ("STRUCT<`zip code`: STRING, `City`: STRING, "
                              "`geo.lat`: DECIMAL(9,6)>")
    assert sql_type(T.ArrayType(T.MapType(T.StringType(), ADDR))) == (
        "ARRAY<MAP<STRING, STRUCT<`zip code`: STRING, `City`: STRING, `geo.lat`: DECIMAL(9,6)>>>")
    assert sql_type(T.StructType([T.StructField("a`b", T.LongType())])) == "STRUCT<`a``b`: BIGINT>"
    assert sql_type(T.TimestampNTZType()) == "TIMESTAMP_NTZ"


def test_leaf_fields_counts_like_spark_codegen_max_fields() -> None:
    """Spark's count against ``spark.sql.codegen.maxFields``: struct leaves, an array's
    element, a map's key and value; a variant or a scalar is one."""
    dtype = T.StructType([T.StructField("id", T.LongType()),
                          T.StructField("v", T.VariantType()),
                          T.StructField("addr", ADDR),
                          T.StructField("lines", T.ArrayType(ADDR)),
                          T.StructField("tags", T.MapType(T.StringType(), ADDR))])
    assert leaf_fields(dtype) == 1 + 1 + 3 + 3 + (1 + 3)
    assert leaf_fields(T.StringType()) == 1


def test_field_names_walks_arrays_maps_and_structs() -> None:
    dtype = T.StructType([T.StructField("id", T.LongType()),
                          T.StructField("lines", T.ArrayType(ADDR)),
                          T.StructField("tags", T.MapType(T.StringType(), T.StructType(
                              [T.StructField("w x", T.IntegerType())])))])
    assert list(field_names(dtype)) == ["id", "lines", "zip code", "City", "geo.lat", "tags",
                                        "w x"]
    assert list(field_names(T.LongType())) == []


def _struct(*names: str) -> T.StructType:
    return T.StructType([T.StructField(n, T.DoubleType()) for n in names])


def test_same_field_names_is_what_a_positional_struct_cast_keeps() -> None:
    assert same_field_names(_struct("lat", "lon"), _struct("LAT", "Lon"))
    assert not same_field_names(_struct("lon", "lat"), _struct("lat", "lon"))
    assert not same_field_names(_struct("lat"), _struct("lat", "lon"))
    assert same_field_names(T.ArrayType(_struct("a")), T.ArrayType(_struct("a")))
    assert not same_field_names(T.MapType(T.StringType(), _struct("a", "b")),
                                T.MapType(T.StringType(), _struct("b", "a")))
    assert same_field_names(T.IntegerType(), T.LongType())
    assert not same_field_names(T.StringType(), _struct("a"))


def test_collated_text_is_found_at_the_top_and_nested() -> None:
    """``<=>`` compares collated text in its collation; the change set must find it wherever it
    is (a struct field, an array element, a map value) and only there."""
    lcase = T.StringType("UTF8_LCASE")
    assert collated(lcase) and not collated(T.StringType()) and not collated(T.LongType())
    assert not holds_collated(ADDR) and not holds_collated(T.StringType())
    for nested in (lcase, T.ArrayType(lcase), T.MapType(T.StringType(), lcase),
                   T.StructType([T.StructField("a", T.ArrayType(T.StructType(
                       [T.StructField("b", lcase)])))])):
        assert holds_collated(nested)
    assert not collated(T.StructType([T.StructField("a", lcase)]))
    assert holds_unordered(T.ArrayType(T.MapType(T.StringType(), T.LongType())))
    assert not holds_unordered(T.ArrayType(lcase))


def test_map_leaves_keeps_the_shape_and_in_binary_drops_every_collation() -> None:
    lcase = T.StringType("UTF8_LCASE")
    dtype = T.StructType([T.StructField("a", T.ArrayType(lcase, False), False,
                                        {"comment": "x"}),
                          T.StructField("m", T.MapType(lcase, T.VariantType(), True))])
    assert in_binary(dtype) == T.StructType([
        T.StructField("a", T.ArrayType(T.StringType(), False), False, {"comment": "x"}),
        T.StructField("m", T.MapType(T.StringType(), T.VariantType(), True))])
    assert not holds_collated(in_binary(dtype))
    as_text = map_leaves(dtype, lambda t: T.StringType() if isinstance(t, T.VariantType) else t)
    assert as_text["m"].dataType == T.MapType(lcase, T.StringType(), True)
