"""The run as an ordered list of small stage dataclasses (pure); ``--explain`` prints it.

:func:`build_stages` is the one description of a run: the evaluator
(:mod:`sparkguard.run.evaluator`) walks the same list, dispatching each stage type to its
handler. Nothing here touches Spark.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from sparkguard.plan.model import BackfillPlan, TargetSpec
from sparkguard.plan.window import (
    AUTO_ROWS_PER_SLICE,
    plan_slices,
    slice_setting,
    target_order,
    waves_of,
    window_partitions,
)
from sparkguard.plan.window_spec import range_window

__all__ = ["DryRunStop", "Evidence", "Guard", "Lock", "Pause", "Promote", "Proof", "Reconcile",
           "Resume", "RunOptions", "Stage", "Wave", "build_stages", "explain", "stage_line",
           "timing", "wave_writers"]


@dataclass(frozen=True)
class RunOptions:
    """Flags of one invocation.

    ``promote_attempts`` bounds how often a promotion is prepared again after the target moved
    or a Delta conflict (each attempt re-reconciles the window against the new version).
    """

    dry_run: bool = False
    takeover_stale_lock: bool = False
    stale_lock_after_s: float = 6 * 3600
    explain: bool = False
    promote_attempts: int = 3
    conflict_backoff_s: float = 2.0


@dataclass(frozen=True)
class Stage:
    """One step of the run; its type picks the handler (``visit_<kind>``)."""

    kind: ClassVar[str] = "stage"
    detail: str
    target: str | None = None
    partitions: tuple[str, ...] = field(default=())
    slice_id: int | None = None


@dataclass(frozen=True)
class Guard(Stage):
    kind: ClassVar[str] = "guard"


@dataclass(frozen=True)
class Lock(Stage):
    kind: ClassVar[str] = "lock"


@dataclass(frozen=True)
class Pause(Stage):
    kind: ClassVar[str] = "pause"


@dataclass(frozen=True)
class Proof(Stage):
    """The first slice of a target: written twice (same content hash), reconciled alone."""

    kind: ClassVar[str] = "proof"


@dataclass(frozen=True)
class Wave(Stage):
    """Consecutive slices written with bounded concurrency and reconciled once together.

    ``slices`` are the wave's slices (1-based ids in ``slice_ids``); ``last`` marks a target's
    last wave, whose gates are those of the full-window reconciliation that follows at once.
    """

    kind: ClassVar[str] = "wave"
    wave: int = 0
    slices: tuple[tuple[str, ...], ...] = ()
    slice_ids: tuple[int, ...] = ()
    last: bool = False


@dataclass(frozen=True)
class Reconcile(Stage):
    kind: ClassVar[str] = "reconcile"


@dataclass(frozen=True)
class DryRunStop(Stage):
    kind: ClassVar[str] = "dry_run_stop"


@dataclass(frozen=True)
class Promote(Stage):
    kind: ClassVar[str] = "promote"


@dataclass(frozen=True)
class Evidence(Stage):
    kind: ClassVar[str] = "evidence"


@dataclass(frozen=True)
class Resume(Stage):
    kind: ClassVar[str] = "resume"


def timing(elapsed_s: float, left_s: float | None) -> str:
    """``elapsed 20.0s, about 20s left``: the estimate only once there is one."""
    left = f", about {left_s:.0f}s left" if left_s is not None else ""
    return f"elapsed {elapsed_s:.1f}s{left}"


def estimate_left(work_s: float, work_rows: int, rows_left: int) -> float | None:
    """Seconds left from the measured cost per source row of the slices written so far
    (write + reconcile), times the rows still to write and reconcile; None before any."""
    if work_rows <= 0 or work_s <= 0:
        return None
    return work_s / work_rows * rows_left


def stage_line(index: int, count: int, stage: Stage, elapsed_s: float,
               left_s: float | None = None) -> str:
    """The progress line printed as ``stage`` starts: its place in the run and its timing."""
    return f"stage {index}/{count} {stage.kind}: {stage.detail} ({timing(elapsed_s, left_s)})"


def _targets(plan: BackfillPlan) -> list[TargetSpec]:
    try:
        return target_order(plan)
    except ValueError:  # a cycle: the guard refuses the plan; --explain still lists it
        return plan.target_specs()


def wave_writers(plan: BackfillPlan) -> int:
    """Shadow commits written at once in a wave. A timestamp window's shadow is unpartitioned
    and takes one: Delta checks each concurrent ``replaceWhere``'s added files against the
    other's data predicate, which it cannot evaluate without partitions, so they conflict."""
    try:
        rw = range_window(plan)
    except ValueError:  # the static guard says why; --explain still lists the stages
        return 1
    if rw is not None and not rw.partition_by:
        return 1
    return max(1, plan.execution.max_concurrent_slices)


