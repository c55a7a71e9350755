"""Issue 6: a crash at a failpoint, then the same command again, converges; never in between.

Every failpoint is reached by exactly one call site. The Spark scenarios run the real
``spark-submit jobs/backfill.py`` (and ``jobs/rollback.py``) through the harness in
``tests/system/harness``; each records its outcome, from which ``bench/reliability.py`` renders
the README's Reliability figures. ``make test``
runs a representative subset (a backfill killed in its slices whose resuming re-run is killed
just after its promote commit, and a rollback killed midway); there the last re-run, which only
resumes from what is on disk, runs in the test process instead of a fresh JVM.
``SPARKGUARD_FULL_CRASH=1`` kills a fresh run at every failpoint and re-runs with spark-submit.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkguard.cli import main
from sparkguard.faults import FAILPOINTS, KILLED_EXIT_CODE, ROLLBACK_FAILPOINTS, failpoint
from tests.system.harness import (
    BACKFILL_FAILPOINTS,
    SUBSET,
    Expected,
    Lake,
    crash_backfill,
    crash_rollback,
    expected_states,
    new_lake,
    paused_after_crash,
    spark_submit,
    state_after_crash,
)

ROOT = Path(__file__).resolve().parents[2]
FULL = os.environ.get("SPARKGUARD_FULL_CRASH") == "1"
# `make test`: the backfill killed at the subset's first failpoint, the re-run that resumes it
# killed at the second, then the last re-run; SPARKGUARD_FULL_CRASH=1 kills a fresh run at each.
BACKFILL_CASES = ([(f, None) for f in BACKFILL_FAILPOINTS] if FULL
                  else [tuple(f for f in SUBSET if f in BACKFILL_FAILPOINTS)])
ROLLBACK_RUN = [f for f in ROLLBACK_FAILPOINTS if FULL or f in SUBSET]


def _call_sites() -> dict[str, list[str]]:
    """failpoint("name") calls in the package source: name -> ["file:line", ...]."""
    sites: dict[str, list[str]] = {}
    for path in sorted((ROOT / "sparkguard").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and (
                    (isinstance(node.func, ast.Name) and node.func.id == "failpoint")
                    or (isinstance(node.func, ast.Attribute) and node.func.attr == "failpoint")):
                arg = node.args[0]
                assert isinstance(arg, ast.Constant), f"{path}:{node.lineno}: name not literal"
                sites.setdefault(str(arg.value), []).append(
                    f"{path.relative_to(ROOT)}:{node.lineno}")
    return sites


def test_every_failpoint_has_exactly_one_call_site() -> None:
    sites = _call_sites()
    assert set(sites) == set(FAILPOINTS)
    assert {name: where for name, where in sites.items() if len(where) != 1} == {}
    rollback = {n for n, (where,) in sites.items() if where.startswith("sparkguard/rollback.py")}
    assert rollback == set(ROLLBACK_FAILPOINTS)


def test_sparkguard_faults_lists_every_reached_failpoint(capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    assert main(["faults"]) == 0
    listed = [ln.split()[0] for ln in capsys.readouterr().out.splitlines()]
    assert listed == list(FAILPOINTS)
    assert set(listed) == set(_call_sites())


def test_unknown_failpoint_name_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown failpoint 'nope'"):
        failpoint("nope")


@pytest.mark.parametrize("armed", [None, "after_lock", "after_guard"])
def test_failpoint_kills_only_when_named(armed: str | None) -> None:
    env = {k: v for k, v in os.environ.items() if k != "SPARKGUARD_FAULT_AT"}
    if armed:
        env["SPARKGUARD_FAULT_AT"] = armed
    code = ("import atexit, sys; from sparkguard.faults import failpoint\n"
            "atexit.register(lambda: print('atexit ran'))\n"
            "try:\n    failpoint('after_guard')\nfinally:\n    print('finally ran')\n"
            "sys.exit(5)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    if armed == "after_guard":
        # died on the spot: no finally block, no atexit handler, the SIGKILL exit code
        assert proc.returncode == KILLED_EXIT_CODE
        assert proc.stdout == ""
    else:
        assert proc.returncode == 5
        assert proc.stdout.splitlines() == ["finally ran", "atexit ran"]


# -- the real jobs, killed --------------------------------------------------------------------


@pytest.fixture(scope="module")
def base(base_lake) -> Path:
    """The session's base lake (built once); each scenario copies it (``new_lake``)."""
    return base_lake


