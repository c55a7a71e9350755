"""The full-window reconciliation of each target."""

from __future__ import annotations

import time

from sparkguard import delta_ops, faults
from sparkguard.run.context import RunContext, RunState, TargetState, record
from sparkguard.run.data import job, print_gates, reconcile_part
from sparkguard.run.shadow import gate_fail, record_wave
from sparkguard.run.stages import Reconcile

__all__ = ["reconcile_window", "visit_reconcile"]


def visit_reconcile(stage: Reconcile, ctx: RunContext, state: RunState) -> None:
    st = state.targets[stage.target or ""]
    job(ctx, state, f"run {state.run_id} target {st.spec.label}: full-window reconciliation")
    faults.failpoint("mid_reconcile")
    # after a crash past the promotion commit, reconcile against the version before it,
    # so the change preview still shows what the promotion changed
    version: int | None = None
    if st.rollback_version is not None and delta_ops.promoted_since(  # resumed past it
            ctx.spark, st.ref, st.rollback_version, state.run_id, st.spec.label) is not None:
        version = st.rollback_version
    if version is None:
        version = delta_ops.current_version(ctx.spark, st.ref)
    reconcile_window(ctx, state, st, version)


def reconcile_window(ctx: RunContext, state: RunState, st: TargetState,
                     version: int | None) -> None:
    """Gates and change preview over the whole window against target ``version``; they are
    also the gates of the target's last wave, recorded here for resume."""
    t1 = time.monotonic()
    parts = ctx.window.partitions
    res = reconcile_part(ctx, state, st, parts, "full window", target_version=version,
                         preview=True)
    st.window, st.reconciled_version = res, version
    if st.pending_wave is not None:
        sid, wave_parts = st.pending_wave
        record_wave(ctx, state, st, sid, wave_parts, res, time.monotonic() - t1)
        st.pending_wave = None
    ctx.say(f"{st.spec.label}: full-window reconciliation over {len(parts)} partitions "
            f"(target version {version}):")
    print_gates(ctx, st.spec.label, res)
    if res.preview:
        pv = res.preview
        gone = (f"delete {pv.deleted - pv.moved}" if st.deletes_unmatched else
                f"{pv.deleted - pv.moved} row(s) no longer produced, kept (merge.when_not_"
                "matched_by_source: keep)")
        moved = (f" ({pv.moved} key(s) moved to another partition, counted as inserted and "
                 "deleted: the MERGE updates them)" if pv.moved else "")
        ctx.say(f"  change preview {st.spec.label}: insert {pv.inserted}, {gone}, change "
                f"{pv.changed}, unchanged {pv.unchanged}{moved}; by column "
                f"{ {k: v for k, v in pv.changed_by_column.items() if v} }")
    if not res.passed:
        gate_fail(ctx, st, res, "full window")
    record(ctx, state, "reconciled", st, version_read=version,
           gates=[g.to_dict() for g in res.gates],
           preview=res.preview.to_dict() if res.preview else None)

