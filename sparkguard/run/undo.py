"""Undo this run's promotions: restore a target, verified on the window."""

from __future__ import annotations

from sparkguard import delta_ops
from sparkguard.errors import SparkguardError
from sparkguard.run.context import (
    RunContext,
    RunState,
    TargetState,
    notify,
    record,
    record_promoted,
)
from sparkguard.run.data import fingerprints, job, target_df, target_rules

__all__ = ["RestoreFailedError", "restore_promoted", "restore_target"]


class RestoreFailedError(SparkguardError):
    """Raised when the automatic restore after a failure did not complete; carries the failure
    that caused the restore, so neither hides the other."""

    def __init__(self, cause: BaseException, errors: dict[str, BaseException]) -> None:
        self.cause, self.errors = cause, errors
        parts = "; ".join(f"{label}: {type(e).__name__}: {str(e)[:500]}"
                          for label, e in errors.items())
        super().__init__(
            f"{cause}\nTHE AUTOMATIC RESTORE FAILED for {', '.join(errors)} ({parts}); those "
            "targets may still hold this run's promotion, or lost other writers' commits (as "
            "said for each) and publish stays paused: roll back with `sparkguard rollback "
            "--run-id <run>` or the RESTORE statement in the evidence, or re-apply their commits")


def restore_target(ctx: RunContext, state: RunState, st: TargetState, why: str) -> None:
    """Undo this run's promotion of ``st``: RESTORE, or (when other writers committed after it)
    put the window back as it was, keeping their commits; refused when they changed the window
    itself (their rows would be lost). Verified on the window."""
    assert st.rollback_version is not None and st.promoted_version is not None
    label, version = st.spec.label, st.rollback_version
    parts = ctx.window.partitions
    job(ctx, state, f"run {state.run_id} target {label}: restore version {version}")
    meta = delta_ops.user_metadata(state.run_id, ctx.fingerprint, "restore", target=label,
                                   reason=why)
    commits = delta_ops.commits_since(ctx.spark, st.ref, st.promoted_version)
    seen = max((int(c["version"]) for c in commits), default=st.promoted_version)
    after = delta_ops.foreign_commits(commits, state.run_id, data_only=True)
    if after:
        listed = delta_ops.listed_commits(after)
        promoted, now = fingerprints(target_df(ctx, st, parts, st.promoted_version),
                                     target_df(ctx, st, parts))
        if promoted != now:
            raise SparkguardError(
                f"{label}: other writers changed the window after this run's promotion "
                f"({listed}); putting the window back as of version {version} would lose their "
                "rows, so it was left as it is: decide with the table's owners, then roll back "
                "with `sparkguard rollback --run-id <run> --force` or repair the window")
        fixed = [c for c, explicit in target_rules(ctx, st).identity if not explicit]
        if fixed:
            raise SparkguardError(
                f"{label}: other writers committed after this run's promotion ({listed}), "
                "outside the window; putting the window back without undoing their commits "
                f"means writing its old rows again, and Delta refuses explicit values for the "
                f"GENERATED ALWAYS identity column(s) {', '.join(fixed)}. Nothing was undone: "
                "roll back with `sparkguard rollback --run-id <run> --force` (a RESTORE, which "
                "also undoes their commits) once their owners agree, or repair the window")
        ctx.say(f"{label}: {len(after)} commit(s) by other writers after the promotion "
                f"({listed}), none in the window; putting the window back as of version "
                f"{version} instead of RESTORE")
        delta_ops.revert_window(ctx.spark, st.ref, version, ctx.window.pred(parts), meta)
    else:
        delta_ops.restore(ctx.spark, st.ref, version, meta)
    want, got = fingerprints(target_df(ctx, st, parts, version), target_df(ctx, st, parts))
    st.restored, st.verified = True, False
    new_version = delta_ops.current_version(ctx.spark, st.ref)
    # commits that landed between the history read and the RESTORE: the RESTORE undid them
    undone = [] if after else delta_ops.undone_by(
        ctx.spark, st.ref, state.run_id, seen,
        delta_ops.find_commit(ctx.spark, st.ref, state.run_id, "restore", seen))
    record(ctx, state, "restored", st, version_read=version, version_written=new_version,
           reason=why, verified=want == got and not undone,
           method="revert_window" if after else "restore",
           undone_commits_of_others=[{k: str(v) for k, v in c.items()} for c in undone[:50]]
           or None)
    notify(ctx, state, "restored", target=st.ref.display, version=version, reason=why)
    if undone:
        raise SparkguardError(
            f"{label}: {len(undone)} commit(s) by other writers landed between the check of "
            f"the history (version {seen}) and the RESTORE to version {version} "
            f"({delta_ops.listed_commits(undone, times=True)}); the RESTORE undid them. This "
            "run's promotion is undone; re-apply their changes, or restore the version just "
            "before the RESTORE commit to take them back (and the promotion with them)")
    if want != got:
        raise SparkguardError(f"{label}: the window after restoring version {version} differs "
                              f"from that version ({got} vs {want}); inspect the table history")


