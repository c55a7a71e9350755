"""Generate the sample lake for ``make demo`` (and for tests): a source orders table, a target
built from it, a planted defect in a 3-day window, and an approved plan to repair it."""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import sys
from pathlib import Path

import yaml
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

__all__ = ["TRANSFORM_SQL", "build_orders", "demo_plan", "generate_lake", "plant_defect",
           "transform_orders"]

START = dt.date(2026, 5, 1)
TRANSFORM_SQL = """SELECT order_id, order_date, customer_id, UPPER(currency) AS currency, status,
       quantity, CAST(amount AS DECIMAL(12,2)) AS amount,
       CAST(amount * quantity AS DECIMAL(14,2)) AS line_total
FROM {source}
WHERE {window}"""


def build_orders(spark: SparkSession, days: int, rows_per_day: int, seed: int = 7) -> DataFrame:
    """Deterministic synthetic orders, ``rows_per_day`` per daily ``order_date`` partition."""
    n = days * rows_per_day
    ids = spark.range(0, n, numPartitions=max(2, min(8, n // 50000 + 1)))
    day = (F.col("id") / F.lit(rows_per_day)).cast("int")
    h = F.abs(F.xxhash64(F.col("id"), F.lit(seed)))
    return ids.select(
        (F.col("id") + 1_000_000).alias("order_id"),
        F.date_add(F.lit(START), day).alias("order_date"),
        (h % 5000 + 1).cast("int").alias("customer_id"),
        F.element_at(F.array(*[F.lit(c) for c in ("usd", "eur", "gbp")]),
                     (h % 3 + 1).cast("int")).alias("currency"),
        F.element_at(F.array(*[F.lit(s) for s in ("paid", "paid", "paid", "refunded")]),
                     (F.shiftright(h, 3) % 4 + 1).cast("int")).alias("status"),
        (F.shiftright(h, 7) % 5 + 1).cast("int").alias("quantity"),
        ((F.shiftright(h, 11) % 100000) / 100).cast("decimal(12,2)").alias("amount"),
    )


def transform_orders(spark: SparkSession, source: DataFrame, partitions: list[object]) -> DataFrame:
    """The same transform as :data:`TRANSFORM_SQL`, as a Python callable."""
    del spark, partitions
    return source.select(
        "order_id", "order_date", "customer_id", F.upper("currency").alias("currency"), "status",
        "quantity", F.col("amount").cast("decimal(12,2)").alias("amount"),
        (F.col("amount") * F.col("quantity")).cast("decimal(14,2)").alias("line_total"))


def plant_defect(spark: SparkSession, target_path: str, days: list[dt.date]) -> None:
    """Corrupt the target in ``days``: 20 % of amounts x10 (line_total too), 3 % of rows gone.

    Delta SQL (UPDATE, DELETE), which classic and Spark Connect sessions both run.
    """
    from sparkguard.sql import PartitionType, TableRef, window_predicate

    table = TableRef.parse(target_path).sql
    in_window = window_predicate("order_date", PartitionType.DATE, days)
    spark.sql(f"UPDATE {table} SET amount = CAST(amount * 10 AS DECIMAL(12,2)), "
              "line_total = CAST(line_total * 10 AS DECIMAL(14,2)) "
              f"WHERE {in_window} AND order_id % 5 = 0")
    spark.sql(f"DELETE FROM {table} WHERE {in_window} AND order_id % 33 = 0")


def demo_plan(root: Path, window: list[dt.date], *, name: str = "fix-orders-amounts",
              promotion: str = "replace_where") -> dict[str, object]:
    """The plan repairing ``window`` (as a YAML-ready dict)."""
    end = window[-1] + dt.timedelta(days=1)
    return {"backfill_plan": {
        "name": name,
        "owner": "data-platform@example.com",
        "reason": "Amounts were multiplied by 10 and rows dropped by a bad deploy; recompute "
                  "the window from the source of truth.",
        "affected_window": {
            "start_utc": f"{window[0].isoformat()}T00:00:00Z",
            "end_utc": f"{end.isoformat()}T00:00:00Z",
            "partitions": [f"order_date={d.isoformat()}" for d in window],
            "max_partitions": 31,
        },
        "partitioning": {"column": "order_date", "type": "date"},
        "source_of_truth": {"system": "delta", "dataset": str(root / "source" / "orders")},
        "targets": [{
            "name": "orders_clean",
            "dataset": str(root / "target" / "orders_clean"),
            "business_keys": ["order_id"],
            "transform": {"sql": TRANSFORM_SQL},
            "promotion": promotion,
            "contract": {"match_target_schema": True, "not_null": ["order_id", "amount"]},
        }],
        "execution": {"mode": "replay", "idempotent": True,
                      "write_strategy": "replaceWhere over the window, one commit"
                      if promotion == "replace_where"
                      else "MERGE on order_id within the window, one commit",
                      "dry_run_completed": False, "slice_partitions": 1,
                      "max_concurrent_slices": 1, "proof_slice": True},
        "safeguards": {"publish_paused": True,
                       "downstream_notifications": ["finance-bi", "ops-analytics"],
                       "rollback_strategy": "RESTORE the target to the version recorded before "
                                            "promotion (jobs/rollback.py --run-id)."},
        "validation": {"checks": [
            {"type": "row_count_parity", "threshold_percent": 0.0},
            {"type": "duplicate_check", "key_columns": ["order_id"]},
            {"type": "metric_reconciliation", "metric": "gross_amount", "aggregation": "sum",
             "source_expr": "amount", "shadow_expr": "amount", "threshold_percent": 0.01},
            {"type": "metric_reconciliation", "metric": "line_total", "aggregation": "sum",
             "source_expr": "amount * quantity", "shadow_expr": "line_total",
             "threshold_percent": 0.01},
        ]},
        "approvals": {"required": ["data-platform-owner", "downstream-owner"]},
        "status": {"state": "review"},
    }}


def generate_lake(spark: SparkSession, root: str | Path, *, days: int = 31,
                  rows_per_day: int = 7000, window_start: int = 11, window_days: int = 3,
                  approve: bool = True, promotion: str = "replace_where") -> Path:
    """Create ``root`` from scratch; return the plan path."""
    from sparkguard.approve import record_approval

    root = Path(root).resolve()
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    src, tgt = root / "source" / "orders", root / "target" / "orders_clean"
    orders = build_orders(spark, days, rows_per_day)
    orders.write.format("delta").partitionBy("order_date").save(str(src))
    source = spark.read.format("delta").load(str(src))
    (transform_orders(spark, source, []).write.format("delta").partitionBy("order_date")
     .save(str(tgt)))
    window = [START + dt.timedelta(days=window_start + i) for i in range(window_days)]
    plant_defect(spark, str(tgt), window)
    plan_path = root / "plan.yaml"
    plan_path.write_text(yaml.safe_dump(demo_plan(root, window, promotion=promotion),
                                        sort_keys=False, width=100), encoding="utf-8")
    if approve:
        record_approval(plan_path, "data-platform-owner", "alice@example.com")
        record_approval(plan_path, "downstream-owner", "bob@example.com")
    return plan_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="generate the sparkguard demo lake")
    parser.add_argument("root", nargs="?", default="demo-lake")
    parser.add_argument("--days", type=int, default=31)
    parser.add_argument("--rows-per-day", type=int, default=7000)
    args = parser.parse_args(argv)
    from sparkguard.compat import set_log_level
    from sparkguard.session import get_or_create_session

    spark = get_or_create_session("sparkguard-demo-lake")
    set_log_level(spark, "ERROR")
    plan = generate_lake(spark, args.root, days=args.days, rows_per_day=args.rows_per_day)
    print(f"demo lake at {Path(args.root).resolve()}: {args.days} daily partitions x "
          f"{args.rows_per_day} orders; defect planted in 3 days of the target; plan {plan}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
