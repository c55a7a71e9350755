"""Per-target locks: the ``locks`` table of the ledger.

Every event of one target carries the next generation number and is committed with Delta's
``txnAppId`` (one per target) and ``txnVersion`` (= generation): of two runs racing for the same
generation, Delta lets exactly one commit; the other's write is skipped or fails with a
conflict, and reading the table's history back tells it who won. The decision per target
(``free``, ``mine``, ``finished``, ``resume``, ``takeover`` or refuse) is the pure
:func:`sparkguard.ledger_model.lock_decision`.
"""

from __future__ import annotations

import hashlib
import json
import socket
import uuid
from collections.abc import Sequence
from typing import Any

from pyspark.sql import functions as F

from sparkguard import delta_ops
from sparkguard.delta_ops import is_conflict
from sparkguard.errors import ConcurrentRunError
from sparkguard.ledger_model import (
    LockInfo,
    RunProgress,
    holder_activity,
    lock_decision,
    lock_holders,
    lock_run_id,
    run_progress,
)
from sparkguard.ledger_schema import lock_row, now
from sparkguard.ledger_tables import LedgerTables
from sparkguard.sql import TableRef

__all__ = ["TargetLocks", "lock_app_id"]


def lock_app_id(target: str) -> str:
    """The Delta ``txnAppId`` of one target's lock events."""
    return "sparkguard-lock-" + hashlib.sha256(target.encode()).hexdigest()[:24]


class TargetLocks:
    """The lock events of one process (its ``token`` and ``host``) in ``tables``."""

    def __init__(self, tables: LedgerTables) -> None:
        self.tables = tables
        self.token = uuid.uuid4().hex
        self.host = socket.gethostname()
        self._held: dict[str, int] = {}  # target -> generation of our acquire event

    def lock_holders(self, targets: Sequence[str]) -> dict[str, LockInfo]:
        """Newest lock event of each target (one read; one row per target reaches the driver)."""
        t = self.tables
        df = t._read("locks")
        if df is None:
            return {}
        newest = t._latest(df.filter(F.col("target").isin(list(targets))), ["target"],
                           "generation", "at")
        return lock_holders(t._collect(newest, order="generation"))

    def lock_holder(self, target: str) -> LockInfo | None:
        """The live holder of ``target``'s lock, if any."""
        info = self.lock_holders([target]).get(target)
        return info if info is not None and info.held else None

    def _runs_of(self, run_ids: Sequence[str]) -> dict[str, RunProgress]:
        """Progress of the given runs (one read; only when a lock is held by someone else)."""
        t = self.tables
        df = t._read("runs")
        if df is None or not run_ids:
            return {}
        by_run: dict[str, list[dict[str, Any]]] = {}
        for e in t._collect(df.filter(F.col("run_id").isin(list(run_ids))), "details"):
            by_run.setdefault(e["run_id"], []).append(e)
        return {r: run_progress(ev) for r, ev in by_run.items()}

    def _lock_event(self, target: str, generation: int, action: str, run_id: str,
                    owner: str | None, prev: str | None) -> None:
        row = self.tables._chained(
            "locks", target, lock_row(target, generation, action, run_id, owner, self.host,
                                      self.token), prev, known=True)
        try:
            self.tables._append("locks", [row], txn=(lock_app_id(target), generation),
                                metadata=self._lock_tag(target, generation))
        except Exception as exc:
            if not is_conflict(exc):
                raise  # a conflict means another run wrote this generation first

    def _lock_tag(self, target: str, generation: int) -> str:
        return json.dumps({"sparkguard": {"lock": self.token, "generation": generation,
                                          "app": lock_app_id(target)}}, sort_keys=True)

    def _committed(self, written: dict[str, int]) -> set[str]:
        """Targets whose lock event by this instance is in the lock table's recent history
        (one history look-up; a write Delta skipped or refused has no commit)."""
        tags = {self._lock_tag(t, g): t for t, g in written.items()}
        history = delta_ops.history(self.tables.spark, TableRef(path=self.tables._path("locks")),
                                    max(50, 4 * len(tags))).select("userMetadata").collect()
        return {tags[h["userMetadata"]] for h in history if h["userMetadata"] in tags}

    def acquire(self, targets: Sequence[str], run_id: str, owner: str | None, *,
                takeover: bool = False, stale_after_s: float = 6 * 3600
                ) -> dict[str, tuple[str, LockInfo | None]]:
        """Lock every target for ``run_id`` or raise ConcurrentRunError (nothing kept locked).

        Returns, per target, the decision taken (``free``, ``mine``, ``finished``, ``resume``,
        ``takeover``) and the previous holder.
        """
        self.tables.ensure()
        targets = sorted(set(targets))
        holders = self.lock_holders(targets)
        at = now()
        others = self._runs_of(sorted({lock_run_id(h.run_id) for h in holders.values()
                                       if h.held and h.token != self.token}))
        decisions: dict[str, tuple[str, LockInfo | None]] = {}
        for t in targets:
            holder = holders.get(t)
            state, last = (holder_activity(holder, others.get(lock_run_id(holder.run_id)))
                           if holder is not None else (None, None))
            what, why = lock_decision(holder, run_id=run_id, token=self.token, host=self.host,
                                      now=at, takeover=takeover, stale_after_s=stale_after_s,
                                      last_activity=last, holder_state=state)
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
                                 self.tables._heads.get(("locks", t)))
