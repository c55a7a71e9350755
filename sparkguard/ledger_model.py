"""The ledger's pure side: run states, and what the ledger's rows say (no Spark).

Both engines feed these: :class:`sparkguard.ledger.Ledger` (Spark) and
:mod:`sparkguard.state_read` (delta-rs, no JVM) read the same tables into plain records
(dicts with the tables' columns, ``details``/``gates`` decoded from JSON, timestamps as naive
datetimes) and fold them with the functions here. The records as written (run states,
clock, audit hashes, JSON columns) are in :mod:`sparkguard.ledger_records`, re-exported here.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

# the records as written (run states, clock, audit hashes, JSON columns), re-exported
from sparkguard.ledger_records import (
    AUDIT_JSON,
    CHAIN_ORDER,
    CLOCK,
    RUN_STATES,
    TARGET_EVENTS,
    TERMINAL_STATES,
    MonotonicClock,
    audit_body,
    chained_hash,
    decode_row,
    instant,
    local_time,
    plus,
)

__all__ = [
    "AUDIT_JSON",
    "CHAIN_ORDER",
    "CLOCK",
    "ROLLBACK_LOCK_SUFFIX",
    "RUN_STATES",
    "TARGET_EVENTS",
    "TERMINAL_STATES",
    "LockInfo",
    "MonotonicClock",
    "PlanHistory",
    "RunProgress",
    "TargetProgress",
    "audit_body",
    "chained_hash",
    "decode_row",
    "holder_activity",
    "instant",
    "local_time",
    "lock_decision",
    "lock_holders",
    "lock_run_id",
    "lost_lock_text",
    "next_action",
    "pid_alive",
    "plus",
    "run_progress",
    "taken_over",
]


# -- pure derivations ---------------------------------------------------------------------------


@dataclass
class TargetProgress:
    """What the ledger says about one target of a run."""

    reconciled_version: int | None = None
    rollback_version: int | None = None
    promoted_version: int | None = None
    verified: bool = False
    restored: bool = False
    dataset: str | None = None
    checked_version: int | None = None  # the version the promotion attempt checked


@dataclass
class RunProgress:
    """A run as derived from its events (oldest first)."""

    run_id: str
    state: str
    fingerprint: str
    plan_name: str | None
    owner: str | None
    started_at: dt.datetime
    last_at: dt.datetime
    source_version: int | None
    dry_run: bool
    targets: dict[str, TargetProgress] = field(default_factory=dict)
    evidence_path: str | None = None
    error: str | None = None
    plan_path: str | None = None
    recipients: list[str] = field(default_factory=list)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES


def run_progress(events: Sequence[dict[str, Any]]) -> RunProgress:
    """Fold a run's events (oldest first, ``details`` decoded) into its progress."""
    if not events:
        raise ValueError("a run has at least one event")
    first = events[0]
    prog = RunProgress(
        run_id=first["run_id"], state=first["state"], fingerprint=first["plan_fingerprint"],
        plan_name=first.get("plan_name"), owner=first.get("owner"), started_at=first["at"],
        last_at=first["at"], source_version=None, dry_run=False)
    for e in events:
        d = e.get("details") or {}
        prog.last_at = e["at"]
        if e["state"] not in TARGET_EVENTS:
            prog.state = e["state"]
        if e.get("source_version") is not None:
            prog.source_version = int(e["source_version"])
        if e["state"] in ("started", "resumed"):
            prog.dry_run = bool(d.get("dry_run"))
            prog.plan_path = d.get("plan_path") or prog.plan_path
            prog.recipients = list(d.get("recipients") or prog.recipients)
        prog.evidence_path = d.get("evidence_path") or prog.evidence_path
        if e["state"] in ("failed", "gate_failed"):
            prog.error = d.get("error")
        label = d.get("label")
        if e["state"] in TARGET_EVENTS and label:
            tp = prog.targets.setdefault(label, TargetProgress())
            tp.dataset = e.get("target") or tp.dataset
            _fold_target(tp, e["state"], e)
    return prog


def _fold_target(tp: TargetProgress, state: str, e: dict[str, Any]) -> None:
    read, written = e.get("target_version_read"), e.get("target_version_written")
    if state in ("reconciled", "target_moved") and read is not None:
        tp.reconciled_version = int(read)
    elif state == "promoting":
        tp.rollback_version = int(read) if read is not None else tp.rollback_version
        tp.checked_version = tp.rollback_version
        tp.promoted_version, tp.verified, tp.restored = None, False, False
    elif state == "promoted":
        tp.rollback_version = int(read) if read is not None else tp.rollback_version
        tp.promoted_version = int(written) if written is not None else None
        tp.restored = False
    elif state == "verified":
        tp.verified = True
    elif state == "restored":
        tp.restored, tp.verified = True, False


