"""Promotion of one target: rollback point, one commit, exactly once, verified."""

from __future__ import annotations

import shlex
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from sparkguard import delta_ops, faults
from sparkguard.errors import GateFailedError, SparkguardError, TargetMovedError
from sparkguard.plan.model import Promotion
from sparkguard.reconcile.engine import reconcile, table_fingerprint
from sparkguard.reconcile.spec import spec_for_target
from sparkguard.run.context import (
    RunContext,
    RunState,
    TargetState,
    fence,
    notify,
    record,
    record_promoted,
)
from sparkguard.run.data import (
    as_shadow,
    bucketed,
    edge_gates,
    fingerprints,
    job,
    shadow_df,
    target_df,
)
from sparkguard.run.stages import Promote
from sparkguard.run.undo import restore_target

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["merge_window_bound", "verify", "visit_promote"]


def visit_promote(stage: Promote, ctx: RunContext, state: RunState) -> None:
    st = state.targets[stage.target or ""]
    label = st.spec.label
    # every target's lock: a promotion in place elsewhere must not be followed by this one
    # once any lock was taken over
    fence(ctx, state, doing=f"promoting {label}: it is unchanged")
    if st.rollback_version is not None and _already_promoted(ctx, state, st):
        return
    job(ctx, state, f"run {state.run_id} target {label}: promote")
    current = _prepare_and_commit(ctx, state, st)
    faults.failpoint("after_promote_commit")
    commits = delta_ops.commits_since(ctx.spark, st.ref, current)
    found = delta_ops.promotion_state(commits, state.run_id, label).promoted_version
    if found is None:
        raise SparkguardError(f"{label}: promotion commit not found in the table history "
                              f"after version {current}")
    _landed(ctx, state, st, current, found, commits)
    faults.failpoint("after_promote_ledger")
    fence(ctx, state, doing=f"verifying {label}", unreadable_ok=True)
    verify(ctx, state, st)


def _landed(ctx: RunContext, state: RunState, st: TargetState, checked: int, found: int,
            commits: Sequence[dict[str, Any]], **facts: object) -> None:
    """The promotion commit ``found`` is in the history: the rollback point becomes the version
    just before it when other writers committed after ``checked``; record it; compare the
    window across that gap (fresh or resumed)."""
    label = st.spec.label
    if found - 1 != checked:
        others = [c for c in delta_ops.foreign_commits(commits, state.run_id)
                  if checked < int(c["version"]) < found]
        note = (f"{len(others)} commit(s) by other writers landed between the rollback point "
                f"{checked} and the promotion commit {found} "
                f"({', '.join('v' + str(c['version']) for c in others)}); the rollback point "
                f"is version {found - 1}, just before the promotion commit")
        st.notes.append(note)
        ctx.say(f"{label}: {note}")
    record_promoted(ctx, state, st, checked, found, **facts)
    notify(ctx, state, "promoted", target=st.ref.display, version=found,
           rollback_version=found - 1)
    if found - 1 != checked:
        _check_gap(ctx, state, st, checked, found - 1)


def _check_gap(ctx: RunContext, state: RunState, st: TargetState, checked: int,
               before_promotion: int) -> None:
    """Commits of other writers between the checked version and the promotion commit were not
    seen by Delta's conflict check (the promotion's transaction began after them); if they
    changed the window, the promotion replaced their rows: undo it at once."""
    label, parts = st.spec.label, ctx.window.partitions
    then, now = fingerprints(target_df(ctx, st, parts, checked),
                             target_df(ctx, st, parts, before_promotion))
    failed = _edge_gates_again(ctx, st, before_promotion) \
        if then == now and before_promotion != checked else ""
    if failed:  # outside the window only, but under a key of the shadow
        ctx.say(f"{label}: another writer committed outside the window between version "
                f"{checked} and the promotion: {failed}; undoing the promotion")
        restore_target(ctx, state, st, "another writer's commit before the promotion fails "
                       "the table-wide duplicate check")
        raise TargetMovedError(
            f"{label}: another writer committed outside the window of {st.ref.display} just "
            f"before the promotion (versions {checked + 1}..{before_promotion}), counted again "
            f"at version {before_promotion}: {failed}. The promotion was undone at once and "
            "publish stays paused")
    if then == now:
        return
    ctx.say(f"{label}: another writer changed the window between version {checked} and the "
            f"promotion (window rows {then['rows']} -> {now['rows']}); undoing the promotion")
    restore_target(ctx, state, st, "another writer changed the window before the promotion")
    raise TargetMovedError(
        f"{label}: another writer changed the window of {st.ref.display} just before the "
        f"promotion (versions {checked + 1}..{before_promotion}); the promotion was undone at "
        f"once (target back at the content of version {before_promotion}, their rows kept) "
        "and publish stays paused. Re-run once that writer has finished")


