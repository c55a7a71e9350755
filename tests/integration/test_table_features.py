"""Tables with the Delta features a Databricks workspace turns on by default, or that teams add:
deletion vectors (rows already deleted in the window), row tracking, v2 checkpoints, in-commit
timestamps, change data feed, and a column widened by type widening. A backfill over them
promotes exactly the recomputation, and its rollback restores exactly the prior content."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from chispa import assert_df_equality
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sparkguard.cli import main
from sparkguard.demo import TRANSFORM_SQL, transform_orders
from sparkguard.ledger import Ledger
from tests.lakes import WINDOW, copy_lake, set_transform, write_plan

pytestmark = pytest.mark.spark

FEATURES = {"delta.enableDeletionVectors": "true", "delta.enableRowTracking": "true",
            "delta.checkpointPolicy": "v2", "delta.enableInCommitTimestamps": "true",
            "delta.enableTypeWidening": "true", "delta.enableChangeDataFeed": "true",
            "delta.checkpointInterval": "2"}


def _read(spark: Any, path: Path) -> DataFrame:
    return spark.read.format("delta").load(str(path)).orderBy("order_date", "order_id")


def _frozen(spark: Any, df: DataFrame) -> DataFrame:
    return spark.createDataFrame(df.collect(), df.schema).orderBy("order_date", "order_id")


@pytest.mark.parametrize("promotion", ["merge_changed", "replace_where"])
def test_a_backfill_over_tables_with_databricks_default_features_promotes_and_rolls_back(
        spark: Any, base_lake: Path, tmp_path: Path, promotion: str) -> None:
    root = copy_lake(base_lake, tmp_path / "lake")
    source, target = root / "source" / "orders", root / "target" / "orders_clean"
    props = ", ".join(f"'{k}' = '{v}'" for k, v in FEATURES.items())
    for table in (source, target):
        spark.sql(f"ALTER TABLE delta.`{table}` SET TBLPROPERTIES ({props})")
        # deletion vectors in and outside the window, on both sides
        spark.sql(f"DELETE FROM delta.`{table}` WHERE order_id % 17 = 0")
    spark.sql(f"ALTER TABLE delta.`{target}` CHANGE COLUMN quantity TYPE BIGINT")
    features = spark.sql(f"DESCRIBE DETAIL delta.`{target}`").first()["tableFeatures"]
    assert {"deletionVectors", "rowTracking", "v2Checkpoint", "inCommitTimestamp",
            "typeWidening"} <= set(features)
    before = _frozen(spark, _read(spark, target))
    widened = TRANSFORM_SQL.replace("quantity, CAST", "CAST(quantity AS BIGINT) AS quantity, CAST")
    plan = write_plan(root, set_transform(widened), promotion=promotion)
    home = str(root / "_sg")
    assert main(["run", "--plan", str(plan), "--home", home,
                 "--evidence-dir", str(root / "evidence")]) == 0
    in_window = F.col("order_date").isin(*WINDOW)
    expected = (transform_orders(spark, spark.read.format("delta").load(str(source))
                                 .filter(in_window), WINDOW)
                .withColumn("quantity", F.col("quantity").cast("bigint"))
                .unionByName(before.filter(~in_window)))
    assert_df_equality(_read(spark, target), expected.orderBy("order_date", "order_id"),
                       ignore_nullable=True)
    (run,) = Ledger(spark, home).latest_runs()
    assert main(["rollback", "--run-id", run.run_id, "--home", home]) == 0
    assert_df_equality(_read(spark, target), before, ignore_nullable=True)
