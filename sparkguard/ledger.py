"""The run ledger: append-only Delta tables of run events, slice events and lock events.

Three tables under ``<home>/ledger`` (see ``docs/state-machine.md``):

- ``runs``: one row per state transition of a run (the run's state is its newest event),
  with the plan fingerprint, versions read and written, elapsed time and details (JSON);
- ``slices``: one row per slice written and reconciled, with its gate verdicts;
- ``locks``: one row per lock acquisition, takeover or release, committed with a Delta
  transaction id per target and generation (:mod:`sparkguard.ledger_locks`).

Appends never conflict with each other. A run reads the ledger once when it starts
(:meth:`Ledger.load`) and from then on only appends; the derivations over the rows
(:func:`run_progress`, :func:`next_action`, :func:`lock_holders`, ...) are pure functions.
Every read computes the latest state per key in Spark (newest runs of a plan, newest slice
event per slice, newest lock event per target) and brings only that bounded result to the
driver, so the answers stay right and fast at any ledger size.

The parts: schemas and event rows in :mod:`sparkguard.ledger_schema`, the tables' plumbing and
audit chains in :mod:`sparkguard.ledger_tables`, the target locks in
:mod:`sparkguard.ledger_locks`; this module holds the run and slice events and the facade.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from sparkguard.ledger_locks import TargetLocks, lock_app_id
from sparkguard.ledger_model import (  # the pure side, re-exported (no pyspark there)
    ROLLBACK_LOCK_SUFFIX,
    RUN_STATES,
    TERMINAL_STATES,
    LockInfo,
    PlanHistory,
    RunProgress,
    TargetProgress,
    decode_row,
    lock_decision,
    lock_holders,
    next_action,
    pid_alive,
    run_progress,
)
from sparkguard.ledger_schema import (
    PLAN_RUNS,
    SCHEMAS,
    WRITE_SCHEMAS,
    evidence_row,
    new_run_id,
    run_row,
    slice_row,
)
from sparkguard.ledger_tables import LedgerTables

__all__ = [
    "ROLLBACK_LOCK_SUFFIX",
    "RUN_STATES",
    "TERMINAL_STATES",
    "Ledger",
    "LockInfo",
    "PlanHistory",
    "RunProgress",
    "TargetProgress",
    "lock_decision",
    "lock_holders",
    "new_run_id",
    "next_action",
    "pid_alive",
    "run_progress",
]

# the tables' schemas without their audit hashes (tests and benchmarks build rows with them)
_SCHEMAS = SCHEMAS


class Ledger(LedgerTables):
    """Run, slice and lock tables under ``<home>/ledger``; the locks are :attr:`locks`."""

    def __init__(self, spark: SparkSession, home: str) -> None:
        super().__init__(spark, home)
        self.locks = TargetLocks(self)

    def record_evidence(self, run_id: str, path: str, content_hash: str, seal: str | None,
                        leaves: dict[str, str]) -> None:
        """Append the audit record of one evidence file (chained per run)."""
        row = evidence_row(run_id, path, content_hash, seal, leaves)
        self._append("evidence", [self._chained("evidence", run_id, row)], txn=None)

    # -- runs and slices --------------------------------------------------------------------

    def record_run(self, run_id: str, state: str, *, fingerprint: str,
                   target: str | None = None, plan_name: str | None = None,
                   owner: str | None = None, source_version: int | None = None,
                   version_read: int | None = None, version_written: int | None = None,
                   elapsed_s: float | None = None, **details: Any) -> None:
        """Append one run event."""
        if state not in RUN_STATES:
            raise ValueError(f"unknown run state {state!r}; one of {sorted(RUN_STATES)}")
        if state == "started":  # a new run: its chains start here, nothing to read
            for name in ("runs", "slices", "evidence"):
                self._heads.setdefault((name, run_id), None)
        row = run_row(run_id, state, fingerprint=fingerprint, target=target, plan_name=plan_name,
                      owner=owner, source_version=source_version, version_read=version_read,
                      version_written=version_written, elapsed_s=elapsed_s, details=details)
        self._append("runs", [self._chained("runs", run_id, row)])

    def record_slice(self, run_id: str, fingerprint: str, target: str, slice_id: int,
                     partitions: list[str], state: str, source_version: int | None, *,
                     rows: int | None = None, content_hash: str | None = None,
                     elapsed_s: float | None = None,
                     gates: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """Append one slice event; returns it as :meth:`load` would."""
        row = self._chained("slices", run_id, slice_row(
            run_id, fingerprint, target, slice_id, partitions, state, source_version, rows=rows,
            content_hash=content_hash, elapsed_s=elapsed_s, gates=gates))
        self._append("slices", [row])
        return decode_row(dict(zip(WRITE_SCHEMAS["slices"].names, row, strict=True)), "gates")

    def load(self, fingerprint: str) -> PlanHistory:
        """What a starting run needs of one plan fingerprint, in two bounded reads.

        Runs: every event of the plan's ``PLAN_RUNS`` newest runs and of its newest passing dry
        run, chosen in Spark. Slices: the newest event of each slice (target, partitions,
        source version), also chosen in Spark.
        """
        hist = PlanHistory(fingerprint)
        runs = self._read("runs")
        if runs is not None:
            mine = runs.filter(F.col("plan_fingerprint") == fingerprint)
            per_run = mine.groupBy("run_id").agg(
                F.min("at").alias("first_at"),
                F.max(F.when(F.col("state") == "dry_run_passed", F.col("at"))).alias("dry_at"))
            newest = per_run.orderBy(F.col("first_at").desc()).limit(PLAN_RUNS).select("run_id")
            dry = (per_run.filter(F.col("dry_at").isNotNull()).orderBy(F.col("dry_at").desc())
                   .limit(1).select("run_id"))
            wanted = newest.union(dry).distinct()
            for e in self._collect(mine.join(F.broadcast(wanted), "run_id"), "details"):
                hist.runs.setdefault(e["run_id"], []).append(e)
        slices = self._read("slices")
        if slices is not None:
            mine = slices.filter(F.col("plan_fingerprint") == fingerprint)
            hist.slices = self._collect(
                self._latest(mine, ["target", "partitions", "source_version"], "at"), "gates")
        # chain heads of these runs: a run's newest slice event is the newest of its slice
        for events in hist.runs.values():
            self._seed("runs", events)
        self._seed("slices", hist.slices)
        for run_id in hist.runs:
            self._heads.setdefault(("slices", run_id), None)
        return hist

    def run_events(self, run_id: str) -> list[dict[str, Any]]:
        """One run's events, oldest first."""
        df = self._read("runs")
        events = self._collect(None if df is None else df.filter(F.col("run_id") == run_id),
                               "details")
        self._seed("runs", events)
        return events

    def slice_events(self, run_id: str) -> list[dict[str, Any]]:
        """One run's slice events, oldest first."""
        df = self._read("slices")
        return self._collect(None if df is None else df.filter(F.col("run_id") == run_id),
                             "gates")

    def progress(self, run_id: str) -> RunProgress | None:
        events = self.run_events(run_id)
        return run_progress(events) if events else None

    def latest_runs(self, limit: int = 20) -> list[RunProgress]:
        """The ``limit`` most recently started runs, newest first (two small reads)."""
        df = self._read("runs")
        if df is None:
            return []
        starts = (df.groupBy("run_id").agg(F.min("at").alias("first_at"))
                  .orderBy(F.col("first_at").desc()).limit(limit))
        events = self._collect(df.join(F.broadcast(starts.select("run_id")), "run_id"),
                               "details")
        by_run: dict[str, list[dict[str, Any]]] = {}
        for e in events:
            by_run.setdefault(e["run_id"], []).append(e)
        return sorted((run_progress(ev) for ev in by_run.values()),
                      key=lambda p: p.started_at, reverse=True)

    # -- locks (sparkguard/ledger_locks.py) -------------------------------------------------

    _lock_app_id = staticmethod(lock_app_id)

    @property
    def token(self) -> str:
        """This process's lock token."""
        return self.locks.token

    @property
    def host(self) -> str:
        return self.locks.host

    def lock_holders(self, targets: Sequence[str]) -> dict[str, LockInfo]:
        """Newest lock event of each target (:meth:`TargetLocks.lock_holders`)."""
        return self.locks.lock_holders(targets)

    def lock_holder(self, target: str) -> LockInfo | None:
        return self.locks.lock_holder(target)

    def acquire(self, targets: Sequence[str], run_id: str, owner: str | None, *,
                takeover: bool = False, stale_after_s: float = 6 * 3600
                ) -> dict[str, tuple[str, LockInfo | None]]:
        """Lock every target for ``run_id`` (:meth:`TargetLocks.acquire`)."""
        return self.locks.acquire(targets, run_id, owner, takeover=takeover,
                                  stale_after_s=stale_after_s)

    def lost_locks(self, keys: Sequence[str]) -> dict[str, LockInfo | None]:
        """The keys this process no longer holds (one read), each with the holder that has it
        now (None when released): the fence before a change to a target."""
        holders = self.lock_holders(keys)
        lost: dict[str, LockInfo | None] = {}
        for key in keys:
            holder = holders.get(key)
            if holder is None or not holder.held or holder.token != self.token:
                lost[key] = holder if holder is not None and holder.held else None
        return lost

    def abandon_taken_over(self, took_over: dict[str, str], by: str,
                           spare: Sequence[str] = ()) -> None:
        """Record ``abandoned`` each run whose lock ``by`` took over (``took_over``: target ->
        the id that held it, :func:`taken_over`), except those in ``spare`` and rollbacks (an
        id ending ``/rollback``: its run stays ``rolling_back``)."""
        for other in sorted(set(took_over.values()) - set(spare)):
            if other.endswith(ROLLBACK_LOCK_SUFFIX):
                continue
            old = self.progress(other)  # recorded under its own plan's fingerprint
            self.record_run(other, "abandoned", fingerprint=old.fingerprint if old else "?",
                            taken_over_by=by,
                            targets=sorted(t for t, r in took_over.items() if r == other))

    def release_finished(self, target: str, holder: LockInfo) -> None:
        """Release a lock left by a run that ended without releasing it."""
        self.locks.release_finished(target, holder)

    def release(self, targets: Sequence[str], run_id: str) -> None:
        """Release this process's locks on ``targets`` (:meth:`TargetLocks.release`)."""
        self.locks.release(targets, run_id)
