"""Roll a promoted run back: RESTORE each target to its recorded version, with safety checks.

The rollback first takes the same per-target lock a backfill run takes, so no run can promote
between its checks and its RESTORE (a run holding a target refuses the rollback, exit 2).
Before anything is restored, every target is checked: the run's promotion must still be in
place, no other writer may have committed after it (``force`` overrides, and the commits that
RESTORE would undo are listed), and the files the recorded version needs must still exist
(VACUUM may have removed them): its data files, listed, and its deletion vectors, which no
listing names, by reading the recorded version's window (the whole table when other writers'
commits are undone too, or the storage refused to list a folder). Right before each RESTORE
the target's history is read again: a commit that landed since the check (a writer outside
sparkguard) refuses that RESTORE. Then each target is restored in one commit tagged with the
run id, and that commit (found by its
userMetadata, so later commits by other writers do not count) is verified by time travel: same
data files as the recorded version, same window content. The rollback is recorded in the
ledger and in the run's evidence. From before the first RESTORE until ``rolled_back`` is
recorded, the rollback holds publish paused on its targets (hold ``<run>/rollback``); a rollback
that stops keeps it. Re-running after a crash finishes the job: a target already restored by
this rollback is found by its commit, and the hold is released at the end.
"""

from __future__ import annotations

import datetime as dt
import getpass
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pyspark.sql import SparkSession

from sparkguard import delta_ops
from sparkguard.audit import AUDIT_KEY_ENV
from sparkguard.audit_trail import audit_key
from sparkguard.doc_io import atomic_write, dump_yaml
from sparkguard.errors import ConcurrentRunError, GateFailedError, RollbackRefusedError
from sparkguard.evidence import render_markdown
from sparkguard.evidence_md import left_unfinished
from sparkguard.faults import failpoint
from sparkguard.ledger import ROLLBACK_LOCK_SUFFIX, Ledger, RunProgress, run_progress
from sparkguard.ledger_model import lost_lock_text, taken_over
from sparkguard.notify import Notifier, notifiers_from_env, send_all
from sparkguard.publish import PublishControl
from sparkguard.reconcile.engine import table_fingerprint
from sparkguard.sql import PartitionType, TableRef, restore_statement, window_predicate

__all__ = ["RollbackPoint", "Takeover", "abandon_rollback", "check_rollback", "rollback_run"]


@dataclass
class RollbackPoint:
    """One target of a run: where it was before the promotion and what happened since."""

    label: str
    dataset: str
    rollback_version: int
    promoted_version: int | None  # the run's promotion still in place, if any
    already_rolled_back: int | None = None  # version of this rollback's own RESTORE commit
    later_commits: tuple[dict[str, Any], ...] = ()  # by other writers after the promotion
    missing_files: tuple[str, ...] = ()
    expected: dict[str, int] | None = None  # the recorded version's window fingerprint, read
    read_all: bool = False  # every file is read, not only the window's (see _unreadable)
    new_version: int | None = None
    verified: bool = False
    recorded_rollback_version: int | None = None  # the ledger's, when the history moved it
    undone_by_restore: tuple[int, ...] = ()  # others' commits an earlier attempt's RESTORE undid

    @property
    def ref(self) -> TableRef:
        return TableRef.parse(self.dataset)

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "dataset": self.dataset,
                "rollback_version": self.rollback_version,
                "promoted_version": self.promoted_version, "new_version": self.new_version,
                "verified": self.verified,
                "undone_commits_of_others": sorted({int(c["version"]) for c in self.later_commits}
                                                   | set(self.undone_by_restore)),
                **({"recorded_rollback_version": self.recorded_rollback_version}
                   if self.recorded_rollback_version is not None else {})}


