"""The run ledger: append-only Delta tables of run events, slice events and locks.

Append-only rows never conflict with each other under Delta's optimistic concurrency; the
current state of a run is its newest event. Locks are one MERGE (insert-if-absent), so two
runs racing for the same target cannot both win.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import uuid
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sparkguard.delta_ops import table_exists, with_conflict_retry
from sparkguard.errors import ConcurrentRunError
from sparkguard.sql import TableRef

__all__ = ["RUN_STATES", "Ledger", "LockInfo", "new_run_id"]

# The run state machine (documented in the README):
# started -> guarded -> paused -> proof_passed -> slices_done -> reconciled
#   -> promoting -> promoted -> verified -> done
# with exits: gate_failed, failed, dry_run_passed, rolled_back, restored_after_failure.
RUN_STATES = (
    "started", "guarded", "paused", "proof_passed", "slices_done", "reconciled", "promoting",
    "promoted", "verified", "done", "gate_failed", "failed", "dry_run_passed", "rolled_back",
    "restored_after_failure", "rolling_back",
)
TERMINAL = {"done", "gate_failed", "dry_run_passed", "rolled_back", "restored_after_failure",
            "rolling_back"}

_RUN_SCHEMA = T.StructType([
    T.StructField("run_id", T.StringType(), False),
    T.StructField("at", T.TimestampType(), False),
    T.StructField("state", T.StringType(), False),
    T.StructField("plan_name", T.StringType(), True),
    T.StructField("plan_fingerprint", T.StringType(), True),
    T.StructField("owner", T.StringType(), True),
    T.StructField("target", T.StringType(), True),
    T.StructField("details", T.StringType(), True),
])
_SLICE_SCHEMA = T.StructType([
    T.StructField("run_id", T.StringType(), False),
    T.StructField("at", T.TimestampType(), False),
    T.StructField("plan_fingerprint", T.StringType(), False),
    T.StructField("target", T.StringType(), False),
    T.StructField("slice_id", T.IntegerType(), False),
    T.StructField("partitions", T.StringType(), False),
    T.StructField("state", T.StringType(), False),
    T.StructField("source_version", T.LongType(), True),
    T.StructField("content_hash", T.StringType(), True),
    T.StructField("details", T.StringType(), True),
])
_LOCK_SCHEMA = T.StructType([
    T.StructField("target", T.StringType(), False),
    T.StructField("run_id", T.StringType(), False),
    T.StructField("owner", T.StringType(), True),
    T.StructField("acquired_at", T.TimestampType(), False),
    T.StructField("host", T.StringType(), True),
])


def new_run_id(now: dt.datetime | None = None) -> str:
    """Sortable, unique run id: ``YYYYmmddTHHMMSSZ-xxxxxxxx``."""
    now = now or dt.datetime.now(dt.timezone.utc)
    return now.strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:8]


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


@dataclass(frozen=True)
class LockInfo:
    """Who holds the lock on a target."""

    target: str
    run_id: str
    owner: str | None
    acquired_at: dt.datetime
    host: str | None


class Ledger:
    """Run, slice and lock tables under ``<home>/ledger``."""

    def __init__(self, spark: SparkSession, home: str) -> None:
        self.spark = spark
        self.home = home.rstrip("/")
        self.runs_ref = TableRef(path=f"{self.home}/ledger/runs")
        self.slices_ref = TableRef(path=f"{self.home}/ledger/slices")
        self.locks_ref = TableRef(path=f"{self.home}/ledger/locks")

    # -- plumbing -------------------------------------------------------------------------

    def _append(self, ref: TableRef, schema: T.StructType, rows: list[tuple[Any, ...]]) -> None:
        df = self.spark.createDataFrame(rows, schema)
        assert ref.path is not None
        with_conflict_retry(lambda: df.write.format("delta").mode("append").save(ref.path),
                            attempts=5, delay_s=0.5, log=lambda _m: None)

    def _read(self, ref: TableRef, schema: T.StructType) -> DataFrame:
        if not table_exists(self.spark, ref):
            return self.spark.createDataFrame([], schema)
        assert ref.path is not None
        return self.spark.read.format("delta").load(ref.path)

    # -- runs -------------------------------------------------------------------------------

    def record_run(self, run_id: str, state: str, *, plan_name: str | None = None,
                   fingerprint: str | None = None, owner: str | None = None,
                   target: str | None = None, **details: Any) -> None:
        """Append a run event."""
        assert state in RUN_STATES, state
        self._append(self.runs_ref, _RUN_SCHEMA, [(
            run_id, _now(), state, plan_name, fingerprint, owner, target,
            json.dumps(details, default=str, sort_keys=True))])

    def run_events(self, run_id: str, limit: int = 500) -> list[dict[str, Any]]:
        """A run's events, oldest first (bounded)."""
        rows = (self._read(self.runs_ref, _RUN_SCHEMA).filter(F.col("run_id") == run_id)
                .orderBy("at").limit(limit).collect())
        return [self._decode(r.asDict()) for r in rows]

    def latest_runs(self, limit: int = 20) -> list[dict[str, Any]]:
        """Newest event of each of the latest runs."""
        df = self._read(self.runs_ref, _RUN_SCHEMA)
        latest = df.groupBy("run_id").agg(F.max("at").alias("at"))
        rows = (df.join(latest, ["run_id", "at"]).orderBy(F.col("at").desc())
                .limit(limit).collect())
        return [self._decode(r.asDict()) for r in rows]

    def resumable_run(self, fingerprint: str) -> dict[str, Any] | None:
        """The newest run of this plan fingerprint that did not reach a terminal state."""
        df = self._read(self.runs_ref, _RUN_SCHEMA).filter(F.col("plan_fingerprint") == fingerprint)
        latest = df.groupBy("run_id").agg(F.max("at").alias("at"))
        row = (df.join(latest, ["run_id", "at"]).orderBy(F.col("at").desc()).limit(1).first())
        if row is None or row["state"] in TERMINAL:
            return None
        return self._decode(row.asDict())

    def dry_run_passed(self, fingerprint: str) -> bool:
        """Whether sparkguard itself recorded a passing dry run of this exact plan."""
        df = self._read(self.runs_ref, _RUN_SCHEMA)
        return df.filter((F.col("plan_fingerprint") == fingerprint)
                         & (F.col("state") == "dry_run_passed")).limit(1).count() > 0

    def find_run(self, run_id: str) -> dict[str, Any] | None:
        events = self.run_events(run_id)
        return events[-1] if events else None

    @staticmethod
    def _decode(row: dict[str, Any]) -> dict[str, Any]:
        try:
            row["details"] = json.loads(row.get("details") or "{}")
        except ValueError:
            row["details"] = {}
        return row

    # -- slices -----------------------------------------------------------------------------

    def record_slice(self, run_id: str, fingerprint: str, target: str, slice_id: int,
                     partitions: list[str], state: str, source_version: int | None,
                     content_hash: str | None = None, **details: Any) -> None:
        self._append(self.slices_ref, _SLICE_SCHEMA, [(
            run_id, _now(), fingerprint, target, slice_id, json.dumps(partitions), state,
            source_version, content_hash, json.dumps(details, default=str, sort_keys=True))])

    def done_slices(self, fingerprint: str, target: str, source_version: int | None) -> set[str]:
        """Partition lists (JSON) already written *and* reconciled for this plan and source."""
        df = self._read(self.slices_ref, _SLICE_SCHEMA).filter(
            (F.col("plan_fingerprint") == fingerprint) & (F.col("target") == target)
            & (F.col("state") == "reconciled"))
        if source_version is not None:
            df = df.filter(F.col("source_version") == source_version)
        return {r["partitions"] for r in df.select("partitions").distinct().limit(10000).collect()}

    def slice_events(self, run_id: str, limit: int = 2000) -> list[dict[str, Any]]:
        rows = (self._read(self.slices_ref, _SLICE_SCHEMA).filter(F.col("run_id") == run_id)
                .orderBy("at").limit(limit).collect())
        return [self._decode(r.asDict()) for r in rows]

    # -- locks ------------------------------------------------------------------------------

    def _ensure_locks(self) -> None:
        if table_exists(self.spark, self.locks_ref):
            return
        assert self.locks_ref.path is not None
        try:
            (self.spark.createDataFrame([], _LOCK_SCHEMA).write.format("delta")
             .mode("append").save(self.locks_ref.path))
        except Exception:
            if not table_exists(self.spark, self.locks_ref):
                raise

    def lock_holder(self, target: str) -> LockInfo | None:
        if not table_exists(self.spark, self.locks_ref):
            return None
        assert self.locks_ref.path is not None
        row = (self.spark.read.format("delta").load(self.locks_ref.path)
               .filter(F.col("target") == target).limit(1).first())
        return LockInfo(**row.asDict()) if row else None

    def acquire(self, target: str, run_id: str, owner: str | None, *, takeover: bool = False,
                stale_after_s: float = 6 * 3600) -> None:
        """Take the lock on ``target`` for ``run_id`` or raise ConcurrentRunError.

        Re-acquiring a lock this run already holds succeeds (resume). A lock held by another
        run is taken over only with ``takeover`` and only once it is older than
        ``stale_after_s``.
        """
        from delta.tables import DeltaTable

        self._ensure_locks()
        holder = self.lock_holder(target)
        if holder is not None and holder.run_id == run_id:
            return
        if holder is not None:
            age = (_now() - holder.acquired_at).total_seconds()
            if not takeover or age < stale_after_s:
                why = ("" if not takeover else
                       f"; it is {age:.0f}s old, younger than the stale timeout {stale_after_s:.0f}s")
                raise ConcurrentRunError(
                    f"target {target} is locked by run {holder.run_id} (owner {holder.owner}, "
                    f"host {holder.host}, since {holder.acquired_at:%Y-%m-%d %H:%M:%S} UTC){why}. "
                    "Wait for it to finish, or after the stale timeout re-run with "
                    "--takeover-stale-lock")
            self.release(target, holder.run_id)
        assert self.locks_ref.path is not None
        row = self.spark.createDataFrame(
            [(target, run_id, owner, _now(), f"{socket.gethostname()}:{os.getpid()}")],
            _LOCK_SCHEMA)
        try:
            (DeltaTable.forPath(self.spark, self.locks_ref.path).alias("l")
             .merge(row.alias("n"), "l.target = n.target")
             .whenNotMatchedInsertAll().execute())
        except Exception as exc:
            if "Concurrent" not in type(exc).__name__ + str(exc)[:500]:
                raise
        holder = self.lock_holder(target)
        if holder is None or holder.run_id != run_id:
            raise ConcurrentRunError(
                f"target {target} was locked by run {holder.run_id if holder else '?'} "
                f"(owner {holder.owner if holder else '?'}) at the same moment; this run stops")

    def release(self, target: str, run_id: str) -> None:
        """Release ``run_id``'s lock on ``target`` (no-op when it does not hold it)."""
        from delta.tables import DeltaTable

        if not table_exists(self.spark, self.locks_ref):
            return
        assert self.locks_ref.path is not None
        tbl = DeltaTable.forPath(self.spark, self.locks_ref.path)
        with_conflict_retry(
            lambda: tbl.delete((F.col("target") == target) & (F.col("run_id") == run_id)),
            attempts=5, delay_s=0.5, log=lambda _m: None)
