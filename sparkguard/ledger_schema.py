"""The ledger's tables as rows: their schemas, and the event rows in those schemas' order.

One schema per table under ``<home>/ledger`` (``docs/state-machine.md`` describes the columns).
The row builders return a table's columns up to, not including, the audit hashes that
:class:`sparkguard.ledger_tables.LedgerTables` appends when it chains an event.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import uuid
from typing import Any

from pyspark.sql import types as T

from sparkguard.ledger_model import CLOCK

__all__ = ["MAX_ROWS", "PLAN_RUNS", "SCHEMAS", "WRITE_SCHEMAS", "evidence_row", "lock_row",
           "new_run_id", "now", "run_row", "slice_row"]

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
# The tables ensure() creates (``evidence`` is created on its first write).
SCHEMAS = {"runs": _RUN_SCHEMA, "slices": _SLICE_SCHEMA, "locks": _LOCK_SCHEMA}
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
WRITE_SCHEMAS = {n: T.StructType([*s.fields, *_HASH_COLUMNS])
                 for n, s in {**SCHEMAS, "evidence": _EVIDENCE_SCHEMA}.items()}
# Reads bring to the driver only results bounded by construction (one run's events, the latest
# row per key); past this many rows a read fails loudly instead of dropping rows.
MAX_ROWS = 20000
# Runs of one plan that a starting run loads (newest first; plus the newest passing dry run).
PLAN_RUNS = 50


def new_run_id(now: dt.datetime | None = None) -> str:
    """Sortable, unique run id: ``YYYYmmddTHHMMSSZ-xxxxxxxx``."""
    now = now or dt.datetime.now(dt.UTC)
    return now.strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:8]


def now() -> dt.datetime:
    """Now as naive local time (what PySpark reads back), strictly increasing within this
    process so events keep their order (:class:`MonotonicClock`)."""
    return CLOCK.now()


def _json(value: Any) -> str:
    return json.dumps(value, default=str, sort_keys=True)


def run_row(run_id: str, state: str, *, fingerprint: str, target: str | None,
            plan_name: str | None, owner: str | None, source_version: int | None,
            version_read: int | None, version_written: int | None, elapsed_s: float | None,
            details: dict[str, Any]) -> tuple[Any, ...]:
    """A ``runs`` event, stamped now."""
    return (run_id, now(), state, target, plan_name, fingerprint, owner, source_version,
            version_read, version_written, elapsed_s, _json(details))


def slice_row(run_id: str, fingerprint: str, target: str, slice_id: int, partitions: list[str],
              state: str, source_version: int | None, *, rows: int | None,
              content_hash: str | None, elapsed_s: float | None,
              gates: list[dict[str, Any]] | None) -> tuple[Any, ...]:
    """A ``slices`` event, stamped now."""
    return (run_id, now(), fingerprint, target, slice_id, json.dumps(partitions), state,
            source_version, rows, content_hash, elapsed_s, _json(gates or []))


def lock_row(target: str, generation: int, action: str, run_id: str, owner: str | None,
             host: str, token: str) -> tuple[Any, ...]:
    """A ``locks`` event of this process, stamped now."""
    return (target, generation, action, run_id, owner, now(), host, os.getpid(), token)


def evidence_row(run_id: str, path: str, content_hash: str, seal: str | None,
                 leaves: dict[str, str]) -> tuple[Any, ...]:
    """An ``evidence`` record of one evidence file, stamped now."""
    return (run_id, now(), path, content_hash, seal, json.dumps(leaves, sort_keys=True))
