"""``bench/reliability.py`` renders the Reliability table from the outcomes tests record in
pytest's JUnit XML (the ``reliability`` property), never from test names."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from xml.sax.saxutils import quoteattr

from bench.reliability import SCENARIOS, read_junit, render, selection

CRASH = {"kind": "failpoint", "job": "backfill", "fault": "mid_slices", "recovery_fault": None,
         "crash_exit": 137, "died_at_fault": True, "after_crash": "original", "paused": True,
         "rerun_exit": 0, "after_rerun": "clean", "ledger_ok": True, "rows_lost": 0,
         "duplicate_keys": 0, "submits": 2, "seconds": 61.4, "problems": []}
ROLLBACK = {**CRASH, "job": "rollback", "fault": "mid_rollback", "after_crash": "clean",
            "after_rerun": "original", "paused": None, "seconds": 30.0}
SCENARIO = {"kind": "scenario", "name": "two runs of the same plan at once", "codes": [0, 2],
            "after": "clean", "rows_lost": 0, "duplicate_keys": 0, "rows_appended": 40,
            "notes": {"winner": "['r1']"}, "submits": 2, "seconds": 50.0, "problems": []}


def _case(name: str, row: dict[str, Any] | None, outcome: str = "") -> str:
    props = "" if row is None else (
        f'<properties><property name="reliability" value={quoteattr(json.dumps(row))} />'
        "</properties>")
    return f'<testcase classname="tests.x" name="{name}" time="1.0">{props}{outcome}</testcase>'


def _xml(tmp_path: Path, *cases: str) -> Path:
    path = tmp_path / "r.xml"
    path.write_text('<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" '
                    f'time="180.0">{"".join(cases)}</testsuite></testsuites>', encoding="utf-8")
    return path


def test_rows_come_from_recorded_outcomes_whatever_the_test_is_called(tmp_path: Path) -> None:
    hostile = {"kind": "hostile_plan"}
    res = read_junit(_xml(tmp_path, _case("a", CRASH), _case("b", ROLLBACK), _case("c", SCENARIO),
                          _case("d", hostile), _case("e", hostile, "<failure message='x'/>"),
                          _case("f", None)))
    table = render(res)
    assert "| Failpoints killed mid-run (exit 137), then recovered by re-running the same " \
           "command | 2 / 2 (2 died at their failpoint) |" in table
    assert "| Target after a crash: original / clean / in between | 1 / 1 / 0 |" in table
    assert "| Hostile or malformed plans rejected (exit 2, nothing written) | 1 / 2 |" in table
    assert "| Rows appended by another writer during a run, outside the window / lost | 40 / 0 |" \
        in table
    assert "| Real `spark-submit` runs / wall time | 6 / 3 min |" in table
    assert "| `mid_slices` | backfill | 137 | original | yes | 0 | clean | yes | 61 |" in table
    assert "| `mid_rollback` | rollback | 137 | clean | - | 0 | original | yes | 30 |" in table
    assert "| two runs of the same plan at once | [0, 2] | clean | yes | winner=['r1'] |" in table
    assert res.failed == ["tests.x::e"] and res.unrecorded == []


def test_a_failed_test_is_not_counted_as_recovered_and_one_without_outcome_is_reported(
        tmp_path: Path) -> None:
    res = read_junit(_xml(tmp_path, _case("a", CRASH, "<failure message='boom'/>"),
                          _case("g", None, "<error message='setup'/>")))
    assert "| 0 / 1 (1 died at their failpoint) |" in render(res)
    assert res.failed == ["tests.x::a"] and res.unrecorded == ["tests.x::g"]


def test_selection_names_one_test_per_failpoint_and_scenario() -> None:
    nodes = selection(["mid_slices", "mid_rollback"], ["twins"], bad_plans=True)
    assert nodes[0].endswith("::test_backfill_killed_then_rerun_converges[mid_slices]")
    assert nodes[1].endswith("::test_rollback_killed_then_rerun_restores[mid_rollback]")
    assert nodes[2:] == [*SCENARIOS["twins"], "tests/integration/test_bad_plans.py"]


def test_every_selected_node_exists_in_the_full_matrix() -> None:
    """What ``make reliability`` asks pytest for is collected (ids of SPARKGUARD_FULL_CRASH=1)."""
    import os
    import subprocess
    import sys

    from sparkguard.faults import FAILPOINTS

    nodes = selection(list(FAILPOINTS), list(SCENARIOS), bad_plans=False)
    env = {**os.environ, "SPARKGUARD_FULL_CRASH": "1"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider", "-m", "reliability", *nodes],
                          cwd=Path(__file__).resolve().parents[2], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    collected = [ln for ln in proc.stdout.splitlines() if "::" in ln]
    assert len(collected) == len(nodes), proc.stdout