@pytest.fixture(scope="module")
def expected(spark, base) -> Expected:
    return expected_states(spark, Lake(base))


# lakes whose crash scenario recovered cleanly: a rollback scenario starts from one of them
_PROMOTED: list[Lake] = []


@pytest.mark.slow
@pytest.mark.reliability
@pytest.mark.parametrize(("fault", "recovery"), BACKFILL_CASES,
                         ids=["-then-".join(f for f in case if f) for case in BACKFILL_CASES])
def test_backfill_killed_then_rerun_converges(spark, base, expected, tmp_path, fault,
                                              recovery, record_property) -> None:
    out = crash_backfill(spark, new_lake(base, tmp_path / "lake"), expected, fault, recovery,
                         rerun_here=not FULL)
    record_property("reliability", json.dumps(out.record()))  # the reliability table's row

    assert out.crash.died_at(fault), out.crash.tail()
    # the moment it died: untouched before the promote commit, fully promoted after it
    assert out.after_crash.state == state_after_crash(fault)
    assert out.after_crash.duplicate_keys == 0 and out.after_crash.rows_lost == 0
    assert out.paused_after_crash is paused_after_crash(fault)
    if recovery is not None:  # the re-run resuming the crashed run was killed as well
        assert out.recovery is not None and out.recovery.proc.died_at(recovery), \
            out.recovery.proc.tail() if out.recovery else "no recovery crash"
        assert out.recovery.after.state == state_after_crash(recovery)
        assert out.recovery.after.duplicate_keys == 0 and out.recovery.after.rows_lost == 0
        assert out.recovery.paused is paused_after_crash(recovery)
    # the same command again finishes the job, resuming the same run
    assert out.rerun.code == 0, out.rerun.tail()
    assert out.after_rerun.state == "clean"
    assert out.after_rerun.duplicate_keys == 0
    assert out.after_rerun.rows_lost == 0 and out.after_rerun.rows_lost_outside_window == 0
    if out.crashed_run is not None:
        assert out.ledger.done_runs() == [out.crashed_run]
    assert len(out.ledger.promote_commits) == 1
    version, run = out.ledger.promote_commits[0]
    assert out.ledger.ledger_promoted[run] == version
    assert out.ledger.paused is False and out.ledger.locks_held == 0
    assert out.problems() == []
    _PROMOTED.append(Lake(tmp_path / "lake"))


@pytest.mark.slow
@pytest.mark.reliability
@pytest.mark.parametrize("fault", ROLLBACK_RUN)
def test_rollback_killed_then_rerun_restores(spark, base, expected, tmp_path, fault,
                                             record_property) -> None:
    if _PROMOTED:
        lake = _PROMOTED.pop()
    else:
        lake = new_lake(base, tmp_path / "lake")
        clean = spark_submit("backfill.py", ["--plan", str(lake.plan)], tmp_path / "clean.log")
        assert clean.code == 0, clean.tail()

    out = crash_rollback(spark, lake, expected, fault, rerun_here=not FULL)
    record_property("reliability", json.dumps(out.record()))

    assert out.crash.died_at(fault), out.crash.tail()
    assert out.after_crash.state == ("original" if fault == "after_rollback_restore"
                                     else "clean")
    assert out.rerun.code == 0, out.rerun.tail()
    assert out.after_rerun.state == "original"
    assert out.after_rerun.rows_lost == 0 and out.after_rerun.duplicate_keys == 0
    assert out.run_state == "rolled_back"
    assert out.promote_commits == 1
    assert out.problems() == []
