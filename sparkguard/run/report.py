"""The typed, frozen record of a run that evidence and the CLI read."""

from __future__ import annotations

from dataclasses import dataclass, field

from sparkguard.plan.model import BackfillPlan, Promotion
from sparkguard.reconcile.verdicts import ReconcileResult
from sparkguard.run.context import RunContext, RunState, TargetState
from sparkguard.sql import TableRef

__all__ = ["RunOutcome", "RunReport", "TargetReport", "report_of"]


@dataclass(frozen=True)
class TargetReport:
    """One target as the run left it."""

    label: str
    ref: TableRef
    shadow: TableRef
    promotion: Promotion
    reconciled_version: int | None
    rollback_version: int | None
    promoted_version: int | None
    verified: bool
    restored: bool
    slice_results: tuple[ReconcileResult, ...]
    skipped_slices: tuple[int, ...]
    window: ReconcileResult | None
    notes: tuple[str, ...]
    deletes_unmatched: bool = True  # rows no longer produced leave the target (else kept)


@dataclass(frozen=True)
class RunReport:
    """Everything the evidence says about a run, and nothing it would have to dig for."""

    run_id: str
    plan: BackfillPlan
    plan_path: str
    fingerprint: str
    home: str
    evidence_dir: str
    source: str
    source_version: int | None
    partition_column: str
    partitions: tuple[str, ...]
    proof_partitions: tuple[str, ...]
    targets: dict[str, TargetReport]
    publish_paused: bool  # this run's publish hold is still set
    # holds this run does not clear when it finishes (an operator's manual pause), per target
    held_by_others: dict[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class RunOutcome:
    """The result the CLI turns into an exit code and a summary."""

    run_id: str
    exit_code: int
    message: str
    evidence_path: str | None = None
    targets: dict[str, TargetReport] = field(default_factory=dict)


def _target(st: TargetState) -> TargetReport:
    return TargetReport(
        label=st.spec.label, ref=st.ref, shadow=st.shadow, promotion=st.spec.promotion,
        reconciled_version=st.reconciled_version, rollback_version=st.rollback_version,
        promoted_version=st.promoted_version, verified=st.verified, restored=st.restored,
        slice_results=tuple(st.slice_results), skipped_slices=tuple(sorted(st.skipped_slices)),
        window=st.window, notes=tuple(st.notes), deletes_unmatched=st.deletes_unmatched)


def report_of(ctx: RunContext, state: RunState) -> RunReport:
    """Freeze what the run knows now."""
    w = ctx.window
    return RunReport(
        run_id=state.run_id, plan=ctx.plan, plan_path=ctx.plan_path,
        fingerprint=ctx.fingerprint, home=ctx.home, evidence_dir=ctx.evidence_dir,
        source=ctx.source.display, source_version=state.source_version,
        partition_column=w.column, partitions=tuple(str(p) for p in w.partitions),
        proof_partitions=tuple(str(p) for p in w.slices[0]) if w.slices else (),
        targets={k: _target(st) for k, st in state.targets.items()},
        publish_paused=state.publish_paused,
        held_by_others={t: tuple(h) for t, h in state.held_by_others.items()})
