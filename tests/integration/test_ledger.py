"""The run ledger: pure derivations over events, and the Delta tables themselves."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

import pytest

from sparkguard.ledger import (
    RUN_STATES,
    TERMINAL_STATES,
    Ledger,
    LockInfo,
    PlanHistory,
    lock_decision,
    lock_holders,
    new_run_id,
    next_action,
    pid_alive,
    run_progress,
)

T0 = dt.datetime(2026, 12, 1, 10, 0, 0)
FP = "f" * 64


def ev(state: str, minute: int, run: str = "r1", **kw: Any) -> dict[str, Any]:
    row = {"run_id": run, "at": T0 + dt.timedelta(minutes=minute), "state": state,
           "plan_fingerprint": FP, "plan_name": "p", "owner": "o", "target": kw.pop("target", None),
           "source_version": kw.pop("source_version", None),
           "target_version_read": kw.pop("read", None),
           "target_version_written": kw.pop("written", None), "details": kw}
    return row


# -- pure -----------------------------------------------------------------------------------


def test_run_ids_sort_by_time_and_are_unique() -> None:
    a = new_run_id(dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    b = new_run_id(dt.datetime(2026, 1, 2, tzinfo=dt.UTC))
    assert a < b and a[:17] == "20260101T000000Z-"
    assert len({new_run_id() for _ in range(50)}) == 50


def test_terminal_states_are_states() -> None:
    assert set(TERMINAL_STATES) <= set(RUN_STATES)
    assert "failed" not in TERMINAL_STATES  # a failed run is resumed by a re-run


def test_progress_folds_versions_per_target_and_keeps_run_state() -> None:
    events = [
        ev("started", 0, source_version=7, dry_run=False, recipients=["bi"], plan_path="/p.yaml"),
        ev("paused", 1),
        ev("reconciled", 2, target="/t", read=4, label="t"),
        ev("promoting", 3, target="/t", read=4, label="t"),
        ev("promoted", 4, target="/t", read=4, written=5, label="t"),
    ]
    prog = run_progress(events)
    assert (prog.state, prog.source_version, prog.recipients) == ("paused", 7, ["bi"])
    t = prog.targets["t"]
    assert (t.dataset, t.reconciled_version, t.rollback_version, t.promoted_version,
            t.verified) == ("/t", 4, 4, 5, False)
    prog = run_progress([*events, ev("verified", 5, target="/t", label="t"),
                         ev("done", 6, evidence_path="/e.yaml")])
    assert prog.state == "done" and prog.targets["t"].verified and prog.terminal
    assert prog.evidence_path == "/e.yaml"


def test_progress_after_restore_and_a_rollback_point_moved_by_other_writers() -> None:
    prog = run_progress([
        ev("started", 0), ev("promoting", 1, target="/t", read=4, label="t"),
        ev("promoted", 2, target="/t", read=5, written=6, label="t"),
        ev("restored", 3, target="/t", read=5, written=7, label="t"),
        ev("failed", 4, error="boom")])
    t = prog.targets["t"]
    assert (t.rollback_version, t.promoted_version, t.restored) == (5, 6, True)
    assert prog.state == "failed" and prog.error == "boom" and not prog.terminal


def test_next_action_for_each_kind_of_end() -> None:
    def action(*events: dict[str, Any]) -> str:
        return next_action(run_progress([ev("started", 0), *events]))

    assert "resume" in action(ev("failed", 1))
    assert "resume" in action(ev("paused", 1))  # a crash leaves a non-terminal state
    assert "without --dry-run" in action(ev("dry_run_passed", 1))
    assert "fix" in action(ev("gate_failed", 1))
    assert action(ev("done", 1)) == "nothing"
    assert "rollback --run-id r1" in action(
        ev("promoted", 1, target="/t", read=1, written=2, label="t"), ev("done", 2))
    assert "rollback --run-id r1" in action(ev("rolling_back", 1))


def test_history_resumable_only_newest_non_terminal_and_dry_runs() -> None:
    hist = PlanHistory(FP, runs={
        "r1": [ev("started", 0, run="r1", dry_run=True), ev("dry_run_passed", 1, run="r1")],
        "r2": [ev("started", 10, run="r2"), ev("failed", 11, run="r2")],
    })
    assert [p.run_id for p in hist.dry_runs()] == ["r1"]
    resumable = hist.resumable()
    assert resumable is not None and resumable.run_id == "r2"
    hist.runs["r3"] = [ev("started", 20, run="r3"), ev("gate_failed", 21, run="r3")]
    assert hist.resumable() is None  # the newest run ended; a re-run starts a new one


def test_done_slices_need_same_source_version_and_newest_event_reconciled() -> None:
    def sl(minute: int, parts: list[str], state: str, sv: int = 3) -> dict[str, Any]:
        return {"run_id": "r", "at": T0 + dt.timedelta(minutes=minute), "target": "t",
                "partitions": json.dumps(parts), "state": state, "source_version": sv}

    hist = PlanHistory(FP, slices=[
        sl(0, ["a"], "reconciled"), sl(1, ["b"], "gate_failed"), sl(2, ["c"], "reconciled", sv=2),
        sl(3, ["d"], "reconciled"), sl(4, ["d"], "gate_failed"), sl(5, ["b"], "reconciled")])
    assert set(hist.done_slices("t", 3)) == {'["a"]', '["b"]'}
    assert set(hist.done_slices("t", 2)) == {'["c"]'}
    assert hist.done_slices("other", 3) == {}


def lock(action: str = "acquire", run: str = "r1", host: str = "h", pid: int = 10,
         token: str = "tok", minute: int = 0, gen: int = 1) -> LockInfo:
    return LockInfo("/t", gen, action, run, "o", T0 + dt.timedelta(minutes=minute), host, pid,
                    token)


def decide(holder: LockInfo | None, **kw: Any) -> str:
    args: dict[str, Any] = dict(run_id="r1", token="me", host="h",
                                now=T0 + dt.timedelta(hours=1), takeover=False,
                                stale_after_s=600.0, alive=True)
    args.update(kw)
    return lock_decision(holder, **args)[0]


def test_lock_decisions() -> None:
    assert decide(None) == "free"
    assert decide(lock("release")) == "free"
    assert decide(lock(token="me")) == "mine"
    # the same run, crashed on this host: a re-run takes it over without a flag
    assert decide(lock(), alive=False) == "resume"
    # the same run still alive (a second invocation), or another host: refused
    assert decide(lock()) == "refuse"
    assert decide(lock(host="other"), alive=None) == "refuse"
    # another run: refused; taken over only with the flag and once stale
    assert decide(lock(run="r0"), alive=False, holder_state="proof_passed") == "refuse"
    # another run that died on this host before recording anything (between its locks and
    # its start): nothing of it to finish or resume, so taken over without a flag (it was
    # refused for the stale timeout, 6 h by default)
    assert decide(lock(run="r0"), alive=False) == "takeover"
    assert decide(lock(run="r0"), alive=True) == "refuse"
    assert decide(lock(run="r0", host="other"), alive=None) == "refuse"
    assert decide(lock(run="r0"), takeover=True) == "takeover"  # idle 1 h > 600 s
    assert decide(lock(run="r0", minute=55), takeover=True) == "refuse"  # idle 5 min
    # activity in the ledger counts as the holder being alive
    assert decide(lock(run="r0"), takeover=True,
                  last_activity=T0 + dt.timedelta(minutes=58)) == "refuse"


def test_a_rollbacks_lock_is_judged_by_the_events_of_the_run_it_rolls_back() -> None:
    """A rollback holds its locks as ``R/rollback`` and records its events under ``R``: its
    idle time counts from R's newest event, and its lock is finished only when R's newest
    event, after the lock, ends a rollback (R's own ``done`` says nothing of it)."""
    from sparkguard.ledger_model import holder_activity, lock_run_id

    held = lock(run="r0/rollback", minute=0)
    assert lock_run_id(held.run_id) == "r0" and lock_run_id("r0") == "r0"

    def events(*states: tuple[str, int]) -> Any:
        return run_progress([{"run_id": "r0", "state": st, "plan_fingerprint": FP,
                              "at": T0 + dt.timedelta(minutes=m), "details": {}}
                             for st, m in states])

    def judged(prog: Any, **kw: Any) -> str:
        state, last = holder_activity(held, prog)
        return decide(held, holder_state=state, last_activity=last, alive=None, **kw)

    # checking before its RESTORE, R still reads done: not finished, and refused
    assert judged(events(("started", -30), ("done", -20))) == "refuse"
    # restoring: its rolling_back event 58 minutes after the lock is activity (idle 2 min)
    assert judged(events(("done", -20), ("rolling_back", 58)), takeover=True) == "refuse"
    assert judged(events(("done", -20), ("rolling_back", 1)), takeover=True) == "takeover"
    # it recorded rolled_back (or rollback_abandoned) and died before releasing: finished
    assert judged(events(("rolling_back", 1), ("rolled_back", 2))) == "finished"
    assert judged(events(("rolling_back", 1), ("rollback_abandoned", 2))) == "finished"
    # an earlier rollback's end, before this lock was taken, is not this one's
    assert judged(events(("rolled_back", -5))) == "refuse"


def test_lock_refusal_names_holder_owner_and_start() -> None:
    what, why = lock_decision(lock(run="r0"), run_id="r1", token="me", host="h", now=T0,
                              takeover=False, stale_after_s=60, alive=True)
    assert what == "refuse" and "--takeover-stale-lock" in why
    text = lock(run="r0").describe()
    assert "run r0" in text and "owner o" in text and "2026-12-01 10:00:00 UTC" in text


def test_lock_holders_newest_generation_wins() -> None:
    rows = [{"target": "/t", "generation": g, "action": a, "run_id": r, "owner": None,
             "at": T0 + dt.timedelta(minutes=g), "host": "h", "pid": 1, "token": r}
            for g, a, r in ((1, "acquire", "r1"), (3, "acquire", "r2"), (2, "release", "r1"))]
    assert lock_holders(rows)["/t"].run_id == "r2"


def test_pid_alive() -> None:
    assert pid_alive(os.getpid())
    assert not pid_alive(None) and not pid_alive(0)
    assert not pid_alive(2 ** 22 + 12345)  # above pid_max on Linux


# -- Delta ----------------------------------------------------------------------------------


@pytest.mark.spark
def test_ledger_tables_round_trip_and_are_append_only(spark: Any, lake: Path) -> None:
    from delta.tables import DeltaTable

    led = Ledger(spark, str(lake / "home"))
    assert led.load(FP).runs == {}  # no table yet: nothing, and nothing created
    led.ensure()
    led.record_run("r1", "started", fingerprint=FP, plan_name="p", owner="o", source_version=3,
                   approvals=[{"role": "x"}], dry_run=False)
    led.record_run("r1", "reconciled", fingerprint=FP, target="/t", version_read=9, label="t",
                   gates=[{"gate": "row_count_parity", "passed": True}])
    led.record_run("r2", "started", fingerprint="other" * 8, plan_name="q")
    led.record_slice("r1", FP, "t", 1, ["2026-05-01"], "reconciled", 3, rows=10,
                     content_hash='{"rows": 10}', elapsed_s=1.5,
                     gates=[{"gate": "duplicate_check", "passed": True}])
    hist = led.load(FP)
    assert list(hist.runs) == ["r1"]
    started, reconciled = hist.runs["r1"]
    assert started["details"]["approvals"] == [{"role": "x"}]
    assert (reconciled["target"], reconciled["target_version_read"]) == ("/t", 9)
    assert set(hist.done_slices("t", 3)) == {'["2026-05-01"]'}
    assert hist.slices[0]["gates"] == [{"gate": "duplicate_check", "passed": True}]
    assert [p.run_id for p in led.latest_runs()] == ["r2", "r1"]
    with pytest.raises(ValueError, match="unknown run state"):
        led.record_run("r1", "almost_done", fingerprint=FP)
    props = DeltaTable.forPath(spark, str(lake / "home/ledger/runs")).detail().first()
    assert props is not None and props["properties"]["delta.appendOnly"] == "true"
    assert props["properties"]["delta.checkpointInterval"] == "100"
    # appends collect column statistics on run_id and at only (status reads newest first)
    stats = [json.loads(json.loads(line)["add"]["stats"])
             for f in sorted((lake / "home/ledger/runs/_delta_log").glob("*.json"))
             for line in f.read_text().splitlines() if '"add"' in line]
    assert stats and all(s["numRecords"] == 1 and set(s) == {
        "numRecords", "minValues", "maxValues", "nullCount"} and all(
        set(s[k]) == {"run_id", "at"} for k in ("minValues", "maxValues", "nullCount"))
        for s in stats), stats
    with pytest.raises(Exception, match=r"(?i)append"):
        DeltaTable.forPath(spark, str(lake / "home/ledger/runs")).delete("run_id = 'r1'")


@pytest.mark.spark
def test_a_log_folder_without_a_commit_is_not_a_table(spark: Any, lake: Path) -> None:
    """Another run creating the ledger makes ``_delta_log`` before its first commit lands;
    this run must create (or wait for) the table, not read a table that is not there yet."""
    home = lake / "home"
    for name in ("runs", "slices", "locks"):
        (home / "ledger" / name / "_delta_log").mkdir(parents=True)
    led = Ledger(spark, str(home))
    assert led.load(FP).runs == {}
    led.ensure()
    led.record_run("r1", "started", fingerprint=FP, plan_name="p")
    led.record_slice("r1", FP, "t", 1, ["2026-05-01"], "reconciled", 3, rows=1)
    hist = led.load(FP)
    assert list(hist.runs) == ["r1"] and len(hist.slices) == 1


@pytest.mark.spark
def test_two_ledgers_created_at_once_both_lock_and_record(spark: Any, lake: Path) -> None:
    """Two runs starting together on a fresh home: both create the tables, exactly one holds
    the lock, and neither fails on a half-created table."""
    from concurrent.futures import ThreadPoolExecutor

    from sparkguard.errors import ConcurrentRunError

    home = str(lake / "home")

    def start(run_id: str) -> str:
        led = Ledger(spark, home)
        led.record_run(run_id, "started", fingerprint=FP, plan_name="p")
        try:
            led.acquire(["/t"], run_id, "o")
        except ConcurrentRunError:
            return "refused"
        return "locked"

    with ThreadPoolExecutor(2) as pool:
        outcomes = sorted(pool.map(start, ["r1", "r2"]))
    assert outcomes == ["locked", "refused"]
    hist = Ledger(spark, home).load(FP)
    assert sorted(hist.runs) == ["r1", "r2"]
