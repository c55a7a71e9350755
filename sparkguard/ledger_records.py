"""The ledger's records as written: the run states, one monotonic clock for chained events, the
audit hash of a row, and the JSON columns decoded (pure; re-exported by
:mod:`sparkguard.ledger_model`)."""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections.abc import Callable, Iterable
from typing import Any

from sparkguard import audit

__all__ = ["AUDIT_JSON", "CHAIN_ORDER", "CLOCK", "RUN_STATES", "TARGET_EVENTS", "TERMINAL_STATES",
           "MonotonicClock", "audit_body", "chained_hash", "decode_row", "instant", "local_time",
           "plus"]


# The run state machine; docs/state-machine.md explains each state and what a re-run does.
RUN_STATES: dict[str, str] = {
    "started": "lock taken, source version pinned, approvals used recorded",
    "resumed": "a re-run of the same plan took the run over after a failure or crash",
    "paused": "publish paused for every target in the control table",
    "proof_passed": "proof slice written twice with the same content hash and reconciled",
    "slices_done": "every slice written and reconciled",
    "reconciled": "full-window gates passed for one target; change preview recorded",
    "dry_run_passed": "dry run: every gate passed, nothing promoted (terminal)",
    "target_moved": "a target changed after reconciliation; the window is re-reconciled",
    "promoting": "rollback point recorded for one target; the promotion commit follows",
    "promoted": "one target promoted in one commit",
    "verified": "one target's promoted window equals the shadow (content hash)",
    "restored": "one target restored to its rollback point after a failure",
    "published": "evidence written and publish reopened",
    "done": "run finished: every target promoted, verified, published (terminal)",
    "gate_failed": "a gate or verification failed; every target unchanged or restored (terminal)",
    "failed": "runtime failure; targets unchanged, restored, or (failing after every target "
              "was verified) left promoted; re-run to resume",
    "abandoned": "lock taken over by another run after the stale timeout (terminal)",
    "rolling_back": "rollback of a finished run started",
    "rolled_back": "every target restored to its rollback point and verified (terminal)",
    "rollback_abandoned": "a stopped rollback closed by an operator, unfinished: targets as its "
                          "details list, publish still paused (terminal)",
}
TERMINAL_STATES = frozenset({"dry_run_passed", "done", "gate_failed", "abandoned", "rolled_back",
                             "rollback_abandoned"})
# Per-target events: they do not change the run's overall state on their own.
TARGET_EVENTS = frozenset({"reconciled", "target_moved", "promoting", "promoted", "verified",
                           "restored"})


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_SECOND = dt.timedelta(seconds=1)


def instant(value: dt.datetime) -> dt.datetime:
    """A timestamp as an aware UTC instant. A naive value is local time, as PySpark reads a
    timestamp back and writes a naive one (its ``fold`` says which of a repeated hour)."""
    return value.astimezone(dt.UTC)


def local_time(value: dt.datetime) -> dt.datetime:
    """An instant as the naive local time PySpark's ``collect()`` gives for it (``fold`` set in
    a repeated hour, so :func:`instant` maps it back exactly)."""
    moment = instant(value)
    seconds = (moment - _EPOCH) // _SECOND
    return dt.datetime.fromtimestamp(seconds).replace(microsecond=moment.microsecond)


def plus(value: dt.datetime, delta: dt.timedelta) -> dt.datetime:
    """``value + delta`` counted on the instant (naive arithmetic drops ``fold``)."""
    return local_time(instant(value) + delta)


class MonotonicClock:
    """Now, as naive local time (what PySpark reads back, so it compares with what was read),
    strictly increasing in UTC within this process: chained events (ledger and publish control
    alike) keep their order even when the wall clock repeats or steps back. Writers hand the
    tables the instant (:func:`instant`), so the stored UTC value is right in any driver zone."""

    def __init__(self, source: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)
                 ) -> None:
        self._lock = threading.Lock()
        self._last: dt.datetime | None = None  # aware UTC
        self.source = source

    def now(self) -> dt.datetime:
        """The next instant, at least 1 µs after every earlier one."""
        with self._lock:
            now = instant(self.source())
            if self._last is not None and now <= self._last:
                now = self._last + dt.timedelta(microseconds=1)
            self._last = now
            return local_time(now)

    def advance_past(self, instants: Iterable[dt.datetime]) -> None:
        """Later calls to :meth:`now` come after each of ``instants``."""
        with self._lock:
            self._last = max([*([self._last] if self._last else []),
                              *(instant(v) for v in instants)])


CLOCK = MonotonicClock()


# Audit chains (see sparkguard/audit.py): the JSON columns of each ledger table, hashed decoded,
# and the column that orders a chain's events as written. Runs, slices and evidence rows chain
# per run; lock and publish-control events chain per target.
AUDIT_JSON: dict[str, tuple[str, ...]] = {"runs": ("details",), "slices": ("gates",),
                                         "locks": (), "evidence": ("leaves",), "publish": ()}
# Columns added to a table after its rows were first hashed: a row where one is null was
# written without it (or with nothing to say there) and its hash covers the row without it.
LATER_COLUMNS = {"publish": ("location",)}
CHAIN_ORDER = {"runs": "at", "slices": "at", "locks": "generation", "evidence": "at",
               "publish": "at"}


def audit_body(table: str, row: dict[str, Any], *, raw_json: bool = False) -> dict[str, Any]:
    """A ledger row as its event hash covers it: hash fields aside, timestamps as the instant
    stored (naive values are local time, as PySpark writes and reads them, so a verifier in
    another time zone hashes the same instant), JSON columns decoded (``raw_json``: the row
    holds them as the JSON text written)."""
    out: dict[str, Any] = {}
    for k, v in row.items():
        if k in audit.HASH_FIELDS or (v is None and k in LATER_COLUMNS.get(table, ())):
            continue
        if isinstance(v, dt.datetime):
            v = instant(v)
        elif raw_json and k in AUDIT_JSON.get(table, ()) and isinstance(v, str):
            v = decode_row({k: v}, k)[k]
        out[k] = v
    return out


def chained_hash(table: str, row: dict[str, Any], prev: str | None, *,
                 raw_json: bool = False) -> str:
    """The ``event_hash`` of a ledger row whose chain's previous event hash is ``prev``."""
    return audit.event_hash(table, audit_body(table, row, raw_json=raw_json), prev)


def decode_row(row: dict[str, Any], *fields: str) -> dict[str, Any]:
    """Decode the JSON columns ``fields`` of one row in place (bad JSON: empty)."""
    for name in fields:
        raw = row.get(name)
        try:
            row[name] = json.loads(raw) if raw else ({} if name == "details" else [])
        except ValueError:
            row[name] = {} if name == "details" else []
    return row
