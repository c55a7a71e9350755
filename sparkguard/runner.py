"""Build the run as an ordered list of small stages (pure), explain it, and evaluate it."""

from __future__ import annotations

from dataclasses import dataclass, field

from sparkguard.guard import target_order, window_partitions
from sparkguard.plan.model import BackfillPlan

__all__ = ["RunOptions", "Stage", "build_stages", "explain", "slices_of", "stage_line", "timing"]


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
    """One step of the run; ``kind`` picks the implementation in :mod:`sparkguard.execute`."""

    kind: str
    detail: str
    target: str | None = None
    partitions: tuple[str, ...] = field(default=())
    slice_id: int | None = None


def timing(elapsed_s: float, done: int, total: int) -> str:
    """``elapsed 20.0s, about 20s left``: the time so far and, once a step of ``total`` has
    finished, the mean time of a finished step times the steps not finished."""
    left = f", about {elapsed_s / done * (total - done):.0f}s left" if done else ""
    return f"elapsed {elapsed_s:.1f}s{left}"


def stage_line(index: int, count: int, stage: Stage, elapsed_s: float, done: int) -> str:
    """The progress line printed as ``stage`` starts: its place in the run and its
    :func:`timing` (the stages still to run include this one; each slice counts as one stage)."""
    return f"stage {index}/{count} {stage.kind}: {stage.detail} ({timing(elapsed_s, done, count)})"


def slices_of(values: list[object], size: int) -> list[list[object]]:
    """Split the window's partitions into consecutive slices of ``size``."""
    return [values[i:i + size] for i in range(0, len(values), size)]


def build_stages(plan: BackfillPlan, options: RunOptions) -> list[Stage]:
    """The run, in order. The first slice of each target is its proof."""
    targets = target_order(plan)
    parts = window_partitions(plan)
    slices = slices_of(parts, plan.execution.slice_partitions)
    labels = ", ".join(t.label for t in targets)
    workers = plan.execution.max_concurrent_slices
    stages = [
        Stage("guard", "static checks, approvals for this fingerprint, live checks"),
        Stage("lock", f"read the ledger once; resume or start a run; lock targets ({labels}); "
              "pin the source version"),
    ]
    if not options.dry_run:
        stages.append(Stage("pause", f"set this run's publish hold on {labels}; notify "
                            f"{', '.join(plan.safeguards.downstream_notifications) or 'nobody'}"))
    for t in targets:
        first = tuple(str(p) for p in slices[0]) if slices else ()
        stages.append(Stage("proof", f"{t.label}: write slice 1 twice (idempotency), reconcile it",
                            t.label, first, 1))
    for t in targets:
        for i, sl in enumerate(slices[1:], start=2):
            stages.append(Stage("slice", f"{t.label}: write and reconcile slice {i}/{len(slices)}"
                                f" (up to {workers} at once)", t.label,
                                tuple(str(p) for p in sl), i))
    for t in targets:
        stages.append(Stage("reconcile", f"{t.label}: full-window gates and change preview",
                            t.label, tuple(str(p) for p in parts)))
    if options.dry_run:
        stages.append(Stage("dry_run_stop", "dry run: record it in the ledger, write evidence, "
                            "stop (target and publish state untouched)"))
        return stages
    for t in targets:
        stages.append(Stage("promote", f"{t.label}: read the rollback point, promote by "
                            f"{t.promotion.value} in one commit (re-reconcile if the target "
                            "moved), verify against the shadow", t.label))
    stages.append(Stage("evidence", "write evidence (YAML + Markdown)"))
    stages.append(Stage("resume", "release this run's publish hold, notify, release locks"))
    return stages


def explain(stages: list[Stage]) -> str:
    """Numbered list of the stages, as ``--explain`` prints it."""
    lines = []
    for i, s in enumerate(stages, 1):
        parts = f" [{', '.join(s.partitions)}]" if s.partitions and s.kind != "reconcile" else ""
        lines.append(f"{i:2}. {s.kind:<13} {s.detail}{parts}")
    return "\n".join(lines)