def _already_promoted(ctx: RunContext, state: RunState, st: TargetState) -> bool:
    """Resume: find this run's promotion in the target history by its userMetadata.

    The history is folded from the run's start, so that the next txnVersion is past every
    promotion commit of the run (a restored one too). A promotion the ledger never heard of
    (the crash came right after its commit) is recorded as a fresh one is, the gap before it
    compared; a crash during that comparison repeats it.
    """
    assert st.rollback_version is not None
    label = st.spec.label
    checked = st.checked_version if st.checked_version is not None else st.rollback_version
    since = min(checked, st.start_version if st.start_version is not None else checked)
    commits = delta_ops.commits_since(ctx.spark, st.ref, since)
    found_state = delta_ops.promotion_state(commits, state.run_id, label)
    st.txn_version = found_state.next_txn_version
    if found_state.promoted_version is None:
        st.promoted_version, st.verified = None, False
        return False
    found = found_state.promoted_version
    ctx.say(f"{label}: already promoted by this run at version {found} (found in the table "
            "history by its userMetadata); not promoting again")
    if st.promoted_version != found:  # the crash came before the ledger row
        _landed(ctx, state, st, checked, found, commits, found_in_history=True)
    elif not st.verified and found - 1 != checked:  # the crash came during the gap check
        _check_gap(ctx, state, st, checked, found - 1)
    _still_holds_promotion(ctx, state, st, commits)
    if st.verified:
        ctx.say(f"{label}: promotion already verified")
    else:
        verify(ctx, state, st)
    return True


def _still_holds_promotion(ctx: RunContext, state: RunState, st: TargetState,
                           commits: Sequence[dict[str, Any]]) -> None:
    """Resume: other writers' commits after this run's promotion may add rows to the window,
    but not undo or overwrite the promoted ones; else the run would end done, and reopen
    publish, over a window that no longer holds the backfill. It stops instead, leaving the
    window as they left it (restoring would lose their change; promoting again would undo an
    operator's RESTORE). A delivered run (publish reopened by an earlier attempt) only says
    so: downstream may have read the promotion, so nothing is undone or redone."""
    assert st.promoted_version is not None and st.rollback_version is not None
    label, found = st.spec.label, st.promoted_version
    after = delta_ops.foreign_commits([c for c in commits if int(c["version"]) > found],
                                      state.run_id, data_only=True)
    if not after:
        return
    listed = delta_ops.listed_commits(after)

    def say(note: str) -> None:
        st.notes.append(note)
        ctx.say(f"{label}: {note}")

    delivered = ("; this run had already delivered it (publish reopened), so the window is "
                 "left as they left it")
    try:
        undone_all = _moved(ctx, st, found)
    except Exception as exc:
        if not state.delivered:
            raise
        say(f"other writers committed after the promotion at version {found} ({listed}); the "
            f"window could not be compared ({type(exc).__name__}: {str(exc)[:200]})"
            f"{delivered}")  # files vacuumed since, say: a said-only check must not stop it
        return
    if undone_all is None:
        if not state.delivered:
            say(f"other writers committed after the promotion at version {found} ({listed}); "
                "every promoted row is still in the window, unchanged")
        return
    if state.delivered:  # downstream may have read it: said, neither undone nor redone
        say(f"other writers' commits after the promotion at version {found} ({listed}) "
            + (f"undid it: the window is as it was at the rollback point {st.rollback_version}"
               if undone_all else "changed rows it promoted") + delivered)
        return
    st.changed_after_promotion = True
    record(ctx, state, "target_moved", st, version_read=delta_ops.current_version(
        ctx.spark, st.ref), since_version=found, window_unchanged=False,
        commits=[{k: str(v) for k, v in c.items()} for c in after[:50]],
        promotion_undone=undone_all)
    what = (f"undid this run's promotion at version {found}: the window is as it was at the "
            f"rollback point {st.rollback_version}" if undone_all else
            f"changed rows this run promoted at version {found}")
    raise TargetMovedError(
        f"{label}: other writers' commits after the promotion ({listed}) {what}. The window is "
        "left as they left it (restoring would lose their change, promoting again would undo "
        "a RESTORE someone chose) and publish stays paused. Decide with the table's owners; "
        "run the plan again to start a new run if the backfill should land, or `sparkguard "
        f"publish resume {shlex.quote(st.ref.display)}` to reopen publish as it is")