def _window(events: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    for e in events:
        w = (e.get("details") or {}).get("window")
        if w:
            return dict(w)
    return None


def _window_predicate(window: dict[str, Any] | None) -> str | None:
    if not window:
        return None
    if window.get("predicate"):  # a window_column window: its exact predicate, as recorded
        return str(window["predicate"])
    return window_predicate(window["column"], PartitionType(window["type"]), window["partitions"])


def check_rollback(spark: SparkSession, prog: RunProgress, window: str | None = None,
                   force: bool = False) -> list[RollbackPoint]:
    """Every target of the run with its promotion, later commits and missing files (no write);
    ``window`` is the run's window predicate, ``force`` whether other writers' commits would
    be undone."""
    points = []
    for label, tp in sorted(prog.targets.items()):
        if tp.rollback_version is None or tp.dataset is None:
            continue
        ref = TableRef.parse(tp.dataset)
        commits = delta_ops.commits_since(spark, ref, tp.rollback_version)
        own = _own_commits(commits, prog.run_id, label)
        state = delta_ops.promotion_state(commits, prog.run_id, label)
        pt = RollbackPoint(label, tp.dataset, tp.rollback_version, state.promoted_version)
        promotes = [int(c["version"]) for c, m in own if m.get("action") == "promote"]
        if promotes and max(promotes) - 1 > tp.rollback_version:
            # the ledger has the promotion as started, not as landed (the run died or failed
            # right after its commit): commits of other writers before that commit stay
            pt.rollback_version, pt.recorded_rollback_version = max(promotes) - 1, \
                tp.rollback_version
        newest = max(own, key=lambda cm: int(cm[0]["version"]), default=None)
        if newest is not None and newest[1].get("action") == "rollback":
            pt.already_rolled_back = int(newest[0]["version"])
        if pt.promoted_version is not None:
            pt.later_commits = tuple(delta_ops.foreign_commits(
                delta_ops.commits_since(spark, ref, pt.promoted_version), prog.run_id,
                data_only=True))
            unlisted: list[str] = []
            pt.missing_files = tuple(delta_ops.missing_files_for_version(
                spark, ref, pt.rollback_version, unlisted=unlisted))
            pt.read_all = bool(pt.later_commits or unlisted)
            if not pt.missing_files and (force or not pt.later_commits):
                pt.missing_files = _unreadable(spark, pt, window)
        points.append(pt)
    return points


def _unreadable(spark: SparkSession, pt: RollbackPoint, window: str | None) -> tuple[str, ...]:
    """The file a read of the recorded version misses, though every data file is there: a
    deletion vector a later commit replaced on a file it kept, then VACUUM removed (RESTORE
    would commit, and leave a table no query can read). Reads the window (its fingerprint is
    kept for the verification), and every file of the table when other writers' commits
    are undone too (they may have changed deletion vectors outside the window) or when the
    storage refused to list a folder (the listing checked nothing there)."""
    then = delta_ops.read_version(spark, pt.ref, pt.rollback_version)
    try:
        pt.expected = table_fingerprint(then.filter(window) if window else then)
        if window and pt.read_all:
            delta_ops.read_all_files(then)
    except Exception as exc:
        gone = delta_ops.gone_file(exc)
        if gone is None:
            raise
        pt.expected = None
        return (gone,)
    return ()


def _own_commits(commits: Sequence[dict[str, Any]], run_id: str, label: str
                 ) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The commits ``run_id`` made to target ``label``, each with its decoded metadata."""
    own = [(c, delta_ops.commit_metadata(c.get("userMetadata")) or {}) for c in commits]
    return [(c, m) for c, m in own if m.get("run_id") == run_id
            and m.get("target", label) == label]


def _refusals(points: Sequence[RollbackPoint], force: bool) -> list[str]:
    out = []
    for pt in points:
        if pt.promoted_version is None:
            continue
        if pt.later_commits and not force:
            listed = delta_ops.listed_commits(pt.later_commits, times=True)
            out.append(f"{pt.dataset}: {len(pt.later_commits)} commit(s) by other writers after "
                       f"the promotion (version {pt.promoted_version}) would be undone by RESTORE: "
                       f"{listed}. Re-run with --force to restore anyway")
        if pt.missing_files:
            out.append(f"{pt.dataset}: version {pt.rollback_version} can no longer be restored: "
                       f"{len(pt.missing_files)} file(s) it needs (data files or deletion "
                       f"vectors) are gone (VACUUM?), e.g. "
                       f"{list(pt.missing_files[:3])}; nothing was restored")
    return out


def rollback_run(spark: SparkSession, home: str, run_id: str, *, force: bool = False,
                 out: Callable[[str], None] = print,
                 notifiers: Sequence[Notifier] | None = None,
                 takeover: Takeover | None = None) -> list[RollbackPoint]:
    """Restore every target promoted by ``run_id`` to the version recorded before promotion,
    holding the targets' run locks throughout.

    Raises ConcurrentRunError (exit 2, nothing restored) when a run holds a target's lock
    (with ``takeover``, one idle longer than its timeout is taken over, as ``run`` does).
    Raises RollbackRefusedError (exit 2, nothing restored) when the run is unknown or never
    promoted, when other writers committed after the promotion (unless ``force``), or when the
    recorded version's files are gone. Raises GateFailedError (exit 1) when a restored target
    does not equal its recorded version.
    """
    with _holding_targets(spark, home, run_id, takeover=takeover, out=out) as held:
        return _rollback_locked(spark, held, force=force, out=out, notifiers=notifiers)


@dataclass(frozen=True)
class Takeover:
    """Take over a target's lock whose holder has been idle ``stale_after_s`` seconds or more
    (``--takeover-stale-lock``): a rollback or a run that died on another host, say."""

    stale_after_s: float


@dataclass
class _Held:
    """What a rollback holds: the run's ledger, events and progress, its targets' lock keys
    (dataset -> the table's location), and the locks it took over (key -> the holder's id)."""

    ledger: Ledger
    events: list[dict[str, Any]]
    prog: RunProgress
    located: dict[str, str]
    took_over: dict[str, str]

    def going_ahead(self) -> None:
        """Past the refusals: a run whose lock was taken over is recorded ``abandoned``
        (never the run rolled back). A rollback refused before this records nothing of it:
        that run, its lock released again, can still resume."""
        self.ledger.abandon_taken_over(self.took_over, rollback_lock_id(self.prog.run_id),
                                       spare=[self.prog.run_id])

    def check_fence(self, dataset: str) -> None:
        """Restore only while this rollback's lock event is still the target's newest: a
        rollback outliving the stale-lock timeout can be taken over, and the process that took
        the lock is then the only one allowed to change the target."""
        lost = self.ledger.lost_locks([self.located[dataset]])
        if lost:
            (holder,) = lost.values()
            raise ConcurrentRunError(
                f"{dataset}: this rollback no longer holds the target's lock "
                f"({lost_lock_text(holder)}); it stops before restoring it, and publish stays "
                "paused")


@contextmanager
def _holding_targets(spark: SparkSession, home: str, run_id: str,
                     check: Callable[[RunProgress], None] | None = None, *,
                     takeover: Takeover | None, out: Callable[[str], None]) -> Iterator[_Held]:
    """The run's ledger, events and progress, with its targets' locks held under the
    rollback's id. An unknown run, or one ``check`` refuses, is refused before any lock is
    taken. The run's events are read again once the locks are held (a process that held one
    may have recorded more, a promotion even): a run that moved on to another target is
    refused. A lock taken over (``takeover``) is said."""
    ledger = Ledger(spark, home)
    events = ledger.run_events(run_id)
    if not events:
        raise RollbackRefusedError(f"run {run_id} is not in the ledger at {ledger.home}; "
                                   "check --run-id and --home")
    prog = run_progress(events)
    if check is not None:
        check(prog)
    datasets = sorted({tp.dataset for tp in prog.targets.values()
                       if tp.rollback_version is not None and tp.dataset is not None})
    located = {d: delta_ops.lock_key(spark, TableRef.parse(d)) for d in datasets}
    keys, lock_id = sorted(set(located.values())), rollback_lock_id(run_id)
    decisions = ledger.acquire(keys, lock_id, _actor(), takeover=takeover is not None,
                               stale_after_s=takeover.stale_after_s if takeover else 0)
    try:
        took_over = taken_over(decisions)
        for key, holder in sorted(took_over.items()):
            out(f"took over the lock of {key} from {holder} (idle past the stale timeout)")
        fresh = ledger.run_events(run_id)
        if len(fresh) != len(events):
            prog = run_progress(fresh)
            if check is not None:
                check(prog)
            if not {tp.dataset for tp in prog.targets.values() if tp.rollback_version
                    is not None and tp.dataset is not None} <= set(datasets):
                raise ConcurrentRunError(
                    f"run {run_id} recorded a promotion of another target while this rollback "
                    "took its locks (another process is running it); nothing was done: "
                    "re-run the rollback")
        yield _Held(ledger, fresh, prog, located, took_over)
    finally:
        ledger.release(keys, lock_id)


def abandon_rollback(spark: SparkSession, home: str, run_id: str, reason: str, *,
                     out: Callable[[str], None] = print,
                     notifiers: Sequence[Notifier] | None = None,
                     takeover: Takeover | None = None) -> list[dict[str, Any]]:
    """Close a rollback that stopped and cannot finish (its rollback point's files are gone,
    say): ``rolling_back`` becomes ``rollback_abandoned`` (terminal), with ``reason`` and, per
    target, whether this rollback's RESTORE landed and the table's version now. Nothing is
    restored; the rollback's publish hold stays (publish reopens with ``sparkguard publish
    resume``); a later rollback of the run may still try again. Again on a run abandoned by a
    process that died before its evidence: writes the evidence. Returns the targets recorded.

    Raises RollbackRefusedError (exit 2, nothing recorded) when the run is unknown, not
    ``rolling_back``, or abandoned already with its evidence written, and ConcurrentRunError
    (exit 2) when a process holds a target's lock (``takeover`` as for :func:`rollback_run`).
    """
    def stopped(prog: RunProgress) -> None:
        if prog.state not in ("rolling_back", "rollback_abandoned"):
            raise RollbackRefusedError(
                f"run {run_id} is {prog.state}: only a rollback that stopped before it "
                "finished (state rolling_back) can be abandoned; nothing was recorded")

    actor = _actor()
    with _holding_targets(spark, home, run_id, stopped, takeover=takeover, out=out) as held:
        ledger, located, events, prog = held.ledger, held.located, held.events, held.prog
        if prog.state == "rollback_abandoned":
            return _abandoned_before(prog, events, out, ledger)
        if prog.state != "rolling_back":  # another process finished it meanwhile
            raise RollbackRefusedError(f"run {run_id} moved on to {prog.state} while the "
                                       "abandonment waited; nothing was recorded")
        targets = [_where_left(spark, run_id, label, tp.dataset, tp.rollback_version)
                   for label, tp in sorted(prog.targets.items())
                   if tp.rollback_version is not None and tp.dataset is not None]
        held.going_ahead()
        ledger.record_run(run_id, "rollback_abandoned", fingerprint=prog.fingerprint,
                          actor=actor, reason=reason, targets=targets,
                          took_over_locks_of=held.took_over or None)
        hold = rollback_lock_id(run_id)
        paused = sorted(t for t, st in PublishControl(spark, ledger.home).statuses(
            sorted(located)).items() if any(h["hold"] == hold for h in st.holds))
        for t in targets:
            out(f"{t['dataset']}: {left_unfinished(t)}")
        out(f"rollback of run {run_id} abandoned ({reason})"
            + (f"; publish stays paused on {', '.join(paused)} (hold {hold}) until `sparkguard "
               "publish resume TARGET`, or until a later backfill of the target finishes"
               if paused else ""))
        send_all(list(notifiers) if notifiers is not None else notifiers_from_env(),
                 "rollback_abandoned", prog.recipients,
                 {"run_id": run_id, "plan": prog.plan_name, "reason": reason,
                  "targets": targets, "publish_paused": paused})
        _record_in_evidence(prog, targets, actor, False, out, ledger, abandoned=reason)
    return targets


def _abandoned_before(prog: RunProgress, events: Sequence[dict[str, Any]],
                      out: Callable[[str], None], ledger: Ledger) -> list[dict[str, Any]]:
    """An abandonment already recorded: add it to the evidence if the process died before
    doing so; else refuse (exit 2)."""
    d = events[-1].get("details") or {}
    targets, reason = list(d.get("targets") or []), str(d.get("reason") or "")
    recorded = _evidence_rollbacks(prog)
    if recorded is None or (recorded and recorded[-1].get("abandoned") is not None):
        raise RollbackRefusedError(f"run {prog.run_id}'s rollback was already abandoned "
                                   f"({reason}); nothing was recorded")
    _record_in_evidence(prog, targets, str(d.get("actor") or "?"), False, out, ledger,
                        abandoned=reason)
    return targets


def _where_left(spark: SparkSession, run_id: str, label: str, dataset: str,
                rollback_version: int) -> dict[str, Any]:
    """Where an abandoned rollback left one target: its own RESTORE commit, if it landed, and
    the table's version now."""
    ref = TableRef.parse(dataset)
    commits = delta_ops.commits_since(spark, ref, rollback_version)
    newest = max(_own_commits(commits, run_id, label),
                 key=lambda cm: int(cm[0]["version"]), default=None)
    restored = (int(newest[0]["version"]) if newest is not None
                and newest[1].get("action") == "rollback" else None)
    now = max([int(c["version"]) for c in commits], default=rollback_version)
    return {"label": label, "dataset": dataset, "rollback_version": rollback_version,
            "restored_version": restored,
            **({"restored_to": delta_ops.restored_to(spark, ref, restored, now)}
               if restored is not None else {}), "current_version": now}


