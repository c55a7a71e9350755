"""Guard rules on the affected window: partitions or a ``window_column`` range (static)."""

from __future__ import annotations

import datetime as dt

from sparkguard.guard_findings import Collector
from sparkguard.plan.model import BackfillPlan
from sparkguard.plan.window_spec import bucket_count, window_problems
from sparkguard.sql import PartitionType, UnsafeSQLError

__all__ = ["window_rules"]


def window_rules(plan: BackfillPlan, c: Collector) -> None:
    """The affected window: declared, bounded, consistent and not too large."""
    w = plan.affected_window
    if plan.window_column is not None:
        _range_window(plan, c)
        return
    if plan.partitioning is None:
        cols = sorted(set(plan.partition_prefixes()))
        hint = f" (the partitions suggest column {cols[0]!r})" if len(cols) == 1 else ""
        c.add("partitioning_missing", "partitioning",
              f"the partition column and type are not declared{hint}",
              "add partitioning: {column: <col>, type: date|string|int}", unfilled=True)
    elif plan.partition_prefixes():
        others = sorted(set(plan.partition_prefixes()) - {plan.partitioning.column})
        if others:
            c.add("partition_column_mismatch", "affected_window.partitions",
                  f"partitions name column(s) {others} but partitioning.column is "
                  f"{plan.partitioning.column!r}", "make them name the same column")
    bounded = w.start_utc is not None and w.end_utc is not None
    if not bounded:
        missing = [n for n, v in (("start_utc", w.start_utc), ("end_utc", w.end_utc)) if v is None]
        c.add("window_unbounded", "affected_window." + missing[0],
              f"{' and '.join(missing)} not set: the window is unbounded",
              "bound the window: start_utc inclusive, end_utc exclusive", unfilled=True)
    elif w.end_utc <= w.start_utc:  # type: ignore[operator]
        c.add("window_inverted", "affected_window.end_utc",
              f"end_utc {w.end_utc:%Y-%m-%dT%H:%M:%SZ} is not after start_utc "
              f"{w.start_utc:%Y-%m-%dT%H:%M:%SZ}",
              "end_utc is exclusive and must be later than start_utc")
    is_date = plan.partitioning is not None and plan.partitioning.type is PartitionType.DATE
    if bounded and is_date:
        for name, bound in (("start_utc", w.start_utc), ("end_utc", w.end_utc)):
            assert bound is not None
            if bound.hour or bound.minute or bound.second or bound.microsecond:
                c.add("window_not_aligned", f"affected_window.{name}",
                      f"{name} {bound:%Y-%m-%dT%H:%M:%SZ} is not midnight UTC; whole daily "
                      "partitions are recomputed", "align the window to partition boundaries")
    try:
        listed = plan.partition_values()
    except UnsafeSQLError as exc:
        c.add("partition_value_invalid", "affected_window.partitions", str(exc),
              "write partition values as plain literals of the partition type")
        return
    if len(set(listed)) != len(listed):
        c.add("partitions_duplicated", "affected_window.partitions", "a partition is listed twice",
              "list each partition once")
    range_days = plan.range_days() if is_date and bounded else None
    count = max(len(set(listed)), range_days or 0)
    if count > w.max_partitions:
        c.add("window_too_large", "affected_window",
              f"{count} partitions exceed the plan's max_partitions {w.max_partitions}",
              "split the backfill, or raise affected_window.max_partitions deliberately")
        return
    if plan.partitioning is not None and count == 0 and not any(
            f.code.startswith("window_") for f in c.findings):
        c.add("window_empty", "affected_window.partitions", "the window has no partitions",
              "list the partitions (or give start_utc/end_utc for date partitions)")
    days = listed if range_days else _as_days(plan, listed) if bounded else None
    if listed and days is not None:
        implied = set(plan.window_partitions_from_range() or [])
        if set(days) != implied:
            shown = dict(zip(days, listed, strict=True))  # as the plan writes them
            extra = sorted(str(shown[x]) for x in set(days) - implied)
            missing = sorted(_spelt(x, days is listed) for x in implied - set(days))
            c.add("partitions_inconsistent", "affected_window.partitions",
                  f"partitions disagree with [start_utc, end_utc): outside the range "
                  f"{_few(extra)}, missing from the list {_few(missing)}",
                  "end_utc is exclusive; make the list match the range")


def _as_days(plan: BackfillPlan, listed: list[object]) -> list[object] | None:
    """Integer partitions that are all eight-digit ``yyyymmdd`` numbers (``20261201``), as
    dates (one that is no calendar day, ``20261232``, stays a number: in no range): the list is
    what the run replaces, so it must agree with the range reviewers read. None for other
    integers (an hour id, a store number), which the range cannot be checked against."""
    if plan.partitioning is None or plan.partitioning.type is not PartitionType.INT:
        return None
    if not all(isinstance(v, int) and 1900_01_01 <= v <= 9999_12_31 for v in listed):
        return None
    out: list[object] = []
    for v in listed:
        assert isinstance(v, int)
        try:
            out.append(dt.date(v // 10000, v // 100 % 100, v % 100))
        except ValueError:
            out.append(v)
    return out


def _spelt(day: dt.date, as_date: bool) -> str:
    return str(day) if as_date else day.strftime("%Y%m%d")


def _range_window(plan: BackfillPlan, c: Collector) -> None:
    """A ``window_column`` window: bounded, not inverted, exactly expressible, not too large."""
    w = plan.affected_window
    if w.start_utc is None or w.end_utc is None:
        missing = [n for n, v in (("start_utc", w.start_utc), ("end_utc", w.end_utc)) if v is None]
        c.add("window_unbounded", "affected_window." + missing[0],
              f"{' and '.join(missing)} not set: the window is unbounded",
              "bound the window: start_utc inclusive, end_utc exclusive", unfilled=True)
    elif w.end_utc <= w.start_utc:
        c.add("window_inverted", "affected_window.end_utc",
              f"end_utc {w.end_utc.isoformat()} is not after start_utc {w.start_utc.isoformat()}",
              "end_utc is exclusive and must be later than start_utc")
    problems = window_problems(plan)
    for path, msg, fix in problems:
        c.add("window_not_exact", path, msg, fix)
    if problems or w.start_utc is None or w.end_utc is None or w.end_utc <= w.start_utc:
        return
    assert plan.window_column is not None
    count = bucket_count(plan.window_column, w.start_utc, w.end_utc)  # none built yet
    if count > w.max_partitions:
        c.add("window_too_large", "affected_window",
              f"{count} buckets exceed the plan's max_partitions {w.max_partitions}",
              "split the backfill, use window_column.bucket: day, or raise "
              "affected_window.max_partitions deliberately")


def _few(items: list[str], n: int = 5) -> str:
    return str(items[:n])[:-1] + f", ... {len(items) - n} more]" if len(items) > n else str(items)
