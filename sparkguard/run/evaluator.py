"""The evaluator: build the stage list, then dispatch each stage to its handler.

Handlers are ``visit_<kind>(stage, ctx, state)``; the same list is what ``--explain``
prints. Failures map to an outcome here and nowhere else: a gate or a moved target is exit 1
(every target this run promoted restored, publish stays paused), a runtime error re-raises
after the same restore; errors while restoring or writing the failure evidence are raised,
naming the failure that led to them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from pyspark.sql import SparkSession

from sparkguard import faults
from sparkguard.errors import (
    EXIT_RUNTIME,
    GateFailedError,
    LockLostError,
    SparkguardError,
    TargetMovedError,
)
from sparkguard.ledger import Ledger
from sparkguard.notify import Notifier, notifiers_from_env
from sparkguard.plan.fingerprint import fingerprint
from sparkguard.plan.model import BackfillPlan
from sparkguard.plan.window import (
    plan_slices,
    slice_setting,
    target_order,
    waves_of,
    window_partitions,
)
from sparkguard.plan.window_spec import range_window
from sparkguard.publish import PublishControl
from sparkguard.run import stages as S
from sparkguard.run.check import visit_reconcile
from sparkguard.run.context import (
    RunContext,
    RunState,
    TargetState,
    Window,
    fence,
    notify,
    record,
)
from sparkguard.run.finish import (
    release_locks,
    visit_dry_run_stop,
    visit_evidence,
    visit_resume,
    write_run_evidence,
)
from sparkguard.run.labels import job_labels, restore_job_labels, set_job_label
from sparkguard.run.promote import visit_promote
from sparkguard.run.report import RunOutcome, report_of
from sparkguard.run.shadow import rows_left, visit_proof, visit_wave
from sparkguard.run.start import Finished, visit_guard, visit_lock, visit_pause
from sparkguard.run.undo import RestoreFailedError, restore_promoted
from sparkguard.sql import PartitionType, TableRef

__all__ = ["FailureEvidenceError", "run_backfill"]

_VISIT: dict[type[S.Stage], Callable[[Any, RunContext, RunState], Any]] = {
    S.Lock: visit_lock, S.Pause: visit_pause, S.Proof: visit_proof, S.Wave: visit_wave,
    S.Reconcile: visit_reconcile, S.DryRunStop: visit_dry_run_stop, S.Promote: visit_promote,
    S.Evidence: visit_evidence, S.Resume: visit_resume,
}


class FailureEvidenceError(SparkguardError):
    """Raised when the evidence of a failed run could not be written; names both errors and
    keeps the exit code of the failure."""

    def __init__(self, cause: BaseException, error: BaseException) -> None:
        self.cause = cause
        self.exit_code = getattr(cause, "exit_code", EXIT_RUNTIME)
        super().__init__(f"{cause}\nTHE FAILURE EVIDENCE WAS NOT WRITTEN: "
                         f"{type(error).__name__}: {str(error)[:500]}; the ledger holds the "
                         "failure (`sparkguard status --run-id <run>`)")


def _window(plan: BackfillPlan, rows: Mapping[str, int] | None) -> Window:
    parts = window_partitions(plan)
    slices = plan_slices(parts, slice_setting(plan), rows)
    rw = range_window(plan)
    if rw is not None:
        column, ptype = rw.column, PartitionType.STRING
    else:
        assert plan.partitioning is not None
        column, ptype = plan.partitioning.column, plan.partitioning.type
    return Window(column, ptype, tuple(parts), tuple(tuple(s) for s in slices),
                  tuple(tuple(w) for w in waves_of(slices, rows)), rows, rw)


def _context(spark: SparkSession, plan: BackfillPlan, plan_path: str, home: str,
             evidence_dir: str, options: S.RunOptions, out: Callable[[str], None],
             notifiers: Sequence[Notifier] | None) -> tuple[RunContext, RunState]:
    fp = fingerprint(plan)
    assert plan.source_of_truth.dataset is not None
    ctx = RunContext(
        spark=spark, plan=plan, plan_path=plan_path, fingerprint=fp, window=_window(plan, None),
        home=home, evidence_dir=evidence_dir, options=options, console=out,
        notifiers=tuple(notifiers) if notifiers is not None else tuple(notifiers_from_env()),
        ledger=Ledger(spark, home), publish=PublishControl(spark, home),
        source=TableRef.parse(plan.source_of_truth.dataset), t0=time.monotonic())
    shadow_root = (plan.execution.shadow_location or f"{home.rstrip('/')}/shadow").rstrip("/")
    targets = {t.label: TargetState(t, TableRef.parse(t.dataset), TableRef(
        path=f"{shadow_root}/{plan.name}/{fp[:12]}/{t.label}")) for t in target_order(plan)}
    return ctx, RunState(targets=targets)


def run_backfill(spark: SparkSession, plan: BackfillPlan, plan_path: str, *, home: str,
                 evidence_dir: str, options: S.RunOptions | None = None,
                 out: Callable[[str], None] = print,
                 notifiers: Sequence[Notifier] | None = None) -> RunOutcome:
    """Run every stage of the plan; map the end state to an exit code (0, 1, 3).

    Plan and guard errors (exit 2) propagate before anything is written; so does a lock held
    by another run (nothing is recorded for the refused run). Every Spark job of the run
    carries the job group ``sparkguard-<run id>`` (``sparkguard-plan-<name>`` before the run
    id is known) and a description naming the stage; the caller's labels are restored after.
    """
    saved = job_labels(spark)
    set_job_label(spark, f"sparkguard-plan-{plan.name}", f"plan {plan.name}: open the ledger")
    try:
        ctx, state = _context(spark, plan, plan_path, home, evidence_dir,
                              options or S.RunOptions(), out, notifiers)
        stages = S.build_stages(plan, ctx.options)
        rows = visit_guard(stages[0], ctx, state)  # type: ignore[arg-type]
        ctx = replace(ctx, window=_window(plan, rows))  # the guard's row counts size slices
        faults.failpoint("after_guard")
        return _evaluate(ctx, state, S.build_stages(plan, ctx.options, rows))
    finally:
        restore_job_labels(spark, saved)


def _walk(ctx: RunContext, state: RunState, stages: list[S.Stage]) -> RunOutcome:
    for i, stage in enumerate(stages[1:], 2):
        left = rows_left(ctx, state) if state.work_rows else 0
        ctx.say(S.stage_line(i, len(stages), stage, ctx.elapsed(),
                             S.estimate_left(state.work_s, state.work_rows, left)))
        if state.promoted_any and not isinstance(stage, S.Promote):  # it fences itself
            fence(ctx, state, doing=f"stage {i} ({stage.kind})", unreadable_ok=True)
        _VISIT[type(stage)](stage, ctx, state)
        if isinstance(stage, S.DryRunStop):
            return RunOutcome(state.run_id, 0, "dry run passed: every gate passed, target and "
                              "publish state untouched", state.evidence_path,
                              report_of(ctx, state).targets)
    return RunOutcome(state.run_id, 0, "promoted and verified", state.evidence_path,
                      report_of(ctx, state).targets)


def _evaluate(ctx: RunContext, state: RunState, stages: list[S.Stage]) -> RunOutcome:
    try:
        return _walk(ctx, state, stages)
    except Finished as done:
        return RunOutcome(state.run_id, 0, str(done), done.evidence_path,
                          report_of(ctx, state).targets)
    except (GateFailedError, TargetMovedError) as exc:
        if not state.holds_locks:
            raise
        _stop_if_fenced(ctx, state, exc)
        restored = _restore_or_fail(ctx, state, exc)
        record(ctx, state, "gate_failed", error=str(exc), restored=restored)
        notify(ctx, state, "gate_failed", error=str(exc))
        path = _failure_evidence(ctx, state, "gate_failed", str(exc), exc)
        ctx.say(f"GATE FAILED: {exc}. Target unchanged{' (restored)' if restored else ''}; "
                "publish stays paused.")
        return RunOutcome(state.run_id, 1, str(exc), path, report_of(ctx, state).targets)
    except Exception as exc:
        if state.holds_locks:  # a run refused its lock writes nothing (the holder's run is live)
            _stop_if_fenced(ctx, state, exc)
            _fail(ctx, state, exc)
        raise
    finally:
        if state.holds_locks:
            release_locks(ctx, state)


def _stop_if_fenced(ctx: RunContext, state: RunState, exc: Exception) -> None:
    """A run that may have a promotion in place on a target whose lock was taken over (a
    rollback or another run took it after the stale-lock timeout) writes nothing more: no
    RESTORE, no ledger event, no evidence, no publish change, no lock release; the process
    holding that lock owns the target now. Raises LockLostError then. Returns otherwise: a
    lost lock of a target it did not promote (the usual failure handling restores what it
    promoted, whose locks it holds), or a lock table it cannot read (handled as ever)."""
    if not state.promoted_any:
        return
    lost = exc if isinstance(exc, LockLostError) else None
    if lost is None:
        try:
            fence(ctx, state, doing="restoring or recording anything")
        except LockLostError as fenced:
            lost = fenced
        except Exception:  # the lock is unreadable: handle exc as ever
            return
    if lost is None:
        return
    promoted = {state.lock_keys[label] for label in state.targets
                if label in state.lock_keys and state.may_have_promoted(label)}
    if not promoted & set(lost.keys):
        return
    state.holds_locks = False
    ctx.say(f"STOPPED: {lost}; this run wrote nothing more. Roll back what it promoted, if "
            f"needed, with `sparkguard rollback --run-id {state.run_id}` once the lock is free")
    if lost is exc:
        raise lost
    raise lost from exc


def _why(exc: BaseException) -> str:
    return str(exc)[:2000] if isinstance(exc, SparkguardError) else \
        f"runtime failure: {type(exc).__name__}: {str(exc)[:2000]}"


def _restore_or_fail(ctx: RunContext, state: RunState, exc: BaseException) -> list[str]:
    """Restore what the run promoted; a failed restore becomes the run's failure."""
    try:
        return restore_promoted(ctx, state, exc)
    except RestoreFailedError as failed:
        record(ctx, state, "failed", error=_why(failed), restored=[],
               restore_errors={k: f"{type(e).__name__}: {str(e)[:500]}"
                               for k, e in failed.errors.items()})
        _failure_evidence(ctx, state, "failed", _why(failed), failed)
        raise