def _moved(ctx: RunContext, st: TargetState, found: int) -> bool | None:
    """None while every row promoted at version ``found`` is still in the window, unchanged;
    else whether the window is back as it was at the rollback point (True) or its promoted
    rows were changed (False)."""
    assert st.rollback_version is not None
    parts = ctx.window.partitions
    window = target_df(ctx, st, parts)
    promoted, now = fingerprints(target_df(ctx, st, parts, found), window)
    if promoted == now or _holds_shadow(ctx, st, window):
        return None
    return table_fingerprint(target_df(ctx, st, parts, st.rollback_version)) == now


def _holds_shadow(ctx: RunContext, st: TargetState, window: DataFrame) -> bool:
    """Every shadow row is in ``window`` (the target's window rows), unchanged, and alone under
    its key; other rows may be there too. A key held twice (a MERGE matched a row of another
    partition too, and updated both) or a column compared on neither side (typed differently
    in the shadow and the target) does not hold it."""
    parts = ctx.window.partitions
    res = reconcile(spec_for_target(ctx.plan, st.spec),
                    shadow=bucketed(ctx, shadow_df(ctx, st, parts)),
                    target=bucketed(ctx, as_shadow(ctx, st, window)), partitions=list(parts),
                    scope="verification")
    pv = res.preview
    return pv is not None and pv.inserted == 0 and pv.changed == 0 and pv.ambiguous == 0 \
        and not pv.not_compared


def _prepare_and_commit(ctx: RunContext, state: RunState, st: TargetState) -> int:
    """Check the target, record the rollback point, commit; returns the rollback point.

    Bounded attempts: a target that moved (or a Delta conflict) is checked again before the
    next attempt; rows another writer put in the window stop the run.
    """
    label, attempts = st.spec.label, max(1, ctx.options.promote_attempts)
    backoff = ctx.options.conflict_backoff_s
    for attempt in range(1, attempts + 1):
        current = delta_ops.current_version(ctx.spark, st.ref)
        if current != st.baseline_version:
            _target_moved(ctx, state, st, current)
        st.rollback_version = current
        record(ctx, state, "promoting", st, version_read=current, attempt=attempt,
               rollback_versions={label: current})
        faults.failpoint("before_promote")
        # Commits landing from here on do not stop the attempt: those inside the promotion's
        # transaction are Delta conflicts (retried below); those before it are outside Delta's
        # check, so visit_promote compares the window across that gap (_check_gap) and moves
        # the rollback point to just before the promotion commit.
        try:
            _commit(ctx, state, st)
            return current
        except Exception as exc:
            if _landed_anyway(ctx, state, st, current, exc):
                return current
            if not delta_ops.is_conflict(exc):
                raise
            ctx.say(f"{label}: delta conflict on promotion attempt {attempt}/{attempts}: "
                    f"{delta_ops.conflict_summary(exc)}; checking the target again in "
                    f"{backoff * attempt:.1f}s")
            time.sleep(backoff * attempt)
    raise TargetMovedError(
        f"{label}: the target kept changing ({attempts} attempts); nothing was promoted and "
        "publish stays paused. Re-run once the other writers are quiet")


def _landed_anyway(ctx: RunContext, state: RunState, st: TargetState, current: int,
                   exc: Exception) -> bool:
    """The promotion raised: did its commit land all the same (a conflict reported after the
    commit, a post-commit hook that failed)? Then the run goes on to record and verify it;
    otherwise a failure would leave a promotion the ledger and the restore never heard of."""
    try:
        found = delta_ops.promoted_since(ctx.spark, st.ref, current, state.run_id,
                                         st.spec.label)
    except Exception:  # the history cannot be read now: the promotion's own error is the story
        return False
    if found is None:
        return False
    note = (f"the promotion commit landed at version {found}, but Delta raised after it: "
            f"{type(exc).__name__}: {str(exc)[:300]}; going on to verify it")
    st.notes.append(note)
    ctx.say(f"{st.spec.label}: {note}")
    return True