def next_action(prog: RunProgress) -> str:
    """What an operator should do next with this run, in words."""
    promoted = [k for k, t in prog.targets.items() if t.promoted_version is not None
                and not t.restored]
    if prog.state == "done":
        return ("nothing; roll back with `sparkguard rollback --run-id "
                f"{prog.run_id}` if needed" if promoted else "nothing")
    if prog.state == "dry_run_passed":
        return "run the same plan without --dry-run to promote"
    if prog.state == "gate_failed":
        return ("read the evidence; fix the data or the plan (re-approve), then run again; "
                "publish stays paused until then (`sparkguard publish resume` to reopen "
                "without a backfill)")
    if prog.state == "rolled_back":
        return "nothing; the targets are back at their rollback points"
    if prog.state == "rolling_back":
        return (f"re-run `sparkguard rollback --run-id {prog.run_id}` to finish the rollback; "
                "if it cannot finish (its rollback point's files are gone), close it with "
                f"`sparkguard rollback --run-id {prog.run_id} --abandon REASON`")
    if prog.state == "rollback_abandoned":
        return ("the targets stay as the abandonment recorded them, and publish stays paused "
                "until `sparkguard publish resume TARGET` (once they are right) or a later "
                "backfill of the target finishes; or try `sparkguard rollback --run-id "
                f"{prog.run_id}` again")
    if prog.state == "abandoned":
        return ("check the targets' history; if this run promoted, roll it back with "
                f"`sparkguard rollback --run-id {prog.run_id} --force`")
    return "re-run the same command to resume (slices already reconciled are skipped)"


@dataclass
class PlanHistory:
    """Everything the ledger holds for one plan fingerprint, read once when a run starts."""

    fingerprint: str
    runs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    slices: list[dict[str, Any]] = field(default_factory=list)

    def progress(self) -> list[RunProgress]:
        """Runs of this fingerprint, newest first."""
        out = [run_progress(ev) for ev in self.runs.values()]
        return sorted(out, key=lambda p: p.started_at, reverse=True)

    def resumable(self) -> RunProgress | None:
        """The newest run of this plan, when it did not reach a terminal state."""
        runs = self.progress()
        if not runs or runs[0].terminal:
            return None
        return runs[0]

    def dry_runs(self) -> list[RunProgress]:
        """Passing dry runs of this exact plan, newest first."""
        return [p for p in self.progress() if p.state == "dry_run_passed"]

    def done_slices(self, target: str, source_version: int | None) -> dict[str, dict[str, Any]]:
        """Slices (key: partition list JSON) reconciled for this plan, target and source version;
        the newest event of each slice decides."""
        latest: dict[str, dict[str, Any]] = {}
        for s in sorted(self.slices, key=lambda r: r["at"]):
            if s["target"] != target:
                continue
            if source_version is not None and s.get("source_version") != source_version:
                continue
            latest[s["partitions"]] = s
        return {k: s for k, s in latest.items() if s["state"] == "reconciled"}


@dataclass(frozen=True)
class LockInfo:
    """The newest lock event of a target."""

    target: str
    generation: int
    action: str
    run_id: str
    owner: str | None
    at: dt.datetime
    host: str | None
    pid: int | None
    token: str
    event_hash: str | None = None  # None: written before audit hashing

    @property
    def held(self) -> bool:
        return self.action != "release"

    def describe(self) -> str:
        return (f"run {self.run_id} (owner {self.owner or '?'}, host {self.host or '?'} pid "
                f"{self.pid}, since {instant(self.at):%Y-%m-%d %H:%M:%S} UTC)")


def lock_holders(rows: Iterable[dict[str, Any]]) -> dict[str, LockInfo]:
    """Newest lock event per target (highest generation)."""
    out: dict[str, LockInfo] = {}
    for r in rows:
        info = LockInfo(target=r["target"], generation=int(r["generation"]), action=r["action"],
                        run_id=r["run_id"], owner=r.get("owner"), at=r["at"], host=r.get("host"),
                        pid=r.get("pid"), token=r["token"],
                        event_hash=r.get("event_hash"))
        cur = out.get(info.target)
        if cur is None or (info.generation, instant(info.at)) > (cur.generation,
                                                                 instant(cur.at)):
            out[info.target] = info
    return out


