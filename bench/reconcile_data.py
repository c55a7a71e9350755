"""Benchmark data: a target table and a shadow with known, counted differences.

Both tables are Delta, partitioned by ``event_date``, 8 columns. The shadow is the target with
differences injected by residue class of the key (``id % 1000``), so the expected counts follow
from arithmetic alone:

====  =========================================================  ============================
 r    shadow row for ``id % 1000 == r``                          expected verdict
====  =========================================================  ============================
 1    missing                                                    delete
 2    ``amount + 0.5``                                           change: amount
 3    ``status`` replaced                                        change: status
 4    ``amount + 1`` and ``price + 0.01``                        change: amount, price
 5    ``amount * (1 + 1e-12)`` (inside the float tolerance)      unchanged
 6    written twice                                              duplicate key (ambiguous)
 7    ``updated_at + 1 second``                                  change: updated_at
 8    ``status || ' '`` (trailing space is a difference)         change: status
 9    ``quantity`` set to null                                   change: quantity
====  =========================================================  ============================

plus ``rows // 1000`` brand-new keys (inserts). ``customer_id`` is null on one row in 50 on both
sides (nulls that match are not differences).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

__all__ = ["COLUMNS", "Expected", "expected_for", "generate"]

COLUMNS = ("id", "event_date", "customer_id", "amount", "quantity", "status", "price", "updated_at")
DAYS = 16
FLOAT_TOLERANCE = 1e-9


def _residue_count(rows: int, r: int) -> int:
    """How many ids in ``range(rows)`` have ``id % 1000 == r``."""
    return rows // 1000 + (1 if r < rows % 1000 else 0)


@dataclass(frozen=True)
class Expected:
    """The differences injected into the shadow, which a correct comparison must report."""

    rows_target: int
    rows_shadow: int
    inserted: int
    deleted: int
    changed: int
    duplicate_keys: int
    changed_by_column: dict[str, int] = field(default_factory=dict)


def expected_for(rows: int) -> Expected:
    """Expected verdicts for a generated pair of ``rows`` target rows."""
    c = {r: _residue_count(rows, r) for r in range(10)}
    inserts = rows // 1000
    by_col = {"customer_id": 0, "amount": c[2] + c[4], "quantity": c[9], "status": c[3] + c[8],
              "price": c[4], "updated_at": c[7]}
    return Expected(
        rows_target=rows,
        rows_shadow=rows - c[1] + c[6] + inserts,
        inserted=inserts,
        deleted=c[1],
        changed=c[2] + c[3] + c[4] + c[7] + c[8] + c[9],
        duplicate_keys=c[6],
        changed_by_column=by_col,
    )


def _base(spark: SparkSession, start: int, count: int) -> DataFrame:
    """``count`` rows of synthetic orders with ids ``start..start+count-1``."""
    idc = F.col("id")
    return spark.range(start, start + count, numPartitions=4).select(
        idc.alias("id"),
        F.date_add(F.lit("2024-03-01").cast("date"), (idc % DAYS).cast("int")).alias("event_date"),
        F.when(idc % 50 == 0, None).otherwise((F.abs(F.xxhash64(idc)) % 100_000).cast("int"))
        .alias("customer_id"),
        (F.abs(F.xxhash64(idc, F.lit(1))) % 1_000_000 / 100.0 + 0.013).alias("amount"),
        (idc % 17).cast("int").alias("quantity"),
        F.element_at(F.array(*[F.lit(s) for s in ("new", "paid", "shipped", "returned")]),
                     (idc % 4 + 1).cast("int")).alias("status"),
        (F.abs(F.xxhash64(idc, F.lit(2))) % 100_000 / 100).cast("decimal(12,2)").alias("price"),
        F.timestamp_seconds(F.lit(1_709_251_200) + idc % 86_400 * 7).alias("updated_at"),
    )


def _shadow(target: DataFrame, spark: SparkSession, rows: int) -> DataFrame:
    r = F.col("id") % 1000
    changed = target.filter(r != 1).select(
        "id", "event_date", "customer_id",
        F.when(r == 2, F.col("amount") + 0.5).when(r == 4, F.col("amount") + 1.0)
        .when(r == 5, F.col("amount") * (1 + 1e-12)).otherwise(F.col("amount")).alias("amount"),
        F.when(r == 9, F.lit(None).cast("int")).otherwise(F.col("quantity")).alias("quantity"),
        F.when(r == 3, F.lit("cancelled")).when(r == 8, F.concat(F.col("status"), F.lit(" ")))
        .otherwise(F.col("status")).alias("status"),
        F.when(r == 4, F.col("price") + F.lit(0.01).cast("decimal(12,2)")).otherwise(F.col("price"))
        .cast("decimal(12,2)").alias("price"),
        F.when(r == 7, F.col("updated_at") + F.expr("INTERVAL 1 SECOND")).otherwise(F.col("updated_at"))
        .alias("updated_at"),
    )
    dups = target.filter(r == 6)
    inserts = _base(spark, 10 * rows + 1_000_000, rows // 1000)
    return changed.unionByName(dups).unionByName(inserts)


def generate(spark: SparkSession, root: str, rows: int) -> tuple[str, str, Expected]:
    """Write ``<root>/target`` and ``<root>/shadow`` (Delta, by event_date); return paths."""
    target_path, shadow_path = f"{root}/target", f"{root}/shadow"
    target = _base(spark, 0, rows)
    (target.repartition("event_date").write.format("delta").mode("overwrite")
     .partitionBy("event_date").save(target_path))
    written = spark.read.format("delta").load(target_path)
    (_shadow(written, spark, rows).repartition("event_date").write.format("delta").mode("overwrite")
     .partitionBy("event_date").save(shadow_path))
    return target_path, shadow_path, expected_for(rows)
