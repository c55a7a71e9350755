"""Window maths the guard and the run share (pure): partitions, target order, slices, waves.

``auto`` slicing: the proof slice is the window's first partition alone (the smallest bounded
piece to write twice); the remaining partitions are grouped, in order, into slices of about
:data:`AUTO_ROWS_PER_SLICE` source rows. Waves group consecutive slices after the proof: a
wave holds at most :data:`WAVE_MAX_ROWS` source rows and :data:`WAVE_MAX_SLICES` slices, so a
failing gate stops the run after a bounded amount of work. ``docs/state-machine.md`` explains
the choice of numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Literal, TypeVar

from sparkguard.plan.model import BackfillPlan, TargetSpec
from sparkguard.plan.window_spec import range_window
from sparkguard.sql import PartitionType

_T = TypeVar("_T")

__all__ = ["AUTO_ROWS_PER_SLICE", "WAVE_MAX_ROWS", "WAVE_MAX_SLICES", "plan_slices",
           "slice_setting", "slices_of", "target_order", "waves_of", "window_partitions"]

AUTO_ROWS_PER_SLICE = 2_000_000
WAVE_MAX_ROWS = 8_000_000
WAVE_MAX_SLICES = 64


def window_partitions(plan: BackfillPlan) -> list[object]:
    """The window's typed partitions: as listed, or derived from [start_utc, end_utc) for dates;
    for a ``window_column`` window, its bucket labels ([] when it cannot be built).

    Raises UnsafeSQLError when a listed value is not a literal of the partition type.
    """
    if plan.window_column is not None:
        try:
            rw = range_window(plan)
        except ValueError:
            return []
        return list(rw.labels) if rw is not None else []
    listed = plan.partition_values()
    if listed:
        return sorted(dict.fromkeys(listed))  # type: ignore[type-var]
    if plan.partitioning and plan.partitioning.type is PartitionType.DATE:
        return list(plan.window_partitions_from_range() or [])
    return []


def slice_setting(plan: BackfillPlan) -> int | Literal["auto"]:
    """Units per slice: ``execution.slice_partitions``, or buckets per ``window_column.slice``."""
    if plan.window_column is not None:
        try:
            rw = range_window(plan)
        except ValueError:
            rw = None
        if rw is not None:
            return rw.slice
    return plan.execution.slice_partitions


def target_order(plan: BackfillPlan) -> list[TargetSpec]:
    """Targets in dependency order (``depends_on``); raises ValueError on unknown or cycles."""
    specs = plan.target_specs()
    by_label = {t.label: t for t in specs}
    order: list[TargetSpec] = []
    state: dict[str, int] = {}

    def visit(t: TargetSpec, trail: tuple[str, ...]) -> None:
        if state.get(t.label) == 2:
            return
        if state.get(t.label) == 1:
            raise ValueError("targets depend on each other in a cycle: "
                             + " -> ".join([*trail, t.label]))
        state[t.label] = 1
        for dep in t.depends_on:
            if dep not in by_label:
                raise ValueError(f"target {t.label!r} depends on unknown target {dep!r}")
            visit(by_label[dep], (*trail, t.label))
        state[t.label] = 2
        order.append(t)

    for t in specs:
        visit(t, ())
    return order


def slices_of(values: list[object], size: int) -> list[list[object]]:
    """Split the window's partitions into consecutive slices of ``size``."""
    return [values[i:i + size] for i in range(0, len(values), size)]


def _rows(counts: Mapping[str, int] | None, part: object) -> int:
    return int(counts.get(str(part), 0)) if counts else 0


def _consecutive_groups(items: Iterable[_T], weight: Callable[[_T], int],
                        max_weight: int | None, max_items: int | None = None) -> list[list[_T]]:
    """Consecutive items grouped greedily: a group closes before it would pass ``max_weight``
    or ``max_items`` (None: no bound); an item heavier than the bound is a group of its own."""
    groups: list[list[_T]] = []
    current: list[_T] = []
    total = 0
    for item in items:
        w = weight(item)
        if current and ((max_weight is not None and total + w > max_weight)
                        or (max_items is not None and len(current) >= max_items)):
            groups.append(current)
            current, total = [], 0
        current.append(item)
        total += w
    if current:
        groups.append(current)
    return groups


def plan_slices(parts: list[object], setting: int | Literal["auto"],
                counts: Mapping[str, int] | None = None,
                rows_per_slice: int = AUTO_ROWS_PER_SLICE) -> list[list[object]]:
    """The window's slices; the first is the proof slice.

    An explicit number keeps its meaning (that many partitions per slice). ``auto`` makes the
    first partition the proof slice and groups the rest towards ``rows_per_slice`` rows, from
    ``counts`` (source rows per partition, keyed by ``str(partition)``); without counts (e.g.
    ``--explain`` before any Spark) every remaining partition goes into one slice.
    """
    if setting != "auto":
        return slices_of(parts, int(setting))
    if not parts:
        return []
    limit = rows_per_slice if counts is not None else None
    return [[parts[0]], *_consecutive_groups(parts[1:], lambda p: _rows(counts, p), limit)]


def waves_of(slices: Sequence[Sequence[object]], counts: Mapping[str, int] | None = None,
             max_rows: int | None = None, max_slices: int | None = None) -> list[list[int]]:
    """Group slice indexes (0-based, the proof excluded) into waves of consecutive slices.

    A wave closes before it would pass ``max_rows`` source rows or ``max_slices`` slices
    (default :data:`WAVE_MAX_ROWS`, :data:`WAVE_MAX_SLICES`); a single slice larger than
    ``max_rows`` is a wave of its own.
    """
    max_rows = WAVE_MAX_ROWS if max_rows is None else max_rows
    max_slices = WAVE_MAX_SLICES if max_slices is None else max_slices
    return _consecutive_groups(range(1, len(slices)),
                               lambda i: sum(_rows(counts, p) for p in slices[i]),
                               max_rows, max_slices)
