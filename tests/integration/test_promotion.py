"""Promotion: idempotent commits (txnAppId/txnVersion), the rollback point read right before
the commit, a target that moved (outside or inside the window), a real Delta conflict retried.
(A verification mismatch restored at once with exit 1: tests/integration/test_multi_target.py.)"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from chispa import assert_df_equality
from delta.tables import DeltaTable
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sparkguard import delta_ops, faults
from sparkguard.cli import main
from sparkguard.demo import transform_orders
from sparkguard.evidence import load_evidence
from sparkguard.ledger import Ledger, run_progress
from sparkguard.plan import load_plan
from sparkguard.publish import is_paused
from sparkguard.run.evaluator import run_backfill
from sparkguard.run.report import RunOutcome
from sparkguard.run.stages import RunOptions
from sparkguard.sql import PartitionType, TableRef, window_predicate
from tests.failpoints import Crash, fails_once_at, on_failpoint
from tests.lakes import WINDOW, copy_lake, write_plan

pytestmark = pytest.mark.spark
OUTSIDE = WINDOW[0].replace(day=1)  # 2026-05-01: a partition outside the window



def _versions(spark: Any, path: Path) -> list[dict[str, Any]]:
    return [r.asDict() for r in DeltaTable.forPath(spark, str(path)).history()
            .orderBy("version").collect()]


def _read(spark: Any, path: Path) -> DataFrame:
    return spark.read.format("delta").load(str(path)).orderBy("order_date", "order_id")


def _rows_on(spark: Any, root: Path, day: Any, offset: int) -> DataFrame:
    """Another writer's rows for ``day`` (new order ids), in the target's shape."""
    src = spark.read.format("delta").load(str(root / "source" / "orders")).limit(3)
    return transform_orders(spark, src, []).withColumn("order_date", F.lit(day)).withColumn(
        "order_id", F.col("order_id") + offset)


def _one_slice(plan: dict[str, Any]) -> None:
    plan["execution"]["slice_partitions"] = 3


def _run(spark: Any, plan: Path, lines: list[str] | None = None,
         options: RunOptions | None = None) -> RunOutcome:
    root = plan.parent
    return run_backfill(spark, load_plan(plan), str(plan), home=str(root / "_sg"),
                        evidence_dir=str(root / "evidence"), options=options,
                        out=(lines.append if lines is not None else (lambda _m: None)))


def test_repeated_commits_with_the_same_txn_are_no_ops(spark: Any, lake: Path) -> None:
    path = lake / "t"
    schema = T.StructType([T.StructField("k", T.IntegerType()), T.StructField("d", T.DateType()),
                           T.StructField("v", T.StringType())])
    spark.createDataFrame([(1, WINDOW[0], "old"), (2, WINDOW[1], "old")], schema).write.format(
        "delta").partitionBy("d").save(str(path))
    ref = TableRef(path=str(path))
    pred = window_predicate("d", PartitionType.DATE, [WINDOW[0]])
    new = spark.createDataFrame([(1, WINDOW[0], "new")], schema)
    for _ in range(2):
        delta_ops.promote_replace_where(new, ref, pred, '{"sparkguard": {}}', ("app-1", 1))
    assert len(_versions(spark, path)) == 2  # create + one promotion
    newer = spark.createDataFrame([(1, WINDOW[0], "newer")], schema)
    for _ in range(2):
        delta_ops.promote_merge(spark, newer, ref, ["k"], window_predicate(
            "d", PartitionType.DATE, [WINDOW[0]], "t"), True, '{"sparkguard": {}}', ("app-2", 1))
    assert len(_versions(spark, path)) == 3  # and one MERGE
    assert sorted(map(tuple, spark.read.format("delta").load(str(path)).collect())) == [
        (1, WINDOW[0], "newer"), (2, WINDOW[1], "old")]
    # the session confs used for the MERGE are gone again
    assert spark.conf.get("spark.databricks.delta.write.txnAppId", None) is None
    # every commit after a version, however small a page of history is read at a time
    for page in (1, 2, 1000):
        assert [c["version"] for c in delta_ops.commits_since(spark, ref, 0, page=page)] == [2, 1]
    assert delta_ops.commits_since(spark, ref, 2, page=1) == []


def test_promotion_state_from_history() -> None:
    def c(v: int, run: str, action: str, target: str = "t") -> dict[str, Any]:
        return {"version": v, "userMetadata": delta_ops.user_metadata(run, "fp", action,
                                                                      target=target)}

    other = {"version": 6, "userMetadata": None}
    st = delta_ops.promotion_state([c(5, "r", "promote"), other], "r", "t")
    assert (st.promoted_version, st.undone, st.next_txn_version) == (5, 0, 1)
    assert [x["version"] for x in st.foreign] == [6]
    st = delta_ops.promotion_state([c(5, "r", "promote"), c(6, "r", "restore")], "r", "t")
    assert (st.promoted_version, st.next_txn_version) == (None, 2)
    assert delta_ops.promotion_state([c(5, "x", "promote"), c(6, "r", "promote", "u")], "r",
                                     "t").promoted_version is None


def test_target_changed_inside_window_stops_before_promotion(
        spark: Any, base_lake: Path, tmp_path: Path, monkeypatch: Any) -> None:
    root = copy_lake(base_lake, tmp_path / "lake")
    plan = write_plan(root, _one_slice)
    target = root / "target" / "orders_clean"
    theirs = _rows_on(spark, root, WINDOW[1], 10 ** 8)
    on_failpoint(monkeypatch, faults, "before_promote",
                 lambda _n: theirs.write.format("delta").mode("append").save(str(target)), times=1)
    before = _read(spark, target).collect()
    v0 = _versions(spark, target)[-1]["version"]
    out = _run(spark, plan)
    assert out.exit_code == 1 and "another writer changed the window" in out.message
    after = _read(spark, target)
    assert after.filter(F.col("order_id") < 10 ** 8).collect() == before  # promotion undone
    assert after.filter(F.col("order_id") >= 10 ** 8).count() == 3  # their rows kept
    # their append landed after the rollback point, before the promotion's transaction began
    # (outside Delta's conflict check): the run found it in the gap and restored at once
    ops = [(h["operation"], h["userMetadata"] or "") for h in _versions(spark, target)
           if h["version"] > v0]
    assert [o for o, _m in ops] == ["WRITE", "WRITE", "RESTORE"]
    assert '"promote"' in ops[1][1] and '"restore"' in ops[2][1]
    assert is_paused(spark, str(target), str(root / "_sg"))
    assert run_progress(Ledger(spark, str(root / "_sg")).run_events(out.run_id)).state == \
        "gate_failed"


def test_target_moving_outside_the_window_and_a_delta_conflict_are_retried(
        spark: Any, base_lake: Path, tmp_path: Path, monkeypatch: Any) -> None:
    """Two things happen to the target around the promotion: another writer appends outside
    the window right after the rollback point is recorded, and a concurrent metadata change
    (a real MetadataChangedException) lands while the promotion writes its files. The conflict
    is logged and retried; the retry finds the window unchanged; the others' commits survive
    and the rollback point is the version just before the promotion commit."""
    root = copy_lake(base_lake, tmp_path / "lake")
    plan = write_plan(root, _one_slice)
    target = root / "target" / "orders_clean"
    v0 = _versions(spark, target)[-1]["version"]
    extra = _rows_on(spark, root, OUTSIDE, 10 ** 8)
    on_failpoint(monkeypatch, faults, "before_promote",
                 lambda _n: extra.write.format("delta").mode("append").save(str(target)), times=1)
    real_promote = delta_ops.promote_replace_where
    calls: list[int] = []
    started = tmp_path / "write-started"

    @F.udf("boolean")
    def slow_true(_x: Any) -> bool:  # runs in the Python worker, inside the write job
        started.touch()
        time.sleep(0.005)
        return True

    def promote(df: DataFrame, ref: TableRef, predicate: str, metadata: str,
                txn: tuple[str, int]) -> None:
        calls.append(txn[1])
        if len(calls) > 1:
            real_promote(df, ref, predicate, metadata, txn)
            return

        def alter() -> None:  # once the promotion is writing its files
            deadline = time.monotonic() + 60
            while not started.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            spark.sql(f"ALTER TABLE delta.`{target}` SET TBLPROPERTIES "
                      "('sparkguard.test.concurrent' = 'yes')")

        t = threading.Thread(target=alter)
        t.start()
        try:
            real_promote(df.repartition(1).filter(slow_true(F.col("order_id"))), ref,
                         predicate, metadata, txn)
        finally:
            t.join()

    monkeypatch.setattr(delta_ops, "promote_replace_where", promote)
    lines: list[str] = []
    out = _run(spark, plan, lines, RunOptions(conflict_backoff_s=0.1))
    assert out.exit_code == 0, out.message
    assert len(calls) == 2  # attempt 1 hit the conflict, attempt 2 committed
    assert any("delta conflict on promotion attempt 1/3" in ln and "Metadata" in ln
               for ln in lines), "\n".join(lines)
    hist = _versions(spark, target)
    ops = [(h["version"], h["operation"]) for h in hist if h["version"] > v0]
    assert [op for _v, op in ops] == ["WRITE", "SET TBLPROPERTIES", "WRITE"]
    promote_version = ops[-1][0]
    assert '"promote"' in hist[-1]["userMetadata"]
    st = out.targets["orders_clean"]
    assert (st.rollback_version, st.promoted_version) == (promote_version - 1, promote_version)
    after = spark.read.format("delta").load(str(target))
    assert after.filter(F.col("order_id") >= 10 ** 8).count() == 3  # their rows survived
    expected = transform_orders(spark, spark.read.format("delta").load(
        str(root / "source" / "orders")), []).unionByName(extra)
    assert_df_equality(_read(spark, target), expected.orderBy("order_date", "order_id"),
                       ignore_nullable=True)
    events = Ledger(spark, str(root / "_sg")).run_events(out.run_id)
    moved = [e["details"]["window_unchanged"] for e in events if e["state"] == "target_moved"]
    assert moved == [True]  # attempt 2 found the append and the new metadata outside the window
    assert [e["target_version_read"] for e in events if e["state"] == "promoting"] == [
        v0, v0 + 2]


def _their_append_at(spark: Any, base_lake: Path, tmp_path: Path, monkeypatch: Any,
                     failpoint: str, where: str) -> tuple[Path, Path, list[Any], int]:
    """A lake and plan where another writer appends 3 rows (order ids >= 10**8) once, at
    ``failpoint``, on a day ``outside`` or ``inside`` the window: (root, plan, the target's
    rows before, its version before)."""
    root = copy_lake(base_lake, tmp_path / "lake")
    plan = write_plan(root, _one_slice)
    target = root / "target" / "orders_clean"
    before = _read(spark, target).collect()
    v0 = _versions(spark, target)[-1]["version"]
    theirs = _rows_on(spark, root, OUTSIDE if where == "outside" else WINDOW[1], 10 ** 8)
    on_failpoint(monkeypatch, faults, failpoint,
                 lambda _n: theirs.write.format("delta").mode("append").save(str(target)), times=1)
    return root, plan, before, v0


@pytest.mark.parametrize("where", ["outside", "inside"])
def test_crash_right_after_a_promotion_past_another_writer_is_resumed_like_a_run_without_it(
        spark: Any, base_lake: Path, tmp_path: Path, monkeypatch: Any, where: str) -> None:
    """Another writer appends between the rollback point and the promotion's transaction, and
    the driver dies right after the promotion commit, before the ledger heard of it. The resumed
    run does what the run without a crash does: outside the window, the rollback point is the
    version just before the promotion (a rollback keeps their rows); inside it, the promotion is
    undone at once."""
    root, plan, before, v0 = _their_append_at(spark, base_lake, tmp_path, monkeypatch,
                                              "before_promote", where)
    target, home = root / "target" / "orders_clean", str(root / "_sg")
    on_failpoint(monkeypatch, faults, "after_promote_commit", times=1)
    with pytest.raises(Crash):
        _run(spark, plan)
    out = _run(spark, plan)
    prog = run_progress(Ledger(spark, home).run_events(out.run_id))
    ours = F.col("order_id") < 10 ** 8
    if where == "inside":
        assert out.exit_code == 1 and "another writer changed the window" in out.message
        assert prog.state == "gate_failed" and prog.targets["orders_clean"].restored
        assert _read(spark, target).filter(ours).collect() == before  # promotion undone
        assert _read(spark, target).filter(~ours).count() == 3  # their rows kept
        return
    assert out.exit_code == 0, out.message
    st = out.targets["orders_clean"]
    assert (st.rollback_version, st.promoted_version) == (v0 + 1, v0 + 2)
    assert prog.targets["orders_clean"].rollback_version == v0 + 1
    assert main(["rollback", "--run-id", out.run_id, "--home", home]) == 0
    assert _read(spark, target).filter(ours).collect() == before
    assert _read(spark, target).filter(~ours).count() == 3  # the rollback kept their append


def test_a_promotion_that_raises_after_its_commit_landed_is_recorded_and_verified(
        spark: Any, base_lake: Path, tmp_path: Path, monkeypatch: Any) -> None:
    """Delta commits the promotion, then raises (a post-commit hook that failed): the run finds
    its commit in the history and verifies it, rather than failing with a promotion that the
    ledger, the evidence and the automatic restore never heard of."""
    root = copy_lake(base_lake, tmp_path / "lake")
    plan = write_plan(root, _one_slice)
    target, home = root / "target" / "orders_clean", str(root / "_sg")
    v0 = _versions(spark, target)[-1]["version"]
    real_promote = delta_ops.promote_replace_where

    def promote(*args: Any) -> None:
        real_promote(*args)
        raise RuntimeError("DELTA_POST_COMMIT_HOOK_FAILED: checkpoint (test)")

    monkeypatch.setattr(delta_ops, "promote_replace_where", promote)
    lines: list[str] = []
    out = _run(spark, plan, lines)
    assert out.exit_code == 0, out.message
    assert [h["operation"] for h in _versions(spark, target) if h["version"] > v0] == ["WRITE"]
    prog = run_progress(Ledger(spark, home).run_events(out.run_id))
    assert prog.state == "done" and prog.targets["orders_clean"].verified
    assert prog.targets["orders_clean"].promoted_version == v0 + 1
    assert any("landed at version" in n and "POST_COMMIT" in n
               for n in out.targets["orders_clean"].notes)
    expected = transform_orders(spark, spark.read.format("delta").load(
        str(root / "source" / "orders")), []).orderBy("order_date", "order_id")
    assert_df_equality(_read(spark, target), expected, ignore_nullable=True)


def test_a_failure_right_after_the_promotion_commit_restores_it_keeping_another_writers_rows(
        spark: Any, base_lake: Path, tmp_path: Path, monkeypatch: Any) -> None:
    """Another writer appends outside the window before the promotion's transaction; the
    promotion commits, then reading the history fails. The failure path finds the commit by its
    userMetadata, records it and restores the version just before it (their rows kept), rather
    than ending failed with the promotion in the target and nothing restored."""
    root, plan, before, v0 = _their_append_at(spark, base_lake, tmp_path, monkeypatch,
                                              "before_promote", "outside")
    target, home = root / "target" / "orders_clean", str(root / "_sg")
    fails_once_at(monkeypatch, faults, "after_promote_commit", "storage hiccup reading history")
    with pytest.raises(Exception, match="storage hiccup"):
        _run(spark, plan)
    (prog,) = Ledger(spark, home).latest_runs()
    tp = prog.targets["orders_clean"]
    assert prog.state == "failed" and tp.restored
    assert (tp.rollback_version, tp.promoted_version) == (v0 + 1, v0 + 2)
    assert [h["operation"] for h in _versions(spark, target) if h["version"] > v0] == [
        "WRITE", "WRITE", "RESTORE"]
    ours = F.col("order_id") < 10 ** 8
    assert _read(spark, target).filter(ours).collect() == before  # the promotion undone
    assert _read(spark, target).filter(~ours).count() == 3  # their rows kept
    events = Ledger(spark, home).run_events(prog.run_id)
    assert [e["details"].get("found_in_history") for e in events
            if e["state"] == "promoted"] == [True]
    assert events[-1]["state"] == "failed" and events[-1]["details"]["restored"] == [
        "orders_clean"]
    assert is_paused(spark, str(target), home)
    assert main(["rollback", "--run-id", prog.run_id, "--home", home]) == 2  # nothing in place


def test_rollback_of_a_run_stopped_right_after_its_promotion_keeps_another_writers_commit(
        spark: Any, base_lake: Path, tmp_path: Path, monkeypatch: Any) -> None:
    """The run is interrupted right after its promotion commit (Ctrl-C: only finally blocks
    run, its lock is released), which landed after another writer's append: the ledger has the
    promotion as started, at the version before that append. Rolling the run back restores the
    version just before the promotion commit (the history's, not the ledger's), so their
    append stays."""
    root, plan, before, v0 = _their_append_at(spark, base_lake, tmp_path, monkeypatch,
                                              "before_promote", "outside")
    target, home = root / "target" / "orders_clean", str(root / "_sg")
    on_failpoint(monkeypatch, faults, "after_promote_commit", times=1)
    with pytest.raises(Crash):
        _run(spark, plan)
    (prog,) = Ledger(spark, home).latest_runs()
    assert prog.targets["orders_clean"].rollback_version == v0  # the ledger's, before the gap
    assert prog.targets["orders_clean"].promoted_version is None
    assert main(["rollback", "--run-id", prog.run_id, "--home", home]) == 0
    ours = F.col("order_id") < 10 ** 8
    assert _read(spark, target).filter(ours).collect() == before
    assert _read(spark, target).filter(~ours).count() == 3  # their append survived
    done = Ledger(spark, home).run_events(prog.run_id)[-1]
    assert done["state"] == "rolled_back"
    (point,) = done["details"]["rolled_back"]
    assert (point["rollback_version"], point["recorded_rollback_version"]) == (v0 + 1, v0)


@pytest.mark.parametrize("where", ["outside", "inside"])
def test_automatic_restore_after_another_writer_committed_behind_the_promotion(
        spark: Any, base_lake: Path, tmp_path: Path, monkeypatch: Any, where: str) -> None:
    """The run promotes and verifies, another writer appends, then the run fails. Their append
    outside the window: the window is put back as it was (no RESTORE), their rows kept. Inside
    the window: putting it back would lose their rows, so nothing is undone, the run's failure
    says so and publish stays paused."""
    root, plan, before, v0 = _their_append_at(spark, base_lake, tmp_path, monkeypatch,
                                              "after_promote_ledger", where)
    target, home = root / "target" / "orders_clean", str(root / "_sg")
    fails_once_at(monkeypatch, faults, "after_verify", "storage hiccup after the verification")
    ours = F.col("order_id") < 10 ** 8
    with pytest.raises(Exception, match="storage hiccup") as err:
        _run(spark, plan)
    ops = [h["operation"] for h in _versions(spark, target) if h["version"] > v0]
    (prog,) = Ledger(spark, home).latest_runs()
    assert prog.state == "failed"
    assert _read(spark, target).filter(~ours).count() == 3  # their rows kept either way
    assert is_paused(spark, str(target), home)
    if where == "outside":
        assert ops == ["WRITE", "WRITE", "WRITE"]  # promotion, theirs, the window put back
        assert prog.targets["orders_clean"].restored
        assert _read(spark, target).filter(ours).collect() == before
        return
    assert "other writers changed the window after this run's promotion" in str(err.value)
    assert ops == ["WRITE", "WRITE"]  # nothing undone
    assert not prog.targets["orders_clean"].restored
    assert _read(spark, target).filter(ours).collect() != before  # the promotion still there


@pytest.mark.parametrize("theirs", ["restore", "update", "append"])
def test_a_resumed_run_does_not_end_done_over_a_promotion_another_writer_undid(
        spark: Any, base_lake: Path, tmp_path: Path, monkeypatch: Any, theirs: str) -> None:
    """The run promotes and verifies, and dies before its evidence; then another writer
    RESTOREs the target to before the promotion, or updates promoted rows, or appends rows to
    the window. The resumed run used to end done, and reopen publish, in every case. Now it
    stops, leaving the window as they left it, unless every promoted row is still there."""
    root = copy_lake(base_lake, tmp_path / "lake")
    plan = write_plan(root, _one_slice)
    target, home = root / "target" / "orders_clean", str(root / "_sg")
    v0 = _versions(spark, target)[-1]["version"]
    before = _read(spark, target).collect()
    on_failpoint(monkeypatch, faults, "after_verify", times=1)
    with pytest.raises(Crash):
        _run(spark, plan)
    promoted = _read(spark, target).collect()
    assert promoted != before
    table = f"delta.`{target}`"
    if theirs == "restore":
        spark.sql(f"RESTORE TABLE {table} TO VERSION AS OF {v0}")
    elif theirs == "update":
        spark.sql(f"UPDATE {table} SET amount = amount + 1 "
                  f"WHERE order_date = DATE'{WINDOW[1]}' AND order_id % 7 = 0")
    else:
        _rows_on(spark, root, WINDOW[1], 10 ** 8).write.format("delta").mode("append").save(
            str(target))
    after_theirs = _read(spark, target).collect()
    v1 = _versions(spark, target)[-1]["version"]
    out = _run(spark, plan)
    prog = run_progress(Ledger(spark, home).run_events(out.run_id))
    if theirs == "append":
        assert out.exit_code == 0, out.message
        assert prog.state == "done" and not is_paused(spark, str(target), home)
        assert any("every promoted row is still in the window" in n
                   for n in out.targets["orders_clean"].notes)
    else:
        assert out.exit_code == 1
        assert ("undid this run's promotion at version" if theirs == "restore"
                else "changed rows this run promoted") in out.message
        assert prog.state == "gate_failed" and not prog.targets["orders_clean"].restored
        assert is_paused(spark, str(target), home)
    assert _versions(spark, target)[-1]["version"] == v1  # nothing written to the target
    assert _read(spark, target).collect() == after_theirs


def test_an_append_landing_between_the_history_read_and_the_runs_restore_is_reported(
        spark: Any, base_lake: Path, tmp_path: Path, monkeypatch: Any) -> None:
    """The run fails after its promotion and restores the target: it reads the history (no
    other writer), then RESTOREs. A streaming job appends outside the window in between: the
    RESTORE drops it, and its writer, seeing its transaction recorded, never writes it again.
    That used to pass as a clean, verified restore; now the restored event lists the commit
    undone, is not verified, and the run's failure names it."""
    from sparkguard.run.undo import RestoreFailedError

    root = copy_lake(base_lake, tmp_path / "lake")
    plan = write_plan(root, _one_slice)
    target, home = root / "target" / "orders_clean", str(root / "_sg")
    v0 = _versions(spark, target)[-1]["version"]
    real_restore = delta_ops.restore

    def appended_first(*args: Any, **kw: Any) -> None:
        _rows_on(spark, root, OUTSIDE, 10 ** 8).write.format("delta").mode("append").save(
            str(target))
        real_restore(*args, **kw)

    monkeypatch.setattr(delta_ops, "restore", appended_first)
    fails_once_at(monkeypatch, faults, "after_promote_ledger", "disk hiccup")
    with pytest.raises(RestoreFailedError) as err:
        _run(spark, plan)
    ops = [h["operation"] for h in _versions(spark, target) if h["version"] > v0]
    assert ops == ["WRITE", "WRITE", "RESTORE"]  # promotion, theirs, the run's RESTORE
    theirs = v0 + 2
    assert f"v{theirs} WRITE" in str(err.value) and "the RESTORE undid them" in str(err.value)
    (run,) = Ledger(spark, home).latest_runs()
    restored = [e["details"] for e in Ledger(spark, home).run_events(run.run_id)
                if e["state"] == "restored"]
    assert len(restored) == 1 and restored[0]["verified"] is False
    assert [c["version"] for c in restored[0]["undone_commits_of_others"]] == [str(theirs)]
    assert is_paused(spark, str(target), home)


