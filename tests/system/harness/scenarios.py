"""The scenarios: a backfill or rollback killed at a failpoint then re-run, and the concurrency
scenarios (two runs at once, a second run mid-run, another writer outside or inside the
window). Each returns an outcome whose ``problems()`` lists what is wrong and whose
``record()`` is the row the reliability table shows."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from sparkguard.faults import FAILPOINTS, ROLLBACK_FAILPOINTS
from tests.lakes import WINDOW
from tests.system.harness.checks import (
    _FINISHED,
    Expected,
    LedgerCheck,
    TableCheck,
    _history,
    _read,
    check_ledger,
    check_table,
)
from tests.system.harness.jobs import (
    NO_CHECKSUM_FILES,
    Proc,
    _backfill,
    _cli_in_process,
    _rollback,
    start_submit,
)
from tests.system.harness.lakes import BACKFILL_FAILPOINTS, COLUMNS, KILLED, SUBMIT_TIMEOUT_S, Lake, Row

# -- crash scenarios --------------------------------------------------------------------------


def _submits(procs: list[Proc]) -> int:
    """How many of ``procs`` were real ``spark-submit`` runs (not re-runs in this process)."""
    return sum(1 for p in procs if p.argv and p.argv[0] == "spark-submit")


def _order(fault: str) -> int:
    return list(FAILPOINTS).index(fault)


def state_after_crash(fault: str) -> str:
    """Where the target must be after dying at ``fault``: untouched until the promote commit."""
    return "clean" if _order(fault) >= _order("after_promote_commit") else "original"


def paused_after_crash(fault: str) -> bool:
    """Publish is paused from ``after_pause`` on, until a successful run reopens it."""
    return _order("after_pause") <= _order(fault) < _order("mid_publish_resume")


@dataclass(frozen=True)
class Crash:
    """One run killed at a failpoint, and what it left behind."""

    fault: str
    proc: Proc
    after: TableCheck
    paused: bool

    def problems(self, label: str) -> list[str]:
        out = []
        if not self.proc.died_at(self.fault):
            out.append(f"{label} exited {self.proc.code}, not {KILLED} at {self.fault}:\n"
                       f"{self.proc.tail()}")
        out += [f"after {label}: {p}" for p in self.after.problems(state_after_crash(self.fault))]
        if self.paused != paused_after_crash(self.fault):
            out.append(f"after {label} publish paused={self.paused}, expected "
                       f"{paused_after_crash(self.fault)}")
        return out


@dataclass
class CrashOutcome:
    """One backfill failpoint: crash, then the same command again (which may itself be killed
    at a second failpoint, ``recovery``, before a last re-run finishes the job)."""

    first: Crash
    crashed_run: str | None  # the run the crash left unfinished (None: no run recorded yet)
    rerun: Proc
    after_rerun: TableCheck
    ledger: LedgerCheck
    seconds: float = 0.0
    recovery: Crash | None = None  # the first re-run, killed too

    @property
    def fault(self) -> str:
        return self.first.fault

    @property
    def crash(self) -> Proc:
        return self.first.proc

    @property
    def after_crash(self) -> TableCheck:
        return self.first.after

    @property
    def paused_after_crash(self) -> bool:
        return self.first.paused

    def problems(self) -> list[str]:
        out = self.first.problems("crash run")
        if self.recovery is not None:
            out += self.recovery.problems("crashed re-run")
        if self.rerun.code != 0:
            out.append(f"re-run exited {self.rerun.code}:\n{self.rerun.tail()}")
        out += [f"after re-run: {p}" for p in self.after_rerun.problems("clean")]
        out += [f"ledger: {p}" for p in self.ledger.problems(self.crashed_run)]
        return out

    @property
    def rows_lost(self) -> int:
        crashed = self.recovery.after.rows_lost if self.recovery is not None else 0
        return self.after_crash.rows_lost + crashed + self.after_rerun.rows_lost

    def record(self) -> dict[str, Any]:
        """The reliability table's row for this failpoint (JSON-ready)."""
        procs = [self.crash, self.rerun, *([self.recovery.proc] if self.recovery else [])]
        dups = self.after_crash.duplicate_keys + self.after_rerun.duplicate_keys + (
            self.recovery.after.duplicate_keys if self.recovery else 0)
        return {"kind": "failpoint", "job": "backfill", "fault": self.fault,
                "recovery_fault": self.recovery.fault if self.recovery else None,
                "crash_exit": self.crash.code, "died_at_fault": self.crash.died_at(self.fault),
                "after_crash": self.after_crash.state, "paused": self.paused_after_crash,
                "rerun_exit": self.rerun.code, "after_rerun": self.after_rerun.state,
                "ledger_ok": not self.ledger.problems(self.crashed_run),
                "rows_lost": self.rows_lost, "duplicate_keys": dups,
                "submits": _submits(procs), "seconds": round(self.seconds, 1),
                "problems": self.problems()}


