"""Reliability figures: a crash at every failpoint, concurrent runs and writers, hostile plans.

For every failpoint in :data:`sparkguard.faults.FAILPOINTS` this runs the real job
(``spark-submit jobs/backfill.py --plan P``, or ``jobs/rollback.py`` after a clean backfill)
with ``SPARKGUARD_FAULT_AT`` set, checks that the process died (exit 137), re-runs the same
command without the fault, and reads the Delta tables back: the target must equal its
original content or the clean result (computed here independently, from the source through
the demo transform), never anything in between; no duplicate business keys; no lost rows;
publish paused from the pause until a successful finish; the ledger agreeing with the target
history. Then the concurrency scenarios, then the count of rejected hostile plans, and a
Markdown table of the figures (the README's Reliability table)::

    make reliability        # = flock /tmp/sparkguard-spark.lock python bench/reliability.py

``tests/test_crash_suite.py`` and ``tests/test_concurrency.py`` run the same scenario
functions (a subset of the failpoints unless ``SPARKGUARD_FULL_CRASH=1``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from sparkguard.demo import transform_orders  # noqa: E402
from sparkguard.faults import FAILPOINTS, ROLLBACK_FAILPOINTS  # noqa: E402
from tests.lakes import WINDOW, build_base, copy_lake, write_plan  # noqa: E402

__all__ = [
    "BACKFILL_FAILPOINTS",
    "SCENARIOS",
    "SUBSET",
    "WINDOW_MOMENTS",
    "CrashOutcome",
    "Expected",
    "Lake",
    "LedgerCheck",
    "RollbackOutcome",
    "ScenarioOutcome",
    "TableCheck",
    "appends_outside_window",
    "check_ledger",
    "check_table",
    "crash_backfill",
    "crash_rollback",
    "expected_states",
    "main",
    "make_base",
    "new_lake",
    "paused_after_crash",
    "second_run_mid_run",
    "spark_submit",
    "state_after_crash",
    "two_runs_at_once",
    "window_writer",
]

KILLED = 137  # what a failpoint exits with, like SIGKILL
BACKFILL_FAILPOINTS = tuple(f for f in FAILPOINTS if f not in ROLLBACK_FAILPOINTS)
# What `make test` runs; SPARKGUARD_FULL_CRASH=1 runs every failpoint.
SUBSET = ("mid_slices", "after_promote_commit", "mid_rollback")
COLUMNS = ("order_id", "order_date", "customer_id", "currency", "status", "quantity", "amount",
           "line_total")
KEY = "order_id"
LABEL = "orders_clean"
SUBMIT_TIMEOUT_S = 900.0

Row = tuple[Any, ...]


# -- lakes ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Lake:
    """One scenario's copy of the demo lake; sparkguard's tables live under ``home``."""

    root: Path

    @property
    def plan(self) -> Path:
        return self.root / "plan.yaml"

    @property
    def source(self) -> str:
        return str(self.root / "source" / "orders")

    @property
    def target(self) -> str:
        return str(self.root / "target" / "orders_clean")

    @property
    def home(self) -> str:
        return str(self.root / "_sparkguard")  # the CLI's default: <plan dir>/_sparkguard


def make_base(spark: SparkSession, root: Path) -> Path:
    """Generate the small demo lake once; scenarios copy it."""
    return build_base(spark, root)


def new_lake(base: Path, dest: Path) -> Lake:
    """A fresh copy of the base lake with its own approved plan."""
    root = copy_lake(base, dest)
    write_plan(root)
    return Lake(root)


def _rows(df: DataFrame) -> Counter[Row]:
    """The table as a multiset of rows (test lakes are a few thousand rows)."""
    return Counter(tuple(r) for r in df.select(*COLUMNS).collect())


def _read(spark: SparkSession, path: str) -> DataFrame:
    return spark.read.format("delta").load(path)


@dataclass(frozen=True)
class Expected:
    """The two acceptable contents of the target: before the backfill, and after it."""

    original: Counter[Row]
    clean: Counter[Row]

    def plus(self, extra: Counter[Row]) -> Expected:
        """Both states with rows another writer added (which must survive either way)."""
        return Expected(self.original + extra, self.clean + extra)


def expected_states(spark: SparkSession, lake: Lake) -> Expected:
    """Original target, and the clean result computed independently from the source.

    Clean = the target outside the window, unchanged, plus the demo Python transform of the
    source inside the window (the plan itself uses the SQL transform).
    """
    target = _read(spark, lake.target)
    in_window = F.col("order_date").isin(WINDOW)
    window = transform_orders(spark, _read(spark, lake.source).filter(in_window), list(WINDOW))
    clean = target.filter(~in_window).unionByName(window.select(*COLUMNS))
    return Expected(_rows(target), _rows(clean))


# -- table and ledger checks ------------------------------------------------------------------


def _outside(rows: Counter[Row]) -> Counter[Row]:
    return Counter({r: n for r, n in rows.items() if r[1] not in WINDOW})


@dataclass(frozen=True)
class TableCheck:
    """What the target holds, against the two acceptable states."""

    state: str  # "original" | "clean" | "between"
    rows: int
    duplicate_keys: int
    rows_lost: int  # rows of the nearest acceptable state missing from the table
    rows_lost_outside_window: int
    rows_extra: int  # rows in the table that the nearest acceptable state lacks

    def problems(self, want: str | None = None) -> list[str]:
        out = []
        if self.state == "between" or (want is not None and self.state != want):
            out.append(f"target is {self.state}, expected {want or 'original or clean'} "
                       f"({self.rows_lost} row(s) missing, {self.rows_extra} extra)")
        if self.duplicate_keys:
            out.append(f"{self.duplicate_keys} duplicate {KEY}(s)")
        if self.rows_lost_outside_window:
            out.append(f"{self.rows_lost_outside_window} row(s) lost outside the window")
        return out


def check_table(spark: SparkSession, lake: Lake, exp: Expected) -> TableCheck:
    """Read the target and place it against ``exp``."""
    rows = _rows(_read(spark, lake.target))
    keys = Counter(r[0] for r in rows.elements())
    dups = sum(1 for n in keys.values() if n > 1)
    if rows == exp.original:
        state = "original"
    elif rows == exp.clean:
        state = "clean"
    else:
        state = "between"
    near = min((exp.original, exp.clean), key=lambda s: sum(((s - rows) + (rows - s)).values()))
    return TableCheck(state=state, rows=sum(rows.values()), duplicate_keys=dups,
                      rows_lost=sum((near - rows).values()),
                      rows_lost_outside_window=sum((_outside(exp.original) - _outside(rows))
                                                   .values()),
                      rows_extra=sum((rows - near).values()))


@dataclass(frozen=True)
class LedgerCheck:
    """sparkguard's own record of the runs, and the target history it must agree with."""

    run_states: dict[str, str]  # run id -> newest state
    promote_commits: list[tuple[int, str]]  # (version, run id) of every promote commit
    ledger_promoted: dict[str, int]  # run id -> promoted version the ledger recorded
    locks_held: int  # targets whose lock is still held
    paused: bool

    def done_runs(self) -> list[str]:
        return [r for r, s in self.run_states.items() if s == "done"]

    def problems(self, resumed_run: str | None = None) -> list[str]:
        """After a successful finish: one done run, one promote commit, ledger = history."""
        out = []
        done = self.done_runs()
        if len(done) != 1:
            out.append(f"{len(done)} run(s) reached done (states {self.run_states})")
        open_runs = {r: s for r, s in self.run_states.items() if s not in _FINISHED}
        if open_runs:
            out.append(f"runs left unfinished in the ledger: {open_runs}")
        if resumed_run is not None and done and done[0] != resumed_run:
            out.append(f"the re-run started run {done[0]} instead of resuming {resumed_run}")
        if len(self.promote_commits) != 1:
            out.append(f"{len(self.promote_commits)} promote commit(s) in the target history: "
                       f"{self.promote_commits}")
        elif done:
            version, run = self.promote_commits[0]
            if run != done[0]:
                out.append(f"promote commit v{version} belongs to run {run}, not {done[0]}")
            if self.ledger_promoted.get(done[0]) != version:
                out.append(f"ledger says promoted version {self.ledger_promoted.get(done[0])}, "
                           f"history says {version}")
        if self.locks_held:
            out.append(f"{self.locks_held} lock(s) still held")
        if self.paused:
            out.append("publish still paused after a successful run")
        return out


