"""Stages before any data is written: guard, lock + ledger (start or resume), pause publish."""

from __future__ import annotations

from typing import Any

from sparkguard import delta_ops, faults
from sparkguard.errors import ConcurrentRunError, GuardError
from sparkguard.guard import blocking, static_findings
from sparkguard.guard_live import live_check
from sparkguard.ledger import PlanHistory, RunProgress, new_run_id
from sparkguard.ledger_model import taken_over
from sparkguard.plan.approvals import valid_approvals
from sparkguard.run.context import RunContext, RunState, notify, record
from sparkguard.run.data import job
from sparkguard.run.stages import Guard, Lock, Pause

__all__ = ["Finished", "visit_guard", "visit_lock", "visit_pause"]


class Finished(Exception):
    """Raised by the lock stage when the plan's newest run already did everything."""

    def __init__(self, message: str, evidence_path: str | None) -> None:
        super().__init__(message)
        self.evidence_path = evidence_path


def visit_guard(stage: Guard, ctx: RunContext, state: RunState) -> dict[str, int]:
    """Static and live checks; returns the source rows per window partition they counted."""
    job(ctx, state, f"plan {ctx.plan.name}: guard, live checks")
    findings = static_findings(ctx.plan)
    if blocking(findings):
        raise GuardError(ctx.plan_path, [f.as_problem() for f in blocking(findings)])
    live, rows = live_check(ctx.spark, ctx.plan)
    if blocking(live):
        raise GuardError(ctx.plan_path, [f.as_problem() for f in blocking(live)])
    for f in [*findings, *live]:
        ctx.say(f.render(ctx.plan_path))
    return rows


def visit_lock(stage: Lock, ctx: RunContext, state: RunState, again: bool = False) -> None:
    """Read the ledger once, resume or start the run, lock the targets, pin the source.

    Raises :class:`Finished`, without starting a run, when the newest run of this plan already
    finished from the same source version and the targets are still as it left them; raises
    :class:`ConcurrentRunError` (exit 2, nothing written) when that run is being rolled back.
    """
    job(ctx, state, f"plan {ctx.plan.name}: read the ledger")
    ctx.ledger.ensure()
    state.history = hist = ctx.ledger.load(ctx.fingerprint)
    runs = hist.progress()
    if not state.lock_keys:  # the table's location, however the plan spells it
        state.lock_keys = {label: delta_ops.lock_key(ctx.spark, st.ref)
                           for label, st in state.targets.items()}
    if runs and runs[0].state == "done" and not ctx.options.dry_run:
        _already_done(ctx, state, runs[0])
    prev = hist.resumable()
    if prev is not None and prev.state == "rolling_back":  # resuming would promote it again
        raise ConcurrentRunError(
            f"run {prev.run_id} of this plan is being rolled back (state rolling_back: its "
            f"rollback stopped before it finished); finish the rollback with `sparkguard "
            f"rollback --run-id {prev.run_id}` (re-run it), or, if it cannot finish, close it "
            f"with `sparkguard rollback --run-id {prev.run_id} --abandon REASON`; nothing was "
            "written")
    if prev is not None and ctx.options.dry_run and (any(
            t.rollback_version is not None for t in prev.targets.values())
            or any(e["state"] == "paused" for e in hist.runs.get(prev.run_id, []))):
        # a dry run never promotes nor reopens publish: taking such a run over would end it
        # with its publish hold set and nothing left to clear it
        raise ConcurrentRunError(
            f"run {prev.run_id} of this plan stopped after pausing publish (state "
            f"{prev.state}); re-run without --dry-run to finish it before a dry run; nothing "
            "was written")
    state.run_id = prev.run_id if prev is not None else new_run_id()
    job(ctx, state, f"run {state.run_id}: lock targets, pin the source version, record the run")
    keys = sorted(set(state.lock_keys.values()))  # the guard refused two targets in one
    decisions = ctx.ledger.acquire(keys, state.run_id, ctx.plan.owner,
                                   takeover=ctx.options.takeover_stale_lock,
                                   stale_after_s=ctx.options.stale_lock_after_s)
    state.holds_locks = True
    if prev is not None and _moved_on(ctx, hist, prev):
        # The run was live when the ledger was read and finished (or stopped) before the lock
        # was free: resuming it from that read would redo or undo its steps. Read again.
        ctx.ledger.release(keys, state.run_id)
        state.holds_locks = False
        if again:
            raise ConcurrentRunError(
                f"run {prev.run_id} of this plan keeps moving on while this run reads the "
                "ledger (another process is running it); nothing was done: re-run later")
        ctx.say(f"run {prev.run_id} moved on while the ledger was read (another process "
                "finished or stopped it); reading the ledger again")
        visit_lock(stage, ctx, state, again=True)
        return
    # a dead rollback's lock is named in took_over_locks_of; its run stays rolling_back
    took_over = taken_over(decisions)
    ctx.ledger.abandon_taken_over(took_over, state.run_id, spare=[state.run_id])
    if prev is not None:
        _load_resume(ctx, state, prev)
    if state.source_version is None:
        state.source_version = delta_ops.current_version(ctx.spark, ctx.source)
    for st in state.targets.values():
        if st.start_version is None:
            st.start_version = delta_ops.current_version(ctx.spark, st.ref)
    _load_done(ctx, state, hist)
    claim = _dry_run_claim(ctx, hist)
    w = ctx.window
    common: dict[str, Any] = dict(
        source_version=state.source_version, plan_path=ctx.plan_path,
        dry_run=ctx.options.dry_run,
        approvals=[a.model_dump(mode="json") for a in valid_approvals(ctx.plan)],
        recipients=list(ctx.plan.safeguards.downstream_notifications),
        targets={k: st.ref.display for k, st in state.targets.items()},
        start_versions={k: st.start_version for k, st in state.targets.items()},
        window={"column": w.column, "type": w.type.value,
                "partitions": [str(x) for x in w.partitions],
                "slices": len(w.slices), "waves": len(w.waves),
                **({"predicate": w.pred(w.partitions)} if w.range is not None else {})},
        locks={t: what for t, (what, _h) in decisions.items()}, dry_run_claim=claim,
        took_over_locks_of=took_over or None)
    event = "started" if prev is None else "resumed"
    extra: dict[str, Any] = {} if prev is None else {"previous_state": prev.state}
    record(ctx, state, event, plan_name=ctx.plan.name, owner=ctx.plan.owner, **extra, **common)
    state.ledger_facts = {"dry_run_claim": claim, "resumed_from_state": state.resumed_state,
                          "lock_decisions": common["locks"]}
    ctx.say(f"run {state.run_id}: plan {ctx.plan.name} fingerprint {ctx.fingerprint[:12]}, "
            f"source {ctx.source.display} pinned at version {state.source_version}")
    faults.failpoint("after_lock")