def _fail(ctx: RunContext, state: RunState, exc: Exception) -> None:
    """Record a runtime failure and its evidence after restoring what the run promoted."""
    if isinstance(exc, (RestoreFailedError, FailureEvidenceError)):
        return  # recorded where it arose
    if state.evidence_path and state.targets and all(
            st.verified for st in state.targets.values()):
        # Promoted, verified and its evidence written: only reopening publish or recording
        # the end failed. Undoing verified data (publish perhaps open already) would be the
        # harm; a re-run finishes the run without promoting again.
        ctx.say("every target is promoted and verified, so nothing is restored; re-run the "
                "same command to reopen publish and record the run as done")
        record(ctx, state, "failed", error=_why(exc), restored=[], promoted_and_verified=True)
        if state.publish_paused:  # the evidence, written before, says publish reopened
            _failure_evidence(ctx, state, "promoted", "promoted and verified, but publish was "
                              f"not reopened: {_why(exc)}; re-run the same command to reopen "
                              "it", exc)
        return
    restored = _restore_or_fail(ctx, state, exc)
    record(ctx, state, "failed", error=_why(exc), restored=restored)
    _failure_evidence(ctx, state, "failed", _why(exc), exc)


def _failure_evidence(ctx: RunContext, state: RunState, outcome: str, why: str,
                      cause: BaseException) -> str:
    try:
        return write_run_evidence(ctx, state, outcome, why)
    except Exception as error:
        ctx.say(f"EVIDENCE NOT WRITTEN: {type(error).__name__}: {error}")
        raise FailureEvidenceError(cause, error) from error
