"""Issue 2 acceptance: a safe backfill end to end on real local Delta tables."""

from __future__ import annotations

from pathlib import Path

import pytest
from chispa import assert_df_equality
from delta.tables import DeltaTable
from pyspark.sql import functions as F

from sparkguard.cli import main
from sparkguard.demo import TRANSFORM_SQL, transform_orders
from tests.lakes import WINDOW, copy_lake, set_transform, write_plan

pytestmark = pytest.mark.spark



@pytest.fixture
def lake_copy(base_lake, tmp_path) -> Path:
    return copy_lake(base_lake, tmp_path / "lake")


def _target(root: Path) -> str:
    return str(root / "target" / "orders_clean")


def _version(spark, path: str) -> int:
    return int(DeltaTable.forPath(spark, path).history(1).first()["version"])


def _run(plan: Path, *extra: str) -> int:
    root = plan.parent
    return main(["run", "--plan", str(plan), "--home", str(root / "_sg"),
                 "--evidence-dir", str(root / "evidence"), *extra])


def _sorted(df):
    return df.orderBy("order_date", "order_id")


def test_happy_path_promotes_exact_recomputation_then_rollback_restores_prior_content(
        spark, lake_copy):
    """The run, then its rollback: one backfill serves both acceptance points."""
    target = _target(lake_copy)
    before_rows = _sorted(spark.read.format("delta").load(target)).collect()
    v_before = _version(spark, target)
    outside_before = [r for r in before_rows if r["order_date"] not in WINDOW]

    plan = write_plan(lake_copy)
    assert _run(plan) == 0

    after = spark.read.format("delta").load(target)
    # independent expectation: the transform applied to the whole source (the target outside
    # the window was built that way and must be untouched; inside, the defect is repaired)
    expected = transform_orders(spark, spark.read.format("delta").load(
        str(lake_copy / "source" / "orders")), [])
    assert_df_equality(_sorted(after), _sorted(expected), ignore_nullable=True)
    assert _sorted(after.filter(~F.col("order_date").isin(WINDOW))).collect() == outside_before

    hist = DeltaTable.forPath(spark, target).history().orderBy("version").collect()
    promote = [h for h in hist if h["version"] > v_before]
    assert len(promote) == 1, "promotion must be exactly one commit"
    assert '"action": "promote"' in promote[0]["userMetadata"]

    evidence = list((lake_copy / "evidence").glob("*.yaml"))
    assert len(evidence) == 1
    import yaml

    ev = yaml.safe_load(evidence[0].read_text())["sparkguard"]
    assert ev["outcome"] == "promoted"
    tgt = ev["targets"][0]
    assert tgt["rollback_point"]["version_before_promotion"] == v_before
    assert tgt["promoted_version"] == v_before + 1
    assert tgt["rollback_point"]["restore_statement"] == (
        f"RESTORE TABLE delta.`{target}` TO VERSION AS OF {v_before}")
    gates = {g["gate"]: g for g in ev["gates"]}
    assert gates["row_count_parity"]["passed"] and gates["duplicate_check"]["passed"]
    assert gates["metric_reconciliation[gross_amount]"]["threshold"] == "<= 0.01%"

    # rollback by run id restores the exact prior content, and history shows the RESTORE
    assert main(["rollback", "--run-id", ev["run_id"], "--home", str(lake_copy / "_sg")]) == 0
    assert _sorted(spark.read.format("delta").load(target)).collect() == before_rows
    last = DeltaTable.forPath(spark, target).history(1).first()
    assert last["operation"] == "RESTORE" and last["version"] == v_before + 2
    # the evidence says what the target holds now, not only that the run once promoted
    after = yaml.safe_load(evidence[0].read_text())
    assert after["sparkguard"]["outcome"] == "rolled_back"
    assert after["release_gate_evidence"]["publish_control"]["deployment_complete"] is False
    assert after["release_gate_evidence"]["decision"]["ready_to_ship"] is False
    assert "**Outcome: rolled_back.**" in evidence[0].with_suffix(".md").read_text()


DEFECTS = {
    "duplicate_keys": TRANSFORM_SQL + "\nUNION ALL SELECT order_id, order_date, customer_id, "
    "UPPER(currency), status, quantity, CAST(amount AS DECIMAL(12,2)), "
    "CAST(amount * quantity AS DECIMAL(14,2)) FROM {source} WHERE {window} AND order_id % 50 = 0",
    "metric_drift": TRANSFORM_SQL.replace("CAST(amount AS DECIMAL(12,2)) AS amount",
                                          "CAST(amount * 1.05 AS DECIMAL(12,2)) AS amount"),
    "row_count_drift": TRANSFORM_SQL + " AND order_id % 20 <> 0",
    # the business key comes out in another case: nothing to pair rows by
    "key_in_another_case": TRANSFORM_SQL.replace("SELECT order_id,", "SELECT order_id AS ORDER_ID,"),
    "type_change": TRANSFORM_SQL.replace("CAST(amount AS DECIMAL(12,2)) AS amount",
                                         "CAST(amount AS DOUBLE) AS amount"),
    "null_in_non_null": TRANSFORM_SQL.replace(
        "CAST(amount AS DECIMAL(12,2)) AS amount",
        "CAST(CASE WHEN order_id % 40 = 0 THEN NULL ELSE amount END AS DECIMAL(12,2)) AS amount"),
}
FAILED_GATE = {
    "duplicate_keys": "duplicate_check",
    "metric_drift": "metric_reconciliation[gross_amount]",
    "row_count_drift": "row_count_parity",
    "key_in_another_case": "business_keys_in_recomputation",
    "type_change": "schema_matches_target",
    "null_in_non_null": "not_null[amount]",
}