def _moved_on(ctx: RunContext, hist: PlanHistory, prev: RunProgress) -> bool:
    """Has the run to resume recorded events since the ledger was read (now that its locks are
    ours, it cannot record more)?"""
    return len(ctx.ledger.run_events(prev.run_id)) != len(hist.runs.get(prev.run_id, []))


def _load_done(ctx: RunContext, state: RunState, hist: PlanHistory) -> None:
    """Partitions already reconciled for this plan, target and source version (any run)."""
    import json

    proof_key = json.dumps([str(p) for p in ctx.window.slices[0]]) if ctx.window.slices else ""
    for label in state.targets:
        done = hist.done_slices(label, state.source_version)
        state.done[label] = {p for key in done for p in json.loads(key)}
        if proof_key in done:
            state.proof_done[label] = done[proof_key]


def _already_done(ctx: RunContext, state: RunState, done: RunProgress) -> None:
    """The same plan already finished from the same source version, and no target changed
    since: nothing to do (e.g. a re-run after a crash just before the locks were released)."""
    if delta_ops.current_version(ctx.spark, ctx.source) != done.source_version:
        return
    for label, st in state.targets.items():
        tp = done.targets.get(label)
        if tp is None or tp.promoted_version is None or tp.restored or \
                delta_ops.current_version(ctx.spark, st.ref) != tp.promoted_version:
            return
    for label, st in state.targets.items():
        tp = done.targets[label]
        st.rollback_version, st.promoted_version, st.verified = (
            tp.rollback_version, tp.promoted_version, tp.verified)
    holders = ctx.ledger.lock_holders(list(state.lock_keys.values()))
    for target, holder in holders.items():
        if holder.held and holder.run_id == done.run_id:  # it died before releasing
            ctx.ledger.release_finished(target, holder)
    state.run_id = done.run_id
    ctx.say(f"nothing to do: run {done.run_id} already promoted this plan from source version "
            f"{done.source_version}, and the targets are still at the versions it promoted; "
            f"evidence {done.evidence_path}")
    raise Finished("already done by run " + done.run_id, done.evidence_path)