def rollback_lock_id(run_id: str) -> str:
    """The id under which the rollback of ``run_id`` holds its targets' locks."""
    return run_id + ROLLBACK_LOCK_SUFFIX


def _rollback_locked(spark: SparkSession, held: _Held, *, force: bool,
                     out: Callable[[str], None],
                     notifiers: Sequence[Notifier] | None) -> list[RollbackPoint]:
    """The rollback proper, with every target's lock held."""
    ledger, events, prog, located = held.ledger, held.events, held.prog, held.located
    took_over = held.took_over or None
    run_id = prog.run_id
    window = _window(events)
    points = check_rollback(spark, prog, _window_predicate(window), force)
    started = [e.get("details") or {} for e in events if e["state"] == "rolling_back"]
    for pt in points:  # an earlier attempt's RESTORE undid these: the record keeps them
        undone = {int(v) for d in started
                  for v in (d.get("undone_by_restore") or {}).get(pt.label, [])}
        if pt.already_rolled_back is not None:  # and the commits it was forced over
            undone |= {int(v) for d in started
                       for v in (d.get("undone_commits") or {}).get(pt.label, [])}
        pt.undone_by_restore = tuple(sorted(undone))
    # recorded forced when any attempt was (a re-run may finish a forced one without --force;
    # new commits of others still need --force of it, below)
    force_recorded = force or any(bool(d.get("forced")) for d in started)
    todo = [p for p in points if p.promoted_version is not None]
    done = [p for p in points if p.already_rolled_back is not None]
    publish, hold = PublishControl(spark, ledger.home), rollback_lock_id(run_id)
    actor = _actor()
    if prog.state == "rolled_back" and not todo:
        out(f"run {run_id} was already rolled back; nothing to do")
        _release_left_hold(publish, [p.dataset for p in points], (hold, run_id), actor, out)
        _release_run_hold(publish, events, [p.dataset for p in points], run_id, actor)
        _record_left_evidence(prog, events, out, ledger)
        return points
    if not todo and not done:
        raise RollbackRefusedError(
            f"run {run_id} (state {prog.state}) has no promotion in place to roll back"
            + ("; its targets were restored when it failed" if points else ""))
    problems = _refusals(todo, force)
    if problems:
        raise RollbackRefusedError("rollback refused, nothing restored:\n  " + "\n  ".join(problems))
    held.going_ahead()
    undone_commits = {p.label: [str(c["version"]) for c in p.later_commits]
                      for p in todo if p.later_commits}
    first = prog.state != "rolling_back"  # a re-run's hold is set already
    if first:
        paused = [p.dataset for p in todo]
        publish.pause(paused, run_id=hold, actor=actor, reason=f"rollback of run {run_id}",
                      locations=located)
        out(f"publish paused for {', '.join(paused)} (hold {hold}) until the rollback finishes")
    if first or undone_commits:  # a re-run forced over commits says so before its RESTORE
        # undoes them, so a later re-run still names them
        taken: dict[str, Any] = {"took_over_locks_of": took_over} if first else {}
        ledger.record_run(run_id, "rolling_back", fingerprint=prog.fingerprint, actor=actor,
                          forced=force, targets=[p.label for p in todo],
                          undone_commits=undone_commits,
                          **taken)
    failpoint("mid_rollback")
    for pt in todo:
        held.check_fence(pt.dataset)
        seen = _recheck(spark, prog.run_id, pt, [p for p in todo if p.new_version is not None])
        _restore_one(spark, ledger, prog, pt, _window_predicate(window), out, seen)
    for pt in done:
        pt.new_version = pt.already_rolled_back
        _verify(spark, pt, _window_predicate(window), out)
    results = [p.to_dict() for p in [*todo, *done]]
    ledger.record_run(run_id, "rolled_back", fingerprint=prog.fingerprint, actor=actor,
                      forced=force_recorded, rolled_back=results, took_over_locks_of=took_over)
    # with every target's lock held: the rolled-back run's own hold goes too (it died holding
    # it, say; nothing else would ever clear it), as do those of other runs that ended
    publish.finish([p.dataset for p in [*todo, *done]], hold, actor=actor,
                   reason=f"rollback of run {run_id} finished", locations=located)
    _release_run_hold(publish, events, [p.dataset for p in [*todo, *done]], run_id, actor)
    out(f"publish hold {hold} released (and any hold left by run {run_id})")
    send_all(list(notifiers) if notifiers is not None else notifiers_from_env(), "rolled_back",
             prog.recipients, {"run_id": run_id, "plan": prog.plan_name, "targets": {
                 p.dataset: p.rollback_version for p in [*todo, *done]}})
    _record_in_evidence(prog, results, actor, force_recorded, out, ledger)
    return [*todo, *done]