@pytest.mark.parametrize("defect", sorted(DEFECTS))
def test_defect_refuses_promotion_target_untouched(spark, lake_copy, defect):
    target = _target(lake_copy)
    v_before = _version(spark, target)
    content_before = _sorted(spark.read.format("delta").load(target)).collect()

    plan = write_plan(lake_copy, set_transform(DEFECTS[defect]))
    assert _run(plan) == 1

    assert _version(spark, target) == v_before
    assert _sorted(spark.read.format("delta").load(target)).collect() == content_before
    import yaml

    (evidence,) = (lake_copy / "evidence").glob("*.yaml")
    ev = yaml.safe_load(evidence.read_text())["sparkguard"]
    assert ev["outcome"] == "gate_failed"
    failed = {g["gate"] for t in ev["targets"] for r in t["slices"] for g in r["gates"]
              if not g["passed"]}
    assert FAILED_GATE[defect] in failed, (defect, failed, ev["error"])
    from sparkguard.publish import PublishControl

    assert PublishControl(spark, str(lake_copy / "_sg")).is_paused(target)


@pytest.mark.parametrize("kind", ["unapproved", "draft_seed_shape", "edited_after_approval"])
def test_unapproved_or_draft_plan_is_refused_with_nothing_written(spark, lake_copy, kind):
    target = _target(lake_copy)
    v_before = _version(spark, target)
    if kind == "unapproved":
        plan = write_plan(lake_copy, approve=False)
    elif kind == "edited_after_approval":
        plan = write_plan(lake_copy)
        text = plan.read_text().replace("threshold_percent: 0.01", "threshold_percent: 5.0")
        plan.write_text(text)
    else:
        plan = lake_copy / "plan.yaml"
        plan.write_text(
            "backfill_plan:\n  name: seed\n  owner: a@example.com\n  reason: r\n"
            "  affected_window:\n    start_utc: '2026-05-03T00:00:00Z'\n"
            "    end_utc: '2026-05-06T00:00:00Z'\n"
            "    partitions: ['order_date=2026-05-03', 'order_date=2026-05-04', "
            "'order_date=2026-05-05']\n"
            f"  source_of_truth: {{system: delta, dataset: {lake_copy}/source/orders}}\n"
            f"  targets: [{target}]\n"
            "  execution: {mode: replay, idempotent: true, write_strategy: merge, "
            "dry_run_completed: true}\n"
            "  safeguards: {publish_paused: true, downstream_notifications: [bi], "
            "rollback_strategy: restore}\n"
            "  validation:\n    checks:\n      - {type: row_count_parity, threshold_percent: 0.1}\n"
            "      - {type: duplicate_check, key_columns: [order_id]}\n"
            "  approvals: {required: [owner]}\n  status: {state: approved}\n")
    assert _run(plan) == 2
    assert _version(spark, target) == v_before
    assert not (lake_copy / "_sg").exists()
    assert not (lake_copy / "evidence").exists()


def test_a_slice_gate_failure_is_the_evidence_release_gate_verdict(spark, lake_copy):
    """The proof slice's row count gate fails, so no full-window gate runs: the evidence must
    say the shadow run and row count parity failed and list the failed gate, not 'not_run' with
    no failed gate."""
    import yaml

    plan = write_plan(lake_copy, set_transform(DEFECTS["row_count_drift"]))
    assert _run(plan) == 1
    (evidence,) = (lake_copy / "evidence").glob("*.yaml")
    ev = yaml.safe_load(evidence.read_text())
    rg, sg = ev["release_gate_evidence"], ev["sparkguard"]
    assert sg["outcome"] == "gate_failed" and sg["gates"] == []
    assert rg["staged_validation"]["shadow_run"] == "fail"
    assert rg["reconciliation"]["row_count_status"] == "fail"
    assert [(g["target"], g["gate"], g["scope"]) for g in sg["failed_gates"]
            if g["gate"] == "row_count_parity"][:1] == [
        ("orders_clean", "row_count_parity", "proof slice 1")]
    md = evidence.with_suffix(".md").read_text()
    assert "## Failed gates" in md and "| Shadow run | fail |" in md
