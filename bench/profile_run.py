"""Where one warm in-process backfill of the test lake spends its time.

``flock /tmp/sparkguard-spark.lock .venv/bin/python -m bench.profile_run``: builds the small
lake of ``tests/lakes.py``, runs the demo plan twice to warm the session, then a third time
under ``cProfile``; prints the run's console, its Spark job count, the Delta commits per table
and sparkguard's functions by cumulative time. No baseline: a profile, not a benchmark.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import tempfile
import time
from pathlib import Path

from sparkguard.plan import load_plan
from sparkguard.run.evaluator import run_backfill
from sparkguard.run.report import RunOutcome
from sparkguard.session import local_session_builder
from tests.lakes import TEST_SESSION_CONF, build_base, copy_lake, write_plan


def main() -> None:
    spark = local_session_builder("sparkguard-profile", extra=TEST_SESSION_CONF).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    tmp = Path(tempfile.mkdtemp(prefix="sparkguard-profile-"))
    base = build_base(spark, tmp / "base")

    def one(name: str) -> tuple[RunOutcome, float, list[str], Path]:
        root = copy_lake(base, tmp / name)
        plan = write_plan(root)
        lines: list[str] = []
        t0 = time.monotonic()
        out = run_backfill(spark, load_plan(plan), str(plan), home=str(root / "_sg"),
                           evidence_dir=str(root / "evidence"), out=lines.append)
        return out, time.monotonic() - t0, lines, root

    for i in range(2):
        out, secs, _lines, _root = one(f"warm{i}")
        print(f"warm-up run {i + 1}: exit {out.exit_code} in {secs:.2f} s")
    prof = cProfile.Profile()
    prof.enable()
    out, secs, lines, root = one("profiled")
    prof.disable()
    print(f"profiled run: exit {out.exit_code} in {secs:.2f} s")
    print("\n".join(lines))
    jobs = spark.sparkContext.statusTracker().getJobIdsForGroup(f"sparkguard-{out.run_id}")
    print(f"Spark jobs in the run's job group: {len(jobs)}")
    commits = {str(log.parent.relative_to(root)): sum(1 for f in log.iterdir()
                                                      if f.name.endswith(".json"))
               for log in sorted(root.rglob("_delta_log"))}
    print(f"Delta commits per table: {commits} (total {sum(commits.values())})")
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats("sparkguard", 60)
    print(buf.getvalue())
    spark.stop()


if __name__ == "__main__":
    main()