def _unfinished_run(spark: SparkSession, lake: Lake) -> str | None:
    states = check_ledger(spark, lake).run_states
    open_runs = [r for r, s in states.items() if s not in _FINISHED]
    return open_runs[-1] if open_runs else None


def _crash(spark: SparkSession, lake: Lake, exp: Expected, fault: str, tag: str) -> Crash:
    from sparkguard.publish import PublishControl

    proc = _backfill(lake, tag, fault)
    after = check_table(spark, lake, exp)
    return Crash(fault, proc, after, PublishControl(spark, lake.home).is_paused(lake.target))


def crash_backfill(spark: SparkSession, lake: Lake, exp: Expected, fault: str,
                   recovery: str | None = None, rerun_here: bool = False) -> CrashOutcome:
    """Run the backfill dying at ``fault``, check the tables, re-run it, check again.

    With ``recovery``, the first re-run dies at that later failpoint as well (a crash while
    recovering from a crash), is checked the same way, and a last re-run finishes the job.
    With ``rerun_here``, that last re-run runs in this process (``run_here``), not spark-submit.
    """
    assert fault in BACKFILL_FAILPOINTS, fault
    assert recovery is None or _order(recovery) > _order(fault), (fault, recovery)
    t0 = time.monotonic()
    first = _crash(spark, lake, exp, fault, f"crash-{fault}")
    crashed_run = _unfinished_run(spark, lake)
    second = _crash(spark, lake, exp, recovery, f"crash-{recovery}") if recovery else None
    rerun = _backfill(lake, f"rerun-{recovery or fault}", here=rerun_here)
    return CrashOutcome(first, crashed_run, rerun, check_table(spark, lake, exp),
                        check_ledger(spark, lake), time.monotonic() - t0, second)


@dataclass
class RollbackOutcome:
    """One rollback failpoint: a promoted run, a rollback dying there, the rollback again."""

    fault: str
    run_id: str
    crash: Proc
    after_crash: TableCheck
    rerun: Proc
    after_rerun: TableCheck
    run_state: str
    promote_commits: int
    seconds: float = 0.0

    def problems(self) -> list[str]:
        out = []
        if not self.crash.died_at(self.fault):
            out.append(f"crashed rollback exited {self.crash.code}, not {KILLED} at "
                       f"{self.fault}:\n{self.crash.tail()}")
        want = "original" if self.fault == "after_rollback_restore" else "clean"
        out += [f"after crash: {p}" for p in self.after_crash.problems(want)]
        if self.rerun.code != 0:
            out.append(f"re-run rollback exited {self.rerun.code}:\n{self.rerun.tail()}")
        out += [f"after re-run: {p}" for p in self.after_rerun.problems("original")]
        if self.run_state != "rolled_back":
            out.append(f"ledger state of run {self.run_id} is {self.run_state}, not rolled_back")
        if self.promote_commits != 1:
            out.append(f"{self.promote_commits} promote commit(s) in the history, expected 1")
        return out

    @property
    def rows_lost(self) -> int:
        return self.after_crash.rows_lost + self.after_rerun.rows_lost

    def record(self) -> dict[str, Any]:
        """The reliability table's row for this failpoint (JSON-ready)."""
        return {"kind": "failpoint", "job": "rollback", "fault": self.fault,
                "recovery_fault": None, "crash_exit": self.crash.code,
                "died_at_fault": self.crash.died_at(self.fault),
                "after_crash": self.after_crash.state, "paused": None,
                "rerun_exit": self.rerun.code, "after_rerun": self.after_rerun.state,
                "ledger_ok": self.run_state == "rolled_back", "rows_lost": self.rows_lost,
                "duplicate_keys": self.after_crash.duplicate_keys
                + self.after_rerun.duplicate_keys,
                "submits": _submits([self.crash, self.rerun]), "seconds": round(self.seconds, 1),
                "problems": self.problems()}