def _record_left_evidence(prog: RunProgress, events: Sequence[dict[str, Any]],
                          out: Callable[[str], None], ledger: Ledger) -> None:
    """Add the recorded rollback to the evidence when it died before doing so."""
    recorded = _evidence_rollbacks(prog)
    if recorded is None or (recorded and recorded[-1].get("abandoned") is None):
        return
    last = [e for e in events if e["state"] == "rolled_back"][-1]
    d = last.get("details") or {}
    _record_in_evidence(prog, list(d.get("rolled_back") or []), str(d.get("actor") or "?"),
                        bool(d.get("forced")), out, ledger)


def _evidence_rollbacks(prog: RunProgress) -> list[dict[str, Any]] | None:
    """The rollback entries of the run's evidence, oldest first; None without an evidence
    file (or with an empty one)."""
    if not prog.evidence_path or not Path(prog.evidence_path).is_file():
        return None
    data = yaml.safe_load(Path(prog.evidence_path).read_text(encoding="utf-8"))
    if not data:
        return None
    return list((data.get("sparkguard") or {}).get("rollbacks") or [])


def _release_run_hold(publish: PublishControl, events: Sequence[dict[str, Any]],
                      handled: Sequence[str], run_id: str, actor: str) -> None:
    """The rolled-back run's own hold on the targets it paused and never promoted (it died
    before them): the run is over, so nothing else would clear it. Only that run's hold."""
    paused = {str(t) for e in events if e["state"] == "paused"
              for t in (e.get("details") or {}).get("publish_paused") or []}
    rest = sorted(paused - set(handled))
    held = sorted({h["target"] for st in (publish.statuses(rest) if rest else {}).values()
                   for h in st.holds if h["hold"] == run_id})  # under the name it was set
    if held:
        publish.release(held, run_id, actor=actor,
                        reason=f"run {run_id} rolled back; it never promoted these")


