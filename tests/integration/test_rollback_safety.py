"""Rollback: restores and verifies, refuses when others committed after the promotion (unless
--force) or when VACUUM removed files the recorded version needs (checked before RESTORE),
records itself in ledger and evidence, and finishes after a crash without restoring twice."""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from chispa import assert_df_equality
from delta.tables import DeltaTable
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sparkguard import delta_ops, rollback
from sparkguard.cli import main
from sparkguard.demo import START, transform_orders
from sparkguard.ledger import Ledger, run_progress
from sparkguard.publish import PublishControl, is_paused
from sparkguard.sql import TableRef
from tests.failpoints import Crash, at_failpoint, dies_at
from tests.lakes import (
    WINDOW,
    copy_lake,
    count_descriptions,
    lock_key_of,
    newer_protocol,
    put_back,
    write_plan,
)

pytestmark = pytest.mark.spark



def _read(spark: Any, path: Path) -> DataFrame:
    return spark.read.format("delta").load(str(path)).orderBy("order_date", "order_id")


def _frozen(spark: Any, df: DataFrame) -> DataFrame:
    """``df``'s rows as of now. Not ``df.cache()``: a Delta write through the DataFrame API
    re-caches every cached read of the table, which then follows the table."""
    return spark.createDataFrame(df.collect(), df.schema).orderBy("order_date", "order_id")


def _history(spark: Any, path: Path) -> list[dict[str, Any]]:
    return [r.asDict() for r in DeltaTable.forPath(spark, str(path)).history()
            .orderBy("version").collect()]


@pytest.fixture(scope="module")
def promoted_once(spark: Any, base_lake: Path, tmp_path_factory: pytest.TempPathFactory
                  ) -> tuple[Path, Path, str, DataFrame]:
    """One successful backfill, run once for the module at a fixed path: (its lake, a copy of
    it, its run id, the target's content before it)."""
    root = copy_lake(base_lake, tmp_path_factory.mktemp("promoted") / "lake")
    plan = write_plan(root, lambda p: p["execution"].update(slice_partitions=3))
    before = _frozen(spark, _read(spark, root / "target" / "orders_clean"))
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(["run", "--plan", str(plan), "--home", str(root / "_sg"),
                     "--evidence-dir", str(root / "evidence")]) == 0
    (prog,) = Ledger(spark, str(root / "_sg")).latest_runs()
    snapshot = root.parent / "snapshot"
    shutil.copytree(root, snapshot)
    return root, snapshot, prog.run_id, before


Promoted = tuple[Path, str, DataFrame]


@pytest.fixture
def promoted(spark: Any, promoted_once: tuple[Path, Path, str, DataFrame]) -> Promoted:
    """The lake after that backfill, as it was: (root, run id, target content before it)."""
    root, snapshot, run_id, before = promoted_once
    return put_back(spark, snapshot, root), run_id, before


def _rollback(root: Path, run_id: str, *extra: str) -> int:
    return main(["rollback", "--run-id", run_id, "--home", str(root / "_sg"), *extra])