def crash_rollback(spark: SparkSession, lake: Lake, exp: Expected, fault: str,
                   rerun_here: bool = False) -> RollbackOutcome:
    """Roll back the lake's promoted run dying at ``fault``; then the same command again.

    ``lake`` must hold exactly one successful backfill (e.g. a recovered crash scenario).
    With ``rerun_here``, the second rollback runs in this process (``run_here``).
    """
    assert fault in ROLLBACK_FAILPOINTS, fault
    t0 = time.monotonic()
    before = check_ledger(spark, lake)
    (run_id,) = before.done_runs()
    crash = _rollback(lake, run_id, f"crash-{fault}", fault)
    after_crash = check_table(spark, lake, exp)
    rerun = _rollback(lake, run_id, f"rerun-{fault}", here=rerun_here)
    after = check_ledger(spark, lake)
    return RollbackOutcome(fault, run_id, crash, after_crash, rerun, check_table(spark, lake, exp),
                           after.run_states.get(run_id, "?"), len(after.promote_commits),
                           time.monotonic() - t0)


# -- concurrency scenarios --------------------------------------------------------------------


@dataclass
class ScenarioOutcome:
    """A concurrency scenario: what happened, and what is wrong with it."""

    name: str
    codes: list[int]
    after: TableCheck
    ledger: LedgerCheck
    notes: dict[str, Any] = field(default_factory=dict)
    found: list[str] = field(default_factory=list)
    seconds: float = 0.0
    submits: int = 0  # real spark-submit runs it took

    def problems(self) -> list[str]:
        return list(self.found)

    @property
    def rows_lost(self) -> int:
        return self.after.rows_lost

    def record(self) -> dict[str, Any]:
        """The reliability table's row for this scenario (JSON-ready)."""
        return {"kind": "scenario", "name": self.name, "codes": list(self.codes),
                "after": self.after.state, "rows_lost": self.rows_lost,
                "duplicate_keys": self.after.duplicate_keys,
                "rows_appended": int(self.notes.get("rows_appended", 0) or 0),
                "notes": {k: str(v) for k, v in self.notes.items() if v not in ("", None)},
                "submits": self.submits, "seconds": round(self.seconds, 1),
                "problems": self.problems()}


def two_runs_at_once(spark: SparkSession, lake: Lake, exp: Expected,
                     append_outside: bool = False, pause_s: float = 2.0) -> ScenarioOutcome:
    """The same plan submitted twice at the same moment: exactly one run proceeds.

    With ``append_outside``, another writer also appends outside the window for as long as
    either run is alive (the appends scenario, checked the same way, in the same two runs).
    """
    t0 = time.monotonic()
    logs = [lake.root.parent / f"{lake.root.name}-twin{i}.log" for i in (1, 2)]
    procs = [start_submit("backfill.py", ["--plan", str(lake.plan)], log,
                          conf=NO_CHECKSUM_FILES)[0] for log in logs]
    writer = _OutsideWriter()
    if append_outside:
        writer.append_while(spark, lake, procs, pause_s)
    codes = [p.wait(timeout=SUBMIT_TIMEOUT_S) for p in procs]
    after, ledger = check_table(spark, lake, exp.plus(writer.rows)), check_ledger(spark, lake)
    found = []
    if sorted(codes) != [0, 2]:
        found.append(f"exit codes {codes}, expected one 0 and one 2")
    winner = ledger.done_runs()
    refusal = ""
    if sorted(codes) == [0, 2] and winner:
        loser = logs[codes.index(2)].read_text(encoding="utf-8", errors="replace")
        refusal = next((ln for ln in loser.splitlines() if winner[0] in ln), "")
        if not refusal:
            found.append(f"the refused run does not name the holder {winner[0]}")
    if len(ledger.run_states) != 1:
        found.append(f"{len(ledger.run_states)} runs in the ledger; the refused one must write "
                     f"nothing: {ledger.run_states}")
    notes: dict[str, Any] = {"winner": winner, "refusal": refusal}
    if append_outside:
        notes.update(writer.notes(spark, lake))
        found += writer.problems(notes)
    found += after.problems("clean") + ledger.problems()
    name = "two runs of the same plan at once" + (
        ", another writer appending outside the window" if append_outside else "")
    return ScenarioOutcome(name, codes, after, ledger, notes, found, time.monotonic() - t0, 2)


def _wait_for_pause(lake: Lake, proc: subprocess.Popen[bytes],
                    timeout_s: float = SUBMIT_TIMEOUT_S) -> bool:
    """Wait until the run in ``proc`` paused publish (its control table's first commit is on
    disk; a file check, so the wait costs no Spark job); False if ``proc`` ended first."""
    first_commit = Path(lake.home) / "control" / "publish" / "_delta_log" / f"{0:020d}.json"
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None and time.monotonic() < deadline:
        if first_commit.exists():
            return True
        time.sleep(0.2)
    return False


