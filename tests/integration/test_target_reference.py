"""A target's own checks against its own reference query (``validation.reference``): a silver
target gated against the source with row-count parity at 0 %, and an aggregated daily_metrics
target gated against the silver shadow aggregated, also at 0 %. A planted defect in
daily_metrics fails its gate and leaves both targets as they were."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame

from sparkguard.errors import EXIT_GATE_FAILED, EXIT_OK
from sparkguard.evidence import load_evidence, render_markdown
from sparkguard.plan import load_plan
from sparkguard.run.evaluator import run_backfill
from tests.lakes import copy_lake, write_plan

pytestmark = pytest.mark.spark
METRICS_SQL = """SELECT order_date, UPPER(currency) AS currency, COUNT(*) AS orders,
       CAST(SUM(CAST(amount AS DECIMAL(12,2))) AS DECIMAL(18,2)) AS revenue
FROM {source} WHERE {window} GROUP BY order_date, UPPER(currency)"""
REFERENCE_SQL = """SELECT order_date, currency, COUNT(*) AS orders,
       CAST(SUM(amount) AS DECIMAL(18,2)) AS revenue
FROM {shadow:orders_clean} WHERE {window} GROUP BY order_date, currency"""
# the defect: one currency's revenue off by 1 % in the aggregated target
DEFECT_SQL = METRICS_SQL.replace(
    "CAST(SUM(CAST(amount AS DECIMAL(12,2))) AS DECIMAL(18,2)) AS revenue",
    "CAST(SUM(CAST(amount AS DECIMAL(12,2))) * IF(UPPER(currency) = 'EUR', 1.01, 1) "
    "AS DECIMAL(18,2)) AS revenue")


@pytest.fixture(scope="module")
def base_lake(spark: Any, base_lake: Path, tmp_path_factory: Any) -> Path:
    root = copy_lake(base_lake, tmp_path_factory.mktemp("refbase") / "lake")
    clean = spark.read.format("delta").load(str(root / "target" / "orders_clean"))
    clean.createOrReplaceTempView("sg_test_clean")
    (spark.sql(REFERENCE_SQL.replace("{shadow:orders_clean}", "sg_test_clean")
               .replace("{window}", "true"))
     .write.format("delta").partitionBy("order_date").save(str(root / "target" / "daily_metrics")))
    spark.catalog.dropTempView("sg_test_clean")
    return root


def _plan(transform_sql: str) -> Any:
    def mutate(plan: dict[str, Any]) -> None:
        silver = plan["targets"][0]
        plan["targets"].append({
            "name": "daily_metrics",
            "dataset": silver["dataset"].replace("orders_clean", "daily_metrics"),
            "business_keys": ["currency"], "transform": {"sql": transform_sql},
            "promotion": "replace_where", "depends_on": ["orders_clean"],
            "validation": {
                "reference": {"sql": REFERENCE_SQL},
                "checks": [
                    {"type": "row_count_parity", "threshold_percent": 0.0},
                    {"type": "duplicate_check", "key_columns": ["currency"]},
                    {"type": "metric_reconciliation", "metric": "revenue", "aggregation": "sum",
                     "source_expr": "revenue", "shadow_expr": "revenue",
                     "threshold_percent": 0.0},
                    {"type": "metric_reconciliation", "metric": "orders", "aggregation": "sum",
                     "source_expr": "orders", "shadow_expr": "orders",
                     "threshold_percent": 0.0}]}})
        plan["execution"]["slice_partitions"] = 3
    return mutate


def _content(spark: Any, root: Path, name: str) -> list[tuple[Any, ...]]:
    df: DataFrame = spark.read.format("delta").load(str(root / "target" / name))
    return sorted(tuple(r) for r in df.collect())


def _run(spark: Any, root: Path, transform_sql: str) -> Any:
    plan = write_plan(root, _plan(transform_sql))
    return run_backfill(spark, load_plan(plan), str(plan), home=str(root / "_sg"),
                        evidence_dir=str(root / "evidence"), out=lambda _m: None)


def test_each_target_gated_against_its_own_reference(spark: Any, base_lake: Path,
                                                     tmp_path: Path) -> None:
    root = copy_lake(base_lake, tmp_path / "lake")
    out = _run(spark, root, METRICS_SQL)
    assert out.exit_code == EXIT_OK, out.message
    metrics = out.targets["daily_metrics"]
    assert metrics.verified and metrics.window is not None
    rows = {g.check_type: g for g in metrics.window.gates if g.partition is None}
    silver = out.targets["orders_clean"].window
    assert silver is not None and all(g.passed for g in silver.gates)
    silver_rows = {g.check_type: g for g in silver.gates if g.partition is None}
    # daily_metrics' row count is gated against the reference's rows (a row per day and
    # currency), silver's against the source's orders, both at 0 %
    gate = rows["row_count_parity"]
    assert gate.passed and gate.expected == gate.measured["value"]
    assert 0 < gate.expected < silver_rows["row_count_parity"].expected == 600
    data = load_evidence(out.evidence_path)
    by_target = {x["target"]: x for x in data["sparkguard"]["plan"]["target_checks"]}
    assert by_target["orders_clean"]["reference"] is None
    assert not by_target["orders_clean"]["own_checks"]
    assert by_target["daily_metrics"]["reference"] == {"sql": REFERENCE_SQL}
    assert [c.get("metric") for c in by_target["daily_metrics"]["checks"]][2:] == \
        ["revenue", "orders"]
    assert "- Checks: its own (row_count_parity, duplicate_check, revenue, orders), against " \
        "its reference `SELECT order_date" in render_markdown(data)


def test_a_defect_in_the_aggregate_fails_its_gate_and_changes_nothing(
        spark: Any, base_lake: Path, tmp_path: Path) -> None:
    root = copy_lake(base_lake, tmp_path / "lake")
    before = {n: _content(spark, root, n) for n in ("orders_clean", "daily_metrics")}
    out = _run(spark, root, DEFECT_SQL)
    assert out.exit_code == EXIT_GATE_FAILED, out.message
    assert "revenue" in out.message
    assert {n: _content(spark, root, n) for n in before} == before

