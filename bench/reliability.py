"""Reliability figures: a crash at every failpoint, concurrent runs and writers, hostile plans.

A thin command over the system tier: it runs the tests marked ``reliability`` with
``SPARKGUARD_FULL_CRASH=1`` (every failpoint kills a fresh ``spark-submit`` run, then the same
command re-runs it; every concurrency scenario; the hostile-plan corpus) and renders the
README's Reliability table from the outcomes those tests record in pytest's JUnit XML (the
``reliability`` property, see ``tests/system/harness``), not from test names::

    make reliability   # = flock /tmp/sparkguard-spark.lock python -m bench.reliability

``--faults``/``--scenarios`` pick a subset; the exit code is 0 only when every selected test
passed and recorded its outcome.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkguard.faults import FAILPOINTS, ROLLBACK_FAILPOINTS

ROOT = Path(__file__).resolve().parents[1]
CRASH = "tests/system/test_crash_suite.py"
CONCURRENCY = "tests/system/test_concurrency.py"
BAD_PLANS = "tests/integration/test_bad_plans.py"
# scenario name -> the tests that run it (selection only; the table reads recorded outcomes)
SCENARIOS: dict[str, list[str]] = {
    "twins": [f"{CONCURRENCY}::test_same_plan_twice_at_once_one_proceeds_and_appends_outside_"
              "the_window_survive"],
    "second-mid-run": [f"{CONCURRENCY}::test_same_plan_again_while_a_run_is_under_way_is_refused"],
    "appends-outside": [f"{CONCURRENCY}::test_appends_outside_the_window_during_a_run_all_survive"],
    "window-after-pause": [f"{CONCURRENCY}::test_writer_in_the_window_stops_the_run_and_loses_"
                           "nothing[after publish paused]"],
    "window-before-promote": [f"{CONCURRENCY}::test_writer_in_the_window_stops_the_run_and_loses_"
                              "nothing[between reconciliation and promotion]"],
}


def selection(faults: Sequence[str], scenarios: Sequence[str], bad_plans: bool) -> list[str]:
    """The pytest node ids to run."""
    nodes = []
    for f in faults:
        test = ("test_rollback_killed_then_rerun_restores" if f in ROLLBACK_FAILPOINTS
                else "test_backfill_killed_then_rerun_converges")
        nodes.append(f"{CRASH}::{test}[{f}]")
    for s in scenarios:
        nodes += SCENARIOS[s]
    if bad_plans:
        nodes.append(BAD_PLANS)
    return nodes


@dataclass
class Results:
    """What the JUnit XML says: each reliability test's recorded row and whether it passed."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    hostile: list[bool] = field(default_factory=list)  # passed, per hostile plan
    unrecorded: list[str] = field(default_factory=list)  # failed before recording an outcome
    failed: list[str] = field(default_factory=list)
    seconds: float = 0.0


def read_junit(path: Path) -> Results:
    """Collect every testcase's ``reliability`` property from a JUnit XML file."""
    res = Results()
    root = ET.parse(path).getroot()
    for suite in root.iter("testsuite"):
        res.seconds += float(suite.get("time", "0") or 0)
    for case in root.iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        passed = all(case.find(t) is None for t in ("failure", "error", "skipped"))
        props = [p.get("value", "") for p in case.iter("property") if p.get("name") == "reliability"]
        if not props:
            if not passed and case.find("skipped") is None:
                res.unrecorded.append(name)
            continue
        row = json.loads(props[-1])
        if not passed:
            res.failed.append(name)
        if row["kind"] == "hostile_plan":
            res.hostile.append(passed)
        else:
            res.rows.append({**row, "passed": passed})
    return res


def _count(rows: Sequence[dict[str, Any]], key: str) -> int:
    return sum(1 for r in rows if r[key])