def _landed_unrecorded(ctx: RunContext, state: RunState, st: TargetState) -> None:
    """A promotion the ledger has as started, not as landed: the failure may have come right
    after its commit (reading the history, say, or in a resumed run before it got to
    promoting). Its commit in the history, found by its userMetadata, is recorded as landed,
    the rollback point just before it (commits of other writers in between stay)."""
    assert st.rollback_version is not None
    label, checked = st.spec.label, st.rollback_version
    found = delta_ops.promoted_since(ctx.spark, st.ref, checked, state.run_id, label)
    if found is None:
        return
    note = (f"the promotion commit landed at version {found} before the failure (found in the "
            "table history by its userMetadata)")
    st.notes.append(note)
    ctx.say(f"{label}: {note}")
    record_promoted(ctx, state, st, checked, found, found_in_history=True)


def restore_promoted(ctx: RunContext, state: RunState, cause: BaseException) -> list[str]:
    """Restore every target this run promoted (multi-target all-or-nothing).

    Every target is attempted even when one fails; a failure raises
    :class:`RestoreFailedError` naming ``cause`` and each restore error.
    """
    why = str(cause)[:2000] if isinstance(cause, SparkguardError) else \
        f"runtime failure: {type(cause).__name__}: {str(cause)[:2000]}"
    restored: list[str] = []
    if state.delivered:  # downstream may have read them: undoing now would be the harm
        ctx.say("every target was promoted, verified and delivered (publish reopened) by an "
                "earlier attempt: nothing is restored; roll back with `sparkguard rollback "
                f"--run-id {state.run_id}` if the backfill must be undone")
        return restored
    errors: dict[str, BaseException] = {}
    for st in state.targets.values():
        if st.rollback_version is not None and st.promoted_version is None:
            try:
                _landed_unrecorded(ctx, state, st)
            except Exception as exc:  # unknown whether it landed: say so, never "nothing"
                ctx.say(f"{st.spec.label}: the table history cannot be read to learn whether "
                        f"the promotion landed: {type(exc).__name__}: {exc}")
                errors[st.spec.label] = exc
                continue
        if st.promoted_version is not None and st.rollback_version is not None \
                and not st.restored and not st.changed_after_promotion:
            ctx.say(f"{st.spec.label}: restoring version {st.rollback_version} because: {why}")
            try:
                restore_target(ctx, state, st, why)
                restored.append(st.spec.label)
            except Exception as exc:  # keep going: every target gets its restore attempt
                ctx.say(f"{st.spec.label}: RESTORE FAILED: {type(exc).__name__}: {exc}")
                errors[st.spec.label] = exc
    if errors:
        raise RestoreFailedError(cause, errors) from cause
    return restored
