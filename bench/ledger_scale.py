"""sparkguard's own state at scale: a run's way from start to lock, and ``sparkguard status``,
on a ledger holding 5,000 earlier runs against the same on an empty ledger.

One process, one local session, the two homes measured in interleaved rounds (medians), so
machine noise hits both alike. The lock path is what a run does before it owns its targets:
read the ledger for its plan (``Ledger.load``), take the lock (``Ledger.acquire``: lock
holders, the holder's runs, the lock commit and its check) and record ``started``. Status is
``sparkguard status`` (the 20 newest runs) through ``sparkguard.cli.main``.

Seeding 5,000 runs in the layout the ledger's own appends leave, without 100,000 commits:
every table gets one data file per event from Delta's auto compaction's point of view, that is
one compacted file holding the older history plus the newest events one file each. The older
runs (all but ``--tail``) go through the ledger's own API (``Ledger.record_run`` /
``record_slice``) inside ``Ledger.batched()``, 250 runs per append, with their lock events and
publish holds appended by ``delta_ops.append_rows`` (the call ``Ledger`` and ``PublishControl``
make); then each table is compacted into one file, what auto compaction does once 50 small
files have piled up. The last ``--tail`` runs are recorded as a run records them: lock acquired
(``Ledger.acquire``), publish paused, every run and slice event its own commit, lock released,
publish reopened, with auto compaction on as always. Each run has the events of a real one
(10 run events, 3 slice events, 2 lock events, 2 publish events).

    python bench/ledger_scale.py [--runs 5000] [--tail 4] [--rounds 7] [--keep DIR]

Last line: ``ledger_runs=N lock_ratio=A status_ratio=B`` (full / empty; target <= 1.2).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import hashlib
import io
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

from sparkguard import delta_ops  # noqa: E402
from sparkguard.cli import main as cli_main  # noqa: E402
from sparkguard.ledger import _SCHEMAS, Ledger  # noqa: E402
from sparkguard.publish import PublishControl, _schema  # noqa: E402
from sparkguard.session import local_session_builder  # noqa: E402

PLANS, TARGETS, BATCH = 50, 5, 250
T0 = dt.datetime(2025, 1, 1)


def _fp(i: int) -> str:
    return hashlib.sha256(f"plan-{i % PLANS}".encode()).hexdigest()


def _target(i: int) -> str:
    return f"/lake/target/t{i % TARGETS}"


def _record(led: Ledger, run_id: str, i: int) -> None:
    """The run and slice events of one finished run (10 and 3)."""
    fp, target, label = _fp(i), _target(i), f"t{i % TARGETS}"
    common = {"fingerprint": fp, "plan_name": f"plan-{i % PLANS}", "owner": "bench"}
    led.record_run(run_id, "started", source_version=i, dry_run=False, recipients=["bi"],
                   window={"column": "d", "type": "date", "partitions": ["2026-05-01"]},
                   **common)
    for state in ("paused", "proof_passed", "slices_done"):
        led.record_run(run_id, state, **common)
    for state, rd, wr in (("reconciled", i, None), ("promoting", i, None),
                          ("promoted", i, i + 1), ("verified", i, i + 1)):
        led.record_run(run_id, state, target=target, version_read=rd, version_written=wr,
                       label=label, **common)
    led.record_run(run_id, "published", **common)
    led.record_run(run_id, "done", evidence_path=f"/ev/{run_id}.yaml", **common)
    for s in range(3):
        led.record_slice(run_id, fp, label, s, [f"2026-05-0{s + 1}"], "reconciled", i,
                         rows=1000, elapsed_s=2.0,
                         gates=[{"gate": "row_count_parity", "passed": True}])


def _run_id(i: int) -> str:
    return (T0 + dt.timedelta(minutes=10 * i)).strftime("%Y%m%dT%H%M%SZ-") + f"{i:08x}"


def seed(spark: Any, home: str, runs: int, tail: int = 4) -> None:
    """Record ``runs`` finished runs, the last ``tail`` one event per commit (see the module
    docstring for how)."""
    from delta.tables import DeltaTable

    led, ctl = Ledger(spark, home), PublishControl(spark, home)
    led.ensure()
    delta_ops.create_log_table(spark, ctl.path, _schema())
    generation = dict.fromkeys(range(TARGETS), 0)
    bulk = max(runs - tail, 0)
    for start in range(0, bulk, BATCH):
        locks, holds = [], []
        with led.batched():
            for i in range(start, min(start + BATCH, bulk)):
                at, run_id, target = T0 + dt.timedelta(minutes=10 * i), _run_id(i), _target(i)
                _record(led, run_id, i)
                g = generation[i % TARGETS]
                generation[i % TARGETS] = g + 2
                for gen, action in ((g + 1, "acquire"), (g + 2, "release")):
                    locks.append((target, gen, action, run_id, "bench", at, "bench-host", 1,
                                  f"token-{i}"))
                holds += [(target, run_id, True, at, run_id, "bench", "backfill"),
                          (target, run_id, False, at + dt.timedelta(minutes=5), run_id, "bench",
                           "backfill done")]
        delta_ops.append_rows(spark, led._path("locks"), _SCHEMAS["locks"], locks)
        delta_ops.append_rows(spark, ctl.path, _schema(), holds)
    for path in [led._path(n) for n in ("runs", "slices", "locks")] + [ctl.path]:
        DeltaTable.forPath(spark, path).optimize().executeCompaction()
    for i in range(bulk, runs):
        run_id, target = _run_id(i), _target(i)
        led.acquire([target], run_id, "bench")
        ctl.pause([target], run_id=run_id, actor="bench", reason="backfill")
        _record(led, run_id, i)
        led.release([target], run_id)
        ctl.finish([target], run_id, actor="bench", reason="backfill done")


def start_to_lock(spark: Any, home: str, n: int) -> float:
    """Seconds for a new run of plan 0 to read the ledger, lock target 0 and record itself."""
    fp, target = _fp(0), _target(0)
    run_id = f"29990101T000000Z-{n:08x}"
    t = time.perf_counter()
    led = Ledger(spark, home)
    led.ensure()
    hist = led.load(fp)
    hist.resumable()
    hist.dry_runs()
    led.acquire([target], run_id, "bench")
    led.record_run(run_id, "started", fingerprint=fp, plan_name="plan-0", owner="bench")
    elapsed = time.perf_counter() - t
    led.record_run(run_id, "done", fingerprint=fp, plan_name="plan-0", owner="bench")
    led.release([target], run_id)
    return elapsed


def status(home: str) -> float:
    """Seconds for ``sparkguard status --home HOME`` (in this process)."""
    buf = io.StringIO()
    t = time.perf_counter()
    with contextlib.redirect_stdout(buf):
        code = cli_main(["status", "--home", home])
    elapsed = time.perf_counter() - t
    assert code == 0, buf.getvalue()
    return elapsed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5000)
    ap.add_argument("--tail", type=int, default=4,
                    help="newest runs recorded one event per commit (default 4)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--keep", help="build the homes here and keep them")
    args = ap.parse_args(argv)
    work = Path(args.keep or tempfile.mkdtemp(prefix="sg-ledger-scale-"))
    spark = local_session_builder("ledger-scale").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        empty, full = str(work / "empty"), str(work / "full")
        Ledger(spark, empty).ensure()
        delta_ops.create_log_table(spark, PublishControl(spark, empty).path, _schema())
        t = time.perf_counter()
        seed(spark, full, args.runs, args.tail)
        print(f"seeded {args.runs} runs in {time.perf_counter() - t:.1f}s", flush=True)
        for name in ("runs", "slices", "locks"):
            d = spark.read.format("delta").load(f"{full}/ledger/{name}")
            print(f"  ledger/{name}: {d.count()} rows in {len(d.inputFiles())} files")
        times: dict[str, dict[str, list[float]]] = {h: {"lock": [], "status": []}
                                                     for h in ("empty", "full")}
        homes = {"empty": empty, "full": full}
        n = 0
        for h in ("empty", "full"):  # warm up both paths once, untimed
            n += 1
            start_to_lock(spark, homes[h], n)
            status(homes[h])
        for r in range(args.rounds):
            order = ("empty", "full") if r % 2 == 0 else ("full", "empty")
            for h in order:
                n += 1
                times[h]["lock"].append(start_to_lock(spark, homes[h], n))
                times[h]["status"].append(status(homes[h]))
        med = {h: {k: statistics.median(v) for k, v in d.items()} for h, d in times.items()}
        print(json.dumps({"median_s": med, "all_s": times}, default=lambda x: round(x, 3)))
        lock_ratio = med["full"]["lock"] / med["empty"]["lock"]
        status_ratio = med["full"]["status"] / med["empty"]["status"]
        print(f"ledger_runs={args.runs} lock_ratio={lock_ratio:.2f} "
              f"status_ratio={status_ratio:.2f}")
    finally:
        spark.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
