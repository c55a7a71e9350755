"""A table's columns and layout as ``plan init`` reads them, and the window column they give
(pure: the Spark side reads schemas and ``DESCRIBE DETAIL``)."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from sparkguard.draft.inputs import refuse
from sparkguard.sql import PartitionType

__all__ = ["Column", "Layout", "LayoutKind", "WindowColumn", "day_format", "window_column"]

_DAY_FORMATS_STRING = ("%Y-%m-%d", "%Y%m%d", "%Y/%m/%d")
_DAY_FORMATS_INT = ("%Y%m%d",)
_INTEGRAL = {"tinyint", "smallint", "int", "bigint"}
_FLOATS = {"float", "double"}


@dataclass(frozen=True)
class Column:
    """A table column as read from its schema (Spark ``simpleString`` type)."""

    name: str
    type: str
    nullable: bool = True
    comment: str = ""
    sql_type: str = ""  # the type as SQL text (nested names backquoted); "" for type.upper()

    @property
    def base(self) -> str:
        return self.type.split("(", 1)[0].split("<", 1)[0].lower()

    @property
    def is_float(self) -> bool:
        return self.base in _FLOATS

    @property
    def is_numeric(self) -> bool:
        return self.base in _INTEGRAL or self.base in _FLOATS or self.base == "decimal"

    @property
    def is_exact_numeric(self) -> bool:
        return self.is_numeric and not self.is_float

    @property
    def is_timestamp(self) -> bool:
        return self.base in ("timestamp", "timestamp_ntz")

    @property
    def key_eligible(self) -> bool:
        """A type whose equality is exact and meaningful for a key."""
        if self.base == "decimal":
            return bool(re.fullmatch(r"decimal\(\d+,0\)", self.type.replace(" ", "")))
        return self.base in _INTEGRAL | {"string", "varchar", "char", "date", "timestamp",
                                         "timestamp_ntz", "binary"}


class LayoutKind(str, Enum):
    """How a table's files are organised."""

    PARTITIONED = "partitioned"
    CLUSTERED = "clustered"
    UNPARTITIONED = "unpartitioned"


@dataclass(frozen=True)
class Layout:
    """A table's layout as read from ``DESCRIBE DETAIL`` and its schema."""

    partition_columns: tuple[str, ...]
    clustering_columns: tuple[str, ...]
    timestamp_columns: tuple[str, ...]
    date_columns: tuple[str, ...]

    @property
    def kind(self) -> LayoutKind:
        if self.partition_columns:
            return LayoutKind.PARTITIONED
        if self.clustering_columns:
            return LayoutKind.CLUSTERED
        return LayoutKind.UNPARTITIONED

    def describe(self) -> str:
        """One line for the draft's comments and refusals."""
        parts = [f"{self.kind.value}"]
        if self.partition_columns:
            parts.append(f"partition columns {list(self.partition_columns)}")
        if self.clustering_columns:
            parts.append(f"clustering columns {list(self.clustering_columns)}")
        parts.append(f"timestamp columns {list(self.timestamp_columns) or 'none'}")
        parts.append(f"date columns {list(self.date_columns) or 'none'}")
        return "; ".join(parts)


@dataclass(frozen=True)
class WindowColumn:
    """The column that bounds the window, its plan type, and how a day is written in it."""

    column: str
    type: PartitionType
    day_format: str | None = None  # strftime format of a day, for string/int partitions

    def values(self, days: Sequence[dt.date]) -> list[object]:
        """The partition values of ``days``."""
        if self.type is PartitionType.DATE:
            return list(days)
        assert self.day_format is not None
        texts = [d.strftime(self.day_format) for d in days]
        return [int(t) for t in texts] if self.type is PartitionType.INT else list(texts)


def window_column(layout: Layout, columns: Sequence[Column]) -> tuple[str, PartitionType]:
    """The window column and its plan type, or a refusal saying what the layout is and why
    ``plan init`` does not draft a plan for it (a ``window_column`` plan, written by hand,
    does)."""
    by_name = {c.name: c for c in columns}
    seen = f"the target is {layout.describe()}"
    if layout.kind is not LayoutKind.PARTITIONED:
        raise refuse("--target", f"{seen}: plan init drafts windows over one partition "
                     "column, and this table has none",
                     "write the plan by hand with a timestamp-range window (partitioning."
                     "window_column; see templates/examples/), or partition the table by day")
    if len(layout.partition_columns) > 1:
        raise refuse("--target", f"{seen}: plans bound the window by one partition column",
                     "backfill a table partitioned by one date, string or int column")
    col = by_name[layout.partition_columns[0]]
    if col.base == "date":
        return col.name, PartitionType.DATE
    if col.base in ("string", "varchar", "char"):
        return col.name, PartitionType.STRING
    if col.base in _INTEGRAL:
        return col.name, PartitionType.INT
    raise refuse("--target", f"{seen}: partition column {col.name!r} is {col.type}; plans "
                 "support date, string and int partition columns",
                 "backfill a table partitioned by a date, string or int column")


def day_format(ptype: PartitionType, samples: Sequence[object]) -> str | None:
    """The strftime format in which every sampled string/int partition value writes a day, or
    None when the values are not days (then the window cannot come from --start/--end)."""
    formats = _DAY_FORMATS_INT if ptype is PartitionType.INT else _DAY_FORMATS_STRING
    texts = [str(s) for s in samples if s is not None]
    if not texts:
        return None
    for fmt in formats:
        try:
            if all(dt.datetime.strptime(t, fmt).strftime(fmt) == t for t in texts):
                return fmt
        except ValueError:
            continue
    return None
