"""The end of a run: evidence, publish reopened, locks released."""

from __future__ import annotations

from sparkguard import faults
from sparkguard.audit_trail import evidence_digest
from sparkguard.evidence import load_evidence, write_evidence
from sparkguard.ledger import Ledger
from sparkguard.publish import MANUAL_HOLD, PublishStatus
from sparkguard.run.audit_facts import audit_facts
from sparkguard.run.context import RunContext, RunState, notify, record
from sparkguard.run.data import job
from sparkguard.run.report import report_of
from sparkguard.run.stages import DryRunStop, Evidence, Resume

__all__ = ["record_evidence_audit", "release_locks", "visit_dry_run_stop", "visit_evidence", "visit_resume",
           "write_run_evidence"]


def write_run_evidence(ctx: RunContext, state: RunState, outcome: str,
                       error: str | None = None) -> str:
    try:
        facts = audit_facts(ctx, state)
    except Exception as exc:  # a target's history unreadable: the evidence must still be written
        facts = {"home": ctx.home, "commits": [], "commits_error": f"{type(exc).__name__}: "
                 f"{exc}"[:300], "chains": ctx.ledger.chain_heads(
                     state.run_id, list(state.lock_keys.values()))}
    path = write_evidence(report_of(ctx, state), outcome, error, audit=facts)
    record_evidence_audit(ctx.ledger, state.run_id, path)
    ctx.say(f"evidence written to {path}")
    return path


def record_evidence_audit(ledger: Ledger, run_id: str, path: str) -> None:
    """Record the evidence file's content hash, seal and leaf hashes in the ledger (hashed as
    read back from the file, what a verifier will read)."""
    data = load_evidence(path)
    leaves, root = evidence_digest(data)
    ledger.record_evidence(run_id, path, root, (data.get("audit") or {}).get("seal"), leaves)


def visit_evidence(stage: Evidence, ctx: RunContext, state: RunState) -> None:
    # an operator's manual pause outlives the run: the evidence must not say publish reopens
    targets = [st.ref.display for st in state.targets.values()]
    manual = {t: tuple(h for h in s.holds if h["hold"] == MANUAL_HOLD)
              for t, s in ctx.publish.statuses(targets, state.locations()).items()}
    state.held_by_others = {t: [PublishStatus(t, True, holds, None).describe()]
                            for t, holds in manual.items() if holds}
    state.evidence_path = write_run_evidence(ctx, state, "promoted")


def visit_dry_run_stop(stage: DryRunStop, ctx: RunContext, state: RunState) -> None:
    job(ctx, state, f"run {state.run_id}: record the dry run")
    record(ctx, state, "dry_run_passed", reconciled_versions={
        k: st.reconciled_version for k, st in state.targets.items()})
    state.evidence_path = write_run_evidence(ctx, state, "dry_run_passed")
    notify(ctx, state, "dry_run_passed")


def visit_resume(stage: Resume, ctx: RunContext, state: RunState) -> None:
    faults.failpoint("before_publish_resume")
    targets = [st.ref.display for st in state.targets.values()]
    job(ctx, state, f"run {state.run_id}: reopen publish")
    after = ctx.publish.finish(targets, state.run_id, actor=ctx.plan.owner,
                               reason=f"backfill {ctx.plan.name} promoted and verified",
                               locations=state.locations())
    state.publish_paused = False
    faults.failpoint("mid_publish_resume")
    notify(ctx, state, "publish_resumed", targets=targets)
    still = {t: s for t, s in after.items() if s.paused}
    record(ctx, state, "done", evidence_path=state.evidence_path,
           promoted_versions={k: st.promoted_version for k, st in state.targets.items()},
           still_paused_by_others={t: [h["hold"] for h in s.holds]
                                   for t, s in still.items()} or None)
    if still:
        for s in still.values():
            ctx.say(f"this run's publish hold released; still paused by others: {s.describe()}")
    else:
        ctx.say("publish reopened")
    faults.failpoint("before_lock_release")


def release_locks(ctx: RunContext, state: RunState) -> None:
    job(ctx, state, f"run {state.run_id}: release locks")
    ctx.ledger.release(state.locked, state.run_id)
