"""Time-range windows (pure): buckets, slices and exact predicates for ``window_column`` plans.

A plan with ``window_column`` bounds ``[start_utc, end_utc)`` on a timestamp column (to the
microsecond) or on a date + hour partition pair. The window is cut into buckets (an hour or a
day, UTC, clipped to the window): the run's unit of slicing and of per-bucket verdicts, named
by labels ``2026-03-10T05`` (hour) or ``2026-03-10`` (day) that sort in time order.

Predicates carry explicit UTC literals (``TIMESTAMP_LTZ'... +00:00'``), so the session time
zone cannot move the window; the bucket expression the reconciliation groups by is computed
from epoch microseconds (``timestamp``) or from the zone-less value (``timestamp_ntz``,
``date_hour``), for the same reason.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from sparkguard.plan.model import BackfillPlan, WindowColumn, WindowType
from sparkguard.sql import UnsafeSQLError, quote_identifier

__all__ = ["BUCKET_COLUMN", "Bucket", "RangeWindow", "bucket_count", "bucket_grain", "range_window",
           "slice_buckets", "window_problems"]

BUCKET_COLUMN = "__sg_bucket"  # the column reconciliation groups by (added to each side)
_HOUR = dt.timedelta(hours=1)
_DAY = dt.timedelta(days=1)
_MICROS_HOUR = 3_600_000_000
_MICROS_DAY = 86_400_000_000
_AUTO_BUCKET_HOURS = 48  # windows up to this long get hour buckets by default


@dataclass(frozen=True)
class Bucket:
    """One bucket: its label and its part of the window, ``[lo, hi)`` (aware UTC)."""

    label: str
    lo: dt.datetime
    hi: dt.datetime


def bucket_grain(wc: WindowColumn, start: dt.datetime, end: dt.datetime) -> Literal["hour", "day"]:
    """The bucket declared, else hour for a window of up to 2 days, else day."""
    if wc.bucket is not None:
        return wc.bucket
    return "hour" if end - start <= dt.timedelta(hours=_AUTO_BUCKET_HOURS) else "day"


def bucket_count(wc: WindowColumn, start: dt.datetime, end: dt.datetime) -> int:
    """How many buckets ``[start, end)`` has, computed without building them."""
    grain = bucket_grain(wc, start, end)
    step = _DAY if grain == "day" else _HOUR
    return max(0, -(-(end - _floor(start, grain)) // step))


def _label(t: dt.datetime, grain: str) -> str:
    return f"{t:%Y-%m-%d}" if grain == "day" else f"{t:%Y-%m-%dT%H}"


def _floor(t: dt.datetime, grain: str) -> dt.datetime:
    t = t.replace(minute=0, second=0, microsecond=0)
    return t.replace(hour=0) if grain == "day" else t


def slice_buckets(setting: str, grain: str) -> int | Literal["auto"]:
    """Buckets per slice for ``window_column.slice``; raises ValueError when the slice is not a
    whole number of buckets."""
    if setting == "auto":
        return "auto"
    n, unit = int(setting[:-1]), setting[-1]
    hours = n * 24 if unit == "d" else n
    if grain == "hour":
        return hours
    if hours % 24:
        raise ValueError(f"slice {setting!r} is not a whole number of day buckets")
    return hours // 24


@dataclass(frozen=True)
class RangeWindow:
    """A window bounded on a timestamp column or a date + hour pair, cut into buckets."""

    column: str
    type: WindowType
    hour_column: str | None
    grain: Literal["hour", "day"]
    buckets: tuple[Bucket, ...]
    slice: int | Literal["auto"]

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(b.label for b in self.buckets)

    @property
    def partition_by(self) -> tuple[str, ...]:
        """Partition columns of the shadow table (none for a timestamp window)."""
        if self.type is WindowType.DATE_HOUR:
            assert self.hour_column is not None
            return (self.column, self.hour_column)
        return ()

    def ranges(self, labels: Sequence[object]) -> list[tuple[dt.datetime, dt.datetime]]:
        """The buckets named by ``labels`` as merged ``[lo, hi)`` ranges, in time order."""
        wanted = {str(x) for x in labels}
        unknown = wanted - set(self.labels)
        if unknown:
            raise UnsafeSQLError(f"bucket(s) {sorted(unknown)[:5]} are not in the window")
        out: list[tuple[dt.datetime, dt.datetime]] = []
        for b in self.buckets:
            if b.label not in wanted:
                continue
            if out and out[-1][1] == b.lo:
                out[-1] = (out[-1][0], b.hi)
            else:
                out.append((b.lo, b.hi))
        return out

    def predicate(self, labels: Sequence[object], alias: str | None = None) -> str:
        """The exact predicate over the rows of the buckets named by ``labels``."""
        ranges = self.ranges(labels)
        if not ranges:
            raise UnsafeSQLError("a window predicate needs at least one bucket")
        pre = f"{quote_identifier(alias)}." if alias else ""
        if self.type is WindowType.DATE_HOUR:
            terms = _date_hour_terms(ranges, pre + quote_identifier(self.column),
                                     pre + quote_identifier(self.hour_column or ""))
        else:
            col = pre + quote_identifier(self.column)
            terms = [f"({col} >= {self.literal(lo)} AND {col} < {self.literal(hi)})"
                     for lo, hi in ranges]
        return terms[0] if len(terms) == 1 else "(" + " OR ".join(terms) + ")"

    def literal(self, t: dt.datetime) -> str:
        """A timestamp literal that means ``t`` (UTC) whatever the session time zone."""
        t = t.astimezone(dt.UTC)
        if self.type is WindowType.TIMESTAMP_NTZ:
            return f"TIMESTAMP_NTZ'{t:%Y-%m-%d %H:%M:%S.%f}'"
        return f"TIMESTAMP_LTZ'{t:%Y-%m-%d %H:%M:%S.%f}+00:00'"

    def bucket_expr(self) -> str:
        """SQL giving each row its bucket label, independent of the session time zone."""
        c = quote_identifier(self.column)
        if self.type is WindowType.DATE_HOUR:
            day = f"CAST({c} AS STRING)"
            hour = f"CAST({quote_identifier(self.hour_column or '')} AS INT)"
        elif self.type is WindowType.TIMESTAMP_NTZ:
            day, hour = f"CAST(CAST({c} AS DATE) AS STRING)", f"hour({c})"
        else:
            micros = f"unix_micros({c})"
            days = f"CAST(({micros} - pmod({micros}, {_MICROS_DAY})) div {_MICROS_DAY} AS INT)"
            day = f"CAST(date_add(DATE'1970-01-01', {days}) AS STRING)"
            hour = f"CAST(pmod({micros}, {_MICROS_DAY}) div {_MICROS_HOUR} AS INT)"
        if self.grain == "day":
            return day
        return f"concat({day}, 'T', lpad(CAST({hour} AS STRING), 2, '0'))"


def _date_hour_terms(ranges: list[tuple[dt.datetime, dt.datetime]], dcol: str,
                     hcol: str) -> list[str]:
    """Hour-aligned ranges as ``(dt IN (whole days) AND hr >= 0 AND hr <= 23)`` and ``(dt = D
    AND hr IN (...))`` terms: a whole day is its hours 0-23, as in slices of it, not its rows
    with a NULL or out-of-range hour."""
    hours: dict[dt.date, list[int]] = {}
    for lo, hi in ranges:
        t = lo
        while t < hi:
            hours.setdefault(t.date(), []).append(t.hour)
            t += _HOUR
    whole = [d for d, hs in hours.items() if len(hs) == 24]
    terms = []
    if whole:
        days = ", ".join(f"DATE'{d.isoformat()}'" for d in whole)
        terms.append(f"({dcol} IN ({days}) AND {hcol} >= 0 AND {hcol} <= 23)")
    for d, hs in hours.items():
        if len(hs) < 24:
            terms.append(f"({dcol} = DATE'{d.isoformat()}' AND {hcol} IN "
                         f"({', '.join(str(h) for h in sorted(hs))}))")
    return terms


def range_window(plan: BackfillPlan) -> RangeWindow | None:
    """The plan's time-range window, or None for a partition-value window (``partitioning``).

    Raises ValueError when the window cannot be built (the static guard reports why first).
    """
    wc = plan.window_column
    if wc is None:
        return None
    problems = window_problems(plan)
    if problems:
        raise ValueError(f"{problems[0][0]}: {problems[0][1]}")
    start, end = plan.affected_window.start_utc, plan.affected_window.end_utc
    if start is None or end is None:
        raise ValueError("affected_window: start_utc and end_utc must both be set")
    count, limit = bucket_count(wc, start, end), plan.affected_window.max_partitions
    if count > limit:
        raise ValueError(f"affected_window: {count} buckets exceed max_partitions {limit}")
    grain = bucket_grain(wc, start, end)
    step = _DAY if grain == "day" else _HOUR
    buckets = []
    t = _floor(start, grain)
    while t < end:
        buckets.append(Bucket(_label(t, grain), max(t, start), min(t + step, end)))
        t += step
    return RangeWindow(wc.name, wc.type, wc.hour_column, grain, tuple(buckets),
                       slice_buckets(wc.slice, grain))


def window_problems(plan: BackfillPlan) -> list[tuple[str, str, str]]:
    """Why a ``window_column`` window cannot be expressed exactly: (field, message, fix)."""
    wc, w = plan.window_column, plan.affected_window
    if wc is None:
        return []
    out: list[tuple[str, str, str]] = []
    if plan.partitioning is not None:
        out.append(("partitioning", "both partitioning and window_column are set",
                    "keep window_column for a time-range window, or partitioning for a list of "
                    "partition values, not both"))
    if w.partitions:
        out.append(("affected_window.partitions", "a window_column window is the time range "
                    "[start_utc, end_utc); a list of partitions cannot be applied to it exactly",
                    "remove affected_window.partitions"))
    if wc.type is WindowType.DATE_HOUR and wc.hour_column is None:
        out.append(("window_column.hour_column", "date_hour needs the hour column",
                    "name the hour partition column (integer 0-23), e.g. hour_column: hr"))
    if wc.type is not WindowType.DATE_HOUR and wc.hour_column is not None:
        out.append(("window_column.hour_column", f"hour_column is only for date_hour, not "
                    f"{wc.type.value}", "remove hour_column"))
    if w.start_utc is None or w.end_utc is None or w.end_utc <= w.start_utc:
        return out  # the window rules report unbounded and inverted windows
    grain = bucket_grain(wc, w.start_utc, w.end_utc)
    if wc.type is WindowType.DATE_HOUR:
        for name, bound in (("start_utc", w.start_utc), ("end_utc", w.end_utc)):
            if bound.minute or bound.second or bound.microsecond:
                out.append((f"affected_window.{name}", f"{name} {bound.isoformat()} is not on a "
                            "whole hour: a date + hour partition window cannot stop inside an "
                            "hour", "round it to the hour, or bound the window on a timestamp "
                            "column (window_column.type: timestamp)"))
    try:
        slice_buckets(wc.slice, grain)
    except ValueError as exc:
        out.append(("window_column.slice", str(exc), "use a slice of whole days (1d, 2d) or "
                    "bucket: hour"))
    return out
