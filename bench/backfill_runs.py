"""Benchmark: repeated in-process backfills of the small test lake, under two session settings.

Static Spark settings need a fresh JVM, so each setting runs in its own child process, one
after the other: the child builds the local session (``local_session_builder`` with the test
suite's small settings plus the given ``--conf``), generates the 6-day lake once, then runs the
backfill ``--runs`` times on fresh copies, printing per run the wall time and how many classes
Spark's code generator compiled (``CodegenMetrics``). The parent prints the median of the warm
runs (all but the first) per setting and, last, their ratio::

    flock /tmp/sparkguard-spark.lock .venv/bin/python -m bench.backfill_runs \\
        --baseline spark.sql.codegen.cache.maxEntries=100

By default the variant is sparkguard's own local settings, so the line reads
``warm backfill: baseline Xs, sparkguard Ys, baseline/sparkguard=R``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

def child(confs: dict[str, str], runs: int) -> int:
    """Build the session, then time ``runs`` backfills; one JSON line per run."""
    from sparkguard.plan import load_plan
    from sparkguard.run.evaluator import run_backfill
    from sparkguard.session import local_session_builder
    from tests.lakes import TEST_SESSION_CONF, build_base, copy_lake, write_plan

    spark = local_session_builder("sparkguard-bench-runs",
                                  extra={**TEST_SESSION_CONF, **confs}).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    metrics = spark.sparkContext._jvm.org.apache.spark.metrics.source.CodegenMetrics  # type: ignore[union-attr]
    with tempfile.TemporaryDirectory(prefix="sg-bench-runs-") as tmp:
        base = build_base(spark, Path(tmp) / "base")
        for i in range(runs):
            lake = copy_lake(base, Path(tmp) / f"run{i}")
            plan = write_plan(lake)
            compiled = metrics.METRIC_COMPILATION_TIME().getCount()
            t0 = time.perf_counter()
            out = run_backfill(spark, load_plan(plan), str(plan), home=str(lake / "_sg"),
                               evidence_dir=str(lake / "ev"), out=lambda _s: None)
            seconds = time.perf_counter() - t0
            compiled = metrics.METRIC_COMPILATION_TIME().getCount() - compiled
            print("RUN " + json.dumps({"run": i, "exit": out.exit_code, "seconds": seconds,
                                       "classes_compiled": compiled}), flush=True)
            shutil.rmtree(lake, ignore_errors=True)
    spark.stop()
    return 0


def _confs(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--baseline/--variant/--conf take key=value, got {pair!r}")
        out[key] = value
    return out


def _run_child(label: str, confs: dict[str, str], runs: int) -> list[dict[str, float]]:
    argv = [sys.executable, __file__, "--child", "--runs", str(runs),
            *[a for k, v in confs.items() for a in ("--conf", f"{k}={v}")]]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)
    rows = [json.loads(ln[4:]) for ln in proc.stdout.splitlines() if ln.startswith("RUN ")]
    for r in rows:
        print(f"{label}: run {r['run']} exit {r['exit']} {r['seconds']:.1f}s, "
              f"{r['classes_compiled']} classes compiled", flush=True)
    if proc.returncode != 0 or len(rows) != runs or any(r["exit"] != 0 for r in rows):
        raise SystemExit(f"{label} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=4, help="backfills per setting (default 4)")
    ap.add_argument("--baseline", nargs="*", default=["spark.sql.codegen.cache.maxEntries=100"],
                    help="settings of the baseline (default: Spark's codegen cache of 100)")
    ap.add_argument("--variant", nargs="*", default=[],
                    help="settings of the variant (default: sparkguard's local settings)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--conf", action="append", default=[], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(_confs(args.conf), args.runs)
    if args.runs < 2:
        raise SystemExit("--runs must be at least 2 (the first run warms the JVM)")
    warm = {}
    for label, pairs in (("baseline", args.baseline), ("sparkguard", args.variant)):
        rows = _run_child(label, _confs(pairs), args.runs)
        warm[label] = statistics.median(r["seconds"] for r in rows[1:])
    print(f"warm backfill: baseline {warm['baseline']:.1f}s, sparkguard {warm['sparkguard']:.1f}s, "
          f"baseline/sparkguard={warm['baseline'] / warm['sparkguard']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