_FINISHED = {"done", "gate_failed", "dry_run_passed", "rolled_back", "restored_after_failure"}


def _history(spark: SparkSession, path: str) -> list[tuple[int, dict[str, Any]]]:
    """(version, sparkguard userMetadata or {}) for every commit of a table."""
    from delta.tables import DeltaTable

    out = []
    for h in DeltaTable.forPath(spark, path).history().select("version", "userMetadata").collect():
        meta: dict[str, Any] = {}
        if h["userMetadata"]:
            try:
                meta = json.loads(h["userMetadata"]).get("sparkguard") or {}
            except ValueError:
                meta = {}
        out.append((int(h["version"]), meta))
    return sorted(out, key=lambda vm: vm[0])


def _delta_rows(spark: SparkSession, path: str) -> list[dict[str, Any]]:
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, path):
        return []
    return [r.asDict() for r in _read(spark, path).collect()]


def check_ledger(spark: SparkSession, lake: Lake) -> LedgerCheck:
    """Read the ledger's run events and the target history directly; locks and publish state
    through their one-call APIs (what an operator or a downstream job would ask)."""
    from sparkguard.ledger import Ledger
    from sparkguard.publish import PublishControl

    events = sorted(_delta_rows(spark, f"{lake.home}/ledger/runs"), key=lambda e: e["at"])
    states: dict[str, str] = {}
    promoted: dict[str, int] = {}
    for e in events:
        states[e["run_id"]] = e["state"]
        if e["state"] != "promoted":
            continue
        details = json.loads(e.get("details") or "{}")
        if LABEL in (details.get("promoted_versions") or {}):
            promoted[e["run_id"]] = int(details["promoted_versions"][LABEL])
        elif e.get("target_version_written") is not None:
            promoted[e["run_id"]] = int(e["target_version_written"])
    commits = [(v, m.get("run_id", "")) for v, m in _history(spark, lake.target)
               if m.get("action") == "promote"]
    locks = int(Ledger(spark, lake.home).lock_holder(lake.target) is not None)
    paused = PublishControl(spark, lake.home).is_paused(lake.target)
    return LedgerCheck(states, commits, promoted, locks, paused)