def second_run_mid_run(spark: SparkSession, lake: Lake, exp: Expected) -> ScenarioOutcome:
    """The same plan run again while a first run is under way: it must not join in.

    The first run is a real ``spark-submit``; once the ledger shows it paused publish, the
    same command runs in this process (no JVM start, so it surely reaches its lock while the
    first is still writing shadows) and must exit 2 naming the holder, writing nothing.
    """
    t0 = time.monotonic()
    first = start_submit("backfill.py", ["--plan", str(lake.plan)],
                         lake.root.parent / f"{lake.root.name}-first.log")[0]
    mid_run = _wait_for_pause(lake, first)
    err = io.StringIO()
    code2 = _cli_in_process(["run", "--plan", str(lake.plan)], sys.stdout, err)
    overlapped = first.poll() is None
    codes = [first.wait(timeout=SUBMIT_TIMEOUT_S), code2]
    after, ledger = check_table(spark, lake, exp), check_ledger(spark, lake)
    found = [] if mid_run and overlapped else [
        "the second run did not overlap the first; the scenario proved nothing"]
    if codes != [0, 2]:
        found.append(f"exit codes {codes} (first, second), expected [0, 2]")
    winner = ledger.done_runs()
    refusal = next((ln for ln in err.getvalue().splitlines() if winner and winner[0] in ln),
                   "")
    if winner and not refusal:
        found.append(f"the second run does not name the holder {winner[0]}")
    found += after.problems("clean") + ledger.problems()
    return ScenarioOutcome("same plan run again mid-run", codes, after, ledger,
                           {"winner": winner, "refusal": refusal, "overlapped": overlapped},
                           found, time.monotonic() - t0, 1)


OUTSIDE_DAYS = (0, len(WINDOW) + 3)  # day offsets from the first lake day, outside the window


def _other_writer_rows(spark: SparkSession, lake: Lake, batch: int, days: Sequence[Any]
                       ) -> tuple[DataFrame, Counter[Row]]:
    """Three new orders per day in ``days``, ids far from the demo's, with the target schema."""
    from decimal import Decimal

    rows = [(9_000_000 + batch * 100 + i * 10 + j, d, 1, "USD", "paid", 1, Decimal("1.00"),
             Decimal("1.00")) for i, d in enumerate(days) for j in range(3)]
    schema = _read(spark, lake.target).select(*COLUMNS).schema
    return spark.createDataFrame(rows, schema), Counter(rows)


@dataclass
class _OutsideWriter:
    """Another writer appending a few rows outside the window, batch after batch."""

    batches: int = 0
    rows: Counter[Row] = field(default_factory=Counter)

    def append_while(self, spark: SparkSession, lake: Lake,
                     procs: Sequence[subprocess.Popen[bytes]], pause_s: float) -> None:
        """Append one batch every ``pause_s`` seconds while any of ``procs`` runs."""
        import datetime as dt

        from sparkguard.demo import START

        days = [START + dt.timedelta(days=o) for o in OUTSIDE_DAYS] + [
            WINDOW[-1] + dt.timedelta(30)]
        assert not set(days) & set(WINDOW)
        while any(p.poll() is None for p in procs):
            df, rows = _other_writer_rows(spark, lake, self.batches, days)
            df.write.format("delta").mode("append").save(lake.target)
            self.rows += rows
            self.batches += 1
            time.sleep(pause_s)

    def notes(self, spark: SparkSession, lake: Lake) -> dict[str, Any]:
        """How many appends landed before and after the promote commit (from the history)."""
        hist = _history(spark, lake.target)
        promote = [v for v, m in hist if m.get("action") == "promote"]
        blind = [v for v, m in hist if not m and v > 0]
        return {"appends": self.batches, "rows_appended": sum(self.rows.values()),
                "appends_before_promotion": sum(1 for v in blind if promote and v < promote[0]),
                "appends_after_promotion": sum(1 for v in blind if promote and v > promote[0])}

    def problems(self, notes: dict[str, Any]) -> list[str]:
        if notes["appends_before_promotion"] < 1:
            return ["no append landed before the promotion; the scenario proved nothing"]
        return []


def appends_outside_window(spark: SparkSession, lake: Lake, exp: Expected,
                           pause_s: float = 2.0) -> ScenarioOutcome:
    """Another writer appends outside the window for as long as a real backfill runs."""
    t0 = time.monotonic()
    proc, _ = start_submit("backfill.py", ["--plan", str(lake.plan)],
                           lake.root.parent / f"{lake.root.name}-appends.log")
    writer = _OutsideWriter()
    writer.append_while(spark, lake, [proc], pause_s)
    code = proc.wait()
    after, ledger = check_table(spark, lake, exp.plus(writer.rows)), check_ledger(spark, lake)
    notes = writer.notes(spark, lake)
    found = [] if code == 0 else [f"backfill exited {code}"]
    found += writer.problems(notes) + after.problems("clean") + ledger.problems()
    return ScenarioOutcome("appends outside the window during a run", [code], after, ledger,
                           notes, found, time.monotonic() - t0, 1)


