"""Benchmark: a sparkguard backfill against the naive job, cold ``spark-submit`` each.

One lake of daily partitions (``sparkguard.demo``: 1,000 orders a day by default) is generated
once; then, per case and round, two identical copies of it are made and, in alternating order,
``spark-submit jobs/backfill.py --plan P`` runs on one and ``spark-submit bench/naive_backfill.py
--plan P`` on the other. The naive job reads the source, applies the same transform SQL to the
same window and writes it with one ``replaceWhere`` commit: what a plain rewrite costs.

Cases: windows of 3, 60 and 365 days at the default slicing (``auto``), and 60 days at
``slice_partitions: 1``. The last line::

    windows=3,60,365 sparkguard/naive=R3,R60,R365 per_slice_s=S

R is the median sparkguard time over the median naive time per window; S the extra seconds per
slice at 60 days with one partition per slice, against the same window at ``auto``:
``(T(60, 1) - T(60, auto)) / (slices(60, 1) - slices(60, auto))``.
Run it alone (it starts one JVM at a time): ``make bench-backfill``, or
``flock /tmp/sparkguard-spark.lock .venv/bin/python bench/backfill.py --rounds 1``.

``--ledger-runs N`` adds the ledger-size part: ``bench/ledger_scale.py`` (start to lock and
``sparkguard status`` with N earlier runs in the ledger against an empty one), its line printed
before the last one.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]

WINDOWS = (3, 60, 365)
ROLES = (("data-platform-owner", "alice@example.com"), ("downstream-owner", "bob@example.com"))


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["SPARK_CONF_DIR"] = str(ROOT / "conf")
    env["PYSPARK_PYTHON"] = sys.executable
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    return env


def generate(base: Path, days: int, rows_per_day: int) -> None:
    """The lake, in a child process whose JVM is gone before any timing starts."""
    code = ("import sys; from sparkguard.session import local_session_builder as b; "
            "from sparkguard.demo import generate_lake; "
            "s = b('bench-backfill-lake').getOrCreate(); s.sparkContext.setLogLevel('ERROR'); "
            f"generate_lake(s, {str(base)!r}, days={days}, rows_per_day={rows_per_day}, "
            f"window_start=1, window_days=3, approve=False); s.stop()")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(), check=True)


def write_plan(lake: Path, days: int, slicing: int | str) -> Path:
    """The demo plan over ``days`` daily partitions from the lake's second day, approved."""
    from sparkguard.approve import record_approval
    from sparkguard.demo import START, demo_plan

    window = [START + dt.timedelta(days=1 + i) for i in range(days)]
    data: Any = demo_plan(lake, window)
    p = data["backfill_plan"]
    p["affected_window"]["max_partitions"] = max(days, 31)
    p["execution"]["slice_partitions"] = slicing
    path = lake / "plan.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False, width=100), encoding="utf-8")
    for role, by in ROLES:
        record_approval(path, role, by)
    return path


def timed(argv: list[str], log: Path) -> float:
    """Seconds of one cold spark-submit; its output goes to ``log``."""
    t0 = time.perf_counter()
    with log.open("w") as fh:
        proc = subprocess.run(argv, cwd=ROOT, env=_env(), stdout=fh, stderr=subprocess.STDOUT,
                              check=False)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}; see {log}")
    return seconds


def one_pair(base: Path, work: Path, days: int, slicing: int | str, order: int,
             tag: str) -> tuple[float, float, int]:
    """(sparkguard s, naive s, slices) on two fresh copies of the lake."""
    from sparkguard.plan import load_plan
    from sparkguard.plan.window import plan_slices, window_partitions

    times: dict[str, float] = {}
    submit = str(Path(sys.executable).parent / "spark-submit")
    runs = {"sparkguard": "jobs/backfill.py", "naive": "bench/naive_backfill.py"}
    names = list(runs) if order % 2 == 0 else list(reversed(runs))
    slices = 0
    for name in names:
        lake = work / f"{tag}-{name}"
        shutil.rmtree(lake, ignore_errors=True)
        shutil.copytree(base, lake)
        plan = write_plan(lake, days, slicing)
        if name == "sparkguard":
            parts = window_partitions(load_plan(plan))
            slices = len(plan_slices(parts, slicing,
                                     {str(x): _rows_per_day(base) for x in parts}))
        times[name] = timed([submit, runs[name], "--plan", str(plan)],
                            work / f"{tag}-{name}.log")
        shutil.rmtree(lake, ignore_errors=True)
    return times["sparkguard"], times["naive"], slices


