"""Where one warm in-process backfill of the test lake spends its time.

``flock /tmp/sparkguard-spark.lock .venv/bin/python -m bench.profile_run``: builds the small
lake of ``tests/lakes.py``, runs the demo plan twice to warm the session, then a third time
under ``cProfile``; prints the run's console, its Spark job count, the Delta commits per table
and sparkguard's functions by cumulative time. No baseline: a profile, not a benchmark.

``--interpreted``: the test session's settings (``tests.lakes.INTERPRETED_CONF``: no code
generation). ``--jfr FILE``: the profiled run is also recorded by the JVM's Flight Recorder
(needs a JDK's ``jcmd`` and ``jfr``), and the JVM's samples are split by thread and by what
they were doing (code generation, Catalyst, Delta, serialization). ``--conf KEY=VALUE``
(repeatable): a setting added to the session. ``--runs N``: N more warm runs, unprofiled, timed
(their median printed). ``--spawns``: one more run with ``strace`` attached to the JVM, counting
the processes it started and which programs they ran (Hadoop's local file system without its
native library runs ``chmod`` and ``readlink`` as processes).
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import io
import json
import pstats
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from sparkguard.plan import load_plan
from sparkguard.run.evaluator import run_backfill
from sparkguard.run.report import RunOutcome
from sparkguard.session import local_session_builder
from tests.lakes import INTERPRETED_CONF, TEST_SESSION_CONF, build_base, copy_lake, write_plan

# what a JVM sample was doing: the first of these found anywhere in its stack
_KINDS = [("code generation", ("expressions/codegen/", "WholeStageCodegen", "codehaus/janino")),
          ("serialization", ("JavaSerializ", "ObjectOutputStream", "ObjectInputStream")),
          ("Delta", ("org/apache/spark/sql/delta",)),
          ("Catalyst (analyze, optimize, plan)", ("sql/catalyst/", "sql/execution/SparkStrategies",
                                                  "QueryExecution")),
          ("Parquet", ("parquet",))]


def jfr_split(path: Path) -> str:
    """The recording's execution samples by thread and kind, as percentages of all samples."""
    out = subprocess.run(["jfr", "print", "--json", "--stack-depth", "64", "--events",
                          "jdk.ExecutionSample", str(path)], capture_output=True, text=True,
                         check=True).stdout
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    events = json.loads(out)["recording"]["events"]
    for event in events:
        thread = event["values"]["sampledThread"]["javaName"]
        who = ("executor" if thread.startswith("Executor task") else
               "driver" if thread.startswith("Thread-") else "scheduler/other")
        stack = event["values"]["stackTrace"] or {"frames": []}
        names = [f["method"]["type"]["name"] for f in stack["frames"]]
        kind = next((k for k, marks in _KINDS if any(m in n for n in names for m in marks)),
                    "other")
        counts[(who, kind)] += 1
    total = max(len(events), 1)
    return "\n".join([f"JVM samples: {len(events)}"] + [
        f"  {100 * n / total:5.1f} %  {who:15s} {kind}" for (who, kind), n in counts.most_common()])


def spawned(pid: str, action: Callable[[], object]) -> str:
    """The processes the JVM ``pid`` started during ``action``, by program (``strace -f``)."""
    with tempfile.NamedTemporaryFile(suffix=".strace") as trace:
        tracer = subprocess.Popen(["strace", "-f", "-qq", "-e", "trace=execve", "-e",
                                   "signal=none", "-o", trace.name, "-p", pid])
        time.sleep(1)  # attached to every thread before the run starts
        try:
            action()
        finally:
            tracer.terminate()
            tracer.wait()
        calls = [ln for ln in Path(trace.name).read_text().splitlines()
                 if 'execve("' in ln and ln.rstrip().endswith("= 0")]
    programs = collections.Counter(ln.split('execve("')[1].split('"')[0].rsplit("/", 1)[-1]
                                   for ln in calls)
    programs.pop("jspawnhelper", None)  # Java's launcher, run before each program
    return (f"processes the JVM started in one run: {sum(programs.values())} "
            f"({', '.join(f'{name} {n}' for name, n in programs.most_common())})")


def _setting(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE")
    return key, value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--interpreted", action="store_true",
                    help="the test session's settings: no code generation")
    ap.add_argument("--jfr", type=Path, metavar="FILE",
                    help="record the profiled run with Java Flight Recorder into FILE")
    ap.add_argument("--conf", action="append", default=[], type=_setting, metavar="KEY=VALUE",
                    help="a setting added to the session (repeatable)")
    ap.add_argument("--runs", type=int, default=0, metavar="N",
                    help="N more warm runs, unprofiled, timed")
    ap.add_argument("--spawns", action="store_true",
                    help="one more run under strace: the processes the JVM started")
    args = ap.parse_args()
    conf = {**TEST_SESSION_CONF, **(INTERPRETED_CONF if args.interpreted else {}),
            **dict(args.conf)}
    spark = local_session_builder("sparkguard-profile", extra=conf).getOrCreate()
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
    pid = str(spark.sparkContext._gateway.proc.pid)  # type: ignore[union-attr]
    if args.jfr:
        subprocess.run(["jcmd", pid, "JFR.start", "name=sg", "settings=profile"], check=True,
                       capture_output=True)
    prof = cProfile.Profile()
    prof.enable()
    out, secs, lines, root = one("profiled")
    prof.disable()
    if args.jfr:
        subprocess.run(["jcmd", pid, "JFR.stop", "name=sg", f"filename={args.jfr.resolve()}"],
                       check=True, capture_output=True)
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
    if args.jfr:
        print(jfr_split(args.jfr))
    if args.runs:
        secs_each = [one(f"timed{i}")[1] for i in range(args.runs)]
        print(f"{args.runs} warm runs: {' '.join(f'{x:.2f}' for x in secs_each)} s, "
              f"median {statistics.median(secs_each):.2f} s")
    if args.spawns:
        print(spawned(pid, lambda: one("traced")))
    spark.stop()


if __name__ == "__main__":
    main()