def test_rollback_restores_verifies_records_and_is_idempotent(
        spark: Any, promoted: Promoted, tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    root, run_id, before = promoted
    target = root / "target" / "orders_clean"
    events = tmp_path / "events.jsonl"
    monkeypatch.setenv("SPARKGUARD_NOTIFY_FILE", str(events))
    n0 = len(_history(spark, target))
    described = count_descriptions(monkeypatch)
    assert _rollback(root, run_id) == 0
    assert described[str(target)] == 1  # for its lock; the publish hold records that location
    assert_df_equality(_read(spark, target), before, ignore_nullable=True)
    last = _history(spark, target)[-1]
    assert last["operation"] == "RESTORE" and len(_history(spark, target)) == n0 + 1
    assert delta_ops.commit_metadata(last["userMetadata"])["action"] == "rollback"  # type: ignore[index]
    prog = run_progress(Ledger(spark, str(root / "_sg")).run_events(run_id))
    assert prog.state == "rolled_back"
    ev = yaml.safe_load((root / "evidence" / f"{run_id}.yaml").read_text())
    (rb,) = ev["sparkguard"]["rollbacks"]
    assert rb["targets"][0]["verified"] is True
    assert rb["targets"][0]["new_version"] == last["version"]
    assert "Rolled back" in (root / "evidence" / f"{run_id}.md").read_text()
    note = json.loads(events.read_text().splitlines()[-1])
    assert note["event"] == "rolled_back" and note["recipients"] == ["finance-bi", "ops-analytics"]
    # again: nothing to do, no new commit
    assert _rollback(root, run_id) == 0
    assert len(_history(spark, target)) == n0 + 1
    assert _rollback(root, "20260101T000000Z-nope0000") == 2
    assert "not in the ledger" in capsys.readouterr().err


def test_rollback_refused_when_others_committed_unless_forced_and_finished_after_a_crash(
        spark: Any, promoted: Promoted, tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    root, run_id, before = promoted
    target, home = root / "target" / "orders_clean", str(root / "_sg")
    DeltaTable.forPath(spark, str(target)).update(F.col("order_id") == 1_000_001,
                                                  {"status": F.lit("late-fix")})
    n = len(_history(spark, target))
    assert _rollback(root, run_id) == 2
    err = capsys.readouterr().err
    other = _history(spark, target)[-1]["version"]
    assert f"v{other} UPDATE" in err and "--force" in err and "nothing restored" in err
    assert len(_history(spark, target)) == n  # nothing restored
    assert run_progress(Ledger(spark, home).run_events(run_id)).state == "done"
    # forced, and the process dies right after the RESTORE commit
    dies_at(monkeypatch, rollback, "after_rollback_restore",
            lambda: rollback.rollback_run(spark, home, run_id, force=True, out=lambda _m: None))
    assert run_progress(Ledger(spark, home).run_events(run_id)).state == "rolling_back"
    assert len(_history(spark, target)) == n + 1
    # the command again (without --force: nothing left to force) finds its RESTORE and
    # finishes without a second one
    assert _rollback(root, run_id) == 0
    assert len(_history(spark, target)) == n + 1
    assert_df_equality(_read(spark, target), before, ignore_nullable=True)  # late fix undone
    events = Ledger(spark, home).run_events(run_id)
    assert run_progress(events).state == "rolled_back"
    rolling = next(e for e in events if e["state"] == "rolling_back")["details"]
    assert rolling["forced"] is True and rolling["undone_commits"] == {"orders_clean": [str(other)]}
    # the record of the end still says the rollback was forced and undid their commit (it
    # said forced: false and no commit of others undone)
    done = events[-1]["details"]
    assert done["forced"] is True
    assert [r["undone_commits_of_others"] for r in done["rolled_back"]] == [[other]]


def test_rollback_refused_before_restore_when_vacuum_removed_needed_files(
        spark: Any, promoted: Promoted, tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    root, run_id, _before = promoted
    target = root / "target" / "orders_clean"
    prog = run_progress(Ledger(spark, str(root / "_sg")).run_events(run_id))
    point = prog.targets["orders_clean"].rollback_version
    assert point is not None
    ref = TableRef(path=str(target))
    assert delta_ops.missing_files_for_version(spark, ref, point) == []
    key = "spark.databricks.delta.retentionDurationCheck.enabled"
    old = spark.conf.get(key, None)
    spark.conf.set(key, "false")  # this test only: let VACUUM remove everything unreferenced
    try:
        spark.sql(f"VACUUM delta.`{target}` RETAIN 0 HOURS")
    finally:
        spark.conf.set(key, old) if old is not None else spark.conf.unset(key)
    missing = delta_ops.missing_files_for_version(spark, ref, point)
    assert missing and all(str(target) in m for m in missing)
    n = len(_history(spark, target))
    assert _rollback(root, run_id) == 2
    err = capsys.readouterr().err
    assert f"version {point} can no longer be restored" in err and "VACUUM" in err
    assert len(_history(spark, target)) == n  # no RESTORE
    assert run_progress(Ledger(spark, str(root / "_sg")).run_events(run_id)).state == "done"
    # where the storage refuses to list a table's folders (Unity Catalog and a managed table's
    # location), the listing names nothing, and reading the recorded version refuses instead
    from sparkguard.delta_ops import files

    monkeypatch.setattr(files, "_file_names", lambda _s, _f: None)
    assert delta_ops.missing_files_for_version(spark, ref, point) == []
    assert _rollback(root, run_id) == 2
    err = capsys.readouterr().err
    assert f"version {point} can no longer be restored" in err and any(m in err for m in missing)
    assert len(_history(spark, target)) == n


@pytest.mark.parametrize("policy", ["delete", "keep"])
def test_merge_promotion_handles_rows_no_longer_produced(
        spark: Any, base_lake: Path, tmp_path: Path, policy: str) -> None:
    from sparkguard.plan import load_plan
    from sparkguard.run.evaluator import run_backfill

    root = copy_lake(base_lake, tmp_path / "lake")
    target = root / "target" / "orders_clean"
    src = spark.read.format("delta").load(str(root / "source" / "orders"))
    stray = transform_orders(spark, src.filter(F.col("order_date") == F.lit(WINDOW[1])).limit(4),
                             []).withColumn("order_id", F.col("order_id") + 10 ** 8)
    stray.write.format("delta").mode("append").save(str(target))  # rows the source lacks
    plan = write_plan(root, lambda p: (p["targets"][0].update(
        merge={"when_not_matched_by_source": policy}), p["execution"].update(slice_partitions=3)),
        promotion="merge")
    lines: list[str] = []
    out = run_backfill(spark, load_plan(plan), str(plan), home=str(root / "_sg"),
                       evidence_dir=str(root / "evidence"), out=lines.append)
    assert out.exit_code == 0, out.message
    window = out.targets["orders_clean"].window
    assert window is not None and window.preview is not None
    assert window.preview.deleted == 4  # the preview shows them either way
    kept = spark.read.format("delta").load(str(target)).filter(F.col("order_id") >= 10 ** 8)
    assert kept.count() == (4 if policy == "keep" else 0)
    expected = transform_orders(spark, src, [])
    if policy == "keep":
        expected = expected.unionByName(stray)
    assert_df_equality(_read(spark, target), expected.orderBy("order_date", "order_id"),
                       ignore_nullable=True)
    preview_line = next(ln for ln in lines if "change preview orders_clean:" in ln)
    assert ("kept (merge.when_not_matched_by_source: keep)" in preview_line) == (policy == "keep")
    assert [h["operation"] for h in _history(spark, target)][-1] == "MERGE"


def test_rollback_refused_while_a_run_holds_the_target_lock(
        spark: Any, promoted: Promoted, tmp_path: Path, capsys: Any) -> None:
    """Rollback takes the same per-target lock as a run: a backfill holding it (alive, here
    this very process) refuses the rollback with exit 2, nothing restored; once it releases,
    the rollback goes ahead and leaves the lock free."""
    root, run_id, before = promoted
    target, home = root / "target" / "orders_clean", str(root / "_sg")
    running, key = Ledger(spark, home), lock_key_of(spark, target)
    running.acquire([key], "20270101T000000Z-running0", "someone-else")
    n = len(_history(spark, target))
    assert _rollback(root, run_id) == 2
    err = capsys.readouterr().err
    assert "20270101T000000Z-running0" in err and "locked" in err
    assert len(_history(spark, target)) == n  # no RESTORE
    assert run_progress(Ledger(spark, home).run_events(run_id)).state == "done"
    running.release([key], "20270101T000000Z-running0")
    assert _rollback(root, run_id) == 0
    assert_df_equality(_read(spark, target), before, ignore_nullable=True)
    assert Ledger(spark, home).lock_holder(key) is None  # the rollback released it


def test_a_commit_landing_between_the_check_and_restore_refuses_the_restore(
        spark: Any, promoted: Promoted, tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    """A writer outside sparkguard commits after the rollback checked the history: the history
    is read again right before RESTORE, which is refused (exit 2); the commit survives."""
    root, run_id, _before = promoted
    target = root / "target" / "orders_clean"
    def late_writer(_name: str) -> None:
        DeltaTable.forPath(spark, str(target)).update(F.col("order_id") == 1_000_001,
                                                      {"status": F.lit("late-fix")})

    with at_failpoint(monkeypatch, rollback, "mid_rollback", late_writer):
        assert _rollback(root, run_id) == 2
    err = capsys.readouterr().err
    late = _history(spark, target)[-1]
    assert late["operation"] == "UPDATE"  # no RESTORE after it
    assert f"v{late['version']} UPDATE" in err and "RESTORE refused" in err
    assert _read(spark, target).filter(F.col("status") == "late-fix").count() == 1
    # the lock is free again, and a re-run sees the commit at its first check
    assert _rollback(root, run_id) == 2
    assert "--force" in capsys.readouterr().err
    # forced, and another append lands after the last check, just before the RESTORE: the
    # RESTORE undoes it, and the rollback says so loudly (exit 1, publish stays paused)
    real_restore = delta_ops.restore

    def restore_after_an_append(*args: Any, **kwargs: Any) -> None:
        _append_outside_window(spark, target)
        real_restore(*args, **kwargs)

    monkeypatch.setattr(delta_ops, "restore", restore_after_an_append)
    assert _rollback(root, run_id, "--force") == 1
    err = capsys.readouterr().err
    appended, restored = _history(spark, target)[-2:]
    assert (appended["operation"], restored["operation"]) == ("WRITE", "RESTORE")
    assert f"v{appended['version']} WRITE" in err and "undid them" in err
    assert is_paused(str(root / "_sg"), str(target))
    # the operator re-runs it: the target is rolled back, publish reopens, and the record (the
    # ledger's rolled_back event, the evidence) still names the commit the RESTORE undid
    monkeypatch.setattr(delta_ops, "restore", real_restore)
    assert _rollback(root, run_id, "--force") == 0
    events = Ledger(spark, str(root / "_sg")).run_events(run_id)
    (last,) = [e for e in events if e["state"] == "rolled_back"]
    (point,) = last["details"]["rolled_back"]
    assert appended["version"] in point["undone_commits_of_others"]
    assert not is_paused(str(root / "_sg"), str(target))


def _append_outside_window(spark: Any, target: Path) -> int:
    """Another writer appends 3 rows on a day outside the plan window (order ids >= 10**8)."""
    rows = (spark.read.format("delta").load(str(target))
            .filter(F.col("order_date") == F.lit(START)).limit(3)
            .withColumn("order_id", F.col("order_id") + 10 ** 8))
    rows.write.format("delta").mode("append").save(str(target))
    return 3


def _dies(*_a: object, **_k: object) -> None:
    raise Crash("killed")


def _appended(spark: Any, target: Path) -> int:
    return _read(spark, target).filter(F.col("order_id") >= 10 ** 8).count()


def _others_removed(spark: Any, target: Path) -> DataFrame:
    return _read(spark, target).filter(F.col("order_id") < 10 ** 8)


def test_a_rollback_stopped_after_its_restore_is_finished_by_rollback_not_undone_by_run(
        spark: Any, promoted: Promoted, tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    """A rollback killed after its RESTORE leaves the run in ``rolling_back``: ``run`` refuses
    it (exit 2, nothing written) instead of promoting again; a later commit by another writer
    does not stop the rollback's re-run from verifying its own RESTORE and finishing."""
    root, run_id, before = promoted
    target, home = root / "target" / "orders_clean", str(root / "_sg")
    dies_at(monkeypatch, rollback, "after_rollback_restore",
            lambda: rollback.rollback_run(spark, home, run_id, out=lambda _m: None))
    assert run_progress(Ledger(spark, home).run_events(run_id)).state == "rolling_back"
    assert is_paused(home, str(target))  # the rollback's hold stays while it is unfinished
    history, events = _history(spark, target), Ledger(spark, home).run_events(run_id)
    # `run` of the same plan must not resume the run and promote it again
    assert main(["run", "--plan", str(root / "plan.yaml"), "--home", home,
                 "--evidence-dir", str(root / "evidence")]) == 2
    err = capsys.readouterr().err
    assert run_id in err and f"sparkguard rollback --run-id {run_id}" in err
    assert "nothing was written" in err
    assert _history(spark, target) == history
    assert Ledger(spark, home).run_events(run_id) == events
    # another writer commits after the RESTORE; the re-run verifies that RESTORE and finishes
    appended = _append_outside_window(spark, target)
    assert _rollback(root, run_id) == 0
    assert run_progress(Ledger(spark, home).run_events(run_id)).state == "rolled_back"
    assert _appended(spark, target) == appended
    assert_df_equality(_others_removed(spark, target), before, ignore_nullable=True)
    assert [h["operation"] for h in _history(spark, target)].count("RESTORE") == 1
    assert not is_paused(home, str(target))


def test_rollback_pauses_publish_until_it_finishes_and_verifies_its_own_restore(
        spark: Any, promoted: Promoted, tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    """A rollback stopped half-way keeps its publish hold on the target; the re-run that
    finishes releases it. A writer committing between the RESTORE and its verification does
    not fail it: the RESTORE commit itself is compared with the rollback point."""
    root, run_id, before = promoted
    target, home = root / "target" / "orders_clean", str(root / "_sg")
    assert not is_paused(home, str(target))
    dies_at(monkeypatch, rollback, "mid_rollback",
            lambda: rollback.rollback_run(spark, home, run_id, out=lambda _m: None))
    assert is_paused(home, str(target))
    # the re-run: another writer appends between the RESTORE and its verification; the
    # process then dies after recording rolled_back, before releasing the hold
    with (at_failpoint(monkeypatch, rollback, "after_rollback_restore",
                       lambda _n: _append_outside_window(spark, target)),
          monkeypatch.context() as mp, pytest.raises(Crash)):
        mp.setattr(PublishControl, "finish", _dies)
        _rollback(root, run_id)
    events = Ledger(spark, home).run_events(run_id)
    assert run_progress(events).state == "rolled_back"
    restore, append = _history(spark, target)[-2:]
    assert (restore["operation"], append["operation"]) == ("RESTORE", "WRITE")
    (verified,) = events[-1]["details"]["rolled_back"]  # the RESTORE commit was verified
    assert verified["new_version"] == restore["version"] and verified["verified"] is True
    assert is_paused(home, str(target))  # died before releasing: publish stays paused
    # the same command again: nothing to restore; the hold is released, and the evidence
    # gets the rollback it had not recorded yet
    assert _rollback(root, run_id) == 0
    assert not is_paused(home, str(target))
    ev = yaml.safe_load((root / "evidence" / f"{run_id}.yaml").read_text())
    (rb,) = ev["sparkguard"]["rollbacks"]
    assert rb["targets"][0]["verified"] is True
    assert rb["targets"][0]["new_version"] == restore["version"]
    assert _appended(spark, target) == 3
    assert_df_equality(_others_removed(spark, target), before, ignore_nullable=True)



def test_rollback_of_a_target_a_newer_delta_upgraded_says_so_and_writes_nothing(
        spark: Any, promoted: Promoted, capsys: Any) -> None:
    """After the run, a newer Delta gave the target a reader feature this one does not know:
    the rollback cannot read it. It fails with Delta's reason and what to do, no Java stack
    trace, and writes nothing (no RESTORE, no publish pause, the run still done)."""
    root, run_id, _before = promoted
    target = root / "target" / "orders_clean"
    version = newer_protocol(spark, target, reader=True)
    capsys.readouterr()
    assert _rollback(root, run_id) == 3
    err = capsys.readouterr().err
    assert "this client's Delta cannot use a table" in err and "futureReaderFeature" in err, err
    assert "Traceback" not in err and "Py4JJavaError" not in err
    assert max(int(p.stem) for p in (target / "_delta_log").glob("*.json")) == version
    assert not is_paused(spark, str(target), str(root / "_sg"))
    assert run_progress(Ledger(spark, str(root / "_sg")).run_events(run_id)).state == "done"


def test_a_folder_the_storage_will_not_list_is_read_instead(
        spark: Any, promoted: Promoted, capsys: Any, monkeypatch: Any) -> None:
    """Unity Catalog refuses path access to a managed table's folders, so the listing checks
    nothing there, and the rollback reads every file of the recorded version instead. OPTIMIZE
    outside the window (it changes no row, so it is no later commit to refuse) and VACUUM
    removed files the recorded version needs there: refused, nothing restored."""
    from sparkguard.delta_ops import files

    root, run_id, _before = promoted
    target, home = root / "target" / "orders_clean", str(root / "_sg")
    day = f"order_date={START}"
    # Z-ordering rewrites a partition's files, even one; then the rewritten file is removed
    # as a VACUUM would (one that runs over that partition only: the window's old files stay,
    # so reading the window alone would find nothing gone)
    old = set((target / day).glob("*.parquet"))
    spark.sql(f"OPTIMIZE delta.`{target}` WHERE order_date = DATE'{START}' ZORDER BY (order_id)")
    for f in old:
        f.unlink()
    point = run_progress(Ledger(spark, home).run_events(run_id)).targets[
        "orders_clean"].rollback_version
    assert point is not None
    ref = TableRef(path=str(target))
    gone = delta_ops.missing_files_for_version(spark, ref, point)
    assert gone and all(day in g for g in gone)  # listed: found
    monkeypatch.setattr(files, "_file_names", lambda _s, _f: None)  # the listing refused
    unlisted: list[str] = []
    assert delta_ops.missing_files_for_version(spark, ref, point, unlisted=unlisted) == []
    assert unlisted
    n = len(_history(spark, target))
    assert _rollback(root, run_id) == 2
    err = capsys.readouterr().err
    assert f"version {point} can no longer be restored" in err and any(g in err for g in gone)
    assert len(_history(spark, target)) == n
    assert not is_paused(home, str(target))


def _vacuum(spark: Any, target: Path) -> None:
    """VACUUM everything the current snapshot does not reference (this call only)."""
    key = "spark.databricks.delta.retentionDurationCheck.enabled"
    old = spark.conf.get(key, None)
    spark.conf.set(key, "false")
    try:
        spark.sql(f"VACUUM delta.`{target}` RETAIN 0 HOURS")
    finally:
        spark.conf.set(key, old) if old is not None else spark.conf.unset(key)


def _deletion_vectors(target: Path) -> set[str]:
    return {p.name for p in target.glob("deletion_vector_*.bin")}


def _with_deletion_vectors(spark: Any, base_lake: Path, root: Path, day: int
                           ) -> tuple[Path, str]:
    """The base lake with deletion vectors on its target, rows of one day deleted (one deletion
    vector file), and a merge_changed backfill promoted over it: the target, and the name of
    that deletion vector's file."""
    copy_lake(base_lake, root)
    target = root / "target" / "orders_clean"
    spark.sql(f"ALTER TABLE delta.`{target}` SET TBLPROPERTIES "
              "('delta.enableDeletionVectors' = 'true')")
    spark.sql(f"DELETE FROM delta.`{target}` WHERE order_id % 17 = 0 "
              f"AND order_date = DATE'{START + dt.timedelta(days=day)}'")
    (dv,) = _deletion_vectors(target)
    plan = write_plan(root, promotion="merge_changed")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(["run", "--plan", str(plan), "--home", str(root / "_sg"),
                     "--evidence-dir", str(root / "evidence")]) == 0
    return target, dv


def test_rollback_refused_when_vacuum_removed_a_deletion_vector_the_window_needs(
        spark: Any, base_lake: Path, tmp_path: Path, capsys: Any) -> None:
    """A merge_changed promotion marks rows of a file that already had a deletion vector: the
    file stays, its deletion vector is replaced, and VACUUM removes the old one. Every data file
    the recorded version lists is there, yet a RESTORE would commit a table no query can read:
    the rollback reads the recorded version first and refuses (exit 2, nothing restored)."""
    target, old_dv = _with_deletion_vectors(spark, base_lake, tmp_path / "lake", day=3)  # window
    (prog,) = Ledger(spark, str(tmp_path / "lake" / "_sg")).latest_runs()
    promoted = _frozen(spark, _read(spark, target))
    _vacuum(spark, target)
    assert old_dv not in _deletion_vectors(target)
    point = prog.targets["orders_clean"].rollback_version
    assert point is not None
    assert delta_ops.missing_files_for_version(spark, TableRef(path=str(target)), point) == []
    n = len(_history(spark, target))
    assert _rollback(tmp_path / "lake", prog.run_id) == 2
    err = capsys.readouterr().err
    assert f"version {point} can no longer be restored" in err and old_dv in err
    assert len(_history(spark, target)) == n  # no RESTORE
    assert_df_equality(_read(spark, target), promoted, ignore_nullable=True)  # still readable
    assert run_progress(Ledger(spark, str(tmp_path / "lake" / "_sg")).run_events(
        prog.run_id)).state == "done"


def test_a_forced_rollback_reads_the_whole_recorded_version_before_and_after_its_restore(
        spark: Any, base_lake: Path, tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    """Another writer deletes rows outside the window after the promotion, on a file with a
    deletion vector, and VACUUM removes the replaced one. A forced rollback (it undoes that
    DELETE) reads every file of the recorded version, not only the window: refused, nothing
    restored. When VACUUM runs between that check and the RESTORE, the verification reads the
    restored table, fails (exit 1, publish stays paused) and says which RESTORE takes the table
    back; that statement does."""
    root = tmp_path / "lake"
    target, old_dv = _with_deletion_vectors(spark, base_lake, root, day=0)  # outside the window
    spark.sql(f"DELETE FROM delta.`{target}` WHERE order_id % 19 = 0 "
              f"AND order_date = DATE'{START}'")
    (prog,) = Ledger(spark, str(root / "_sg")).latest_runs()
    snapshot = tmp_path / "snapshot"
    shutil.copytree(root, snapshot)
    before_rollback = _frozen(spark, _read(spark, target))
    _vacuum(spark, target)
    assert old_dv not in _deletion_vectors(target)
    n = len(_history(spark, target))
    assert _rollback(root, prog.run_id) == 2
    assert "--force" in capsys.readouterr().err
    assert _rollback(root, prog.run_id, "--force") == 2
    err = capsys.readouterr().err
    assert "can no longer be restored" in err and old_dv in err and "nothing was restored" in err
    assert len(_history(spark, target)) == n
    assert_df_equality(_read(spark, target), before_rollback, ignore_nullable=True)
    # the same lake before that VACUUM, which now lands between the check and the RESTORE
    put_back(spark, snapshot, root)
    real_restore = delta_ops.restore

    def vacuum_then_restore(*args: Any, **kwargs: Any) -> None:
        _vacuum(spark, target)
        real_restore(*args, **kwargs)

    monkeypatch.setattr(delta_ops, "restore", vacuum_then_restore)
    assert _rollback(root, prog.run_id, "--force") == 1
    err = capsys.readouterr().err
    restored = _history(spark, target)[-1]
    assert restored["operation"] == "RESTORE" and "cannot be read" in err and old_dv in err
    assert is_paused(str(root / "_sg"), str(target))
    back = f"RESTORE TABLE delta.`{target}` TO VERSION AS OF {restored['version'] - 1}"
    assert back in err
    # a re-run finds its RESTORE and reads every file of it (it cannot know what the first
    # attempt undid): it fails the same way, and neither records rolled_back nor reopens publish
    monkeypatch.setattr(delta_ops, "restore", real_restore)
    home = str(root / "_sg")
    assert _rollback(root, prog.run_id, "--force") == 1
    assert back in capsys.readouterr().err
    assert run_progress(Ledger(spark, home).run_events(prog.run_id)).state == "rolling_back"
    assert is_paused(home, str(target))
    spark.sql(back)
    assert_df_equality(_read(spark, target), before_rollback, ignore_nullable=True)
    # after that RESTORE by hand, a re-run still refuses to call the rollback done, and does not
    # advise restoring again (a commit now follows the rollback's RESTORE)
    assert _rollback(root, prog.run_id, "--force") == 1
    err = capsys.readouterr().err
    assert "history before restoring anything" in err and back not in err
    assert run_progress(Ledger(spark, home).run_events(prog.run_id)).state == "rolling_back"
    assert_df_equality(_read(spark, target), before_rollback, ignore_nullable=True)


def test_a_rollback_that_cannot_finish_is_abandoned_by_an_operator_with_a_reason(
        spark: Any, promoted: Promoted, tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    """A rollback stopped half-way, then VACUUM removed its rollback point's files: re-running
    it is refused for good, and the plan's runs are refused while it is ``rolling_back``.
    ``--abandon REASON`` closes it (``rollback_abandoned``, terminal) without restoring:
    ledger, evidence and a notification say where each target is; publish stays paused until
    an operator resumes it. It is refused, recording nothing, for a run not rolling_back."""
    root, run_id, _before = promoted
    target, home = root / "target" / "orders_clean", str(root / "_sg")
    events = tmp_path / "events.jsonl"
    monkeypatch.setenv("SPARKGUARD_NOTIFY_FILE", str(events))
    ledger = Ledger(spark, home)
    n_events = len(ledger.run_events(run_id))
    assert _rollback(root, run_id, "--abandon", "not needed") == 2  # the run is done
    assert "only a rollback that stopped" in capsys.readouterr().err
    assert len(ledger.run_events(run_id)) == n_events
    dies_at(monkeypatch, rollback, "mid_rollback",
            lambda: rollback.rollback_run(spark, home, run_id, out=lambda _m: None))
    _vacuum(spark, target)
    history = _history(spark, target)
    assert _rollback(root, run_id) == 2
    assert "can no longer be restored" in capsys.readouterr().err
    prog = run_progress(ledger.run_events(run_id))
    assert prog.state == "rolling_back" and is_paused(home, str(target))
    assert ledger.load(prog.fingerprint).resumable() is not None  # its plan's runs: refused
    # usage: a reason is required, and --force does not go with it
    assert _rollback(root, run_id, "--abandon", " ") == 2
    assert _rollback(root, run_id, "--abandon", "x", "--force") == 2
    capsys.readouterr()
    reason = "rollback point vacuumed; fixing forward with plan v2 (INC-42, 'Ops')"
    assert _rollback(root, run_id, "--abandon", reason) == 0
    out = capsys.readouterr().out
    assert "not restored by this rollback" in out and "sparkguard publish resume" in out
    assert _history(spark, target) == history  # nothing restored
    run_events = ledger.run_events(run_id)
    prog = run_progress(run_events)
    assert prog.state == "rollback_abandoned" and prog.terminal
    details = run_events[-1]["details"]
    assert details["reason"] == reason
    (left,) = details["targets"]
    assert left["restored_version"] is None
    assert left["current_version"] == history[-1]["version"]
    assert left["rollback_version"] == prog.targets["orders_clean"].rollback_version
    assert ledger.load(prog.fingerprint).resumable() is None  # the plan may run again
    assert is_paused(home, str(target))  # the operator decides when publish reopens
    ev = yaml.safe_load((root / "evidence" / f"{run_id}.yaml").read_text())
    assert ev["sparkguard"]["outcome"] == "rollback_abandoned"
    assert ev["sparkguard"]["rollbacks"][-1]["abandoned"] == reason
    md = (root / "evidence" / f"{run_id}.md").read_text()
    assert "Rollback abandoned" in md and "INC-42" in md and "not restored" in md
    note = json.loads(events.read_text().splitlines()[-1])
    assert note["event"] == "rollback_abandoned" and note["reason"] == reason
    assert main(["verify", "--run-id", run_id, "--home", home]) == 0  # chain and evidence hold
    capsys.readouterr()
    assert main(["status", "--run-id", run_id, "--home", home]) == 0
    shown = capsys.readouterr().out
    assert "rollback_abandoned" in shown and "sparkguard publish resume" in shown
    assert _rollback(root, run_id, "--abandon", reason) == 2  # once only
    assert "already abandoned" in capsys.readouterr().err
    assert _rollback(root, run_id) == 2  # trying the rollback again: still refused, as it was
    assert run_progress(ledger.run_events(run_id)).state == "rollback_abandoned"
    assert main(["publish", "resume", str(target), "--home", home, "--reason", "fixed"]) == 0
    assert not is_paused(home, str(target))


def test_an_abandoned_rollback_whose_restore_landed_says_so_and_its_evidence_is_written_late(
        spark: Any, promoted: Promoted, capsys: Any, monkeypatch: Any) -> None:
    """A rollback killed right after its RESTORE, before verifying it, then abandoned: the
    record names that RESTORE (the version it restored, the commit) as not verified. A process
    that dies after recording the abandonment but before the evidence: the same command
    writes the evidence, once."""
    root, run_id, _before = promoted
    target, home = root / "target" / "orders_clean", str(root / "_sg")
    point = run_progress(Ledger(spark, home).run_events(run_id)).targets[
        "orders_clean"].rollback_version
    dies_at(monkeypatch, rollback, "after_rollback_restore",
            lambda: rollback.rollback_run(spark, home, run_id, out=lambda _m: None))
    restore = _history(spark, target)[-1]
    assert restore["operation"] == "RESTORE"
    reason = "decided to keep the promoted data"
    with monkeypatch.context() as mp, pytest.raises(Crash):
        mp.setattr(rollback, "_record_in_evidence", _dies)
        rollback.abandon_rollback(spark, home, run_id, reason, out=lambda _m: None)
    events = Ledger(spark, home).run_events(run_id)
    assert run_progress(events).state == "rollback_abandoned"
    (left,) = events[-1]["details"]["targets"]
    assert (left["restored_version"], left["restored_to"], left["current_version"]) == (
        restore["version"], point, restore["version"])
    evidence = root / "evidence" / f"{run_id}.yaml"
    assert "rollbacks" not in yaml.safe_load(evidence.read_text())["sparkguard"]
    capsys.readouterr()
    assert _rollback(root, run_id, "--abandon", "typed again") == 0  # writes the evidence
    (rb,) = yaml.safe_load(evidence.read_text())["sparkguard"]["rollbacks"]
    assert rb["abandoned"] == reason and rb["targets"] == [left]  # the recorded one
    md = (root / "evidence" / f"{run_id}.md").read_text()
    assert (f"this rollback's RESTORE to version {point} committed as version "
            f"{restore['version']}, not verified") in md
    assert _rollback(root, run_id, "--abandon", reason) == 2
    assert len(Ledger(spark, home).run_events(run_id)) == len(events)


@pytest.mark.parametrize("action", ["finish", "abandon"])
def test_a_rollback_that_died_on_another_host_is_taken_over_after_the_stale_timeout(
        spark: Any, promoted: Promoted, capsys: Any, monkeypatch: Any, action: str) -> None:
    """A rollback whose process died on another host (its job cluster gone) leaves its lock.
    The re-run here is refused (exit 2) naming the holder and the flag; with
    ``--takeover-stale-lock`` it waits for ``--stale-lock-timeout``, then takes the lock over
    and finishes the rollback (or abandons it), recording the takeover. There was no such flag
    on ``rollback``: the hint named one it refused, and only editing the ledger got out."""
    root, run_id, before = promoted
    target, home = root / "target" / "orders_clean", str(root / "_sg")
    dies_at(monkeypatch, rollback, "mid_rollback",
            lambda: rollback.rollback_run(spark, home, run_id, out=lambda _m: None))
    key, holder = lock_key_of(spark, target), f"{run_id}/rollback"
    dead = Ledger(spark, home)  # its lock, as the process on the other host left it
    dead.locks.host = "db-cluster-0412"
    dead.acquire([key], holder, "alice@example.com")
    n = len(_history(spark, target))
    extra = ("--abandon", "decided with the owners") if action == "abandon" else ()
    capsys.readouterr()
    assert _rollback(root, run_id, *extra) == 2
    err = capsys.readouterr().err
    assert f"locked by run {holder}" in err and "host db-cluster-0412" in err
    assert "on another host" in err and "--takeover-stale-lock" in err
    assert _rollback(root, run_id, *extra, "--takeover-stale-lock") == 2  # not idle 6 hours
    assert "stale timeout is 21600s" in capsys.readouterr().err
    assert run_progress(Ledger(spark, home).run_events(run_id)).state == "rolling_back"
    assert len(_history(spark, target)) == n
    assert _rollback(root, run_id, *extra, "--takeover-stale-lock",
                     "--stale-lock-timeout", "0.001") == 0
    assert f"took over the lock of {key} from {holder}" in capsys.readouterr().out
    led = Ledger(spark, home)
    last = led.run_events(run_id)[-1]
    assert last["state"] == ("rolled_back" if action == "finish" else "rollback_abandoned")
    assert last["details"]["took_over_locks_of"] == {key: holder}
    if action == "finish":
        assert_df_equality(_read(spark, target), before, ignore_nullable=True)
        assert len(_history(spark, target)) == n + 1
    else:
        assert len(_history(spark, target)) == n
    assert led.lock_holder(key) is None
    events = spark.read.format("delta").load(led.locks_ref.path).where(F.col("target") == key)
    assert [(r["action"], r["host"]) for r in events.orderBy("generation").collect()][-2:] == [
        ("takeover", led.host), ("release", led.host)]


def test_a_run_that_died_on_another_host_after_its_promotion_is_rolled_back_over_its_lock(
        spark: Any, base_lake: Path, tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    """A run whose driver died on another host after its promotion was recorded keeps its
    lock. With ``--takeover-stale-lock`` past the timeout, its rollback takes that lock over,
    restores the target and records ``rolled_back``; the run is not also marked
    ``abandoned`` (the rollback is its end)."""
    from sparkguard import faults
    from sparkguard.plan import load_plan
    from sparkguard.run.evaluator import run_backfill

    root = copy_lake(base_lake, tmp_path / "lake")
    plan = write_plan(root, lambda p: p["execution"].update(slice_partitions=3))
    target, home = root / "target" / "orders_clean", str(root / "_sg")
    before = _frozen(spark, _read(spark, target))
    dies_at(monkeypatch, faults, "after_promote_ledger", lambda: run_backfill(
        spark, load_plan(plan), str(plan), home=home, evidence_dir=str(root / "evidence"),
        out=lambda _m: None))
    (started,) = Ledger(spark, home).latest_runs()
    prog = run_progress(Ledger(spark, home).run_events(started.run_id))
    assert prog.targets["orders_clean"].promoted_version is not None  # and recorded
    key = lock_key_of(spark, target)
    dead = Ledger(spark, home)  # the run's lock, as its driver on the other host left it
    dead.locks.host = "db-cluster-0412"
    dead.acquire([key], prog.run_id, "alice@example.com")
    capsys.readouterr()
    assert is_paused(home, str(target))  # the dead run's own hold
    assert _rollback(root, prog.run_id) == 2
    assert f"locked by run {prog.run_id}" in capsys.readouterr().err
    assert _rollback(root, prog.run_id, "--takeover-stale-lock",
                     "--stale-lock-timeout", "0.001") == 0
    assert_df_equality(_read(spark, target), before, ignore_nullable=True)
    led = Ledger(spark, home)
    states = [e["state"] for e in led.run_events(prog.run_id)]
    assert states[-2:] == ["rolling_back", "rolled_back"] and "abandoned" not in states
    assert led.run_events(prog.run_id)[-1]["details"]["took_over_locks_of"] == {
        key: prog.run_id}
    assert led.lock_holder(key) is None
    # the dead run's hold went with the rollback's: nothing else would ever clear it
    assert not is_paused(home, str(target))


def test_a_rollback_whose_lock_was_taken_over_stops_before_restoring(
        spark: Any, promoted: Promoted, monkeypatch: Any) -> None:
    """Fencing, as a run has before promoting: a rollback that outlived the stale-lock timeout
    and was taken over (here, just after it recorded ``rolling_back``) restores nothing; the
    process that took the lock is the only one that may change the target."""
    from sparkguard.errors import ConcurrentRunError
    from tests.failpoints import on_failpoint

    root, run_id, _before = promoted
    target, home = root / "target" / "orders_clean", str(root / "_sg")
    key = lock_key_of(spark, target)
    n = len(_history(spark, target))
    other = Ledger(spark, home)

    def taken(_fp: str) -> None:
        other.acquire([key], "20261207T000000Z-other000", "bob", takeover=True,
                      stale_after_s=0)

    on_failpoint(monkeypatch, rollback, "mid_rollback", taken)
    with pytest.raises(ConcurrentRunError, match="no longer holds the target's lock"):
        rollback.rollback_run(spark, home, run_id, out=lambda _m: None)
    assert len(_history(spark, target)) == n  # no RESTORE
    led = Ledger(spark, home)
    assert run_progress(led.run_events(run_id)).state == "rolling_back"
    holder = led.lock_holder(key)
    assert holder is not None and holder.run_id == "20261207T000000Z-other000"
    assert is_paused(home, str(target))


def test_a_rollback_refused_after_taking_a_lock_over_leaves_that_run_resumable(
        spark: Any, promoted: Promoted, capsys: Any) -> None:
    """A rollback that takes over another run's stale lock and is then refused (another writer
    committed: ``--force`` needed) records nothing of that run: it is not marked
    ``abandoned``, and with the lock released again it can still resume."""
    root, run_id, _before = promoted
    target, home = root / "target" / "orders_clean", str(root / "_sg")
    DeltaTable.forPath(spark, str(target)).update(F.col("order_id") == 1_000_001,
                                                  {"status": F.lit("late-fix")})
    key, lost = lock_key_of(spark, target), "20261207T010000Z-lost0000"
    dead = Ledger(spark, home)
    dead.locks.host = "db-cluster-0412"
    dead.acquire([key], lost, "carol@example.com")
    dead.record_run(lost, "started", fingerprint="a" * 64, plan_name="other")
    n = len(_history(spark, target))
    capsys.readouterr()
    assert _rollback(root, run_id, "--takeover-stale-lock", "--stale-lock-timeout", "0.001") == 2
    captured = capsys.readouterr()
    assert f"took over the lock of {key} from {lost}" in captured.out
    assert "--force" in captured.err and "nothing restored" in captured.err
    led = Ledger(spark, home)
    assert [e["state"] for e in led.run_events(lost)] == ["started"]
    assert run_progress(led.run_events(run_id)).state == "done"
    assert led.lock_holder(key) is None and len(_history(spark, target)) == n


def test_a_rollback_reads_the_run_again_once_its_locks_are_held(
        spark: Any, promoted: Promoted, monkeypatch: Any) -> None:
    """The run's events read before the locks were taken may be stale: a process holding a lock
    may record more before releasing it. Here the run records the promotion of a target the
    first read did not have: the rollback refuses (exit 2) rather than restore only part of
    what the run promoted."""
    from sparkguard.errors import ConcurrentRunError

    root, run_id, _before = promoted
    target, home = root / "target" / "orders_clean", str(root / "_sg")
    fp = run_progress(Ledger(spark, home).run_events(run_id)).fingerprint
    real = Ledger.acquire

    def acquire_then_the_run_moves_on(self: Ledger, *a: Any, **k: Any) -> Any:
        out = real(self, *a, **k)
        self.record_run(run_id, "promoting", fingerprint=fp, target=str(root / "late"),
                        version_read=3, label="late")
        return out

    monkeypatch.setattr(Ledger, "acquire", acquire_then_the_run_moves_on)
    n = len(_history(spark, target))
    with pytest.raises(ConcurrentRunError, match="promotion of another target"):
        rollback.rollback_run(spark, home, run_id, out=lambda _m: None)
    assert len(_history(spark, target)) == n
    assert Ledger(spark, home).lock_holder(lock_key_of(spark, target)) is None