def _rows_per_day(base: Path) -> int:
    return int((base / "rows_per_day").read_text())


def ledger_part(runs: int) -> str:
    """The ledger-size figures: ``bench/ledger_scale.py --runs N`` in its own process (start
    to lock and ``sparkguard status`` with N earlier runs against an empty ledger); its last
    line, ``ledger_runs=N lock_ratio=... ...``."""
    path = ROOT / "bench" / "ledger_scale.py"
    if not path.exists():
        return f"ledger_runs={runs}: not measured (bench/ledger_scale.py is not in this tree)"
    proc = subprocess.run([sys.executable, str(path), "--runs", str(runs), "--rounds", "3"],
                          cwd=ROOT, env=_env(), capture_output=True, text=True, check=False)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"bench/ledger_scale.py exited {proc.returncode}: {proc.stderr[-2000:]}")
    return lines[-1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=1, help="pairs per case (default 1)")
    ap.add_argument("--rows-per-day", type=int, default=1000)
    ap.add_argument("--windows", default=",".join(str(w) for w in WINDOWS))
    ap.add_argument("--ledger-runs", type=int, default=0,
                    help="also measure start-to-lock and status with this many earlier runs")
    ap.add_argument("--keep", action="store_true", help="keep the work folder and job logs")
    args = ap.parse_args(argv)
    windows = [int(w) for w in args.windows.split(",")]
    work = Path(tempfile.mkdtemp(prefix="sg-bench-backfill-"))
    try:
        base = work / "base"
        t0 = time.perf_counter()
        generate(base, max(windows) + 2, args.rows_per_day)
        (base / "rows_per_day").write_text(str(args.rows_per_day))
        print(f"lake: {max(windows) + 2} days x {args.rows_per_day} rows in "
              f"{time.perf_counter() - t0:.0f}s ({work})", flush=True)
        cases: list[tuple[int, int | str]] = [(w, "auto") for w in windows]
        if 60 in windows:
            cases.append((60, 1))
        results: dict[tuple[int, int | str], list[tuple[float, float, int]]] = {}
        for r in range(args.rounds):
            for i, (days, slicing) in enumerate(cases):
                sg, naive, slices = one_pair(base, work, days, slicing, r + i,
                                             f"r{r}-{days}-{slicing}")
                results.setdefault((days, slicing), []).append((sg, naive, slices))
                print(f"round {r + 1} window {days} slicing {slicing} ({slices} slices): "
                      f"sparkguard {sg:.1f}s naive {naive:.1f}s ratio {sg / naive:.2f}",
                      flush=True)
        med = {k: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v),
                   v[0][2]) for k, v in results.items()}
        ratios = [med[(w, "auto")][0] / med[(w, "auto")][1] for w in windows]
        per_slice = float("nan")
        if (60, 1) in med and (60, "auto") in med:
            (t1, _n1, s1), (ta, _na, sa) = med[(60, 1)], med[(60, "auto")]
            per_slice = (t1 - ta) / max(1, s1 - sa)
            print(f"60 days: slice_partitions 1 {t1:.1f}s ({s1} slices), auto {ta:.1f}s "
                  f"({sa} slices)")
        if args.ledger_runs:
            print(ledger_part(args.ledger_runs), flush=True)
        print(f"windows={','.join(str(w) for w in windows)} sparkguard/naive="
              f"{','.join(f'{r:.2f}' for r in ratios)} per_slice_s={per_slice:.2f}")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