def _release_left_hold(publish: PublishControl, datasets: Sequence[str],
                       holds: tuple[str, str], actor: str, out: Callable[[str], None]) -> None:
    """Release the rollback's hold, and the rolled-back run's, where still set (the rollback
    died before releasing them); its locks are held."""
    held = [t for t, st in publish.statuses(datasets).items()
            if any(h["hold"] in holds for h in st.holds)]
    if held:
        publish.finish(held, holds[0], actor=actor, reason="rollback finished earlier")
        out(f"publish hold {holds[0]} released (and any hold left by run {holds[1]})")


def _recheck(spark: SparkSession, run_id: str, pt: RollbackPoint,
             restored: Sequence[RollbackPoint]) -> int:
    """Read the target's history again right before its RESTORE: a commit by another writer
    since the check (one that ``force`` did not accept) refuses it. Returns the newest version
    it saw."""
    assert pt.promoted_version is not None
    accepted = {int(c["version"]) for c in pt.later_commits}
    commits = delta_ops.commits_since(spark, pt.ref, pt.rollback_version)
    state = delta_ops.promotion_state(commits, run_id, pt.label)
    fresh = [c for c in delta_ops.foreign_commits(
        [c for c in commits if int(c["version"]) > pt.promoted_version], run_id, data_only=True)
        if int(c["version"]) not in accepted]
    if state.promoted_version == pt.promoted_version and not fresh:
        return max([int(c["version"]) for c in commits], default=pt.promoted_version)
    listed = delta_ops.listed_commits(fresh, times=True)
    done = (f" (already restored: {', '.join(p.dataset for p in restored)})" if restored
            else "; nothing was restored")
    raise RollbackRefusedError(
        f"{pt.dataset}: the table changed after the rollback checked it: "
        + (f"{len(fresh)} new commit(s) by other writers: {listed}" if fresh
           else f"the promotion (version {pt.promoted_version}) is no longer in place")
        + f"; RESTORE refused{done}. Re-run the rollback to check again")


