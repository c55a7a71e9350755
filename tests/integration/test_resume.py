"""Resume after a failure: reconciled slices skipped, a half-written slice rewritten, and the
promotion exactly once even after a crash between the commit and its ledger row."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from chispa import assert_df_equality
from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sparkguard import faults
from sparkguard.demo import transform_orders
from sparkguard.errors import ConcurrentRunError
from sparkguard.ledger import Ledger, run_progress
from sparkguard.plan import load_plan
from sparkguard.publish import is_paused
from sparkguard.run.evaluator import run_backfill
from sparkguard.run.report import RunOutcome
from sparkguard.run.stages import RunOptions
from tests.failpoints import Crash, dies_at, fails_once_at, on_failpoint
from tests.lakes import WINDOW, copy_lake, lock_key_of, write_plan

pytestmark = pytest.mark.spark
FAIL_ON: set[str] = set()


def flaky_transform(spark: SparkSession, source: DataFrame, partitions: list[object]) -> DataFrame:
    """The demo transform; raises for a partition listed in FAIL_ON (a bug fixed later)."""
    bad = FAIL_ON & {str(p) for p in partitions}
    if bad:
        raise RuntimeError(f"transform bug on {sorted(bad)}")
    return transform_orders(spark, source, partitions)



def _run(spark: Any, plan: Path) -> RunOutcome:
    root = plan.parent
    return run_backfill(spark, load_plan(plan), str(plan), home=str(root / "_sg"),
                        evidence_dir=str(root / "evidence"), out=lambda _m: None)


def _history(spark: Any, path: Path) -> list[dict[str, Any]]:
    rows = DeltaTable.forPath(spark, str(path)).history().orderBy("version").collect()
    return [r.asDict() for r in rows]


def _expected(spark: Any, root: Path) -> DataFrame:
    src = spark.read.format("delta").load(str(root / "source" / "orders"))
    return transform_orders(spark, src, []).orderBy("order_date", "order_id")


def test_failure_on_slice_3_then_fix_and_rerun_redoes_only_the_unfinished_wave(
        spark: Any, base_lake: Path, tmp_path: Path) -> None:
    root = copy_lake(base_lake, tmp_path / "lake")
    plan = write_plan(root, lambda p: (p["targets"][0].update(
        transform={"callable": "tests.integration.test_resume:flaky_transform"}),
        p["execution"].update(max_concurrent_slices=2)))  # slices 2 and 3 side by side
    target, home = root / "target" / "orders_clean", str(root / "_sg")
    FAIL_ON.add(str(WINDOW[2]))
    try:
        with pytest.raises(RuntimeError, match="transform bug"):
            _run(spark, plan)
    finally:
        FAIL_ON.clear()
    led = Ledger(spark, home)
    (prog,) = led.latest_runs()
    assert prog.state == "failed" and "transform bug" in (prog.error or "")
    # slices 2 and 3 form one wave: it did not finish, so nothing of it is recorded
    assert [(s["slice_id"], s["state"]) for s in led.slice_events(prog.run_id)] == [
        (1, "reconciled")]
    assert is_paused(spark, str(target), home)  # a failed run keeps publish paused
    assert led.lock_holder(lock_key_of(spark, target)) is None  # and released its lock
    shadow = Path(home) / "shadow"
    shadow_path = next(shadow.glob("*/*/orders_clean"))
    # a half-written slice 3: junk rows in its partition, no ledger row
    junk = spark.read.format("delta").load(str(shadow_path)).limit(5).withColumn(
        "order_date", F.lit(WINDOW[2])).withColumn("order_id", F.col("order_id") + 10 ** 9)
    junk.write.format("delta").mode("append").save(str(shadow_path))
    writes_before = [h for h in _history(spark, shadow_path) if h["userMetadata"]]

    out = _run(spark, plan)
    assert out.exit_code == 0, out.message
    assert out.run_id == prog.run_id  # the same run, resumed
    st = out.targets["orders_clean"]
    assert sorted(st.skipped_slices) == [1]
    # only the unfinished wave was written again (two slices side by side: two commits), the
    # proof slice was not rewritten; the junk in slice 3's partition is gone (content below)
    new_writes = [h for h in _history(spark, shadow_path) if h["userMetadata"]][
        len(writes_before):]
    assert sorted('"slice": 3' in h["userMetadata"] for h in new_writes) == [False, True]
    assert not any('"slice": 1' in h["userMetadata"] for h in new_writes)
    assert_df_equality(spark.read.format("delta").load(str(target))
                       .orderBy("order_date", "order_id"), _expected(spark, root),
                       ignore_nullable=True)
    events = [e["state"] for e in led.run_events(prog.run_id)]
    assert events[:4] == ["started", "paused", "proof_passed", "failed"]
    assert events[4:] == ["resumed", "paused", "reconciled", "promoting", "promoted", "verified",
                          "done"]


def _one_slice(plan: dict[str, Any]) -> None:
    plan["execution"]["slice_partitions"] = 3


def test_crash_after_the_promotion_commit_does_not_promote_twice(
        spark: Any, base_lake: Path, tmp_path: Path, monkeypatch: Any) -> None:
    """The driver dies after the commit, before its ledger row (the crash suite covers the
    other failpoints through spark-submit)."""
    where = "after_promote_commit"
    root = copy_lake(base_lake, tmp_path / "lake")
    plan = write_plan(root, _one_slice)
    target, home = root / "target" / "orders_clean", str(root / "_sg")
    v0 = _history(spark, target)[-1]["version"]
    dies_at(monkeypatch, faults, where, lambda: _run(spark, plan))
    led = Ledger(spark, home)
    (crashed,) = led.latest_runs()
    last = run_progress(led.run_events(crashed.run_id))
    assert last.targets["orders_clean"].promoted_version is None  # the ledger never heard
    assert last.targets["orders_clean"].rollback_version == v0

    out = _run(spark, plan)
    assert out.exit_code == 0 and out.run_id == crashed.run_id
    promotes = [h for h in _history(spark, target) if h["version"] > v0]
    assert [h["version"] for h in promotes] == [v0 + 1], "promoted exactly once"
    assert '"action": "promote"' in promotes[0]["userMetadata"]
    prog = run_progress(led.run_events(crashed.run_id))
    assert prog.state == "done"
    assert (prog.targets["orders_clean"].promoted_version,
            prog.targets["orders_clean"].rollback_version) == (v0 + 1, v0)
    assert prog.targets["orders_clean"].verified
    assert_df_equality(spark.read.format("delta").load(str(target))
                       .orderBy("order_date", "order_id"), _expected(spark, root),
                       ignore_nullable=True)
    # the resumed run reconciled against the version before its promotion: the change
    # preview still shows the repair rather than "no change"
    assert out.targets["orders_clean"].window is not None
    preview = out.targets["orders_clean"].window.preview
    assert preview is not None and preview.changed > 0
    assert not is_paused(spark, str(target), home)


def test_dry_run_slices_are_reused_by_the_real_run(spark: Any, base_lake: Path,
                                                   tmp_path: Path) -> None:
    root = copy_lake(base_lake, tmp_path / "lake")
    plan = write_plan(root, lambda p: p["execution"].update(slice_partitions=2,
                                                            dry_run_completed=True))
    target, home = root / "target" / "orders_clean", str(root / "_sg")
    v0 = _history(spark, target)[-1]["version"]
    dry = run_backfill(spark, load_plan(plan), str(plan), home=home,
                       evidence_dir=str(root / "evidence"), out=lambda _m: None,
                       options=RunOptions(dry_run=True))
    assert dry.exit_code == 0
    assert _history(spark, target)[-1]["version"] == v0  # target untouched
    assert not (Path(home) / "control").exists()  # publish state untouched by a dry run
    led = Ledger(spark, home)
    dry_prog = run_progress(led.run_events(dry.run_id))
    assert dry_prog.state == "dry_run_passed" and dry_prog.dry_run
    lines: list[str] = []
    out = run_backfill(spark, load_plan(plan), str(plan), home=home,
                       evidence_dir=str(root / "evidence"), out=lines.append)
    assert out.exit_code == 0 and out.run_id != dry.run_id
    assert sorted(out.targets["orders_clean"].skipped_slices) == [1, 2]
    started = led.run_events(out.run_id)[0]["details"]
    assert started["dry_run_claim"]["recorded_run_id"] == dry.run_id
    assert any(f"dry run of this exact plan recorded in the ledger: run {dry.run_id}" in ln
               for ln in lines)


def test_a_run_restored_after_promoting_then_killed_before_promoting_again_still_promotes(
        spark: Any, base_lake: Path, tmp_path: Path, monkeypatch: Any) -> None:
    """Promoted, then a runtime failure restored the target; the re-run records a new rollback
    point and dies before its promotion; the next re-run must not reuse the first promotion's
    txnVersion (Delta would skip the write as a duplicate, on every re-run)."""
    root = copy_lake(base_lake, tmp_path / "lake")
    plan = write_plan(root, _one_slice)
    target, home = root / "target" / "orders_clean", str(root / "_sg")
    v0 = _history(spark, target)[-1]["version"]
    fails_once_at(monkeypatch, faults, "after_verify", "storage hiccup after the verification")
    with pytest.raises(RuntimeError, match="storage hiccup"):
        _run(spark, plan)
    (first,) = Ledger(spark, home).latest_runs()
    assert first.state == "failed" and first.targets["orders_clean"].restored
    on_failpoint(monkeypatch, faults, "before_promote", times=1)
    with pytest.raises(Crash):
        _run(spark, plan)
    out = _run(spark, plan)
    assert out.exit_code == 0 and out.run_id == first.run_id, out.message
    ops = [(h["operation"], h["userMetadata"] or "") for h in _history(spark, target)
           if h["version"] > v0]
    assert [o for o, _m in ops] == ["WRITE", "RESTORE", "WRITE"]
    assert '"promote"' in ops[2][1]
    prog = run_progress(Ledger(spark, home).run_events(out.run_id))
    assert prog.state == "done" and prog.targets["orders_clean"].promoted_version == v0 + 3
    assert_df_equality(spark.read.format("delta").load(str(target))
                       .orderBy("order_date", "order_id"), _expected(spark, root),
                       ignore_nullable=True)


def test_a_failure_after_publish_reopened_keeps_the_verified_promotion_and_the_rerun_finishes(
        spark: Any, base_lake: Path, tmp_path: Path, monkeypatch: Any) -> None:
    """Every target promoted and verified, the evidence written, publish reopened; then
    recording the end fails. Downstream may already read the new data: the run must not
    restore it behind their back; the re-run records the run as done without promoting again."""
    root = copy_lake(base_lake, tmp_path / "lake")
    plan = write_plan(root, _one_slice)
    target, home = root / "target" / "orders_clean", str(root / "_sg")
    v0 = _history(spark, target)[-1]["version"]
    fails_once_at(monkeypatch, faults, "mid_publish_resume", "ledger storage hiccup")
    with pytest.raises(RuntimeError, match="ledger storage hiccup"):
        _run(spark, plan)
    (failed,) = Ledger(spark, home).latest_runs()
    assert failed.state == "failed" and not failed.targets["orders_clean"].restored
    assert [h["operation"] for h in _history(spark, target) if h["version"] > v0] == ["WRITE"]
    assert_df_equality(spark.read.format("delta").load(str(target))
                       .orderBy("order_date", "order_id"), _expected(spark, root),
                       ignore_nullable=True)
    out = _run(spark, plan)
    assert out.exit_code == 0 and out.run_id == failed.run_id, out.message
    assert [h["operation"] for h in _history(spark, target) if h["version"] > v0] == ["WRITE"]
    assert run_progress(Ledger(spark, home).run_events(out.run_id)).state == "done"
    assert not is_paused(spark, str(target), home)


def test_a_run_finished_by_another_process_while_the_ledger_was_read_is_not_resumed_again(
        spark: Any, base_lake: Path, tmp_path: Path, monkeypatch: Any) -> None:
    """A re-run reads the ledger while another process is finishing the stopped run; by the
    time the lock is free that run is done. Resuming it from the stale read would see its own
    promotion as another writer's change and fail it; the re-run reads again: nothing to do."""
    root = copy_lake(base_lake, tmp_path / "lake")
    plan = write_plan(root, _one_slice)
    target, home = root / "target" / "orders_clean", str(root / "_sg")
    v0 = _history(spark, target)[-1]["version"]
    dies_at(monkeypatch, faults, "mid_reconcile", lambda: _run(spark, plan))
    (stopped,) = Ledger(spark, home).latest_runs()
    real_acquire = Ledger.acquire
    calls: list[int] = []
    others: list[RunOutcome] = []

    def acquire(self: Ledger, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:  # the other process finishes the run just before this one locks
            others.append(_run(spark, plan))
        return real_acquire(self, *args, **kwargs)

    monkeypatch.setattr(Ledger, "acquire", acquire)
    out = _run(spark, plan)
    assert others[0].exit_code == 0 and others[0].run_id == stopped.run_id
    assert out.exit_code == 0 and out.run_id == stopped.run_id, out.message
    assert "already done" in out.message
    assert [h["operation"] for h in _history(spark, target) if h["version"] > v0] == ["WRITE"]
    assert run_progress(Ledger(spark, home).run_events(stopped.run_id)).state == "done"
    assert not is_paused(spark, str(target), home)


def test_a_promoted_run_whose_publish_was_not_reopened_says_so_in_its_evidence(
        spark: Any, base_lake: Path, tmp_path: Path, monkeypatch: Any) -> None:
    """The evidence is written before publish is reopened; when reopening fails the run ends
    failed with publish paused, and its evidence used to say publish was unblocked. The re-run
    reopens it and writes the evidence again."""
    import yaml

    root = copy_lake(base_lake, tmp_path / "lake")
    plan = write_plan(root, _one_slice)
    target, home = root / "target" / "orders_clean", str(root / "_sg")
    fails_once_at(monkeypatch, faults, "before_publish_resume", "control table unreachable")
    with pytest.raises(RuntimeError, match="control table unreachable"):
        _run(spark, plan)
    assert is_paused(spark, str(target), home)
    (evidence,) = (root / "evidence").glob("*.yaml")
    data = yaml.safe_load(evidence.read_text(encoding="utf-8"))
    assert data["sparkguard"]["outcome"] == "promoted"
    assert data["release_gate_evidence"]["publish_control"]["publish_unblocked"] is False
    assert "publish was not reopened" in data["sparkguard"]["error"]
    assert "publish unblocked: no" in evidence.with_suffix(".md").read_text(encoding="utf-8")
    out = _run(spark, plan)
    assert out.exit_code == 0 and not is_paused(spark, str(target), home)
    data = yaml.safe_load(evidence.read_text(encoding="utf-8"))
    assert data["release_gate_evidence"]["publish_control"]["publish_unblocked"] is True
    assert data["sparkguard"]["error"] is None


def test_a_dry_run_does_not_take_over_a_real_run_that_paused_publish(
        spark: Any, base_lake: Path, tmp_path: Path, monkeypatch: Any) -> None:
    """A real run dies right after pausing publish; a dry run of the same plan used to resume
    it and record dry_run_passed (terminal) with the hold still set: publish stayed paused under
    a finished run, and its evidence said publish was unblocked. It is refused, nothing written;
    the real re-run finishes and reopens publish."""
    root = copy_lake(base_lake, tmp_path / "lake")
    plan = write_plan(root, _one_slice)
    target, home = root / "target" / "orders_clean", str(root / "_sg")
    on_failpoint(monkeypatch, faults, "after_pause", times=1)
    with pytest.raises(Crash):
        _run(spark, plan)
    led = Ledger(spark, home)
    (killed,) = led.latest_runs()
    events = len(led.run_events(killed.run_id))
    with pytest.raises(ConcurrentRunError, match="re-run without --dry-run") as refused:
        run_backfill(spark, load_plan(plan), str(plan), home=home,
                     evidence_dir=str(root / "evidence"), out=lambda _m: None,
                     options=RunOptions(dry_run=True))
    assert refused.value.exit_code == 2
    assert len(led.run_events(killed.run_id)) == events  # nothing recorded for it
    assert [r.run_id for r in led.latest_runs()] == [killed.run_id]
    assert is_paused(spark, str(target), home)
    out = _run(spark, plan)
    assert out.exit_code == 0 and out.run_id == killed.run_id, out.message
    assert not is_paused(spark, str(target), home)
