"""The backfill plan as frozen pydantic models.

A superset of the seed's ``backfill_plan:`` template: every seed field keeps its name, and a
plan written in the seed's shape loads (as a draft the guard then rejects for what it lacks).
Every validator raises :class:`PlanValueError` (or :class:`~sparkguard.sql.UnsafeSQLError`)
with a message naming the rule and, where it helps, a ``fix`` the loader prints.

The sections live in their own modules (``fields``, ``enums``, ``sections``, ``targets``);
this module holds the top-level plan and re-exports them all, so ``sparkguard.plan.model``
stays the one place to import a plan model from.
"""

from __future__ import annotations

import datetime as dt
import re

from pydantic import Field, field_validator

from sparkguard.plan.enums import (
    Aggregation,
    CheckType,
    ExecutionMode,
    NanRule,
    Promotion,
    WindowType,
)
from sparkguard.plan.fields import (
    ADDED_LATER,
    MAX_RANGE_DAYS,
    Person,
    PlanValueError,
    Text,
    _Frozen,
    split_partition,
)
from sparkguard.plan.sections import (
    AffectedWindow,
    ApprovalRecord,
    Approvals,
    Execution,
    Partitioning,
    Safeguards,
    SourceOfTruth,
    Status,
    WindowColumn,
)
from sparkguard.plan.targets import (
    Check,
    ColumnContract,
    Contract,
    MergeSpec,
    TargetItem,
    TargetSpec,
    TargetValidation,
    Transform,
    Validation,
)
from sparkguard.sql import PartitionType, UnsafeSQLError, parse_partition_value

__all__ = [
    "ADDED_LATER",
    "MAX_RANGE_DAYS",
    "AffectedWindow",
    "Aggregation",
    "ApprovalRecord",
    "Approvals",
    "BackfillPlan",
    "Check",
    "CheckType",
    "ColumnContract",
    "Contract",
    "Execution",
    "ExecutionMode",
    "MergeSpec",
    "NanRule",
    "Partitioning",
    "PlanDocument",
    "PlanValueError",
    "Promotion",
    "Safeguards",
    "SourceOfTruth",
    "Status",
    "TargetSpec",
    "TargetValidation",
    "Transform",
    "Validation",
    "WindowColumn",
    "WindowType",
    "field_names",
    "split_partition",
]

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}")


class BackfillPlan(_Frozen):
    """``backfill_plan:`` as written by the user."""

    name: str | None = Field(default=None, description="Plan name (letters, digits, _ . -).")
    owner: Person | None = Field(default=None, description="Who is accountable.")
    reason: Text | None = Field(default=None, description="Why the backfill is needed.")
    affected_window: AffectedWindow = AffectedWindow()
    partitioning: Partitioning | None = None
    window_column: WindowColumn | None = Field(
        default=None, json_schema_extra=ADDED_LATER,
        description="The column(s) bounding [start_utc, end_utc) as a time range (instead of "
            "partitioning): a timestamp column, or date + hour partition columns.")
    source_of_truth: SourceOfTruth = SourceOfTruth()
    targets: list[TargetItem] = Field(default_factory=list)
    execution: Execution = Execution()
    safeguards: Safeguards = Safeguards()
    validation: Validation = Validation()
    approvals: Approvals = Approvals()
    status: Status = Status()

    @field_validator("name")
    @classmethod
    def _v_name(cls, v: str | None) -> str | None:
        if v is not None and not _NAME_RE.fullmatch(v):
            raise PlanValueError("name must be letters, digits, '_', '.' or '-' (at most 200)",
                                 "it names the shadow folder; e.g. fix-orders-2026-05")
        if v is not None and ".." in v:
            raise PlanValueError("name must not contain '..'", "use '-' or '_' instead")
        return v

    # -- derived views used by the guard and the runner ------------------------------------

    def partition_values(self) -> list[object]:
        """The window's partitions as typed values (``col=value`` prefixes stripped).

        Raises UnsafeSQLError when a value is not a literal of the partition type.
        """
        ptype = self.partitioning.type if self.partitioning else PartitionType.STRING
        out: list[object] = []
        for raw in self.affected_window.partitions or []:
            col, value = split_partition(raw)
            if col is not None and ptype is PartitionType.STRING and isinstance(value, str) \
                    and value != value.strip():
                raise UnsafeSQLError(
                    f"{raw!r}: the value after '{col}=' starts or ends with a space, and a "
                    "string partition is matched exactly; remove the space, or write the value "
                    f"alone and quoted ({value!r}) if the space is part of it")
            out.append(parse_partition_value(value, ptype))
        return out

    def partition_prefixes(self) -> list[str]:
        """Column names written as ``col=value`` in ``affected_window.partitions``."""
        return [col for col, _ in map(split_partition, self.affected_window.partitions or [])
                if col is not None]

    def range_days(self) -> int | None:
        """Number of daily partitions in ``[start_utc, end_utc)``; None when unbounded."""
        span = self._day_span()
        return None if span is None else max(0, (span[1] - span[0]).days)

    def _day_span(self) -> tuple[dt.date, dt.date] | None:
        start, end = self.affected_window.start_utc, self.affected_window.end_utc
        if start is None or end is None:
            return None
        d0, d1 = start.date(), end.date()
        if end.time() != dt.time(0):  # a partial last day still needs its partition
            d1 = d1 + dt.timedelta(days=1)
        return d0, d1

    def window_partitions_from_range(self) -> list[dt.date] | None:
        """Daily partitions implied by ``[start_utc, end_utc)``; [] when inverted or too long."""
        span = self._day_span()
        if span is None:
            return None
        d0, d1 = span
        if d1 <= d0 or (d1 - d0).days > MAX_RANGE_DAYS:
            return []
        return [d0 + dt.timedelta(days=i) for i in range((d1 - d0).days)]

    def target_specs(self) -> list[TargetSpec]:
        """The targets written as mappings (the seed's bare names carry no execution details)."""
        return [t for t in self.targets if isinstance(t, TargetSpec)]

    def checks_for(self, target: TargetSpec) -> list[Check]:
        """The target's own checks where it declares some, else the plan's."""
        own = target.validation.checks if target.validation is not None else []
        return own or self.validation.checks


class PlanDocument(_Frozen):
    """The whole YAML document."""

    backfill_plan: BackfillPlan


def field_names() -> set[str]:
    """Every key a plan may use (for "did you mean" hints)."""
    names: set[str] = set()
    for model in (PlanDocument, BackfillPlan, AffectedWindow, Partitioning, WindowColumn,
                  SourceOfTruth,
                  TargetSpec, Transform, Contract, ColumnContract, MergeSpec, Execution,
                  Safeguards, Check, Validation, Approvals, ApprovalRecord, Status):
        names.update(model.model_fields)
    return names