def _restore_one(spark: SparkSession, ledger: Ledger, prog: RunProgress, pt: RollbackPoint,
                 window: str | None, out: Callable[[str], None], seen: int) -> None:
    """RESTORE, then verify it; commits by others that landed between the last check (the
    newest version ``seen``) and the RESTORE were undone by it: that fails loudly, naming them."""
    meta = delta_ops.user_metadata(prog.run_id, prog.fingerprint, "rollback", target=pt.label)
    delta_ops.restore(spark, pt.ref, pt.rollback_version, meta)
    failpoint("after_rollback_restore")
    assert pt.promoted_version is not None
    pt.new_version = delta_ops.find_commit(spark, pt.ref, prog.run_id, "rollback",
                                           pt.promoted_version)
    _verify(spark, pt, window, out)
    undone = delta_ops.undone_by(spark, pt.ref, prog.run_id, seen, pt.new_version)
    if undone:
        assert pt.new_version is not None
        listed = delta_ops.listed_commits(undone, times=True)
        # recorded now: a re-run finds the target rolled back and must still say what was lost
        ledger.record_run(prog.run_id, "rolling_back", fingerprint=prog.fingerprint,
                          actor=_actor(), undone_by_restore={
                              pt.label: [int(c["version"]) for c in undone]})
        raise GateFailedError(
            f"{pt.dataset}: {len(undone)} commit(s) by other writers landed between the "
            f"rollback's last check (version {seen}) and its RESTORE ({listed}); the RESTORE "
            f"to version {pt.rollback_version} undid them. Publish stays paused: re-apply "
            f"their changes, or restore version {pt.new_version - 1} to take them back")