def _target_moved(ctx: RunContext, state: RunState, st: TargetState, current: int) -> None:
    """The target changed since the run started: go on only if the window's content is the
    same as then (commits outside the window survive the promotion; rows another writer put in
    the window would be overwritten, so the run stops instead)."""
    label, parts = st.spec.label, ctx.window.partitions
    since = st.baseline_version
    assert since is not None
    moved = delta_ops.foreign_commits(
        delta_ops.commits_since(ctx.spark, st.ref, since), state.run_id)
    listed = delta_ops.listed_commits(moved)
    before, after = fingerprints(target_df(ctx, st, parts, since),
                                 target_df(ctx, st, parts, current))
    record(ctx, state, "target_moved", st, version_read=current, since_version=since,
           commits=[{k: str(v) for k, v in c.items()} for c in moved[:50]],
           window_unchanged=before == after)
    if before != after:
        raise TargetMovedError(
            f"{label}: another writer changed the window of {st.ref.display} during the run "
            f"(version {since} -> {current}: {listed}; window rows {before['rows']} -> "
            f"{after['rows']}); promoting would overwrite its rows, so nothing was promoted "
            "and publish stays paused. Re-run once that writer has finished: the new run "
            "reconciles against the target as it is then")
    failed = _edge_gates_again(ctx, st, current)
    if failed:
        raise TargetMovedError(
            f"{label}: another writer committed outside the window of {st.ref.display} during "
            f"the run ({listed}); counted again at version {current}: {failed}. Nothing was "
            "promoted and publish stays paused")
    ctx.say(f"{label}: target moved since reconciliation ({listed}), outside the window only "
            "(window content unchanged); promoting over the new version")
    st.reconciled_version = current
    st.start_version = current  # the window is as it was then: later checks start here


def _edge_gates_again(ctx: RunContext, st: TargetState, version: int) -> str:
    """Commits outside the window leave its content alone but not the table-wide duplicate
    check (``keys_outside_window``): a row another writer put outside the window under a key
    of the shadow makes the promotion a duplicate. Those gates are counted again at
    ``version`` (the target outside the window, as the promotion leaves it) and replace the
    window's; returns the failures, said ("" when none)."""
    again = edge_gates(ctx, st, ctx.window.partitions, version)
    if not again:
        return ""
    if st.window is not None:
        names = {g.gate for g in again}
        st.window = replace(st.window, gates=(
            *[g for g in st.window.gates if g.gate not in names], *again))
    return "; ".join(f"{g.gate}: {g.reason}" for g in again if not g.passed)


def _commit(ctx: RunContext, state: RunState, st: TargetState) -> None:
    label, parts = st.spec.label, ctx.window.partitions
    meta = delta_ops.user_metadata(state.run_id, ctx.fingerprint, "promote", target=label)
    txn = (f"sparkguard-{state.run_id}-{label}", st.txn_version)
    shadow = shadow_df(ctx, st, parts)
    if st.spec.promotion is Promotion.REPLACE_WHERE:
        delta_ops.promote_replace_where(shadow, st.ref, ctx.window.pred(parts), meta, txn)
    else:
        delta_ops.promote_merge(ctx.spark, shadow, st.ref, st.spec.business_keys,
                                merge_window_bound(ctx, parts), st.deletes_unmatched, meta, txn,
                                changed_only=st.spec.promotion is Promotion.MERGE_CHANGED)


def merge_window_bound(ctx: RunContext, parts: Sequence[object]) -> str:
    """The predicate over the target (alias ``t``) that bounds a MERGE promotion to the window:
    matching, and deleting rows the recomputation no longer produces, happen only inside it.

    The one place a MERGE's window bound is made (``merge`` and ``merge_changed`` alike).
    """
    return ctx.window.pred(parts, "t")


def verify(ctx: RunContext, state: RunState, st: TargetState) -> None:
    """The promoted window equals the shadow (content hash); otherwise restore at once."""
    label, parts = st.spec.label, ctx.window.partitions
    assert st.promoted_version is not None and st.rollback_version is not None
    job(ctx, state, f"run {state.run_id} target {label}: verify promotion")
    shadow_h, target_h = fingerprints(
        shadow_df(ctx, st, parts), as_shadow(ctx, st, target_df(ctx, st, parts,
                                                                 st.promoted_version)))
    ok = shadow_h == target_h
    if not ok and not st.deletes_unmatched:
        # MERGE keeping unmatched rows: the window must hold every shadow row unchanged
        ok = _holds_shadow(ctx, st, target_df(ctx, st, parts, st.promoted_version))
    if not ok:
        ctx.say(f"{label}: VERIFICATION FAILED (target window {target_h} != shadow "
                f"{shadow_h}); restoring version {st.rollback_version} now")
        restore_target(ctx, state, st, "verification failed")
        raise GateFailedError(f"{label}: promoted content does not equal the shadow; target "
                              f"restored to version {st.rollback_version}")
    st.verified = True
    record(ctx, state, "verified", st, version_read=st.promoted_version, content_hash=target_h)
    ctx.say(f"{label}: promoted at version {st.promoted_version} and verified "
            f"({target_h['rows']} rows in the window equal the shadow)")
    faults.failpoint("after_verify")
