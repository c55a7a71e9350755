"""`sparkguard status` (runs, slices, states, next action), `sparkguard report --run-id`
(the evidence, found through the ledger), and the home from the Spark conf."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from sparkguard.cli import main
from sparkguard.evidence import load_evidence, render_markdown
from sparkguard.ledger import Ledger
from sparkguard.publish import is_paused
from tests.lakes import copy_lake, set_transform, write_plan

pytestmark = pytest.mark.spark
HOME_CONF = "spark.sparkguard.home"


@pytest.fixture(scope="module")
def ran(spark: Any, base_lake: Path, tmp_path_factory: Any) -> tuple[Path, str, str]:
    """A lake with one failed (gate) run and one finished run: (root, failed id, done id)."""
    root = copy_lake(base_lake, tmp_path_factory.mktemp("st") / "lake")
    bad = write_plan(root, set_transform(
        "SELECT order_id, order_date, customer_id, UPPER(currency) AS currency, status, "
        "quantity, CAST(amount AS DECIMAL(12,2)) AS amount, "
        "CAST(amount * quantity AS DECIMAL(14,2)) AS line_total FROM {source} "
        "WHERE {window} AND order_id % 10 <> 0"), name="bad.yaml")
    good = write_plan(root, lambda p: p["execution"].update(slice_partitions=2))
    spark.conf.set(HOME_CONF, str(root / "_sg"))  # no --home: the Spark conf decides
    try:
        assert main(["run", "--plan", str(bad), "--evidence-dir", str(root / "ev")]) == 1
        assert main(["run", "--plan", str(good), "--evidence-dir", str(root / "ev")]) == 0
    finally:
        spark.conf.unset(HOME_CONF)
    # the finished run cleared the hold the failed run left (no manual hold was set)
    assert not is_paused(spark, str(root / "target" / "orders_clean"), str(root / "_sg"))
    runs = Ledger(spark, str(root / "_sg")).latest_runs()
    assert [p.state for p in runs] == ["done", "gate_failed"]
    assert not (root / "_sparkguard").exists()  # the plan-dir default was not used
    return root, runs[1].run_id, runs[0].run_id


def test_status_lists_runs_with_state_and_next_action(ran: Any, capsys: Any) -> None:
    root, failed, done = ran
    capsys.readouterr()
    assert main(["status", "--home", str(root / "_sg")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(done) and " done " in lines[0]
    assert "rollback --run-id" in lines[0]
    assert lines[1].startswith(failed) and "gate_failed" in lines[1]
    assert "fix the data or the plan" in lines[1]


def test_status_of_one_run_shows_events_versions_slices_next(ran: Any, capsys: Any) -> None:
    root, failed, done = ran
    capsys.readouterr()
    assert main(["status", "--home", str(root / "_sg"), "--run-id", done]) == 0
    out = capsys.readouterr().out
    assert f"run {done}: plan fix-orders-amounts" in out and "state done" in out
    assert "rollback point v2, promoted v3, verified True" in out
    shown = re.findall(r"^  \S+ \S+ \+\s*[\d.]+s (\w+)", out, re.MULTILINE)
    assert shown == ["started", "paused", "proof_passed", "reconciled", "promoting", "promoted",
                     "verified", "done"]
    assert out.count("reconciled, 400 rows") == 1 and out.count("reconciled, 200 rows") == 1
    assert main(["status", "--home", str(root / "_sg"), "--run-id", failed]) == 0
    out = capsys.readouterr().out
    assert "failed: row_count_parity" in out and "next: read the evidence" in out
    assert main(["status", "--home", str(root / "_sg"), "--run-id", "nope"]) == 2
    capsys.readouterr()
    assert main(["rollback", "--home", str(root / "_sg"), "--run-id", failed]) == 2
    assert "no promotion in place" in capsys.readouterr().err


def test_report_renders_the_evidence_found_through_the_ledger(ran: Any, capsys: Any) -> None:
    root, _failed, done = ran
    capsys.readouterr()
    assert main(["report", "--run-id", done, "--home", str(root / "_sg")]) == 0
    out = capsys.readouterr().out
    assert out.strip() == render_markdown(load_evidence(root / "ev" / f"{done}.yaml")).strip()
    assert main(["report", "--home", str(root / "_sg")]) == 2