def _verify(spark: SparkSession, pt: RollbackPoint, window: str | None,
            out: Callable[[str], None]) -> None:
    """The rollback's RESTORE commit (``pt.new_version``) against the recorded version: same
    data files, same window content (time travel; later commits by others do not count), and
    every file readable (the window's; the table's when others' commits were undone, a folder
    was not listed, or on a re-run)."""
    ref, version = pt.ref, pt.rollback_version
    if pt.new_version is None:
        pt.verified = False
        out(f"{pt.dataset}: {restore_statement(ref, version)} -> no RESTORE commit of this "
            "rollback in the history")
        raise GateFailedError(f"{pt.dataset}: no RESTORE commit of this rollback found after "
                              f"version {pt.promoted_version}; the table was not restored")
    restored = pt.new_version
    same_files = (delta_ops.snapshot_files(spark, ref, restored)
                  == delta_ops.snapshot_files(spark, ref, version))
    now, then = (delta_ops.read_version(spark, ref, restored),
                 delta_ops.read_version(spark, ref, version))
    if window:
        now, then = now.filter(window), then.filter(window)
    try:
        same_rows = table_fingerprint(now) == (pt.expected or table_fingerprint(then))
        # every file, when the window's alone may not show a gone one: others' commits undone,
        # a folder not listed, or a re-run (it does not know what the first attempt undid)
        if window and (pt.read_all or pt.already_rolled_back is not None):
            delta_ops.read_all_files(delta_ops.read_version(spark, ref, restored))
    except Exception as exc:
        gone = delta_ops.gone_file(exc)
        if gone is None:
            raise
        pt.verified = False
        out(f"{pt.dataset}: {restore_statement(ref, version)} -> version {restored}, which "
            f"cannot be read: {gone} is gone")
        raise GateFailedError(
            f"{pt.dataset}: after RESTORE, version {restored} (the files of version {version}) "
            f"cannot be read: {gone} is gone (VACUUM?); version {version} can no longer be "
            f"restored. Publish stays paused. {_take_back(spark, ref, restored)}") from exc
    pt.verified = same_files and same_rows
    out(f"{pt.dataset}: {restore_statement(ref, version)} -> version {pt.new_version}; "
        + (f"verified: same data files and {'window ' if window else ''}content as version "
           f"{version}" if pt.verified else "MISMATCH with the recorded version"))
    if not pt.verified:
        raise GateFailedError(f"{pt.dataset}: after RESTORE the table differs from version "
                              f"{version} (files equal: {same_files}, content equal: {same_rows})")