def build_stages(plan: BackfillPlan, options: RunOptions,
                 rows: Mapping[str, int] | None = None) -> list[Stage]:
    """The run, in order. The first slice of each target is its proof; ``rows`` (source rows per
    partition, from the live guard) sizes ``auto`` slices and waves."""
    targets = _targets(plan)
    parts = window_partitions(plan)
    setting = slice_setting(plan)
    slices = plan_slices(parts, setting, rows)
    waves = waves_of(slices, rows)
    labels = ", ".join(t.label for t in targets)
    workers = wave_writers(plan)
    sizing = (f"auto slices (~{AUTO_ROWS_PER_SLICE:,} source rows each"
              + ("" if rows is not None else ", sized from row counts at run time") + ")"
              if setting == "auto" else f"{setting} {'bucket' if plan.window_column else 'partition'}"
              "(s) per slice")
    stages: list[Stage] = [
        Guard("static checks, approvals for this fingerprint, live checks (row counts)"),
        Lock(f"read the ledger once; resume or start a run; lock targets ({labels}); "
             "pin the source version"),
    ]
    if not options.dry_run:
        stages.append(Pause(f"set this run's publish hold on {labels}; notify "
                            f"{', '.join(plan.safeguards.downstream_notifications) or 'nobody'}"))
    first = tuple(str(p) for p in slices[0]) if slices else ()
    for t in targets:
        stages.append(Proof(f"{t.label}: write slice 1 twice (idempotency), reconcile it alone",
                            t.label, first, 1))
    for t in targets:
        for w, idx in enumerate(waves, start=1):
            sl = tuple(tuple(str(p) for p in slices[i]) for i in idx)
            last = w == len(waves)
            gated = ("gated by the full-window reconciliation" if last
                     else "reconciled once, per-partition verdicts")
            stages.append(Wave(
                f"{t.label}: wave {w}/{len(waves)}: write slices {idx[0] + 1}-{idx[-1] + 1} of "
                f"{len(slices)} ({sizing}, up to {workers} at once), {gated}",
                t.label, tuple(p for s in sl for p in s), idx[0] + 1, wave=w, slices=sl,
                slice_ids=tuple(i + 1 for i in idx), last=last))
    for t in targets:
        stages.append(Reconcile(f"{t.label}: full-window gates and change preview",
                                t.label, tuple(str(p) for p in parts)))
    if options.dry_run:
        stages.append(DryRunStop("dry run: record it in the ledger, write evidence, stop "
                                 "(target and publish state untouched)"))
        return stages
    for t in targets:
        stages.append(Promote(f"{t.label}: read the rollback point, promote by "
                              f"{t.promotion.value} in one commit (re-reconcile if the target "
                              "moved), verify against the shadow", t.label))
    stages.append(Evidence("write evidence (YAML + Markdown)"))
    stages.append(Resume("release this run's publish hold, notify, release locks"))
    return stages


def explain(stages: list[Stage]) -> str:
    """Numbered list of the stages, as ``--explain`` prints it."""
    lines = []
    for i, s in enumerate(stages, 1):
        shown = s.partitions
        if len(shown) > 6:
            shown = (*shown[:2], f"... {len(shown) - 3} more ...", shown[-1])
        parts = f" [{', '.join(shown)}]" if shown and s.kind != "reconcile" else ""
        lines.append(f"{i:2}. {s.kind:<13} {s.detail}{parts}")
    return "\n".join(lines)
