"""The plan's enumerations: modes, promotions, check types, aggregations, window types."""

from __future__ import annotations

from enum import Enum

__all__ = ["Aggregation", "CheckType", "ExecutionMode", "NanRule", "Promotion", "WindowType"]


class ExecutionMode(str, Enum):
    """Seed field ``execution.mode``."""

    REPLAY = "replay"
    MERGE = "merge"
    OVERWRITE = "overwrite"


class Promotion(str, Enum):
    """How the shadow is promoted into the target in one Delta commit."""

    REPLACE_WHERE = "replace_where"
    MERGE = "merge"
    MERGE_CHANGED = "merge_changed"  # a MERGE that updates only the rows whose values changed


class CheckType(str, Enum):
    """Reconciliation gate types (seed names)."""

    ROW_COUNT_PARITY = "row_count_parity"
    METRIC_RECONCILIATION = "metric_reconciliation"
    DUPLICATE_CHECK = "duplicate_check"


class Aggregation(str, Enum):
    """Aggregations a metric gate may apply to its per-side expression."""

    SUM = "sum"
    COUNT = "count"
    COUNT_DISTINCT = "count_distinct"
    MIN = "min"
    MAX = "max"
    AVG = "avg"


class NanRule(str, Enum):
    """What a ``sum``, ``avg``, ``min`` or ``max`` gate does with NaN and infinite inputs."""

    FAIL = "fail"
    EXCLUDE = "exclude"



class WindowType(str, Enum):
    """How ``[start_utc, end_utc)`` is bounded on the table (``window_column.type``)."""

    TIMESTAMP = "timestamp"          # a TIMESTAMP column, to the microsecond
    TIMESTAMP_NTZ = "timestamp_ntz"  # a TIMESTAMP_NTZ column holding UTC wall-clock times
    DATE_HOUR = "date_hour"          # a date partition column plus an hour (0-23) column
