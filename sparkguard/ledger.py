"""The run ledger: append-only Delta tables of run events, slice events and lock events.

Three tables under ``<home>/ledger`` (see ``docs/state-machine.md``):

- ``runs``: one row per state transition of a run (the run's state is its newest event),
  with the plan fingerprint, versions read and written, elapsed time and details (JSON);
- ``slices``: one row per slice written and reconciled, with its gate verdicts;
- ``locks``: one row per lock acquisition, takeover or release. Every event of one target
  carries the next generation number and is committed with Delta's ``txnAppId`` (one per
  target) and ``txnVersion`` (= generation): of two runs racing for the same generation,
  Delta lets exactly one commit; the other's write is skipped or fails with a conflict, and
  reading the table back tells it who won.

Appends never conflict with each other. A run reads the ledger once when it starts
(:meth:`Ledger.load`) and from then on only appends; the derivations over the rows
(:func:`run_progress`, :func:`next_action`, :func:`lock_holders`, ...) are pure functions.
Every read computes the latest state per key in Spark (newest runs of a plan, newest slice
event per slice, newest lock event per target) and brings only that bounded result to the
driver, so the answers stay right and fast at any ledger size.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import socket
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sparkguard import delta_ops
from sparkguard.delta_ops import append_rows, create_log_table, delta_log_exists, is_conflict
from sparkguard.errors import ConcurrentRunError, SparkguardError
from sparkguard.ledger_model import (  # the pure side, re-exported (no pyspark there)
    CLOCK,
    RUN_STATES,
    TERMINAL_STATES,
    LockInfo,
    PlanHistory,
    RunProgress,
    TargetProgress,
    chained_hash,
    decode_row,
    lock_decision,
    lock_holders,
    next_action,
    pid_alive,
    run_progress,
)
from sparkguard.sql import TableRef

__all__ = [
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

_RUN_SCHEMA = T.StructType([
    T.StructField("run_id", T.StringType(), False),
    T.StructField("at", T.TimestampType(), False),
    T.StructField("state", T.StringType(), False),
    T.StructField("target", T.StringType(), True),
    T.StructField("plan_name", T.StringType(), True),
    T.StructField("plan_fingerprint", T.StringType(), False),
    T.StructField("owner", T.StringType(), True),
    T.StructField("source_version", T.LongType(), True),
    T.StructField("target_version_read", T.LongType(), True),
    T.StructField("target_version_written", T.LongType(), True),
    T.StructField("elapsed_s", T.DoubleType(), True),
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
    T.StructField("rows", T.LongType(), True),
    T.StructField("content_hash", T.StringType(), True),
    T.StructField("elapsed_s", T.DoubleType(), True),
    T.StructField("gates", T.StringType(), True),
])
_LOCK_SCHEMA = T.StructType([
    T.StructField("target", T.StringType(), False),
    T.StructField("generation", T.LongType(), False),
    T.StructField("action", T.StringType(), False),
    T.StructField("run_id", T.StringType(), False),
    T.StructField("owner", T.StringType(), True),
    T.StructField("at", T.TimestampType(), False),
    T.StructField("host", T.StringType(), True),
    T.StructField("pid", T.LongType(), True),
    T.StructField("token", T.StringType(), False),
])
_SCHEMAS = {"runs": _RUN_SCHEMA, "slices": _SLICE_SCHEMA, "locks": _LOCK_SCHEMA}
# Every event the ledger writes ends with its audit hashes (sparkguard/audit.py): the hash of its
# content and of the previous event of its chain (the run's; for lock events the target's).
# Tables created before auditing gain the columns by schema evolution on the next append; their
# old rows read with nulls there ("unchained").
_HASH_COLUMNS = [T.StructField("event_hash", T.StringType(), True),
                 T.StructField("prev_hash", T.StringType(), True)]
# One row per evidence file written: its content hash, seal and leaf hashes (so a verifier
# names the edited field). Created on the first evidence write, not by ensure().
_EVIDENCE_SCHEMA = T.StructType([
    T.StructField("run_id", T.StringType(), False),
    T.StructField("at", T.TimestampType(), False),
    T.StructField("path", T.StringType(), True),
    T.StructField("content_hash", T.StringType(), False),
    T.StructField("seal", T.StringType(), True),
    T.StructField("leaves", T.StringType(), True),
])
_WRITE_SCHEMAS = {n: T.StructType([*s.fields, *_HASH_COLUMNS])
                  for n, s in {**_SCHEMAS, "evidence": _EVIDENCE_SCHEMA}.items()}
# Reads bring to the driver only results bounded by construction (one run's events, the latest
# row per key); past this many rows a read fails loudly instead of dropping rows.
_MAX_ROWS = 20000
# Runs of one plan that a starting run loads (newest first; plus the newest passing dry run).
_PLAN_RUNS = 50

_known_tables: set[str] = set()


def new_run_id(now: dt.datetime | None = None) -> str:
    """Sortable, unique run id: ``YYYYmmddTHHMMSSZ-xxxxxxxx``."""
    now = now or dt.datetime.now(dt.UTC)
    return now.strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:8]


def _now() -> dt.datetime:
    """UTC now (naive), strictly increasing within this process so events keep their order."""
    return CLOCK.now()


def _json(value: Any) -> str:
    return json.dumps(value, default=str, sort_keys=True)


_decode = decode_row


# -- the tables -----------------------------------------------------------------------------------


class Ledger:
    """Run, slice and lock tables under ``<home>/ledger``."""

    def __init__(self, spark: SparkSession, home: str) -> None:
        self.spark = spark
        self.home = home.rstrip("/")
        self.refs = {n: TableRef(path=f"{self.home}/ledger/{n}") for n in _WRITE_SCHEMAS}
        self.token = uuid.uuid4().hex
        self.host = socket.gethostname()
        self._held: dict[str, int] = {}  # target -> generation of our acquire event
        self._empty: set[str] = set()  # tables created empty by this instance, not yet written
        self._batch: dict[str, list[tuple[Any, ...]]] | None = None  # see batched()
        # audit chain heads known in memory: (table, run id or target) -> newest event hash
        self._heads: dict[tuple[str, str], str | None] = {}

    @property
    def runs_ref(self) -> TableRef:
        return self.refs["runs"]

    @property
    def slices_ref(self) -> TableRef:
        return self.refs["slices"]

    @property
    def locks_ref(self) -> TableRef:
        return self.refs["locks"]

    def _path(self, name: str) -> str:
        path = self.refs[name].path
        assert path is not None
        return path

    # -- plumbing -------------------------------------------------------------------------

    def _exists(self, name: str) -> bool:
        path = self._path(name)
        if path in _known_tables:
            return True
        if delta_log_exists(self.spark, path):
            _known_tables.add(path)
            return True
        return False

    def ensure(self) -> None:
        """Create the ledger tables that do not exist yet (a file-system check when they do).

        A table this call created is known to be empty, so reading it is skipped.
        """
        for name in _SCHEMAS:
            if not self._exists(name):
                if create_log_table(self.spark, self._path(name), _WRITE_SCHEMAS[name]):
                    self._empty.add(name)
                _known_tables.add(self._path(name))

    def _append(self, name: str, rows: list[tuple[Any, ...]],
                txn: tuple[str, int] | None = None, metadata: str | None = None) -> None:
        width = len(_WRITE_SCHEMAS[name].fields)  # rows without their hashes: unchained
        rows = [(*r, *(None,) * (width - len(r))) for r in rows]
        if self._batch is not None and txn is None:
            self._batch.setdefault(name, []).extend(rows)
            return
        if not self._exists(name):
            if name in _SCHEMAS:
                self.ensure()
            else:
                create_log_table(self.spark, self._path(name), _WRITE_SCHEMAS[name])
                _known_tables.add(self._path(name))
        append_rows(self.spark, self._path(name), _WRITE_SCHEMAS[name], rows, txn, metadata,
                    merge_schema=True)
        self._empty.discard(name)

    @contextmanager
    def batched(self) -> Iterator[None]:
        """Buffer the run and slice events recorded inside the block and append them in one
        commit per table when it ends (imports of history, benchmarks). Lock events are never
        buffered: each is its own commit with its transaction id."""
        if self._batch is not None:
            yield
            return
        self._batch = {}
        try:
            yield
            batch, self._batch = self._batch, None
            for name, rows in batch.items():
                if rows:
                    self._append(name, rows)
        finally:
            self._batch = None

    def _read(self, name: str) -> DataFrame | None:
        if name in self._empty or not self._exists(name):
            return None
        return self.spark.read.format("delta").load(self._path(name))

    def _collect(self, df: DataFrame | None, *json_fields: str, order: str = "at"
                 ) -> list[dict[str, Any]]:
        """Rows of a result bounded by construction, sorted by ``order`` on the driver.

        Never truncates: a result above ``_MAX_ROWS`` rows raises instead of dropping rows.
        """
        if df is None:
            return []
        rows = df.limit(_MAX_ROWS + 1).collect()
        if len(rows) > _MAX_ROWS:
            raise SparkguardError(
                f"a ledger read under {self.home} returned more than {_MAX_ROWS} rows; it "
                "should return the latest state per key only (a bug: report it)")
        out = [_decode(r.asDict(), *json_fields) for r in rows]
        return sorted(out, key=lambda r: r[order])

    @staticmethod
    def _latest(df: DataFrame, keys: Sequence[str], *order: str) -> DataFrame:
        """The newest row per ``keys`` (the greatest ``order`` values), computed in Spark by one
        aggregation (partial aggregates before the shuffle: no sort of the whole table)."""
        cols = df.columns
        newest = F.max_by(F.struct(*[F.col(c) for c in cols]), F.struct(*[F.col(c) for c in order]))
        return df.groupBy(*keys).agg(newest.alias("_row")).select(
            *[F.col("_row")[c].alias(c) for c in cols])

    # -- audit chains -----------------------------------------------------------------------

    def _chained(self, name: str, key: str, row: tuple[Any, ...],
                 prev: str | None = None, *, known: bool = False) -> tuple[Any, ...]:
        """``row`` with its ``event_hash`` and ``prev_hash``, continuing chain ``(name, key)``
        (``known``: ``prev`` is the head, else the head in memory or read once)."""
        if not known:
            prev = self._head(name, key)
        names = [f.name for f in _WRITE_SCHEMAS[name].fields][:len(row)]
        h = chained_hash(name, dict(zip(names, row, strict=True)), prev, raw_json=True)
        self._heads[(name, key)] = h
        return (*row, h, prev)

    def _head(self, name: str, run_id: str) -> str | None:
        """The newest event hash of a run's chain in table ``name``: from memory, else one
        bounded read (the run's newest row; a run seen by load/run_events is in memory)."""
        if (name, run_id) in self._heads:
            return self._heads[(name, run_id)]
        df = self._read(name)
        head = None
        if df is not None and "event_hash" in df.columns:
            row = (df.filter(F.col("run_id") == run_id)
                   .agg(F.max_by("event_hash", "at").alias("h")).first())
            head = row["h"] if row is not None else None
        self._heads[(name, run_id)] = head
        return head

    def _seed(self, name: str, events: Sequence[dict[str, Any]]) -> None:
        """Remember the chain heads of runs whose events were just read (oldest first)."""
        newest: dict[str, str | None] = {}
        for e in events:
            newest[e["run_id"]] = e.get("event_hash") or newest.get(e["run_id"])
        for run_id, h in newest.items():
            self._heads.setdefault((name, run_id), h)

    def chain_heads(self, run_id: str, targets: Sequence[str]) -> dict[str, Any]:
        """The heads of a run's chains as this instance wrote them (for its evidence)."""
        return {"runs": self._heads.get(("runs", run_id)),
                "slices": self._heads.get(("slices", run_id)),
                "locks": {t: self._heads.get(("locks", t)) for t in sorted(set(targets))}}

    def record_evidence(self, run_id: str, path: str, content_hash: str, seal: str | None,
                        leaves: dict[str, str]) -> None:
        """Append the audit record of one evidence file (chained per run)."""
        row = (run_id, _now(), path, content_hash, seal, json.dumps(leaves, sort_keys=True))
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
        row = (run_id, _now(), state, target, plan_name, fingerprint, owner, source_version,
               version_read, version_written, elapsed_s, _json(details))
        self._append("runs", [self._chained("runs", run_id, row)])

    def record_slice(self, run_id: str, fingerprint: str, target: str, slice_id: int,
                     partitions: list[str], state: str, source_version: int | None, *,
                     rows: int | None = None, content_hash: str | None = None,
                     elapsed_s: float | None = None,
                     gates: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """Append one slice event; returns it as :meth:`load` would."""
        row = self._chained("slices", run_id, (
            run_id, _now(), fingerprint, target, slice_id, json.dumps(partitions), state,
            source_version, rows, content_hash, elapsed_s, _json(gates or [])))
        self._append("slices", [row])
        return _decode(dict(zip(_WRITE_SCHEMAS["slices"].names, row, strict=True)), "gates")

    def load(self, fingerprint: str) -> PlanHistory:
        """What a starting run needs of one plan fingerprint, in two bounded reads.

        Runs: every event of the plan's ``_PLAN_RUNS`` newest runs and of its newest passing dry
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
            newest = per_run.orderBy(F.col("first_at").desc()).limit(_PLAN_RUNS).select("run_id")
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

    # -- locks ------------------------------------------------------------------------------

    @staticmethod
    def _lock_app_id(target: str) -> str:
        return "sparkguard-lock-" + hashlib.sha256(target.encode()).hexdigest()[:24]

    def lock_holders(self, targets: Sequence[str]) -> dict[str, LockInfo]:
        """Newest lock event of each target (one read; one row per target reaches the driver)."""
        df = self._read("locks")
        if df is None:
            return {}
        newest = self._latest(df.filter(F.col("target").isin(list(targets))), ["target"],
                              "generation", "at")
        return lock_holders(self._collect(newest, order="generation"))

    def lock_holder(self, target: str) -> LockInfo | None:
        info = self.lock_holders([target]).get(target)
        return info if info is not None and info.held else None

    def _runs_of(self, run_ids: Sequence[str]) -> dict[str, RunProgress]:
        """Progress of the given runs (one read; only when a lock is held by someone else)."""
        df = self._read("runs")
        if df is None or not run_ids:
            return {}
        by_run: dict[str, list[dict[str, Any]]] = {}
        for e in self._collect(df.filter(F.col("run_id").isin(list(run_ids))), "details"):
            by_run.setdefault(e["run_id"], []).append(e)
        return {r: run_progress(ev) for r, ev in by_run.items()}

    def _lock_event(self, target: str, generation: int, action: str, run_id: str,
                    owner: str | None, prev: str | None) -> None:
        row = self._chained("locks", target, (target, generation, action, run_id, owner, _now(),
                                              self.host, os.getpid(), self.token),
                            prev, known=True)
        try:
            self._append("locks", [row], txn=(self._lock_app_id(target), generation),
                         metadata=self._lock_tag(target, generation))
        except Exception as exc:
            if not is_conflict(exc):
                raise  # a conflict means another run wrote this generation first

    def _lock_tag(self, target: str, generation: int) -> str:
        return json.dumps({"sparkguard": {"lock": self.token, "generation": generation,
                                          "app": self._lock_app_id(target)}}, sort_keys=True)

    def _committed(self, written: dict[str, int]) -> set[str]:
        """Targets whose lock event by this instance is in the lock table's recent history
        (one history look-up; a write Delta skipped or refused has no commit)."""
        tags = {self._lock_tag(t, g): t for t, g in written.items()}
        history = delta_ops.history(self.spark, TableRef(path=self._path("locks")),
                                    max(50, 4 * len(tags))).select("userMetadata").collect()
        return {tags[h["userMetadata"]] for h in history if h["userMetadata"] in tags}

    def acquire(self, targets: Sequence[str], run_id: str, owner: str | None, *,
                takeover: bool = False, stale_after_s: float = 6 * 3600
                ) -> dict[str, tuple[str, LockInfo | None]]:
        """Lock every target for ``run_id`` or raise ConcurrentRunError (nothing kept locked).

        Returns, per target, the decision taken (``free``, ``mine``, ``finished``, ``resume``,
        ``takeover``) and the previous holder.
        """
        self.ensure()
        targets = sorted(set(targets))
        holders = self.lock_holders(targets)
        now = _now()
        others = self._runs_of(sorted({h.run_id for h in holders.values()
                                       if h.held and h.token != self.token}))
        decisions: dict[str, tuple[str, LockInfo | None]] = {}
        for t in targets:
            holder = holders.get(t)
            prog = others.get(holder.run_id) if holder is not None else None
            what, why = lock_decision(holder, run_id=run_id, token=self.token, host=self.host,
                                      now=now, takeover=takeover, stale_after_s=stale_after_s,
                                      last_activity=prog.last_at if prog else None,
                                      holder_state=prog.state if prog else None)
            if what == "refuse":
                assert holder is not None
                raise ConcurrentRunError(
                    f"target {t} is locked by {holder.describe()}: {why}. One run at a time "
                    "may backfill a target; wait for it to finish")
            decisions[t] = (what, holder)
        written: dict[str, int] = {}
        for t in targets:
            what, holder = decisions[t]
            if what == "mine":
                continue
            gen = (holder.generation if holder else 0) + 1
            self._lock_event(t, gen, "acquire" if what in ("free", "finished") else what, run_id,
                             owner, holder.event_hash if holder else None)
            written[t] = gen
        if written:
            won = self._committed(written)
            for t, gen in written.items():
                if t in won:
                    self._held[t] = gen
            lost = sorted(set(written) - won)
            if lost:
                self.release(list(self._held), run_id)
                winner = self.lock_holders(lost).get(lost[0])
                raise ConcurrentRunError(
                    f"target {lost[0]} was locked at the same moment by "
                    f"{winner.describe() if winner else 'another run'}; this run stops")
        return decisions

    def release_finished(self, target: str, holder: LockInfo) -> None:
        """Release a lock left by a run that ended without releasing it (died just before)."""
        self._lock_event(target, holder.generation + 1, "release", holder.run_id, None,
                         holder.event_hash)

    def release(self, targets: Sequence[str], run_id: str) -> None:
        """Release this process's locks on ``targets`` (targets it does not hold are skipped).

        The release event takes the next generation under the same txnAppId, so a release
        racing a takeover of the same generation is a no-op.
        """
        for t in sorted(set(targets)):
            gen = self._held.pop(t, None)
            if gen is not None:
                self._lock_event(t, gen + 1, "release", run_id, None,
                                 self._heads.get(("locks", t)))