def render(res: Results) -> str:
    """The Markdown tables (summary, then one row per failpoint and scenario)."""
    fps = [r for r in res.rows if r["kind"] == "failpoint"]
    scen = [r for r in res.rows if r["kind"] == "scenario"]
    states = Counter(r["after_crash"] for r in fps)
    recovered = sum(1 for r in fps if r["passed"] and not r["problems"])
    lines = [
        "| Figure | Value |",
        "|---|---|",
        f"| Failpoints killed mid-run (exit 137), then recovered by re-running the same command "
        f"| {recovered} / {len(fps)} ({_count(fps, 'died_at_fault')} died at their failpoint) |",
        f"| Target after a crash: original / clean / in between | {states['original']} / "
        f"{states['clean']} / {states['between']} |",
        f"| Concurrent scenarios passed | "
        f"{sum(1 for r in scen if r['passed'] and not r['problems'])} / {len(scen)} |",
        f"| Rows appended by another writer during a run, outside the window / lost | "
        f"{sum(r['rows_appended'] for r in scen)} / {sum(r['rows_lost'] for r in scen)} |",
        f"| Hostile or malformed plans rejected (exit 2, nothing written) | "
        f"{sum(res.hostile)} / {len(res.hostile)} |",
        f"| Rows lost, all scenarios | {sum(r['rows_lost'] for r in res.rows)} |",
        f"| Duplicate business keys, all scenarios | {sum(r['duplicate_keys'] for r in res.rows)} |",
        f"| Real `spark-submit` runs / wall time | {sum(r['submits'] for r in res.rows)} / "
        f"{res.seconds / 60:.0f} min |",
        "",
        "| Failpoint | Job | Crash exit | Target after crash | Publish paused | Re-run exit | "
        "Target after re-run | Ledger = history | s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in fps:
        paused = "-" if r["paused"] is None else ("yes" if r["paused"] else "no")
        lines.append(f"| `{r['fault']}` | {r['job']} | {r['crash_exit']} | {r['after_crash']} | "
                     f"{paused} | {r['rerun_exit']} | {r['after_rerun']} | "
                     f"{'yes' if r['ledger_ok'] else 'NO'} | {r['seconds']:.0f} |")
    lines += ["", "| Concurrent scenario | Exit codes | Target after | Passed | Notes |",
              "|---|---|---|---|---|"]
    for r in scen:
        notes = ", ".join(f"{k}={v}" for k, v in r["notes"].items())
        ok = "yes" if r["passed"] and not r["problems"] else "NO"
        lines.append(f"| {r['name']} | {r['codes']} | {r['after']} | {ok} | {notes} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--faults", nargs="*", default=list(FAILPOINTS),
                        help="failpoints to crash at (default: all)")
    parser.add_argument("--scenarios", nargs="*", default=list(SCENARIOS),
                        help=f"concurrency scenarios (default: all of {', '.join(SCENARIOS)})")
    parser.add_argument("--no-bad-plans", action="store_true")
    parser.add_argument("--work", help="keep the JUnit XML and pytest's log here")
    parser.add_argument("--junit", help="render this JUnit XML file instead of running pytest")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.faults) - set(FAILPOINTS)) + sorted(set(args.scenarios) - set(
        SCENARIOS))
    if unknown:
        parser.error(f"unknown failpoint(s) or scenario(s) {unknown}; see `sparkguard faults`")
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="sg-reliability-"))
    work.mkdir(parents=True, exist_ok=True)
    xml = Path(args.junit) if args.junit else work / "reliability.xml"
    if not args.junit:
        env = {**os.environ, "SPARKGUARD_FULL_CRASH": "1"}
        nodes = selection(args.faults, args.scenarios, not args.no_bad_plans)
        with open(work / "pytest.log", "wb") as log:
            subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            "-m", "reliability", "-o", "junit_family=xunit1",
                            f"--junitxml={xml}", *nodes], cwd=ROOT, env=env, stdout=log,
                           stderr=subprocess.STDOUT, check=False)
    res = read_junit(xml)
    for name in res.failed + res.unrecorded:
        print(f"FAILED {name} (see {work / 'pytest.log'})", file=sys.stderr)
    print(render(res))
    ok = not (res.failed or res.unrecorded) and bool(res.rows or res.hostile)
    if ok and not args.work and not args.junit:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
