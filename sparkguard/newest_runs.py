"""The newest runs of the runs table read newest first, from the files' column statistics
(pure: no delta-rs, no pyspark; :class:`sparkguard.delta_reader.DeltaRsReader` runs the reads).

``sparkguard status`` ranks runs by their first event (``min(at)`` per run). A run's newest
files cannot bound that (a run resumed today may have started a year ago), so without
statistics every file is read. With the minimum and maximum of ``run_id`` and ``at`` per data
file (``delta.dataSkippingNumIndexedCols = 2``) an exact read exists:

1. order the files by their newest event; take files until they hold enough rows for the
   runs asked for, and cut at ``x``, at or after every event of the files left out;
2. read every event later than ``x`` (the files left out are skipped by their statistics);
3. a run seen there may still have events at or before ``x``: read those of the runs whose id
   falls in the run-id range of a file holding such events (none when run ids follow time);
4. every run whose first event is later than ``x`` is now read whole, and every other run
   started at or before ``x``: when there are at least ``limit`` of the former, they are the
   answer. Otherwise (or when a file has no statistics: ledgers written before them) the caller
   reads everything, as before.

Delta (Spark) writes timestamp statistics truncated to milliseconds and may cut long strings to
a prefix; the bounds here allow for both.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["FileStats", "cut", "file_stats", "newest_runs"]

MS = 1_000  # microseconds: a truncated timestamp maximum is at most this much below the truth
ROWS_PER_RUN = 16  # rows read per run asked for before the first cut is tried
MAX_COMPLETE = 500  # runs whose older events are looked up by id; past it, read everything

Row = dict[str, Any]
Fetch = Callable[[str], list[Row]]  # SQL condition -> rows (``at`` in microseconds since epoch)


@dataclass(frozen=True)
class FileStats:
    """One data file of the runs table: rows, and the range of ``at`` (µs) and ``run_id``."""

    rows: int
    min_at: int
    max_at: int
    min_run: str
    max_run: str

    def may_hold(self, run_id: str) -> bool:
        """Whether ``run_id`` can be in this file (a truncated maximum is a prefix, compared on
        its own length; a truncated minimum is below every value anyway)."""
        return self.min_run <= run_id and run_id[:len(self.max_run)] <= self.max_run


def file_stats(actions: Mapping[str, Sequence[Any]]) -> list[FileStats] | None:
    """The runs table's data files from its add actions (flattened columns, ``at`` in µs);
    None when a file lacks one of the statistics or counts a null ``at``."""
    try:
        cols = [actions[k] for k in ("num_records", "min.at", "max.at", "min.run_id",
                                     "max.run_id", "null_count.at")]
    except KeyError:  # the table collects no statistics on these columns
        return None
    out = []
    for n, lo, hi, rlo, rhi, nulls in zip(*cols, strict=True):
        if None in (n, lo, hi, rlo, rhi) or nulls:
            return None
        out.append(FileStats(int(n), int(lo), int(hi), str(rlo), str(rhi)))
    return out


def cut(files: Sequence[FileStats], want: int) -> int | None:
    """``x`` such that the files newest first holding at least ``want`` rows hold every event
    later than ``x`` and each other file only events at or before it; None when no such cut
    leaves out at least half of the files (each file read costs about a millisecond, whatever
    its size: reading most of them in two steps is slower than one whole read). The files
    kept have a maximum statistic above ``x`` (a reader skipping files by ``at > x`` keeps
    them), the others a true maximum at or below it."""
    order = sorted(files, key=lambda f: f.max_at, reverse=True)
    total = 0
    for kept, (f, nxt) in enumerate(itertools.pairwise(order), start=1):
        total += f.rows
        if 2 * kept > len(order):  # reading most files newest first costs more than reading all
            return None
        if total >= want and f.max_at - nxt.max_at >= MS:
            return nxt.max_at + MS - 1
    return None


def _in(values: Sequence[str]) -> str:
    return ", ".join("'" + v.replace("'", "''") + "'" for v in values)


def newest_runs(files: Sequence[FileStats], limit: int, fetch: Fetch) -> list[Row] | None:
    """Every event of the ``limit`` runs with the latest first event, read newest first
    (see the module docstring), or None when the caller must read everything. A cut that
    yields too few runs is retried deeper (four times the rows each time)."""
    want = max(limit, 1) * ROWS_PER_RUN
    while (x := cut(files, want)) is not None and limit >= 1:
        found = _above(files, limit, fetch, x)
        if found is not None:
            return found
        want = 4 * max(want, sum(f.rows for f in files if f.max_at > x))
    return None


def _above(files: Sequence[FileStats], limit: int, fetch: Fetch, x: int) -> list[Row] | None:
    """The answer when at least ``limit`` runs started after ``x``, else None."""
    ts = f"arrow_cast({x}, 'Timestamp(Microsecond, Some(\"UTC\"))')"
    runs: dict[str, list[Row]] = {}
    for r in fetch(f"at > {ts}"):
        if r["at"] > x:
            runs.setdefault(r["run_id"], []).append(r)
    if len(runs) < limit:
        return None
    older = [f for f in files if f.min_at <= x]
    need = sorted(run for run in runs if any(f.may_hold(run) for f in older))
    if len(need) > MAX_COMPLETE:
        return None
    if need:
        cond = (f"at <= {ts} AND run_id >= {_in(need[:1])} AND run_id <= {_in(need[-1:])} "
                f"AND run_id IN ({_in(need)})")
        for r in fetch(cond):
            if r["at"] <= x and r["run_id"] in runs:
                runs[r["run_id"]].append(r)
    first = {run: min(r["at"] for r in rows) for run, rows in runs.items()}
    whole = [run for run in runs if first[run] > x]
    if len(whole) < limit:
        return None
    top = sorted(whole, key=lambda run: first[run], reverse=True)[:limit]
    return [r for run in top for r in runs[run]]