def _take_back(spark: SparkSession, ref: TableRef, restored: int) -> str:
    """What returns the table to its content before the rollback's RESTORE ``restored``: the
    version before it, while no commit came after it (else that would undo those too)."""
    newest = delta_ops.current_version(spark, ref)
    if newest == restored:
        return (f"To take back the table as it was before the rollback: "
                f"{restore_statement(ref, restored - 1)}")
    return (f"Commits landed after that RESTORE (newest version {newest}); read the table's "
            "history before restoring anything")


def _actor() -> str:
    """Who runs the rollback: ``$SPARKGUARD_ACTOR``, else the OS user."""
    return os.environ.get("SPARKGUARD_ACTOR") or _user()


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:
        return "unknown"


def _record_in_evidence(prog: RunProgress, results: list[dict[str, Any]], actor: str,
                        force: bool, out: Callable[[str], None],
                        ledger: Ledger | None = None, abandoned: str | None = None) -> None:
    """Add the rollback to the run's evidence (``sparkguard.rollbacks``; ``abandoned``: the
    reason it was closed unfinished) and re-render the Markdown beside it."""
    if not prog.evidence_path or not Path(prog.evidence_path).exists():
        return
    path = Path(prog.evidence_path)
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if ledger is not None and isinstance(data.get("audit"), dict):
        edits = _evidence_edits(ledger, prog.run_id, str(path), data)
        if edits:  # re-hashing and re-sealing it would make the edits verify as intact
            out(f"WARNING the evidence {path} does not match the ledger's record of it "
                f"({'; '.join(edits[:3])}): it was edited after it was written, so it is left "
                "as it is; the rollback is recorded in the ledger. Run `sparkguard verify "
                f"--run-id {prog.run_id}` and restore the evidence from a trusted copy")
            return
    entry = {"at": dt.datetime.now(dt.UTC).isoformat(), "by": actor, "forced": force,
             "targets": results, **({"abandoned": abandoned} if abandoned is not None else {})}
    sg = data.setdefault("sparkguard", {})
    sg.setdefault("rollbacks", []).append(entry)
    # what the targets hold now; the promotion stays below
    sg["outcome"] = "rolled_back" if abandoned is None else "rollback_abandoned"
    rg = data.get("release_gate_evidence") or {}
    if isinstance(rg.get("decision"), dict):
        rg["decision"]["ready_to_ship"] = False
    if isinstance(rg.get("publish_control"), dict):
        rg["publish_control"]["deployment_complete"] = False
    audited = ledger if isinstance(data.get("audit"), dict) else None
    if audited is not None:
        if data["audit"].get("seal") and audit_key() is None:
            out(f"WARNING the evidence was sealed and {AUDIT_KEY_ENV} is not set: it is "
                "rewritten unsealed, and `sparkguard verify` reports it (seal_mismatch)")
        _reseal(data, prog.run_id, audited)
    atomic_write(path, dump_yaml(data))
    if audited is not None:
        from sparkguard.run.finish import record_evidence_audit

        record_evidence_audit(audited, prog.run_id, str(path))
    atomic_write(path.with_suffix(".md"), render_markdown(data))
    out(f"rollback {'abandonment ' if abandoned is not None else ''}recorded in the evidence: "
        f"{path}")


def _evidence_edits(ledger: Ledger, run_id: str, path: str, data: Mapping[str, Any]
                    ) -> list[str]:
    """What ``verify`` would report as tampering in the evidence file, against the ledger's
    newest record of it (delta-rs where it can serve)."""
    from sparkguard.audit_trail import check_evidence
    from sparkguard.state_read import read_state

    records = read_state(ledger.home, lambda r: r.rows("evidence", "run_id", [run_id]),
                         spark=lambda: ledger.spark)
    return [f"{f.kind}: {f.detail}" for f in check_evidence(
        path, data, records[-1] if records else None, audit_key()) if f.severity == "tamper"]


def _reseal(data: dict[str, Any], run_id: str, ledger: Ledger) -> None:
    """The audit section again after the rollback's edit: the run chain's new head, the rest as
    recorded (the rollback's restores show as later commits on the targets)."""
    from sparkguard.audit_trail import attach_audit

    old = data.pop("audit")
    chains = dict(old.get("chains") or {})
    chains["runs"] = ledger.chain_heads(run_id, [])["runs"] or chains.get("runs")
    attach_audit(data, home=old.get("ledger_home") or ledger.home, chains=chains,
                 commits=old.get("commits") or [], key=audit_key())

