"""Cold ``sparkguard status`` on a ledger of many runs: the JVM-free path (delta-rs) against the
Spark path, each a fresh process, interleaved.

    flock /tmp/sparkguard-spark.lock .venv/bin/python bench/status.py [--runs 1000] [--rounds 5]

Seeds ``--runs`` finished runs (8 events each, the states a promoted run records) into a new
ledger through sparkguard's own Ledger with Spark, ``--runs-per-commit`` runs per commit, unless
``--home`` names a ledger already seeded. Then, per round, times ``sparkguard status --home H``
with ``SPARKGUARD_READER=delta-rs`` and with ``SPARKGUARD_READER=spark`` (alternating which goes
first), checks both printed the same text, and prints the medians; the last line is
``status jvm_free=Xs spark=Ys ratio=R``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

STATES = ["started", "paused", "proof_passed", "reconciled", "promoting", "promoted", "verified",
          "done"]


def seed(home: Path, runs: int, per_commit: int) -> float:
    """Record ``runs`` finished runs through the Ledger; returns the seconds it took."""
    from sparkguard.ledger import Ledger
    from sparkguard.session import local_session_builder

    t0 = time.monotonic()
    spark = local_session_builder("bench-status-seed").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        ledger = Ledger(spark, str(home))
        ledger.ensure()
        start = dt.datetime(2026, 1, 1)
        batch: list[tuple[object, ...]] = []
        for i in range(runs):
            run_id = f"{(start + dt.timedelta(hours=i)):%Y%m%dT%H%M%SZ}-{i:08x}"
            fp = f"{i:064x}"
            for k, state in enumerate(STATES):
                label = {"label": "orders_clean"} if 2 < k < 7 else {}
                batch.append((run_id, start + dt.timedelta(hours=i, seconds=k), state,
                              "/lake/target/orders_clean", f"plan-{i % 37}", fp, "bench",
                              i if state == "started" else None, 2 if k > 2 else None,
                              3 if state in ("promoted", "verified") else None, float(k),
                              json.dumps({"dry_run": False, **label} if k == 0 else label)))
            if (i + 1) % per_commit == 0 or i == runs - 1:
                ledger._append("runs", batch)  # one commit, as one record_run call makes
                batch = []
    finally:
        spark.stop()
    return time.monotonic() - t0


def status(home: Path, engine: str) -> tuple[float, str]:
    """One cold ``sparkguard status`` in its own process: (seconds, stdout)."""
    env = {**os.environ, "SPARKGUARD_READER": engine}
    t0 = time.monotonic()
    proc = subprocess.run([str(Path(sys.executable).parent / "sparkguard"), "status", "--home",
                           str(home)], capture_output=True, text=True, env=env, check=False)
    seconds = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{engine}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    return seconds, proc.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs-per-commit", type=int, default=10)
    parser.add_argument("--home", type=Path, help="a ledger already seeded (else a new one)")
    args = parser.parse_args()
    home = args.home or Path(tempfile.mkdtemp(prefix="sg-bench-status-")) / "_sparkguard"
    if not (home / "ledger" / "runs" / "_delta_log").is_dir():
        took = seed(home, args.runs, args.runs_per_commit)
        print(f"seeded {args.runs} runs ({args.runs * len(STATES)} events, "
              f"{-(-args.runs // args.runs_per_commit)} commits) at {home} in {took:.1f}s",
              flush=True)
    fast: list[float] = []
    spark: list[float] = []
    for r in range(args.rounds):
        order = ["delta-rs", "spark"] if r % 2 == 0 else ["spark", "delta-rs"]
        outs = {}
        for engine in order:
            seconds, outs[engine] = status(home, engine)
            (fast if engine == "delta-rs" else spark).append(seconds)
        if outs["delta-rs"] != outs["spark"]:
            print("the two paths printed different text", file=sys.stderr)
            return 1
        print(f"round {r + 1}: jvm_free {fast[-1]:.2f}s spark {spark[-1]:.2f}s "
              f"({len(outs['spark'].splitlines())} lines each, identical)", flush=True)
    x, y = statistics.median(fast), statistics.median(spark)
    print(f"status jvm_free={x:.2f}s spark={y:.2f}s ratio={y / x:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
