"""Run engine: waves (one reconciliation and one ledger event per wave, a failing wave stops
the run before the next is written), the Delta commits one run makes, and failures reported
as what they are (a transform returning no DataFrame, a failed restore, evidence that could
not be written, the true last step on resume)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sparkguard import faults
from sparkguard.demo import transform_orders
from sparkguard.errors import EXIT_RUNTIME
from sparkguard.evidence import load_evidence
from sparkguard.ledger import Ledger
from sparkguard.plan import load_plan
from sparkguard.plan import window as plan_window
from sparkguard.publish import is_paused
from sparkguard.run import evaluator, finish, undo
from sparkguard.run.data import TransformResultError
from sparkguard.run.evaluator import FailureEvidenceError, run_backfill
from sparkguard.run.report import RunOutcome
from sparkguard.run.undo import RestoreFailedError
from tests.failpoints import dies_at, on_failpoint
from tests.lakes import WINDOW, copy_lake, write_plan

pytestmark = pytest.mark.spark


def not_a_frame(spark: SparkSession, source: DataFrame, partitions: list[object]) -> Any:
    """A transform with a bug: returns a list."""
    return [1, 2, 3]


def drops_middle_day(spark: SparkSession, source: DataFrame,
                     partitions: list[object]) -> DataFrame:
    """The demo transform, losing half the rows of the window's middle day."""
    out = transform_orders(spark, source, partitions)
    return out.filter((F.col("order_date") != F.lit(WINDOW[1])) | (F.col("order_id") % 2 == 0))


def _run(spark: Any, plan: Path, lines: list[str] | None = None) -> RunOutcome:
    root = plan.parent
    return run_backfill(spark, load_plan(plan), str(plan), home=str(root / "_sg"),
                        evidence_dir=str(root / "evidence"),
                        out=(lines.append if lines is not None else lambda _m: None))


def _commits(spark: Any, path: Path) -> int:
    return DeltaTable.forPath(spark, str(path)).history().count()


def _shadow(home: str) -> Path:
    return next((Path(home) / "shadow").glob("*/*/orders_clean"))


def _one_per_slice(p: dict[str, Any]) -> None:
    p["execution"]["slice_partitions"] = 1


def test_one_wave_one_reconciliation_one_ledger_event_and_few_commits(
        spark: Any, base_lake: Path, tmp_path: Path) -> None:
    root = copy_lake(base_lake, tmp_path / "lake")
    plan = write_plan(root, _one_per_slice)  # 3 slices: the proof, then one wave of two
    target, home = root / "target" / "orders_clean", str(root / "_sg")
    before = _commits(spark, target)
    lines: list[str] = []
    out = _run(spark, plan, lines)
    assert out.exit_code == 0, out.message
    led = Ledger(spark, home)
    assert [(s["slice_id"], json.loads(s["partitions"]), s["state"])
            for s in led.slice_events(out.run_id)] == [
        (1, [str(WINDOW[0])], "reconciled"),
        (2, [str(WINDOW[1]), str(WINDOW[2])], "reconciled")]
    # the Delta commits of one run (docs/state-machine.md): the target once, the shadow three
    # times (proof twice, the wave once), 8 run events, 2 slice events, lock + release, pause
    # + reopen; plus the tables' creation on a fresh home
    assert _commits(spark, target) - before == 1
    assert _commits(spark, _shadow(home)) == 3
    ledger = Path(home) / "ledger"
    assert _commits(spark, ledger / "runs") == 1 + 8
    assert _commits(spark, ledger / "slices") == 1 + 2
    assert _commits(spark, ledger / "locks") == 1 + 2
    assert _commits(spark, Path(home) / "control" / "publish") == 1 + 2
    assert _commits(spark, ledger / "evidence") == 1 + 1
    assert sum("wave 1 slices 2-3/3" in ln for ln in lines) == 1