# -- running the real jobs ------------------------------------------------------------------


@dataclass(frozen=True)
class Proc:
    """One finished spark-submit."""

    argv: list[str]
    code: int
    seconds: float
    log: Path

    def tail(self, n: int = 30) -> str:
        lines = self.log.read_text(encoding="utf-8", errors="replace").splitlines()
        return "\n".join(lines[-n:])

    def died_at(self, fault: str) -> bool:
        """The failpoint, not something else, ended the process."""
        text = self.log.read_text(encoding="utf-8", errors="replace")
        return self.code == KILLED and f"failpoint {fault} hit" in text


def submit_env(fault: str | None = None) -> dict[str, str]:
    """The environment the README documents for spark-submit, plus the failpoint."""
    env = dict(os.environ)
    env.pop("SPARKGUARD_FAULT_AT", None)
    env["PATH"] = f"{ROOT / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    from sparkguard.session import submit_conf_dir

    env["SPARK_CONF_DIR"] = str(submit_conf_dir(ROOT / "conf"))  # jars resolved once: no Ivy
    env["PYSPARK_PYTHON"] = env["PYSPARK_DRIVER_PYTHON"] = str(ROOT / ".venv" / "bin" / "python")
    if fault:
        env["SPARKGUARD_FAULT_AT"] = fault
    return env


