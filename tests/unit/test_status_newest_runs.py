"""``sparkguard status`` without a JVM picks the newest runs by each run's first event, over
every file of the runs table, however the events are spread across commits.

The table is written by delta-rs (another writer) in several commits, so a reader that looked
only at the newest files, at run ids, or at the ``started`` events would answer differently:

- an old run that a re-run resumed has its newest events in the newest commit, yet it started
  first of all and is not among the newest runs;
- some of the newest runs have their first event appended in a later commit than their last
  (events recorded out of order), the others in an earlier commit than the run's end;
- run ids are random, so their order says nothing about time;
- one run's first recorded event is not ``started`` and is older than its ``started``.

The expected answer is computed here from the generated rows, independently of the reader.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from sparkguard.state_read import DeltaRsReader

EPOCH_2026 = 1_767_225_600_000_000  # 2026-01-01 00:00:00 UTC in microseconds
MINUTE = 60_000_000
Event = tuple[str, int, str]  # run_id, at (micros), state


def _append(home: Path, events: list[Event]) -> None:
    """One commit of run events to ``<home>/ledger/runs`` (delta-rs)."""
    from arro3.core import Array, DataType, Table
    from deltalake import write_deltalake

    n = len(events)
    none_s, none_l = Array([None] * n, DataType.string()), Array([None] * n, DataType.int64())
    cols = {
        "run_id": Array([e[0] for e in events], DataType.string()),
        "at": Array([e[1] for e in events], DataType.int64()).cast(
            DataType.timestamp("us", tz="UTC")),
        "state": Array([e[2] for e in events], DataType.string()),
        "target": none_s,
        "plan_name": Array([f"plan-{e[0][:4]}" for e in events], DataType.string()),
        "plan_fingerprint": Array(["f" * 64] * n, DataType.string()),
        "owner": Array(["bot"] * n, DataType.string()),
        "source_version": none_l, "target_version_read": none_l,
        "target_version_written": none_l,
        "elapsed_s": Array([None] * n, DataType.float64()),
        "details": Array([json.dumps({"dry_run": False})] * n, DataType.string()),
    }
    write_deltalake(str(home / "ledger" / "runs"), Table.from_pydict(cols), mode="append")


def _expected(events: list[Event], limit: int) -> list[tuple[str, str]]:
    """(run_id, state of its newest non-target event) of the ``limit`` runs with the latest
    first event, newest first."""
    by_run: dict[str, list[Event]] = {}
    for e in events:
        by_run.setdefault(e[0], []).append(e)
    first = {r: min(e[1] for e in evs) for r, evs in by_run.items()}
    newest = sorted(first, key=lambda r: first[r], reverse=True)[:limit]
    return [(r, max(by_run[r], key=lambda e: e[1])[2]) for r in newest]


def test_latest_runs_rank_by_first_event_across_every_file(tmp_path: Path) -> None:
    rng = random.Random(11)
    ids = [f"{rng.getrandbits(64):016x}" for _ in range(2_540)]
    old, new, resumed = ids[:2_500], ids[2_500:2_539], ids[2_539]
    t = EPOCH_2026
    # 2,500 finished runs, 10 minutes apart, in one commit (shuffled)
    history = [e for i, r in enumerate(old)
               for e in ((r, t + 10 * MINUTE * i, "started"), (r, t + 10 * MINUTE * i + 1, "done"))]
    # the resumed run started before all of them; it failed then
    history += [(resumed, t - MINUTE, "started"), (resumed, t - MINUTE + 5, "failed")]
    rng.shuffle(history)
    recent = t + 10 * MINUTE * 3_000
    early, late = [], []
    for i, r in enumerate(new):
        start = recent + MINUTE * i
        if i % 2:  # first event appended after the last one
            late += [(r, start, "started")]
            early += [(r, start + 30, "done")]
        else:
            early += [(r, start, "started")]
            late += [(r, start + 30, "gate_failed")]
    # one new run's first event is a 'failed' recorded before its 'started'
    odd = new[7]
    early += [(odd, recent + MINUTE * 7 - 2, "failed")]
    # the resumed run's re-run: its newest events come last of all
    late += [(resumed, recent + MINUTE * 100, "resumed"), (resumed, recent + MINUTE * 101, "done")]
    home = tmp_path / "home"
    for batch in (history[:2_600], history[2_600:], early, late):
        _append(home, batch)
    events = history + early + late

    reader = DeltaRsReader(str(home))
    for limit in (1, 20, 39, 40):
        got = [(p.run_id, p.state) for p in reader.latest_runs(limit)]
        assert got == _expected(events, limit), limit
    assert resumed not in {p.run_id for p in reader.latest_runs(39)}
    # past every run, the resumed run comes last and its newest event decides its state
    everything = reader.latest_runs(3_000)
    assert len(everything) == 2_540
    assert (everything[-1].run_id, everything[-1].state) == (resumed, "done")
    assert everything[-1].started_at < everything[-2].started_at
    # the run whose first event is not 'started' starts at that event
    odd_prog = next(p for p in everything if p.run_id == odd)
    micros = int(odd_prog.started_at.timestamp()) * 1_000_000 + odd_prog.started_at.microsecond
    assert micros == recent + MINUTE * 7 - 2