def test_a_failing_wave_stops_the_run_before_the_next_wave_is_written(
        spark: Any, base_lake: Path, tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(plan_window, "WAVE_MAX_SLICES", 1)  # one slice per wave
    root = copy_lake(base_lake, tmp_path / "lake")
    plan = write_plan(root, lambda p: (_one_per_slice(p), p["targets"][0].update(
        transform={"callable": "tests.integration.test_run_engine:drops_middle_day"})))
    home = str(root / "_sg")
    out = _run(spark, plan)
    assert out.exit_code == 1 and "wave 1" in out.message
    events = Ledger(spark, home).slice_events(out.run_id)
    assert [(s["slice_id"], s["state"]) for s in events] == [(1, "reconciled"),
                                                             (2, "gate_failed")]
    assert any(g["gate"] == "row_count_parity" and not g["passed"] for g in events[1]["gates"])
    wave = out.targets["orders_clean"].slice_results[-1]  # per-partition figures: the bad day
    assert [p.partition for p in wave.partitions if p.rows_shadow != p.rows_source] == \
        [str(WINDOW[1])]
    shadow = spark.read.format("delta").load(str(_shadow(home)))
    assert shadow.filter(F.col("order_date") == F.lit(WINDOW[2])).count() == 0, \
        "the wave after the failing one was written"


def test_a_transform_returning_no_dataframe_is_a_runtime_failure_with_publish_paused(
        spark: Any, base_lake: Path, tmp_path: Path) -> None:
    root = copy_lake(base_lake, tmp_path / "lake")
    plan = write_plan(root, lambda p: p["targets"][0].update(
        transform={"callable": "tests.integration.test_run_engine:not_a_frame"}))
    target, home = root / "target" / "orders_clean", str(root / "_sg")
    with pytest.raises(TransformResultError, match="returned list, not a pyspark DataFrame") \
            as err:
        _run(spark, plan)
    assert err.value.exit_code == EXIT_RUNTIME
    assert "publish stays paused" in str(err.value)
    assert is_paused(spark, str(target), home)
    (prog,) = Ledger(spark, home).latest_runs()
    assert prog.state == "failed"
    ev = load_evidence(Path(root / "evidence") / f"{prog.run_id}.yaml")
    assert ev["sparkguard"]["outcome"] == "failed"
    assert ev["sparkguard"]["publish"] == {"paused_by_this_run": True}
    assert ev["release_gate_evidence"]["publish_control"]["publish_unblocked"] is False


def test_failure_evidence_that_cannot_be_written_surfaces_with_the_failure(
        spark: Any, base_lake: Path, tmp_path: Path, monkeypatch: Any) -> None:
    root = copy_lake(base_lake, tmp_path / "lake")
    plan = write_plan(root, lambda p: p["targets"][0].update(
        transform={"callable": "tests.integration.test_run_engine:not_a_frame"}))

    def broken(*_a: Any, **_k: Any) -> str:
        raise OSError("disk full")

    monkeypatch.setattr(finish, "write_evidence", broken)
    with pytest.raises(FailureEvidenceError) as err:
        _run(spark, plan)
    text = str(err.value)
    assert "returned list" in text and "disk full" in text
    assert err.value.exit_code == EXIT_RUNTIME
    (prog,) = Ledger(spark, str(root / "_sg")).latest_runs()
    assert prog.state == "failed"


def test_a_failed_restore_does_not_hide_the_error_that_caused_it(
        spark: Any, base_lake: Path, tmp_path: Path, monkeypatch: Any) -> None:
    root = copy_lake(base_lake, tmp_path / "lake")
    plan = write_plan(root)
    target, home = root / "target" / "orders_clean", str(root / "_sg")
    def boom(_name: str) -> None:
        raise RuntimeError("boom after verification")

    def restore_broken(*_a: Any, **_k: Any) -> None:
        raise RuntimeError("restore broke")

    on_failpoint(monkeypatch, faults, "after_verify", boom)
    monkeypatch.setattr(undo.delta_ops, "restore", restore_broken)
    with pytest.raises(RestoreFailedError) as err:
        _run(spark, plan)
    text = str(err.value)
    assert "boom after verification" in text and "restore broke" in text
    assert isinstance(err.value.cause, RuntimeError)
    (prog,) = Ledger(spark, home).latest_runs()
    assert prog.state == "failed" and "boom after verification" in (prog.error or "")
    assert is_paused(spark, str(target), home)
    assert evaluator.FailureEvidenceError is FailureEvidenceError


def test_resume_after_the_promotion_commit_names_the_true_last_step(
        spark: Any, base_lake: Path, tmp_path: Path, monkeypatch: Any) -> None:
    root = copy_lake(base_lake, tmp_path / "lake")
    plan = write_plan(root)
    dies_at(monkeypatch, faults, "after_promote_commit", lambda: _run(spark, plan))
    lines: list[str] = []
    out = _run(spark, plan, lines)
    assert out.exit_code == 0, out.message
    (resumed,) = [ln for ln in lines if "resuming run" in ln]
    assert "last state proof_passed" not in resumed
    assert "last step promotion commit of orders_clean at version" in resumed
    assert "the ledger's newest event is promoting orders_clean" in resumed
