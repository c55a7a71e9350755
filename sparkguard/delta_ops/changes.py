"""The change set of a window: the rows of a recomputation that differ from the target's."""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType

from sparkguard.delta_ops.tables import read_table
from sparkguard.spark_types import (
    collated,
    exact_json,
    holds_collated,
    holds_unordered,
    same_field_names,
)
from sparkguard.sql import CHANGE_OP, TableRef, changed_condition, merge_condition, quote_column

__all__ = ["window_changes"]


def window_changes(spark: SparkSession, df: DataFrame, ref: TableRef, keys: Sequence[str],
                   window_predicate_target: str, delete_unmatched: bool) -> DataFrame:
    """The rows of ``df`` (the new window) that differ from the target's window, each with
    :data:`~sparkguard.sql.CHANGE_OP`: ``'I'`` a key only in ``df``, ``'U'`` a key in both
    whose non-key values differ (null-safe, :func:`~sparkguard.sql.changed_condition`), and,
    with ``delete_unmatched``, ``'D'`` a key only in the target (its key values, from the
    target). One full outer join on the keys; nothing is fetched to the driver.

    A column of another type than the target's is compared, and returned, as the MERGE writes
    it: cast to the target's type (a struct only when its fields pair by name, as the MERGE
    pairs them; ``cast_to_target`` gates have checked that the cast keeps each value; see
    :func:`_as_written` for what is not cast). A map or a variant (which ``<=>`` cannot
    compare), or text collated inside a struct or an array, is compared as its exact JSON text
    (:func:`~sparkguard.spark_types.exact_json`); collated text at the top in binary."""
    target = read_table(spark, ref)
    df = _as_written(df, target)
    cols = df.columns
    key_set = set(keys)
    types = {f.name.lower(): f.dataType for f in target.schema.fields}
    # each compared column's type on both sides (the target's where it has the column)
    sides = {f.name: (f.dataType, types.get(f.name.lower(), f.dataType))
             for f in df.schema.fields if f.name not in key_set}
    as_json = [c for c, ts in sides.items()
               if any(holds_unordered(t) or (holds_collated(t) and not collated(t)) for t in ts)]
    as_binary = [c for c, ts in sides.items()
                 if c not in as_json and any(collated(t) for t in ts)]
    texts = {c: f"__sg_j{i}" for i, c in enumerate(as_json)}  # compared as exact JSON text
    side_s, side_t = "__sg_in_s", "__sg_in_t"

    def col(alias: str, name: str) -> Column:
        return F.col(f"`{alias}`.{quote_column(name)}")

    s = df.withColumns({side_s: F.lit(True), **{
        name: exact_json(F.col(quote_column(c)), sides[c][0]) for c, name in texts.items()}})
    t = (target.alias("t").filter(window_predicate_target)
         .select(*[col("t", c).alias(c) for c in cols],
                 *[exact_json(col("t", c), sides[c][1]).alias(name) for c, name in texts.items()],
                 F.lit(True).alias(side_t)).alias("t"))
    op = (F.when(col("s", side_s).isNull(), F.lit("D"))
          .when(col("t", side_t).isNull(), F.lit("I")))
    if sides:
        compared = [texts.get(c, c) for c in sides]
        op = op.when(F.expr(changed_condition(compared, as_binary)), F.lit("U"))
    joined = s.alias("s").join(t, F.expr(merge_condition(keys)), "full_outer") \
        .withColumn(CHANGE_OP, op)
    wanted = ["I", "U", "D"] if delete_unmatched else ["I", "U"]
    return (joined.filter(F.col(CHANGE_OP).isin(wanted))
            .select(*[F.when(F.col(CHANGE_OP) == "D", col("t", c)).otherwise(col("s", c))
                      .alias(c) for c in cols], F.col(CHANGE_OP)))


def _as_written(df: DataFrame, target: DataFrame) -> DataFrame:
    """``df`` with each column whose type is not the target's cast to it, where a cast pairs
    struct fields as their names do and ``cast_to_target`` gates it; maps and variants (which
    compare as JSON), and text differing only in collation (a cast would compare it in the
    target's collation, ``UTF8_LCASE`` blind to a change of case), stay as they are."""
    types = {f.name.lower(): f.dataType for f in target.schema.fields}
    casts = {}
    for f in df.schema.fields:
        want = types.get(f.name.lower())
        if (want is not None and want.simpleString() != f.dataType.simpleString()
                and same_field_names(f.dataType, want)
                and not any(holds_unordered(t) for t in (want, f.dataType))
                and not all(isinstance(t, StringType) for t in (want, f.dataType))):
            casts[f.name] = F.col(quote_column(f.name)).cast(want)
    return df.withColumns(casts) if casts else df
