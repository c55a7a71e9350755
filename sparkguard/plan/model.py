"""The backfill plan as frozen pydantic models.

A superset of the seed's ``backfill_plan:`` template: every seed field keeps its name, and a
plan written in the seed's shape loads (as a draft the guard then rejects for what it lacks).
"""

from __future__ import annotations

import datetime as dt
import re
from enum import Enum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sparkguard.sql import (
    PartitionType,
    TableRef,
    UnsafeSQLError,
    check_expression,
    parse_partition_value,
    quote_identifier,
)

__all__ = [
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
    "Partitioning",
    "PlanDocument",
    "Promotion",
    "Safeguards",
    "SourceOfTruth",
    "Status",
    "TargetSpec",
    "Transform",
    "Validation",
]

_CALLABLE_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_ROLE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_enum_values=False)


def _identifier(value: str) -> str:
    try:
        quote_identifier(value)
    except UnsafeSQLError as exc:
        raise ValueError(str(exc)) from None
    return value


def _dataset(value: str) -> str:
    try:
        TableRef.parse(value)
    except UnsafeSQLError as exc:
        raise ValueError(str(exc)) from None
    return value


Identifier = Annotated[str, Field(min_length=1, max_length=128)]


class ExecutionMode(str, Enum):
    """Seed field ``execution.mode``."""

    REPLAY = "replay"
    MERGE = "merge"
    OVERWRITE = "overwrite"


class Promotion(str, Enum):
    """How the shadow is promoted into the target in one Delta commit."""

    REPLACE_WHERE = "replace_where"
    MERGE = "merge"


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


class Partitioning(_Frozen):
    """The partition column of source, shadow and target, and its type."""

    column: Identifier
    type: PartitionType = PartitionType.DATE

    _v_col = field_validator("column")(classmethod(lambda cls, v: _identifier(v)))


class AffectedWindow(_Frozen):
    """Seed ``affected_window``: ``end_utc`` is exclusive."""

    start_utc: dt.datetime | dt.date | None = None
    end_utc: dt.datetime | dt.date | None = None
    partitions: list[str | int | dt.date] | None = None
    max_partitions: int = Field(default=31, ge=1, le=3660)


class SourceOfTruth(_Frozen):
    """Seed ``source_of_truth``: ``dataset`` is a table name or a path."""

    system: str | None = None
    dataset: str | None = None

    _v_ds = field_validator("dataset")(
        classmethod(lambda cls, v: v if v is None else _dataset(v))
    )


class Transform(_Frozen):
    """Exactly one of ``sql`` (a SELECT with placeholders) or ``callable`` (``module:function``).

    SQL placeholders: ``{source}`` the source table, ``{window}`` the slice predicate on the
    partition column, ``{shadow:NAME}`` the shadow of an upstream target of this plan.
    A callable receives ``(spark, source_df, partitions)`` and returns a DataFrame.
    """

    sql: str | None = None
    callable: str | None = None

    @field_validator("sql")
    @classmethod
    def _v_sql(cls, v: str | None) -> str | None:
        if v is None:
            return v
        body = v.strip().rstrip(";").strip()
        if ";" in body:
            raise ValueError("transform SQL must be one query; remove the ';' inside it")
        if not re.match(r"(?is)^\s*(select|with)\b", body):
            raise ValueError("transform SQL must be a query starting with SELECT or WITH")
        return body

    @field_validator("callable")
    @classmethod
    def _v_callable(cls, v: str | None) -> str | None:
        if v is not None and not _CALLABLE_RE.match(v):
            raise ValueError("callable must look like 'package.module:function'")
        return v

    @model_validator(mode="after")
    def _exactly_one(self) -> Transform:
        if (self.sql is None) == (self.callable is None):
            raise ValueError("give exactly one of transform.sql or transform.callable")
        return self


class ColumnContract(_Frozen):
    """One column the shadow must have, with its Spark SQL type and nullability."""

    name: Identifier
    type: str
    nullable: bool = True

    _v_name = field_validator("name")(classmethod(lambda cls, v: _identifier(v)))


class Contract(_Frozen):
    """Schema and nullability contract the shadow must satisfy before promotion."""

    match_target_schema: bool = True
    not_null: list[Identifier] = Field(default_factory=list)
    columns: list[ColumnContract] = Field(default_factory=list)

    @field_validator("not_null")
    @classmethod
    def _v_nn(cls, v: list[str]) -> list[str]:
        return [_identifier(c) for c in v]


class MergeSpec(_Frozen):
    """MERGE promotion options: what to do with window rows the recomputation no longer has."""

    when_not_matched_by_source: Literal["delete", "keep"] = "delete"