@pytest.mark.parametrize("when", ["after_reconcile", "before_promote"])
def test_a_key_another_writer_puts_outside_the_window_during_the_run_fails_the_table_wide_check(
        spark: Any, base_lake: Path, tmp_path: Path, monkeypatch: Any, when: str) -> None:
    """The table-wide duplicate check passed at reconciliation; then another writer appends,
    outside the window, a row under an order id the recomputation holds. The window is
    unchanged, so the run used to promote over the new version and report the gate passed: the
    target held that order twice. The gate is counted again: after reconciliation, before any
    commit; in the gap before the promotion's transaction, the promotion is undone at once.
    Their row stays; the evidence shows the gate failed."""
    from sparkguard.run import promote

    def table_wide(plan: dict[str, Any]) -> None:
        _one_slice(plan)
        for check in plan["validation"]["checks"]:
            if check["type"] == "duplicate_check":
                check["table_wide"] = True

    root = copy_lake(base_lake, tmp_path / "lake")
    plan = write_plan(root, table_wide)
    target = root / "target" / "orders_clean"
    src = spark.read.format("delta").load(str(root / "source" / "orders"))
    theirs = transform_orders(spark, src, []).filter(
        F.col("order_date") == F.lit(WINDOW[1])).limit(1).withColumn(
        "order_date", F.lit(OUTSIDE)).collect()

    def append(*_a: Any) -> None:
        spark.createDataFrame(theirs, _read(spark, target).schema).write.format(
            "delta").mode("append").save(str(target))

    if when == "before_promote":
        on_failpoint(monkeypatch, faults, "before_promote", append, times=1)
    else:  # after the full window's reconciliation, before the promotion stage reads anything
        real_fence, calls = promote.fence, []

        def fence(*args: Any, **kw: Any) -> None:
            if not calls:
                calls.append(1)
                append()
            real_fence(*args, **kw)

        monkeypatch.setattr(promote, "fence", fence)
    before = _read(spark, target).collect()
    v0 = _versions(spark, target)[-1]["version"]
    out = _run(spark, plan)
    assert out.exit_code == 1, out.message
    assert "keys_outside_window" in out.message
    ops = [h["operation"] for h in _versions(spark, target) if h["version"] > v0]
    assert ops == (["WRITE"] if when == "after_reconcile" else ["WRITE", "WRITE", "RESTORE"])
    after = _read(spark, target)
    assert after.filter(F.col("order_date") != F.lit(OUTSIDE)).collect() == [
        r for r in before if r["order_date"] != OUTSIDE]  # the window as it was
    assert after.filter((F.col("order_date") == F.lit(OUTSIDE))
                        & (F.col("order_id") == theirs[0]["order_id"])).count() == 1  # theirs
    assert out.evidence_path is not None
    gates = load_evidence(out.evidence_path)["sparkguard"]["gates"]
    (gate,) = [g for g in gates if g["gate"] == "keys_outside_window"]
    assert not gate["passed"], gate
