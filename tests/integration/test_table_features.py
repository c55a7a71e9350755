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


def test_a_variant_target_with_deletion_vectors_that_spark_cannot_read_says_how_to_read_it(
        spark: Any, base_lake: Path, tmp_path: Path, capsys: Any) -> None:
    """Spark 4.0 cannot read a VARIANT column from a file with a deletion vector without
    whole-stage code generation (SPARK-55552; this test session has it off). A run and a
    rollback that must read such files fail with exit 3, nothing written, and the message says
    how to read them; with Parquet's vectorized reader off, as it says, both succeed."""
    root = copy_lake(base_lake, tmp_path / "lake")
    target = root / "target" / "orders_clean"
    spark.sql(f"ALTER TABLE delta.`{target}` SET TBLPROPERTIES ('delta.feature.variantType' = "
              "'supported')")
    spark.sql(f"ALTER TABLE delta.`{target}` ADD COLUMNS (attrs VARIANT)")
    spark.sql(f"UPDATE delta.`{target}` SET attrs = parse_json(to_json(named_struct("
              "'status', status)))")
    spark.sql(f"ALTER TABLE delta.`{target}` SET TBLPROPERTIES "
              "('delta.enableDeletionVectors' = 'true')")
    spark.sql(f"DELETE FROM delta.`{target}` WHERE order_id % 17 = 0")  # in the window too
    sql = TRANSFORM_SQL.replace(
        "AS line_total\n",
        "AS line_total,\n       parse_json(to_json(named_struct('status', status))) AS attrs\n")
    plan = write_plan(root, set_transform(sql), promotion="replace_where")
    home = str(root / "_sg")
    args = ["run", "--plan", str(plan), "--home", home, "--evidence-dir", str(root / "evidence")]
    history = spark.sql(f"DESCRIBE HISTORY delta.`{target}`").count()
    fix = "--conf spark.sql.parquet.enableVectorizedReader=false"
    capsys.readouterr()
    assert main(args) == 3
    assert fix in capsys.readouterr().err
    assert spark.sql(f"DESCRIBE HISTORY delta.`{target}`").count() == history  # nothing written
    key = "spark.sql.parquet.enableVectorizedReader"
    try:
        spark.conf.set(key, "false")
        assert main(args) == 0
        (run,) = [r for r in Ledger(spark, home).latest_runs() if r.state == "done"]
        spark.conf.unset(key)
        assert main(["rollback", "--run-id", run.run_id, "--home", home]) == 3
        assert fix in capsys.readouterr().err
        promoted = spark.sql(f"DESCRIBE HISTORY delta.`{target}`").count()
        spark.conf.set(key, "false")
        assert main(["rollback", "--run-id", run.run_id, "--home", home]) == 0
        assert spark.sql(f"DESCRIBE HISTORY delta.`{target}`").count() == promoted + 1
    finally:
        spark.conf.unset(key)