def last_step(ctx: RunContext, state: RunState, prev: RunProgress) -> str:
    """The true last step of a stopped run: its newest event, or a promotion commit found in a
    target's history that the ledger had not recorded yet (a crash right after it)."""
    events = state.history.runs.get(prev.run_id, []) if state.history else []
    step = prev.state
    if events:
        e = events[-1]
        label = (e.get("details") or {}).get("label")
        step = f"{e['state']} {label}" if label else str(e["state"])
    for label, st in state.targets.items():
        tp = prev.targets.get(label)
        if tp is None or tp.rollback_version is None or tp.promoted_version is not None:
            continue
        found = delta_ops.promoted_since(ctx.spark, st.ref, tp.rollback_version, prev.run_id,
                                         label)
        if found is not None:
            step = (f"promotion commit of {label} at version {found}, found in the table "
                    f"history; the ledger's newest event is {step}")
    return step


def _load_resume(ctx: RunContext, state: RunState, prev: RunProgress) -> None:
    state.resumed = prev
    state.source_version = prev.source_version
    start: dict[str, int] = {}
    for e in (state.history.runs.get(prev.run_id, []) if state.history else []):
        start.update((e.get("details") or {}).get("start_versions") or {})
    state.publish_paused = any(e["state"] == "paused" for e in (
        state.history.runs.get(prev.run_id, []) if state.history else []))
    for label, st in state.targets.items():
        st.start_version = start.get(label)
        tp = prev.targets.get(label)
        if tp is None:
            continue
        st.rollback_version, st.checked_version = tp.rollback_version, tp.checked_version
        st.promoted_version = tp.promoted_version if not tp.restored else None
        st.verified = tp.verified and not tp.restored
    ctx.say(f"resuming run {prev.run_id} (last step {last_step(ctx, state, prev)}, source pinned "
            f"at version {prev.source_version}); slices already reconciled are skipped")


def _dry_run_claim(ctx: RunContext, hist: PlanHistory) -> dict[str, Any]:
    """Check ``execution.dry_run_completed`` against the dry runs the ledger recorded."""
    claimed = bool(ctx.plan.execution.dry_run_completed)
    recorded = hist.dry_runs()
    fact = {"claimed": claimed, "recorded_run_id": recorded[0].run_id if recorded else None,
            "recorded_at": str(recorded[0].last_at) if recorded else None}
    if ctx.options.dry_run:
        return fact
    if recorded:
        ctx.say(f"dry run of this exact plan recorded in the ledger: run {recorded[0].run_id} "
                f"at {recorded[0].last_at:%Y-%m-%d %H:%M:%S} UTC")
    elif claimed:
        ctx.say("WARNING execution.dry_run_completed: true is not backed by the ledger (no dry "
                f"run of fingerprint {ctx.fingerprint[:12]} recorded); the claim is ignored and "
                "this run proves every gate itself before promoting")
    else:
        ctx.say("no dry run of this plan recorded; this run proves every gate itself before "
                "promoting")
    return fact


def visit_pause(stage: Pause, ctx: RunContext, state: RunState) -> None:
    targets = [st.ref.display for st in state.targets.values()]
    if state.resumed is not None and all(st.verified for st in state.targets.values()):
        held = ctx.publish.statuses(targets, state.locations())
        if any(h["hold"] == state.run_id for s in held.values() for h in s.holds):
            ctx.say("every target already promoted and verified; publish hold left as it is")
            return
        state.delivered = True
        ctx.say("every target already promoted and verified, and this run's publish hold is "
                "cleared (publish reopened by an earlier attempt, or by an operator): "
                "downstream may have read the promotions, so later commits of other writers "
                "are only noted, nothing is undone; the run's end is recorded")
        return
    job(ctx, state, f"run {state.run_id}: pause publish")
    ctx.publish.pause(targets, run_id=state.run_id, actor=ctx.plan.owner,
                      reason=f"backfill {ctx.plan.name}", locations=state.locations())
    state.publish_paused = True
    record(ctx, state, "paused", publish_paused=targets)
    notify(ctx, state, "publish_paused", targets=targets)
    ctx.say(f"publish paused for {', '.join(targets)}")
    faults.failpoint("after_pause")