class TargetSpec(_Frozen):
    """One target of the backfill, with everything execution needs."""

    dataset: str
    name: Identifier | None = None
    business_keys: list[Identifier] = Field(min_length=1)
    transform: Transform
    promotion: Promotion = Promotion.REPLACE_WHERE
    merge: MergeSpec = MergeSpec()
    contract: Contract = Contract()
    depends_on: list[Identifier] = Field(default_factory=list)

    _v_ds = field_validator("dataset")(classmethod(lambda cls, v: _dataset(v)))

    @field_validator("business_keys")
    @classmethod
    def _v_keys(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("business_keys lists a column twice")
        return [_identifier(c) for c in v]

    @property
    def label(self) -> str:
        """Short name used in the ledger, shadow path and placeholders."""
        if self.name:
            return self.name
        return re.sub(r"[^A-Za-z0-9_]", "_", self.dataset.rstrip("/").split("/")[-1])


class Execution(_Frozen):
    """Seed ``execution`` plus slicing and shadow placement."""

    mode: ExecutionMode | None = None
    idempotent: bool | None = None
    write_strategy: str | None = None
    dry_run_completed: bool | None = None  # a claim; the ledger decides
    shadow_location: str | None = None
    slice_partitions: int = Field(default=1, ge=1, le=366)
    max_concurrent_slices: int = Field(default=1, ge=1, le=16)
    proof_slice: bool = True

    _v_shadow = field_validator("shadow_location")(
        classmethod(lambda cls, v: v if v is None else _dataset(v))
    )


class Safeguards(_Frozen):
    """Seed ``safeguards``."""

    publish_paused: bool | None = None  # a claim; the publish control table decides
    downstream_notifications: list[str] = Field(default_factory=list)
    rollback_strategy: str | None = None


class Check(_Frozen):
    """One reconciliation gate (seed ``validation.checks[]``)."""

    type: CheckType
    threshold_percent: float | None = Field(default=None, ge=0, le=100)
    threshold_absolute: float | None = Field(default=None, ge=0)
    metric: Identifier | None = None
    key_columns: list[Identifier] | None = None
    aggregation: Aggregation = Aggregation.SUM
    source_expr: str | None = None
    shadow_expr: str | None = None
    per_partition: bool = False

    @field_validator("source_expr", "shadow_expr")
    @classmethod
    def _v_expr(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            return check_expression(v)
        except UnsafeSQLError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("key_columns")
    @classmethod
    def _v_keys(cls, v: list[str] | None) -> list[str] | None:
        return v if v is None else [_identifier(c) for c in v]

    @field_validator("metric")
    @classmethod
    def _v_metric(cls, v: str | None) -> str | None:
        return v if v is None else _identifier(v)


class Validation(_Frozen):
    """Seed ``validation``."""

    checks: list[Check] = Field(default_factory=list)


class ApprovalRecord(_Frozen):
    """One approval: who, in which role, when, for which plan fingerprint."""

    role: str
    by: str
    at: dt.datetime
    fingerprint: str = Field(pattern=r"^[0-9a-f]{64}$")


class Approvals(_Frozen):
    """Seed ``approvals``; ``granted`` is filled by ``sparkguard approve``."""

    required: list[str] = Field(default_factory=list)
    granted: list[ApprovalRecord] = Field(default_factory=list)
    owner_may_self_approve: bool = False

    @field_validator("required")
    @classmethod
    def _v_roles(cls, v: list[str]) -> list[str]:
        for role in v:
            if not _ROLE_RE.match(role):
                raise ValueError(f"role {role!r} must be letters, digits, '_', '.', '@' or '-'")
        return v


class Status(_Frozen):
    """Seed ``status``: informational only; the ledger is the source of truth."""

    state: Literal["draft", "review", "approved", "running", "done", "rolled_back"] = "draft"


class BackfillPlan(_Frozen):
    """``backfill_plan:`` as written by the user."""

    name: str | None = Field(default=None, max_length=200)
    owner: str | None = None
    reason: str | None = None
    affected_window: AffectedWindow = AffectedWindow()
    partitioning: Partitioning | None = None
    source_of_truth: SourceOfTruth = SourceOfTruth()
    targets: list[str | TargetSpec] = Field(default_factory=list)
    execution: Execution = Execution()
    safeguards: Safeguards = Safeguards()
    validation: Validation = Validation()
    approvals: Approvals = Approvals()
    status: Status = Status()

    @field_validator("name")
    @classmethod
    def _v_name(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", v):
            raise ValueError("name must be letters, digits, '_', '.' or '-'")
        return v

    @field_validator("targets", mode="before")
    @classmethod
    def _v_targets(cls, v: object) -> object:
        if isinstance(v, list):
            for item in v:
                if isinstance(item, str):
                    _dataset(item)
        return v

    # -- derived views used by the guard and the runner ------------------------------------

    def partition_values(self) -> list[object]:
        """The window's partitions as typed values (``col=value`` prefixes stripped)."""
        ptype = self.partitioning.type if self.partitioning else PartitionType.STRING
        out: list[object] = []
        for raw in self.affected_window.partitions or []:
            val: object = raw
            if isinstance(raw, str) and "=" in raw:
                val = raw.split("=", 1)[1]
            out.append(parse_partition_value(val, ptype))
        return out

    def window_partitions_from_range(self) -> list[dt.date] | None:
        """Daily partitions implied by ``[start_utc, end_utc)``, for date partitioning."""
        start, end = self.affected_window.start_utc, self.affected_window.end_utc
        if start is None or end is None:
            return None
        d0 = start.date() if isinstance(start, dt.datetime) else start
        d1 = end.date() if isinstance(end, dt.datetime) else end
        if isinstance(end, dt.datetime) and (end.hour or end.minute or end.second):
            d1 = d1 + dt.timedelta(days=1)
        if d1 <= d0 or (d1 - d0).days > 36600:
            return []
        return [d0 + dt.timedelta(days=i) for i in range((d1 - d0).days)]

    def target_specs(self) -> list[TargetSpec]:
        return [t for t in self.targets if isinstance(t, TargetSpec)]


class PlanDocument(_Frozen):
    """The whole YAML document."""

    backfill_plan: BackfillPlan
