"""``sparkguard status`` reads the runs table newest first where its files carry column
statistics, and still answers exactly what the whole table says (no JVM: delta-rs writes).

Each ledger here makes a reader that stopped at the newest files answer wrongly: a run resumed
long after it started, a run whose events span many commits, a timestamp maximum that Spark
truncated to the millisecond, a ledger written without statistics. Every answer is compared
with one computed from the rows, and the tests check which read served it.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from sparkguard.delta_reader import DeltaRsReader
from sparkguard.newest_runs import MS, FileStats, cut

T0 = 1_767_225_600_000_000  # 2026-01-01 00:00:00 UTC, µs
MINUTE = 60_000_000
Event = tuple[str, int, str]  # run_id, at (µs), state


def _append(runs: Path, events: list[Event], config: dict[str, str] | None = None) -> None:
    """One commit of run events (delta-rs; ``config`` on the first commit)."""
    from arro3.core import Array, DataType, Table
    from deltalake import write_deltalake

    n = len(events)
    none_s, none_l = Array([None] * n, DataType.string()), Array([None] * n, DataType.int64())
    cols = {"run_id": Array([e[0] for e in events], DataType.string()),
            "at": Array([e[1] for e in events], DataType.int64()).cast(
                DataType.timestamp("us", tz="UTC")),
            "state": Array([e[2] for e in events], DataType.string()), "target": none_s,
            "plan_name": Array(["p"] * n, DataType.string()),
            "plan_fingerprint": Array(["f" * 64] * n, DataType.string()), "owner": none_s,
            "source_version": none_l, "target_version_read": none_l,
            "target_version_written": none_l, "elapsed_s": Array([None] * n, DataType.float64()),
            "details": Array(["{}"] * n, DataType.string())}
    write_deltalake(str(runs), Table.from_pydict(cols), mode="append", configuration=config)


def _expected(events: list[Event], limit: int) -> list[tuple[str, str, int]]:
    """(run_id, state of its newest event, first event) of the ``limit`` latest-started runs."""
    by_run: dict[str, list[Event]] = {}
    for e in events:
        by_run.setdefault(e[0], []).append(e)
    first = {r: min(e[1] for e in evs) for r, evs in by_run.items()}
    top = sorted(first, key=lambda r: first[r], reverse=True)[:limit]
    return [(r, max(by_run[r], key=lambda e: e[1])[2], first[r]) for r in top]


def _micros(at: dt.datetime) -> int:
    return (at.astimezone(dt.UTC) - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) \
        // dt.timedelta(microseconds=1)


def _answer(home: Path, limit: int) -> list[tuple[str, str, int]]:
    return [(p.run_id, p.state, _micros(p.started_at))
            for p in DeltaRsReader(str(home)).latest_runs(limit)]


def _run_id(i: int) -> str:
    return f"{(dt.datetime(2026, 1, 1) + dt.timedelta(minutes=i)):%Y%m%dT%H%M%SZ}-{i:08x}"


def test_a_run_resumed_long_after_it_started_is_ranked_by_its_first_event(
        tmp_path: Path, served: list[bool]) -> None:
    runs = tmp_path / "h" / "ledger" / "runs"
    old = _run_id(0)
    events: list[Event] = [(old, T0, "started"), (old, T0 + 5, "failed")]
    _append(runs, events[:])
    # 80 runs of 3 events, one commit per run: newer ids, later events
    for i in range(1, 81):
        batch = [(_run_id(i), T0 + i * MINUTE + k, s)
                 for k, s in enumerate(("started", "paused", "done"))]
        events += batch
        _append(runs, batch)
    # the old run is resumed last of all: its newest events sit in the newest files
    for k, state in enumerate(("resumed", "proof_passed", "slices_done", "done")):
        batch = [(old, T0 + 200 * MINUTE + k, state)]
        events += batch
        _append(runs, batch)
    for limit in (1, 2, 5, 20, 79):
        assert _answer(runs.parents[1], limit) == _expected(events, limit), limit
        assert old not in {r for r, _, _ in _answer(runs.parents[1], limit)}
    assert all(served[:5]), "the newest-first read answered"
    # every run: the resumed one comes last, with its newest state
    assert _answer(runs.parents[1], 81)[-1] == (old, "done", T0)


def test_runs_spread_over_many_files_and_interleaved(tmp_path: Path, served: list[bool]) -> None:
    runs = tmp_path / "h" / "ledger" / "runs"
    events: list[Event] = []
    # 120 runs, 4 events each, started a minute apart; each commit holds events of the 6
    # runs in flight, so a run's events span several files and a file spans several runs
    pending = [(_run_id(i), T0 + i * MINUTE + k * 3 * MINUTE, s)
               for i in range(120) for k, s in enumerate(("started", "paused", "promoted",
                                                          "done"))]
    pending.sort(key=lambda e: e[1])
    for start in range(0, len(pending), 6):
        batch = pending[start:start + 6]
        events += batch
        _append(runs, batch)
    for limit in (1, 3, 20, 60):
        assert _answer(runs.parents[1], limit) == _expected(events, limit), limit
    # 20 runs want most of the 80 files, 60 runs more rows than a cut leaves: read whole
    assert served == [True, True, False, False]


def test_a_ledger_without_statistics_is_read_whole(tmp_path: Path, served: list[bool]) -> None:
    runs = tmp_path / "h" / "ledger" / "runs"
    events = [(_run_id(i), T0 + i * MINUTE + k, s) for i in range(40)
              for k, s in enumerate(("started", "done"))]
    _append(runs, events[:2], {"delta.dataSkippingNumIndexedCols": "0"})
    for start in range(2, len(events), 2):
        _append(runs, events[start:start + 2])
    assert _answer(runs.parents[1], 5) == _expected(events, 5)
    assert served == []  # no statistics: the newest-first read is not tried


def _truncate_at_stats(runs: Path) -> None:
    """Rewrite every file's ``at`` statistics as Spark writes them: cut to the millisecond."""
    for log in sorted((runs / "_delta_log").glob("*.json")):
        out = []
        for line in log.read_text().splitlines():
            action = json.loads(line)
            add = action.get("add")
            if add and add.get("stats"):
                stats = json.loads(add["stats"])
                for bound in ("minValues", "maxValues"):
                    at = dt.datetime.fromisoformat(stats[bound]["at"].replace("Z", "+00:00"))
                    at = at.replace(microsecond=at.microsecond // 1000 * 1000)
                    stats[bound]["at"] = at.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
                add["stats"] = json.dumps(stats)
            out.append(json.dumps(action))
        log.write_text("\n".join(out) + "\n")


def test_timestamp_maxima_truncated_to_the_millisecond(tmp_path: Path,
                                                       served: list[bool]) -> None:
    runs = tmp_path / "h" / "ledger" / "runs"
    late, early = _run_id(2), _run_id(1)
    # the latest-started run's only event is 0.9 ms into a millisecond: its file's maximum
    # reads as the millisecond's start, below the 0.5 ms first event of the run after it
    events: list[Event] = [(late, T0 + 900, "failed")]
    _append(runs, events[:])
    newer = [(early, T0 + 500, "started")] + [(early, T0 + 5 * MS + k, "slices_done")
                                              for k in range(20)]
    events += newer
    _append(runs, newer)
    _truncate_at_stats(runs)
    assert _answer(runs.parents[1], 1) == _expected(events, 1) == [(late, "failed", T0 + 900)]
    assert _answer(runs.parents[1], 2) == _expected(events, 2)


def test_the_cut_leaves_out_only_files_whose_events_all_precede_it() -> None:
    def f(rows: int, max_at: int) -> FileStats:
        return FileStats(rows, 0, max_at, "a", "b")

    old = [f(10, 0), f(10, 0)]
    # maxima within a millisecond are never split: a truncated one may hide a later event
    assert cut([f(10, 5 * MS), f(10, 5 * MS - 1), f(10, MS), *old], want=5) == MS + MS - 1
    assert cut([f(10, 5 * MS), f(10, 4 * MS)], want=5) == 5 * MS - 1
    assert cut([f(10, 5 * MS), f(10, 4 * MS)], want=11) is None  # nothing left to skip
    assert cut([f(3, 9 * MS), f(3, 8 * MS), f(3, 7 * MS), *old], want=6) == 8 * MS - 1
    # a cut that keeps most files is not taken: one whole read is cheaper
    assert cut([f(3, 9 * MS), f(3, 8 * MS), f(3, 7 * MS)], want=6) is None


def test_a_truncated_run_id_maximum_still_bounds_its_file() -> None:
    # Delta cuts long string statistics to a prefix (the maximum with a bumped last character)
    stats = FileStats(1, 0, 1, "run-a", "run-" + "x" * 28 + "\uffff")
    assert stats.may_hold("run-" + "x" * 40)
    assert stats.may_hold("run-b")
    assert not stats.may_hold("run-z") and not stats.may_hold("run-")
    plain = FileStats(1, 0, 1, "r1", "r5")
    assert plain.may_hold("r5") and not plain.may_hold("r6") and not plain.may_hold("r0")
    assert plain.may_hold("r50")  # "r5" may be a prefix: read rather than miss it