class _WindowWriter:
    """Another writer that appends into the window (and outside it) once, at a given moment.

    It fires on a notifier event (a real extension point, e.g. ``publish_paused``) or on a
    progress message of the run, so the moment is deterministic.
    """

    def __init__(self, spark: SparkSession, lake: Lake, event: str | None,
                 message: str | None) -> None:
        import datetime as dt

        from sparkguard.demo import START

        self.spark, self.lake, self.event, self.message = spark, lake, event, message
        self.days = [WINDOW[1], START + dt.timedelta(days=OUTSIDE_DAYS[0])]
        self.rows: Counter[Row] = Counter()
        self.lines: list[str] = []

    def _write(self) -> None:
        if self.rows:
            return
        df, rows = _other_writer_rows(self.spark, self.lake, 0, self.days)
        df.write.format("delta").mode("append").save(self.lake.target)
        self.rows = rows

    def send(self, event: str, recipients: Sequence[str], payload: dict[str, Any]) -> None:
        if event == self.event:
            self._write()

    def out(self, line: str) -> None:
        self.lines.append(line)
        if self.message and re.search(self.message, line):
            self._write()


def _run_in_process(spark: SparkSession, lake: Lake, writer: _WindowWriter) -> int:
    """``sparkguard run`` in this process, with the writer hooked in; returns the exit code."""
    from sparkguard.errors import EXIT_RUNTIME, SparkguardError
    from sparkguard.plan import load_plan
    from sparkguard.run.evaluator import run_backfill

    try:
        outcome = run_backfill(spark, load_plan(lake.plan), str(lake.plan), home=lake.home,
                               evidence_dir=str(lake.root / "evidence"), notifiers=[writer],
                               out=writer.out)
        return outcome.exit_code
    except SparkguardError as exc:
        return exc.exit_code
    except Exception as exc:  # a runtime failure is also a safe stop if nothing was lost
        writer.lines.append(f"runtime failure: {exc}")
        return EXIT_RUNTIME


WINDOW_MOMENTS = {
    "after publish paused": ("publish_paused", None),
    "between reconciliation and promotion": (None, r"full-window reconciliation over"),
}


def window_writer(spark: SparkSession, lake: Lake, exp: Expected, moment: str) -> ScenarioOutcome:
    """Another writer appends into the window during the run: stop safely or retry, lose nothing.

    Acceptable ends: the run stopped (non-zero exit, publish still paused) with the target as
    before plus the writer's rows; or the run finished with the clean window plus the writer's
    rows. Losing the writer's rows, or a partial window, is a failure.
    """
    t0 = time.monotonic()
    event, message = WINDOW_MOMENTS[moment]
    writer = _WindowWriter(spark, lake, event, message)
    code = _run_in_process(spark, lake, writer)
    after, ledger = check_table(spark, lake, exp.plus(writer.rows)), check_ledger(spark, lake)
    found = []
    if not writer.rows:
        found.append(f"the other writer never fired ({moment}); the scenario proved nothing")
    found += after.problems()
    if code == 0 and after.state != "clean":
        found.append(f"run succeeded but the target is {after.state}")
    if code != 0 and not ledger.paused:
        found.append("run stopped but publish is open")
    if code != 0 and after.state != "original":
        found.append(f"run stopped (exit {code}) but the target is {after.state}")
    notes = {"exit": code, "stopped": code != 0,
             "why": next((ln for ln in reversed(writer.lines) if "moved" in ln or "FAILED" in ln
                          or "failure" in ln), "")}
    return ScenarioOutcome(f"writer in the window {moment}", [code], after, ledger, notes, found,
                           time.monotonic() - t0)


Scenario = Callable[[SparkSession, Lake, Expected], ScenarioOutcome]
SCENARIOS: dict[str, Scenario] = {
    "twins": two_runs_at_once,
    "second-mid-run": second_run_mid_run,
    "appends-outside": appends_outside_window,
    "window-after-pause": lambda sp, lk, ex: window_writer(sp, lk, ex, "after publish paused"),
    "window-before-promote": lambda sp, lk, ex: window_writer(
        sp, lk, ex, "between reconciliation and promotion"),
}