def start_submit(job: str, args: Sequence[str], log: Path, fault: str | None = None,
                 env: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], list[str]]:
    """Start ``spark-submit jobs/<job> args`` with output to ``log``; returns (process, argv)."""
    argv = ["spark-submit", str(ROOT / "jobs" / job), *args]
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as fh:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env or submit_env(fault), stdout=fh,
                                stderr=subprocess.STDOUT)
    return proc, argv


def spark_submit(job: str, args: Sequence[str], log: Path, fault: str | None = None,
                 env: dict[str, str] | None = None) -> Proc:
    """Run ``spark-submit jobs/<job> args`` to the end."""
    t0 = time.monotonic()
    proc, argv = start_submit(job, args, log, fault, env)
    try:
        code = proc.wait(timeout=SUBMIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
    return Proc(argv, code, time.monotonic() - t0, log)


def _cli_in_process(argv: list[str], out: TextIO, err: TextIO) -> int:
    """``sparkguard <argv>`` in this process (its active session), output to ``out``/``err``."""
    from sparkguard.cli import main

    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        return main(argv)


_JOB_COMMAND = {"backfill.py": "run", "rollback.py": "rollback"}


def run_here(job: str, args: Sequence[str], log: Path) -> Proc:
    """What ``jobs/<job> args`` runs, in this process on its active session, output to ``log``.

    For a re-run after a crash: everything it resumes from is on disk (ledger, shadow tables,
    the target's history), so it needs no fresh JVM to prove the recovery.
    """
    argv = [_JOB_COMMAND[job], *args]
    t0 = time.monotonic()
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w", encoding="utf-8") as fh:
        code = _cli_in_process(argv, fh, fh)
    return Proc(["sparkguard", *argv], code, time.monotonic() - t0, log)


def _job(job: str, args: list[str], lake: Lake, tag: str, fault: str | None,
         here: bool) -> Proc:
    log = lake.root.parent / f"{lake.root.name}-{tag}.log"
    if here:
        assert fault is None, "a failpoint kills the process: only for spark-submit"
        return run_here(job, args, log)
    return spark_submit(job, args, log, fault)


def _backfill(lake: Lake, tag: str, fault: str | None = None, here: bool = False) -> Proc:
    return _job("backfill.py", ["--plan", str(lake.plan)], lake, tag, fault, here)


def _rollback(lake: Lake, run_id: str, tag: str, fault: str | None = None,
              here: bool = False) -> Proc:
    return _job("rollback.py", ["--run-id", run_id, "--home", lake.home], lake, tag, fault, here)


# -- crash scenarios --------------------------------------------------------------------------


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


def two_runs_at_once(spark: SparkSession, lake: Lake, exp: Expected,
                     append_outside: bool = False, pause_s: float = 2.0) -> ScenarioOutcome:
    """The same plan submitted twice at the same moment: exactly one run proceeds.

    With ``append_outside``, another writer also appends outside the window for as long as
    either run is alive (the appends scenario, checked the same way, in the same two runs).
    """
    t0 = time.monotonic()
    logs = [lake.root.parent / f"{lake.root.name}-twin{i}.log" for i in (1, 2)]
    procs = [start_submit("backfill.py", ["--plan", str(lake.plan)], log)[0] for log in logs]
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


# -- hostile plans ----------------------------------------------------------------------------

BAD_PLANS_TESTS = ROOT / "tests" / "test_bad_plans.py"


def hostile_plans(log: Path) -> tuple[int, int]:
    """(refused as required, total) hostile or malformed plans of ``tests/test_bad_plans.py``.

    That file's corpus runs through pytest; each ``*bad_plan_refused*`` case submits one bad
    plan and asserts exit 2, a message naming the field and the fix, and a byte-identical
    tree (nothing written). Returns (0, 0) when the file does not exist.
    """
    if not BAD_PLANS_TESTS.exists():
        return 0, 0
    xml = log.with_suffix(".xml")
    with open(log, "wb") as fh:
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        f"--junitxml={xml}", str(BAD_PLANS_TESTS)], cwd=ROOT, stdout=fh,
                       stderr=subprocess.STDOUT, check=False)
    import xml.etree.ElementTree as ET

    cases = [c for c in ET.parse(xml).getroot().iter("testcase")
             if "bad_plan_refused" in c.get("name", "")]
    failed = sum(1 for c in cases if c.find("failure") is not None or c.find("error") is not None
                 or c.find("skipped") is not None)
    return len(cases) - failed, len(cases)


