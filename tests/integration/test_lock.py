"""One active run per target: concurrent acquisitions, refusal with exit 2 naming the holder,
stale takeover only with the flag after the timeout, crash resume, release vs takeover."""

from __future__ import annotations

import datetime as dt
import threading
from pathlib import Path
from typing import Any

import pytest
from delta.tables import DeltaTable

from sparkguard.cli import main
from sparkguard.errors import EXIT_USAGE, ConcurrentRunError
from sparkguard.ledger import Ledger, run_progress
from tests.lakes import copy_lake, lock_key_of, write_plan

pytestmark = pytest.mark.spark
TARGET = "/lake/target/t"



def _version(spark: Any, path: Path) -> int:
    return int(DeltaTable.forPath(spark, str(path)).history(1).first()["version"])


def test_two_concurrent_acquisitions_exactly_one_wins(spark: Any, lake: Path) -> None:
    home = str(lake / "home")
    Ledger(spark, home).ensure()
    results: dict[str, str] = {}
    barrier = threading.Barrier(2)

    def take(run_id: str) -> None:
        led = Ledger(spark, home)
        barrier.wait()
        try:
            led.acquire([TARGET], run_id, f"owner-{run_id}")
            results[run_id] = "won"
        except ConcurrentRunError as exc:
            results[run_id] = str(exc)

    threads = [threading.Thread(target=take, args=(r,)) for r in ("run-a", "run-b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [r for r, v in results.items() if v == "won"]
    assert len(winners) == 1, results
    loser = next(r for r in results if r not in winners)
    assert f"run {winners[0]}" in results[loser] and f"owner-{winners[0]}" in results[loser]
    holder = Ledger(spark, home).lock_holder(TARGET)
    assert holder is not None and holder.run_id == winners[0]


def test_release_racing_a_takeover_is_a_no_op(spark: Any, lake: Path) -> None:
    home = str(lake / "home")
    a, b = Ledger(spark, home), Ledger(spark, home)
    a.acquire([TARGET], "run-a", "alice")
    b.acquire([TARGET], "run-b", "bob", takeover=True, stale_after_s=0)
    a.release([TARGET], "run-a")  # a's release takes the generation b already used
    holder = Ledger(spark, home).lock_holder(TARGET)
    assert holder is not None and holder.run_id == "run-b"
    b.release([TARGET], "run-b")
    assert Ledger(spark, home).lock_holder(TARGET) is None
    c = Ledger(spark, home)
    c.acquire([TARGET], "run-c", "carol")  # free again
    assert c.lock_holders([TARGET])[TARGET].generation == 4


def _run(plan: Path, *extra: str) -> int:
    return main(["run", "--plan", str(plan), "--home", str(plan.parent / "_sg"),
                 "--evidence-dir", str(plan.parent / "evidence"), *extra])


def _one_slice(plan: dict[str, Any]) -> None:
    plan["execution"]["slice_partitions"] = 3


def test_second_run_refused_exit_2_naming_holder_then_stale_takeover_only_with_flag(
        spark: Any, base_lake: Path, tmp_path: Path, capsys: Any) -> None:
    root = copy_lake(base_lake, tmp_path / "lake")
    plan = write_plan(root, _one_slice)
    target = root / "target" / "orders_clean"
    home = str(root / "_sg")
    v0 = _version(spark, target)
    other = "20261201T090000Z-0ther000"
    key = lock_key_of(spark, target)  # the table's location, however a plan spells it
    holder = Ledger(spark, home)  # another run of another plan, alive (this process)
    holder.acquire([key], other, "carol@example.com")
    holder.record_run(other, "started", fingerprint="a" * 64, plan_name="other")
    capsys.readouterr()
    assert _run(plan) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"locked by run {other}" in err
    assert "owner carol@example.com" in err and "since " in err and " UTC" in err
    # nothing written: no run recorded, no shadow, target and publish untouched
    assert [p.run_id for p in Ledger(spark, home).latest_runs()] == [other]
    assert not (root / "_sg" / "shadow").exists()
    assert not (root / "_sg" / "control").exists()
    assert _version(spark, target) == v0
    # the flag alone is not enough before the timeout, nor the timeout without the flag
    assert _run(plan, "--takeover-stale-lock") == EXIT_USAGE
    assert "stale timeout" in capsys.readouterr().err
    assert _run(plan, "--stale-lock-timeout", "0.001") == EXIT_USAGE
    # both: taken over; the old run is marked abandoned
    assert _run(plan, "--takeover-stale-lock", "--stale-lock-timeout", "0.001", "--dry-run") == 0
    led = Ledger(spark, home)
    assert run_progress(led.run_events(other)).state == "abandoned"
    mine = next(p for p in led.latest_runs() if p.run_id != other)
    assert mine.state == "dry_run_passed"
    started = led.run_events(mine.run_id)[0]["details"]
    assert started["took_over_locks_of"] == {key: other}
    assert started["locks"] == {key: "takeover"}
    assert led.lock_holder(key) is None  # released at the end


TAKER = "20261201T090000Z-taker000"


def _taken_over_at(spark: Any, base_lake: Path, tmp_path: Path, monkeypatch: Any,
                   failpoint: str, restore: bool = False) -> tuple[Path, Path, Path, str, int]:
    """A lake and plan whose run's lock run ``TAKER`` takes over at ``failpoint`` (restoring
    the target to its version before the run too, with ``restore``): (root, plan, target, its
    lock key, its version before the run)."""
    from sparkguard import faults
    from tests.failpoints import on_failpoint

    root = copy_lake(base_lake, tmp_path / "lake")
    plan = write_plan(root, _one_slice)
    target = root / "target" / "orders_clean"
    key, v0 = lock_key_of(spark, target), _version(spark, target)

    def take_over(_name: str) -> None:
        Ledger(spark, str(root / "_sg")).acquire([key], TAKER, "dave@example.com",
                                                 takeover=True, stale_after_s=0)
        if restore:
            spark.sql(f"RESTORE TABLE delta.`{target}` TO VERSION AS OF {v0}")

    on_failpoint(monkeypatch, faults, failpoint, take_over, times=1)
    return root, plan, target, key, v0


def test_a_run_whose_lock_was_taken_over_stops_before_promoting(
        spark: Any, base_lake: Path, tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    """Fencing: a run slow enough to be taken over (``--takeover-stale-lock``) must not promote
    after the takeover; the run that took the lock is the only one allowed to."""
    root, plan, target, key, v0 = _taken_over_at(spark, base_lake, tmp_path, monkeypatch,
                                                 "mid_reconcile")
    home = str(root / "_sg")
    capsys.readouterr()
    assert _run(plan) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "no longer holds the target's lock" in err and f"taken over by run {TAKER}" in err
    assert _version(spark, target) == v0  # no promotion, no restore
    led = Ledger(spark, home)
    (mine,) = [p for p in led.latest_runs() if p.run_id != TAKER]
    assert mine.state == "failed" and mine.targets["orders_clean"].rollback_version is None
    holder = led.lock_holder(key)  # the stopped run's release did not free the taker's lock
    assert holder is not None and holder.run_id == TAKER


@pytest.mark.parametrize("spelling", ["catalog name", "trailing slash"])
def test_a_run_naming_a_locked_table_another_way_is_refused(
        spark: Any, base_lake: Path, tmp_path: Path, capsys: Any, spelling: str) -> None:
    """The lock is the table's, not the plan's string: a run locked the target by its path,
    and a second plan names the same table through the catalog or with a trailing slash."""
    root = copy_lake(base_lake, tmp_path / "lake")
    target = root / "target" / "orders_clean"
    alias = f"sg_lock_alias_{tmp_path.name.replace('-', '_')}"
    spark.sql(f"CREATE TABLE {alias} USING DELTA LOCATION '{target}'")
    try:
        dataset = alias if spelling == "catalog name" else f"{target}/"
        plan = write_plan(root, lambda p: (_one_slice(p), p["targets"][0].update(dataset=dataset)))
        home = str(root / "_sg")
        other = "20261201T090000Z-0ther000"
        holder = Ledger(spark, home)
        holder.acquire([lock_key_of(spark, target)], other, "carol@example.com")
        holder.record_run(other, "started", fingerprint="a" * 64, plan_name="other")
        v0 = _version(spark, target)
        capsys.readouterr()
        assert _run(plan) == EXIT_USAGE
        assert f"locked by run {other}" in capsys.readouterr().err
        assert [p.run_id for p in Ledger(spark, home).latest_runs()] == [other]
        assert _version(spark, target) == v0 and not (root / "_sg" / "shadow").exists()
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {alias}")


def test_crashed_run_of_the_same_plan_is_resumed_without_a_flag(
        spark: Any, base_lake: Path, tmp_path: Path) -> None:
    from sparkguard.plan import fingerprint, load_plan

    root = copy_lake(base_lake, tmp_path / "lake")
    plan = write_plan(root, _one_slice)
    target = lock_key_of(spark, root / "target" / "orders_clean")
    home = str(root / "_sg")
    fp = fingerprint(load_plan(plan))
    run_id = "20261201T090000Z-crash000"
    led = Ledger(spark, home)
    led.ensure()
    # what a driver killed right after taking its lock leaves behind: a lock held by a
    # process that no longer exists, and a started run
    led._append("locks", [(target, 1, "acquire", run_id, "o", dt.datetime(2026, 12, 1, 9),
                           led.host, 2 ** 22 + 4321, "dead-token")],
                txn=(led._lock_app_id(target), 1))
    led.record_run(run_id, "started", fingerprint=fp, plan_name="fix-orders-amounts",
                   source_version=0, dry_run=False)
    assert _run(plan, "--dry-run") == 0
    events = Ledger(spark, home).run_events(run_id)
    assert [e["state"] for e in events][:2] == ["started", "resumed"]
    assert events[1]["details"]["locks"] == {target: "resume"}
    assert run_progress(events).state == "dry_run_passed"


def test_a_run_that_died_on_another_host_is_resumed_by_taking_its_stale_lock_over(
        spark: Any, base_lake: Path, tmp_path: Path, capsys: Any) -> None:
    """A driver that died on another host (a Databricks job cluster that is gone) leaves a lock
    sparkguard cannot judge: the re-run is refused, and ``--takeover-stale-lock=true`` (as the
    bundle's jobs pass it) past the timeout resumes the same run, which is not marked
    ``abandoned`` (it is the one resumed)."""
    from sparkguard.plan import fingerprint, load_plan

    root = copy_lake(base_lake, tmp_path / "lake")
    plan = write_plan(root, _one_slice)
    target = lock_key_of(spark, root / "target" / "orders_clean")
    home = str(root / "_sg")
    run_id = "20261201T090000Z-lost0000"
    led = Ledger(spark, home)
    led.ensure()
    led._append("locks", [(target, 1, "acquire", run_id, "o", dt.datetime(2026, 12, 1, 9),
                           "0412-093011-abcd1234-10-0-1-7", 4321, "dead-token")],
                txn=(led._lock_app_id(target), 1))
    led.record_run(run_id, "started", fingerprint=fingerprint(load_plan(plan)),
                   plan_name="fix-orders-amounts", source_version=0, dry_run=False)
    capsys.readouterr()
    assert _run(plan, "--dry-run", "--takeover-stale-lock=false") == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"locked by run {run_id}" in err and "on another host" in err
    assert [e["state"] for e in Ledger(spark, home).run_events(run_id)] == ["started"]
    assert _run(plan, "--dry-run", "--takeover-stale-lock=true") == EXIT_USAGE  # its event
    assert "idle" in capsys.readouterr().err  # (recorded just now) is not 6 hours old
    assert _run(plan, "--dry-run", "--takeover-stale-lock=true",
                "--stale-lock-timeout=0.001") == 0
    events = Ledger(spark, home).run_events(run_id)
    states = [e["state"] for e in events]
    assert states[:2] == ["started", "resumed"] and "abandoned" not in states
    assert events[1]["details"]["locks"] == {target: "takeover"}
    assert events[1]["details"]["took_over_locks_of"] == {target: run_id}
    assert run_progress(events).state == "dry_run_passed"
    assert Ledger(spark, home).lock_holder(target) is None


@pytest.mark.parametrize("then", ["nothing", "restore"])
def test_a_run_whose_lock_was_taken_over_after_its_promotion_writes_nothing_more(
        spark: Any, base_lake: Path, tmp_path: Path, capsys: Any, monkeypatch: Any,
        then: str) -> None:
    """Fencing after the promotion: a run taken over once its promotion is recorded (by a
    rollback from another host, say, which may have restored the target already) stops with
    exit 2 and writes nothing more: no RESTORE of its own, no ledger event, no evidence, no
    publish change, no lock release. It used to go on: verify, write evidence, reopen publish
    and record ``done`` over the rollback, or restore the target a second time."""
    from sparkguard.publish import is_paused

    root, plan, target, key, v0 = _taken_over_at(spark, base_lake, tmp_path, monkeypatch,
                                                 "after_promote_ledger", then == "restore")
    home = str(root / "_sg")
    capsys.readouterr()
    assert _run(plan) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "no longer holds the target's lock" in err and f"taken over by run {TAKER}" in err
    assert _version(spark, target) == v0 + (2 if then == "restore" else 1)  # none of its own
    led = Ledger(spark, home)
    (mine,) = [p for p in led.latest_runs() if p.run_id != TAKER]
    assert [e["state"] for e in led.run_events(mine.run_id)][-1] == "promoted"
    assert not list((root / "evidence").glob("*.yaml"))
    assert is_paused(home, str(target))
    holder = led.lock_holder(key)
    assert holder is not None and holder.run_id == TAKER


def test_a_resumed_run_whose_promotion_landed_is_fenced_before_it_records_or_restores(
        spark: Any, base_lake: Path, tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    """A run that died right after its promotion commit (the ledger has its rollback point
    only) is resumed; taken over while resuming, it stops at the next stage and writes
    nothing more: its landed promotion is neither recorded nor restored by it."""
    from sparkguard import faults
    from tests.failpoints import dies_at, on_failpoint

    root = copy_lake(base_lake, tmp_path / "lake")
    plan = write_plan(root, _one_slice)
    target, home = root / "target" / "orders_clean", str(root / "_sg")
    key, v0 = lock_key_of(spark, target), _version(spark, target)
    dies_at(monkeypatch, faults, "after_promote_commit", lambda: _run(plan))
    assert _version(spark, target) == v0 + 1  # landed; the ledger has "promoting" only
    (crashed,) = Ledger(spark, home).latest_runs()
    before = [e["state"] for e in Ledger(spark, home).run_events(crashed.run_id)]
    assert before[-1] == "promoting"

    def take_over(_name: str) -> None:
        Ledger(spark, home).acquire([key], TAKER, "dave@example.com", takeover=True,
                                    stale_after_s=0)

    on_failpoint(monkeypatch, faults, "after_lock", take_over, times=1)
    capsys.readouterr()
    assert _run(plan) == EXIT_USAGE
    assert f"taken over by run {TAKER}" in capsys.readouterr().err
    assert _version(spark, target) == v0 + 1  # not restored by it
    after = [e["state"] for e in Ledger(spark, home).run_events(crashed.run_id)]
    assert after[:len(before)] == before
    assert not {"promoted", "verified", "restored", "failed", "done"} & set(after[len(before):])
    holder = Ledger(spark, home).lock_holder(key)
    assert holder is not None and holder.run_id == TAKER