def pid_alive(pid: int | None) -> bool:
    """Whether a process with this id runs on this host (zombies count as dead)."""
    if not pid or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return True


ROLLBACK_LOCK_SUFFIX = "/rollback"  # a rollback of run R holds its locks as "R/rollback"


def lock_run_id(holder_id: str) -> str:
    """The run whose ledger events tell what a lock's holder did: the run itself, or for a
    rollback's lock the run it rolls back (a rollback records its events under that run)."""
    return holder_id.removesuffix(ROLLBACK_LOCK_SUFFIX)


def lost_lock_text(holder: LockInfo | None) -> str:
    """Who has a lock this process lost: ``taken over by run ...`` or ``released``."""
    return f"taken over by {holder.describe()}" if holder is not None else "released"


def taken_over(decisions: dict[str, tuple[str, LockInfo | None]]) -> dict[str, str]:
    """The locks taken over, from an acquisition's decisions: target -> the id that held it."""
    return {t: h.run_id for t, (what, h) in decisions.items()
            if what == "takeover" and h is not None}


def holder_activity(holder: LockInfo, prog: RunProgress | None
                    ) -> tuple[str | None, dt.datetime | None]:
    """The state and newest ledger event that :func:`lock_decision` judges ``holder`` by, from
    the progress of :func:`lock_run_id`'s run. A rollback's lock counts as finished only when
    that run's newest event, after the lock was taken, ends a rollback; before that the run's
    own end (``done``) says nothing of the rollback that holds the lock."""
    if prog is None:
        return None, None
    if not holder.run_id.endswith(ROLLBACK_LOCK_SUFFIX):
        return prog.state, prog.last_at
    ended = (prog.state in ("rolled_back", "rollback_abandoned")
             and instant(prog.last_at) >= instant(holder.at))
    return (prog.state if ended else "rolling_back"), prog.last_at


def lock_decision(holder: LockInfo | None, *, run_id: str, token: str, host: str, now: dt.datetime,
                  takeover: bool, stale_after_s: float, last_activity: dt.datetime | None = None,
                  alive: bool | None = None, holder_state: str | None = None) -> tuple[str, str]:
    """Decide what to do with a target's lock: ``("free"|"mine"|"finished"|"resume"|"takeover"|
    "refuse", why)``.

    ``finished``: the holder's run reached a terminal state in the ledger (it died before
    releasing); its lock is taken without a flag. A holder on this host whose process is gone
    and whose run recorded no event (it died before recording its start) is taken over
    without a flag too. ``resume``: the holder is this same run on
    this host and its process is gone (a crash); the re-run takes the lock over without a
    flag. Any other holder is refused unless ``takeover`` is given and the holder has been
    idle longer than ``stale_after_s`` (idle = since the later of its lock and its newest
    ledger event).
    """
    if holder is None or not holder.held:
        return "free", ""
    if holder.token == token:
        return "mine", ""
    if holder_state in TERMINAL_STATES and holder.run_id != run_id:
        return "finished", f"its run {holder.run_id} already ended ({holder_state})"
    same_host = holder.host == host
    if alive is None:
        alive = pid_alive(holder.pid) if same_host else True
    if same_host and not alive and holder.run_id == run_id:
        return "resume", f"process {holder.pid} that held it is gone"
    if same_host and not alive and holder_state is None:
        # it died between taking its locks and recording its start: nothing of it to finish
        return "takeover", (f"its process {holder.pid} on this host is gone and its run "
                            f"{holder.run_id} recorded nothing")
    idle_since = max([instant(holder.at), *([instant(last_activity)] if last_activity else [])])
    idle = (instant(now) - idle_since).total_seconds()  # instants: drivers in other zones
    where = (f"its process {holder.pid} is gone" if same_host and not alive else
             "it is alive" if same_host else "on another host")
    if takeover and idle >= stale_after_s:
        return "takeover", f"idle {idle:.0f}s >= stale timeout {stale_after_s:.0f}s; {where}"
    hint = (f"; it has been idle {idle:.0f}s, the stale timeout is {stale_after_s:.0f}s"
            if takeover else "; after the stale timeout re-run with --takeover-stale-lock")
    return "refuse", f"{where}{hint}"