# -- the command ------------------------------------------------------------------------------


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _session() -> SparkSession:
    from sparkguard.session import local_session_builder

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = local_session_builder(
        "sparkguard-reliability",
        extra={"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2",
               "spark.driver.memory": "2g"}).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


@dataclass
class Figures:
    """Everything the table reports."""

    crashes: list[CrashOutcome] = field(default_factory=list)
    rollbacks: list[RollbackOutcome] = field(default_factory=list)
    scenarios: list[ScenarioOutcome] = field(default_factory=list)
    bad_plans: tuple[int, int] = (0, 0)
    seconds: float = 0.0

    def all_outcomes(self) -> list[CrashOutcome | RollbackOutcome | ScenarioOutcome]:
        return [*self.crashes, *self.rollbacks, *self.scenarios]

    def ok(self) -> bool:
        return all(not o.problems() for o in self.all_outcomes()) and \
            self.bad_plans[0] == self.bad_plans[1]


def _count(pred: Callable[[Any], bool], items: Sequence[Any]) -> int:
    return sum(1 for i in items if pred(i))


def render(fig: Figures) -> str:
    """The Markdown tables (summary, then one row per failpoint and scenario)."""
    fps = [*fig.crashes, *fig.rollbacks]
    died = _count(lambda o: o.crash.died_at(o.fault), fps)
    recovered = _count(lambda o: not o.problems(), fps)
    states = Counter(o.after_crash.state for o in fps)
    lost = sum(o.rows_lost for o in fig.all_outcomes())
    dups = sum(o.after_crash.duplicate_keys + o.after_rerun.duplicate_keys for o in fps) + \
        sum(o.after.duplicate_keys for o in fig.scenarios)
    appended = sum(int(o.notes.get("rows_appended", 0)) for o in fig.scenarios)
    submits = 2 * len(fps) + sum(o.submits for o in fig.scenarios)
    passed, total = fig.bad_plans
    lines = [
        "| Figure | Value |",
        "|---|---|",
        f"| Failpoints killed mid-run (exit 137), then recovered by re-running the same command "
        f"| {recovered} / {len(fps)} ({died} died at their failpoint) |",
        f"| Target after a crash: original / clean / in between | {states['original']} / "
        f"{states['clean']} / {states['between']} |",
        f"| Concurrent scenarios passed | {_count(lambda o: not o.problems(), fig.scenarios)} / "
        f"{len(fig.scenarios)} |",
        f"| Rows appended by another writer during a run, outside the window / lost | "
        f"{appended} / {sum(o.rows_lost for o in fig.scenarios)} |",
        f"| Hostile or malformed plans rejected (exit 2, nothing written) | {passed} / {total} |",
        f"| Rows lost, all scenarios | {lost} |",
        f"| Duplicate business keys, all scenarios | {dups} |",
        f"| Real `spark-submit` runs / wall time | {submits} / {fig.seconds / 60:.0f} min |",
        "",
        "| Failpoint | Job | Crash exit | Target after crash | Publish paused | Re-run exit | "
        "Target after re-run | Ledger = history | s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in fig.crashes:
        ledger_ok = "yes" if not c.ledger.problems(c.crashed_run) else "NO"
        lines.append(f"| `{c.fault}` | backfill | {c.crash.code} | {c.after_crash.state} | "
                     f"{'yes' if c.paused_after_crash else 'no'} | {c.rerun.code} | "
                     f"{c.after_rerun.state} | {ledger_ok} | {c.seconds:.0f} |")
    for r in fig.rollbacks:
        lines.append(f"| `{r.fault}` | rollback | {r.crash.code} | {r.after_crash.state} | - | "
                     f"{r.rerun.code} | {r.after_rerun.state} | "
                     f"{'yes' if r.run_state == 'rolled_back' else 'NO'} | {r.seconds:.0f} |")
    lines += ["", "| Concurrent scenario | Exit codes | Target after | Passed | Notes |",
              "|---|---|---|---|---|"]
    for s in fig.scenarios:
        notes = ", ".join(f"{k}={v}" for k, v in s.notes.items() if v not in ("", None))
        lines.append(f"| {s.name} | {s.codes} | {s.after.state} | "
                     f"{'yes' if not s.problems() else 'NO'} | {notes} |")
    return "\n".join(lines)


def run_all(spark: SparkSession, work: Path, faults: Sequence[str], scenarios: Sequence[str],
            bad_plans: bool) -> Figures:
    """Every requested failpoint, the concurrency scenarios and the hostile plans."""
    t0 = time.monotonic()
    fig = Figures()
    base = make_base(spark, work / "base")
    exp = expected_states(spark, Lake(base))
    lakes: dict[str, Lake] = {}
    for fault in [f for f in faults if f in BACKFILL_FAILPOINTS]:
        lake = new_lake(base, work / fault / "lake")
        out = crash_backfill(spark, lake, exp, fault)
        fig.crashes.append(out)
        lakes[fault] = lake
        _say(f"{fault}: {out.seconds:.0f}s {'ok' if not out.problems() else out.problems()}")
    # a rollback needs a promoted run: chain on a recovered crash scenario, else a clean run
    recovered = [c.fault for c in fig.crashes if not c.problems()]
    for fault in [f for f in faults if f in ROLLBACK_FAILPOINTS]:
        if recovered:
            lake = lakes[recovered.pop()]
        else:
            lake = new_lake(base, work / fault / "lake")
            _backfill(lake, "clean")
        out_rb = crash_rollback(spark, lake, exp, fault)
        fig.rollbacks.append(out_rb)
        _say(f"{fault}: {out_rb.seconds:.0f}s "
             f"{'ok' if not out_rb.problems() else out_rb.problems()}")
    for name in scenarios:
        s = SCENARIOS[name](spark, new_lake(base, work / name / "lake"), exp)
        fig.scenarios.append(s)
        _say(f"{s.name}: {s.seconds:.0f}s {s.problems() or 'ok'}")
    if bad_plans:
        fig.bad_plans = hostile_plans(work / "bad_plans.log")
        _say(f"hostile plans rejected: {fig.bad_plans[0]} / {fig.bad_plans[1]}")
    fig.seconds = time.monotonic() - t0
    return fig


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--faults", nargs="*", default=list(FAILPOINTS),
                        help="failpoints to crash at (default: all)")
    parser.add_argument("--scenarios", nargs="*", default=list(SCENARIOS),
                        help=f"concurrency scenarios (default: all of {', '.join(SCENARIOS)})")
    parser.add_argument("--no-bad-plans", action="store_true")
    parser.add_argument("--work", help="keep lakes and logs here (default: a temp folder)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.faults) - set(FAILPOINTS)) + sorted(set(args.scenarios) - set(
        SCENARIOS))
    if unknown:
        parser.error(f"unknown failpoint(s) or scenario(s) {unknown}; see `sparkguard faults`")
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="sg-reliability-"))
    spark = _session()
    try:
        fig = run_all(spark, work, args.faults, args.scenarios, not args.no_bad_plans)
    finally:
        spark.stop()
    for o in fig.all_outcomes():
        for p in o.problems():
            _say(f"PROBLEM {getattr(o, 'fault', getattr(o, 'name', '?'))}: {p}")
    print(render(fig))
    ok = fig.ok()  # reads the run logs: before the work folder goes
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

