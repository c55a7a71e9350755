"""Shadow stages: the proof slice (written twice, reconciled alone) and the waves after it."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from sparkguard import delta_ops, faults
from sparkguard.errors import GateFailedError
from sparkguard.reconcile.engine import table_fingerprint
from sparkguard.reconcile.verdicts import ReconcileResult
from sparkguard.run.context import RunContext, RunState, TargetState, record
from sparkguard.run.data import job, print_gates, reconcile_part, shadow_df, transform
from sparkguard.run.stages import Proof, Wave, estimate_left, wave_writers

__all__ = ["gate_fail", "record_wave", "visit_proof", "visit_wave", "write_parts"]


def write_parts(ctx: RunContext, state: RunState, st: TargetState,
                partitions: Sequence[object], sid: int, what: str) -> None:
    """One shadow commit: ``replaceWhere`` over exactly ``partitions``."""
    job(ctx, state, f"run {state.run_id} target {st.spec.label} {what}: shadow write")
    df, views = transform(ctx, state, st, partitions, f"{st.spec.label}_{sid}")
    try:
        delta_ops.write_partitions(
            df, st.shadow, ctx.window.pred(partitions), ctx.window.partition_by,
            metadata=delta_ops.user_metadata(state.run_id, ctx.fingerprint, "shadow_write",
                                             slice=sid))
    finally:
        for v in views:
            ctx.spark.catalog.dropTempView(v)


def record_wave(ctx: RunContext, state: RunState, st: TargetState, sid: int,
                partitions: Sequence[object], res: ReconcileResult, seconds: float,
                h: dict[str, int] | None = None) -> None:
    """One ``slices`` ledger event for a proof slice or a whole wave (``res`` may cover more
    partitions, the full window's for the last wave: the rows counted are the wave's)."""
    mine = {str(p) for p in partitions}
    rows = sum(p.rows_shadow for p in res.partitions if p.partition in mine)
    ctx.ledger.record_slice(
        state.run_id, ctx.fingerprint, st.spec.label, sid, [str(p) for p in partitions],
        "reconciled" if res.passed else "gate_failed", state.source_version,
        rows=rows, content_hash=json.dumps(h) if h else None,
        elapsed_s=round(seconds, 3), gates=[g.to_dict() for g in res.gates])
    if res.passed:
        with state.lock:
            state.done[st.spec.label].update(str(p) for p in partitions)


def gate_fail(ctx: RunContext, st: TargetState, res: ReconcileResult, where: str) -> None:
    print_gates(ctx, st.spec.label, res)
    worst = res.failed[0]
    raise GateFailedError(f"{st.spec.label}: {where}: gate {worst.gate} failed: {worst.reason}")


def _rows(ctx: RunContext, partitions: Sequence[object]) -> int:
    return sum(int((ctx.window.rows or {}).get(str(p), 0)) for p in partitions)


def visit_proof(stage: Proof, ctx: RunContext, state: RunState) -> None:
    st = state.targets[stage.target or ""]
    parts = list(ctx.window.slices[0])
    t1 = time.monotonic()
    prior = state.proof_done.get(st.spec.label)
    if prior is not None:
        st.proof_hash = json.loads(prior["content_hash"]) if prior.get("content_hash") else None
        st.skipped_slices.append(1)
        ctx.say(f"{st.spec.label}: proof slice {[str(p) for p in parts]} already written twice "
                f"and reconciled for this plan and source version (run {prior['run_id']}); "
                "skipped")
        return
    write_parts(ctx, state, st, parts, 1, "slice 1")
    faults.failpoint("mid_shadow_write")
    h1 = table_fingerprint(shadow_df(ctx, st, parts))
    write_parts(ctx, state, st, parts, 1, "slice 1")
    h2 = table_fingerprint(shadow_df(ctx, st, parts))
    if h1 != h2:
        raise GateFailedError(
            f"{st.spec.label}: idempotency proof failed: writing slice 1 twice gave different "
            f"content ({h1} vs {h2}); make the transform deterministic")
    st.proof_hash = h1
    job(ctx, state, f"run {state.run_id} target {st.spec.label} slice 1: reconcile")
    res = reconcile_part(ctx, state, st, parts, "proof slice 1")
    st.slice_results.append(res)
    record_wave(ctx, state, st, 1, parts, res, time.monotonic() - t1, h1)
    ctx.say(f"{st.spec.label}: proof slice {[str(p) for p in parts]}: {h1['rows']} rows, written "
            f"twice with identical content hash; gates {'passed' if res.passed else 'FAILED'} "
            f"({time.monotonic() - t1:.1f}s)")
    if not res.passed:
        gate_fail(ctx, st, res, "proof slice")
    record(ctx, state, "proof_passed", st, content_hash=h1)
    faults.failpoint("after_proof")


def _groups(slices: Sequence[Sequence[str]], ids: Sequence[int], workers: int
            ) -> list[tuple[int, list[str]]]:
    """The wave's slices in up to ``workers`` contiguous groups, one shadow commit each
    (tagged with the group's first slice id)."""
    n = max(1, min(workers, len(slices)))
    size = -(-len(slices) // n)
    return [(ids[i], [p for s in slices[i:i + size] for p in s])
            for i in range(0, len(slices), size)]


def visit_wave(stage: Wave, ctx: RunContext, state: RunState) -> None:
    """Write the wave's unfinished slices (``max_concurrent_slices`` commits at once), then
    reconcile the wave once with per-partition verdicts and record it once. A target's last
    wave is gated by the full-window reconciliation that follows (same verdicts, one pass)."""
    st, label = state.targets[stage.target or ""], stage.target or ""
    todo_ids = [i for s, i in zip(stage.slices, stage.slice_ids, strict=True)
                if not set(s) <= state.done[label]]
    todo = [s for s in stage.slices if not set(s) <= state.done[label]]
    ids = f"{stage.slice_ids[0]}-{stage.slice_ids[-1]}/{len(ctx.window.slices)}"
    if not todo:
        st.skipped_slices.extend(stage.slice_ids)
        ctx.say(f"{label}: wave {stage.wave} (slices {ids}) already reconciled; skipped")
        return
    t1 = time.monotonic()
    typed = {str(p): p for p in ctx.window.partitions}  # a callable gets typed values
    parts = [typed[p] for s in todo for p in s]
    workers = wave_writers(ctx.plan)
    groups = [(i, [typed[p] for p in g]) for i, g in _groups(todo, todo_ids, workers)]
    sid = stage.slice_ids[0]
    with ThreadPoolExecutor(max_workers=len(groups)) as pool:
        list(pool.map(lambda g: write_parts(ctx, state, st, g[1], g[0], f"wave {stage.wave} "
                                            f"slice {g[0]}"), groups))
    rows = _rows(ctx, parts)
    if stage.last:
        st.pending_wave = (sid, tuple(parts))
        verdict = "gates with the full window"
    else:
        job(ctx, state, f"run {state.run_id} target {label} wave {stage.wave}: reconcile")
        res = reconcile_part(ctx, state, st, parts, f"wave {stage.wave} (slices {ids})")
        st.slice_results.append(res)
        record_wave(ctx, state, st, sid, parts, res, time.monotonic() - t1)
        rows = int(res.totals().get("rows_source", rows))
        verdict = f"gates {'passed' if res.passed else 'FAILED'}"
        if not res.passed:
            gate_fail(ctx, st, res, f"wave {stage.wave}")
    with state.lock:
        state.work_s += time.monotonic() - t1
        state.work_rows += rows
    left = estimate_left(state.work_s, state.work_rows, rows_left(ctx, state))
    ctx.say(f"{label}: wave {stage.wave} slices {ids} ({len(parts)} partitions, "
            f"{len(groups)} commit(s)): {rows} rows, {verdict}; elapsed {ctx.elapsed():.1f}s"
            + (f", about {left:.0f}s left" if left is not None else ""))
    faults.failpoint("mid_slices")


def rows_left(ctx: RunContext, state: RunState) -> int:
    """Source rows still to write (waves) and to reconcile (each target's full window)."""
    total = _rows(ctx, ctx.window.partitions)
    left = 0
    for label, st in state.targets.items():
        left += total - _rows(ctx, [p for p in ctx.window.partitions
                                    if str(p) in state.done[label]])
        if st.window is None:
            left += total
    return left
