"""The backfill plan as frozen pydantic models.

A superset of the seed's ``backfill_plan:`` template: every seed field keeps its name, and a
plan written in the seed's shape loads (as a draft the guard then rejects for what it lacks).
Every validator raises :class:`PlanValueError` (or :class:`~sparkguard.sql.UnsafeSQLError`)
with a message naming the rule and, where it helps, a ``fix`` the loader prints.
"""

from __future__ import annotations

import datetime as dt
import re
from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    JsonValue,
    Tag,
    field_validator,
    model_validator,
)

from sparkguard.sql import (
    PartitionType,
    TableRef,
    check_expression,
    parse_partition_value,
    quote_identifier,
)

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

# A date window longer than this is never materialised partition by partition (the guard
# reports it as too large from its length alone).
MAX_RANGE_DAYS = 3660

_CALLABLE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*")
_ROLE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}")
_TARGET_TAGS = ("dataset-name", "target-spec")  # union tags; the loader hides them from paths


class PlanValueError(ValueError):
    """Raised by a plan validator; ``fix`` says what to write instead."""

    def __init__(self, message: str, fix: str = "") -> None:
        super().__init__(message)
        self.fix = fix


def _plain_text(value: str) -> str:
    if any((ord(c) < 32 and c not in "\n\t") or ord(c) == 127 for c in value):
        raise PlanValueError("contains a control character", "write plain text")
    return value


def _identifier(value: str) -> str:
    quote_identifier(value)  # raises UnsafeSQLError (a ValueError) with the reason
    if "." in value:
        raise PlanValueError(f"column name {value!r} must not contain '.'",
                             "name one column (letters, digits, '_')")
    return value


def _dataset(value: str) -> str:
    TableRef.parse(value)  # raises UnsafeSQLError with the reason
    return value


def _path(value: str) -> str:
    ref = TableRef.parse(value)
    if ref.path is None:
        raise PlanValueError(f"{value!r} is a table name, not a path",
                             "give an absolute path or a URI (s3://, abfss://, dbfs:/ ...)")
    return value


def _label(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", value):
        raise PlanValueError(f"{value!r} is not a plain name",
                             "use letters, digits and '_' (it names shadow tables and views)")
    return value


def _role(value: str) -> str:
    if not _ROLE_RE.fullmatch(value):
        raise PlanValueError(f"role {value!r} is not a plain role name",
                             "use letters, digits, '_', '.', '@' or '-' (at most 64)")
    return value


def _person(value: str) -> str:
    value = value.strip()
    if not value or len(value) > 200 or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise PlanValueError("is empty, longer than 200 characters or has control characters",
                             "give a plain name or e-mail address")
    return value


def _utc_bound(value: object) -> object:
    """Window bounds: an ISO-8601 timestamp or a date; naive means UTC; stored as aware UTC."""
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        moment = value
    elif isinstance(value, dt.date):
        moment = dt.datetime(value.year, value.month, value.day)
    elif isinstance(value, str):
        text = value.strip()
        try:
            moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            raise PlanValueError(
                "is not an ISO-8601 UTC timestamp",
                "write it like 2026-05-01T00:00:00Z (or a date, 2026-05-01)") from None
    else:
        raise PlanValueError("is not a timestamp",
                             "write it like \"2026-05-01T00:00:00Z\" (quoted) or 2026-05-01")
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return moment.astimezone(dt.UTC)


def _partition_item(value: object) -> object:
    if isinstance(value, bool) or not isinstance(value, str | int | dt.date):
        raise PlanValueError(f"partition value of type {type(value).__name__} is not allowed",
                             "write 'column=value', a date, a string or an integer")
    if isinstance(value, dt.datetime):
        raise PlanValueError("partition value is a timestamp, not a date",
                             "daily partitions are dates: write 2026-05-01")
    if isinstance(value, str) and not value.strip():
        raise PlanValueError("partition value is empty", "remove it or fill it in")
    if isinstance(value, str):
        _plain_text(value)
    return value


SqlName = Annotated[str, Field(min_length=1, max_length=128), AfterValidator(_identifier)]
Dataset = Annotated[str, Field(min_length=1, max_length=1000), AfterValidator(_dataset)]
PathStr = Annotated[str, Field(min_length=1, max_length=1000), AfterValidator(_path)]
Label = Annotated[str, Field(min_length=1, max_length=64), AfterValidator(_label)]
Role = Annotated[str, AfterValidator(_role)]
Person = Annotated[str, AfterValidator(_person)]
Text = Annotated[str, Field(max_length=4000), AfterValidator(_plain_text)]
UtcBound = Annotated[dt.datetime | None, BeforeValidator(_utc_bound)]
PartitionItem = Annotated[str | int | dt.date, BeforeValidator(_partition_item)]


def split_partition(raw: object) -> tuple[str | None, object]:
    """``"event_date=2026-05-01"`` -> ``("event_date", "2026-05-01")``; other values unchanged.

    Only a plain column name before the first ``=`` counts as a prefix, so a string value that
    merely contains ``=`` is kept whole.
    """
    if isinstance(raw, str) and "=" in raw:
        col, value = raw.split("=", 1)
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", col.strip()):
            return col.strip(), value.strip()
    return None, raw


class _Frozen(BaseModel):
    """Frozen, unknown keys rejected; a blank string in an optional field means "not set"."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_enum_values=False)

    @model_validator(mode="before")
    @classmethod
    def _blank_is_unset(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        out = dict(data)
        for key, value in data.items():
            field = cls.model_fields.get(key) if isinstance(key, str) else None
            if field is not None and field.default is None and isinstance(value, str) \
                    and not value.strip():
                out[key] = None
        return out


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


# Fields added after plans were approved: left out of the fingerprint while at their default,
# so a plan that loaded before they existed keeps its fingerprint (and its approvals).
ADDED_LATER: dict[str, JsonValue] = {"added_later": True}


class Partitioning(_Frozen):
    """The partition column of source, shadow and target, and its type."""

    column: SqlName = Field(description="Partition column of source, shadow and target.")
    type: PartitionType = Field(
        default=PartitionType.DATE, description="date | string | int; decides how partition values are "
            "rendered as SQL literals.")


class WindowType(str, Enum):
    """How ``[start_utc, end_utc)`` is bounded on the table (``window_column.type``)."""

    TIMESTAMP = "timestamp"          # a TIMESTAMP column, to the microsecond
    TIMESTAMP_NTZ = "timestamp_ntz"  # a TIMESTAMP_NTZ column holding UTC wall-clock times
    DATE_HOUR = "date_hour"          # a date partition column plus an hour (0-23) column


_SLICE_RE = re.compile(r"auto|[1-9][0-9]{0,3}[hd]")


class WindowColumn(_Frozen):
    """The column(s) bounding the window when it is a time range rather than a list of
    partition values: see docs/windows.md."""

    name: SqlName = Field(description="The timestamp column (timestamp, timestamp_ntz), or the "
                          "date partition column (date_hour).")
    type: WindowType = Field(description="timestamp | timestamp_ntz | date_hour.")
    hour_column: SqlName | None = Field(
        default=None, description="date_hour only: the hour partition column (integer 0-23).")
    bucket: Literal["hour", "day"] | None = Field(
        default=None, description="Grain of the per-bucket verdicts; default hour for a window "
            "of up to 2 days, else day.")
    slice: str = Field(
        default="auto", description="Slice length: Nh (hours), Nd (days) or auto (sized by "
            "source rows, the proof slice is the first bucket).")

    @field_validator("slice")
    @classmethod
    def _v_slice(cls, v: str) -> str:
        if not _SLICE_RE.fullmatch(v.strip()):
            raise PlanValueError(f"slice {v!r} is not a length",
                                 "write 6h, 1d or auto")
        return v.strip()


class AffectedWindow(_Frozen):
    """Seed ``affected_window``: ``start_utc`` inclusive, ``end_utc`` exclusive."""

    start_utc: UtcBound = Field(
        default=None, description="Inclusive start, ISO-8601 UTC (a date means midnight UTC).")
    end_utc: UtcBound = Field(default=None, description="Exclusive end, ISO-8601 UTC.")
    partitions: list[PartitionItem] | None = Field(
        default=None, description="The window's partitions, as 'col=value' or plain values; must match "
            "[start_utc, end_utc) for dates.")
    max_partitions: int = Field(
        default=31, ge=1, le=MAX_RANGE_DAYS, description="Largest window this plan may touch; a bigger "
            "window is refused.")


class SourceOfTruth(_Frozen):
    """Seed ``source_of_truth``: ``dataset`` is a table name or a path."""

    system: Text | None = Field(default=None, description="Where the truth comes from (documentation).")
    dataset: Dataset | None = Field(
        default=None, description="Source Delta table: a name (db.table, catalog.db.table) or a path.")


class Transform(_Frozen):
    """Exactly one of ``sql`` (a SELECT with placeholders) or ``callable`` (``module:function``).

    SQL placeholders: ``{source}`` the source table, ``{window}`` the slice predicate on the
    partition column, ``{shadow:NAME}`` the shadow of an upstream target of this plan.
    A callable receives ``(spark, source_df, partitions)`` and returns a DataFrame.
    """

    sql: str | None = Field(
        default=None, max_length=100_000, description="One SELECT/WITH query reading {source}; may use "
            "{window} and {shadow:NAME}.")
    callable: str | None = Field(
        default=None, description="'package.module:function' called as f(spark, source_df, partitions) -> "
            "DataFrame.")

    @field_validator("sql")
    @classmethod
    def _v_sql(cls, v: str | None) -> str | None:
        if v is None:
            return v
        body = v.strip().rstrip(";").strip()
        if ";" in body:
            raise PlanValueError("transform SQL must be one query, it contains ';'",
                                 "remove the ';' inside it")
        if not re.match(r"(?is)^\s*(select|with)\b", body):
            raise PlanValueError("transform SQL must be a query",
                                 "start it with SELECT or WITH")
        return body

    @field_validator("callable")
    @classmethod
    def _v_callable(cls, v: str | None) -> str | None:
        if v is not None and not _CALLABLE_RE.fullmatch(v):
            raise PlanValueError("callable is not a 'module:function' reference",
                                 "write it like 'package.module:function'")
        return v

    @model_validator(mode="after")
    def _exactly_one(self) -> Transform:
        if (self.sql is None) == (self.callable is None):
            raise PlanValueError("give exactly one of transform.sql or transform.callable",
                                 "keep sql (a SELECT) or callable (module:function), not both")
        return self


class ColumnContract(_Frozen):
    """One column the shadow must have, with its Spark SQL type and nullability."""

    name: SqlName = Field(description="Column name.")
    type: Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9_ ,()<>:]{0,199}$")]
    nullable: bool = Field(default=True, description="false: the column must have no nulls.")


class Contract(_Frozen):
    """Schema and nullability contract the shadow must satisfy before promotion."""

    match_target_schema: bool = Field(
        default=True, description="The shadow must have exactly the target's columns and types.")
    not_null: list[SqlName] = Field(
        default_factory=list, description="Columns that must have no nulls in the shadow.")
    columns: list[ColumnContract] = Field(
        default_factory=list, description="Explicit column contract (name, Spark SQL type, nullable).")


class MergeSpec(_Frozen):
    """MERGE promotion options: what to do with window rows the recomputation no longer has."""

    when_not_matched_by_source: Literal["delete", "keep"] = Field(
        default="delete", description="Window rows of the target the recomputation no longer has: delete or "
            "keep.")


class TargetSpec(_Frozen):
    """One target of the backfill, with everything execution needs."""

    dataset: Dataset = Field(description="Target Delta table: a name or a path.")
    name: Label | None = Field(
        default=None, description="Short name (ledger, shadow folder, {shadow:NAME}); default: the last part "
            "of dataset.")
    business_keys: list[SqlName] = Field(
        min_length=1, description="Columns identifying a row within a partition (duplicate check, MERGE, "
            "change preview).")
    transform: Transform = Field(description="How the target's rows are recomputed from the source.")
    promotion: Promotion = Field(
        default=Promotion.REPLACE_WHERE, description="replace_where (swap the window), merge (on "
            "business_keys) or merge_changed (a merge that inserts, deletes and updates only the "
            "rows that differ), one Delta commit.")
    merge: MergeSpec = Field(default=MergeSpec(), description="Options of merge promotion.")
    contract: Contract = Field(
        default=Contract(), description="Schema and nullability contract checked before promotion.")
    depends_on: list[Label] = Field(
        default_factory=list, description="Targets (by name) promoted before this one; required for "
            "{shadow:NAME}.")
    validation: TargetValidation | None = Field(
        default=None, json_schema_extra=ADDED_LATER,
        description="This target's own checks and the reference they compare with; default: the "
            "plan's validation.checks against the source of truth.")

    @field_validator("business_keys")
    @classmethod
    def _v_keys(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise PlanValueError("business_keys lists a column twice", "list each column once")
        return v

    @property
    def label(self) -> str:
        """Short name used in the ledger, shadow path and placeholders."""
        if self.name:
            return self.name
        return re.sub(r"[^A-Za-z0-9_]", "_", self.dataset.rstrip("/").split("/")[-1])


def _target_kind(value: Any) -> str:
    return _TARGET_TAGS[0] if isinstance(value, str) else _TARGET_TAGS[1]


TargetItem = Annotated[
    Annotated[Dataset, Tag(_TARGET_TAGS[0])] | Annotated[TargetSpec, Tag(_TARGET_TAGS[1])],
    Discriminator(_target_kind),
]


class Execution(_Frozen):
    """Seed ``execution`` plus slicing and shadow placement."""

    mode: ExecutionMode | None = Field(
        default=None, description="Seed field: replay | merge | overwrite (documentation; promotion decides "
            "the write).")
    idempotent: bool | None = Field(
        default=None, description="Must be true; proven by writing the proof slice twice.")
    write_strategy: Text | None = Field(
        default=None, description="The idempotent write at target grain, in words.")
    dry_run_completed: bool | None = Field(
        default=None, description="A claim, never trusted and not part of the fingerprint: the ledger "
            "records dry runs.")
    shadow_location: PathStr | None = Field(
        default=None, description="Folder for shadow tables; default <home>/shadow. Never the target.")
    slice_partitions: Annotated[int, Field(ge=1, le=366)] | Literal["auto"] = Field(
        default="auto", description="Partitions per slice, or auto: the proof slice is the first "
            "partition, the rest is grouped towards 2,000,000 source rows per slice (from the "
            "live guard's row counts).")
    max_concurrent_slices: int = Field(
        default=1, ge=1, le=16, description="Slices written at once after the proof slice.")
    proof_slice: bool = Field(
        default=True, description="Must be true: the first slice is written twice and reconciled before the "
            "rest.")


class Safeguards(_Frozen):
    """Seed ``safeguards``."""

    publish_paused: bool | None = Field(
        default=None, description="Must be true: an intent; sparkguard pauses publish itself in its control "
            "table.")
    downstream_notifications: list[Annotated[str, Field(max_length=200),
                                             AfterValidator(_person)]] = Field(default_factory=list)
    rollback_strategy: Text | None = Field(
        default=None, description="The rollback, in words (sparkguard records the version to RESTORE).")
    rollback_horizon_days: float = Field(
        default=7.0, ge=0, le=3650, allow_inf_nan=False,
        description="How long after promotion a rollback must stay possible; the target's "
                    "retention must cover it.")


class Check(_Frozen):
    """One reconciliation gate (seed ``validation.checks[]``)."""

    type: CheckType = Field(description="row_count_parity | metric_reconciliation | duplicate_check.")
    threshold_percent: float | None = Field(
        default=None, ge=0, le=100, allow_inf_nan=False,
        description="Allowed relative difference in percent (0 = exact).")
    threshold_absolute: float | None = Field(
        default=None, ge=0, allow_inf_nan=False, description="Allowed absolute difference.")
    metric: SqlName | None = Field(default=None, description="Name of the reconciled metric.")
    key_columns: list[SqlName] | None = Field(
        default=None, description="duplicate_check keys; default: the target's business_keys (plus the "
            "partition column).")
    aggregation: Aggregation = Field(
        default=Aggregation.SUM, description="How the metric expression is aggregated on each side.")
    source_expr: str | None = Field(
        default=None, max_length=2000, description="SQL expression over source columns.")
    shadow_expr: str | None = Field(
        default=None, max_length=2000, description="SQL expression over shadow (target-shaped) columns.")
    per_partition: bool = Field(default=False, description="Also apply the threshold to each partition.")
    drift_threshold_percent: float | None = Field(
        default=None, ge=0, allow_inf_nan=False, json_schema_extra=ADDED_LATER,
        description="metric_reconciliation only: also gate the metric's move from the current "
            "target to the shadow (per window and partition), in percent of the target's value.")
    drift_threshold_absolute: float | None = Field(
        default=None, ge=0, allow_inf_nan=False, json_schema_extra=ADDED_LATER,
        description="Like drift_threshold_percent, as an absolute difference.")
    nan: NanRule = Field(
        default=NanRule.FAIL, json_schema_extra=ADDED_LATER,
        description="NaN or infinite inputs of a sum/avg/min/max metric: fail (default: the gate fails "
            "naming the side and the count) | exclude (compare the finite values, and the count of "
            "NaN and infinite rows per side separately).")

    @field_validator("source_expr", "shadow_expr")
    @classmethod
    def _v_expr(cls, v: str | None) -> str | None:
        return v if v is None else check_expression(v)


class Validation(_Frozen):
    """Seed ``validation``."""

    checks: list[Check] = Field(default_factory=list, description="Reconciliation gates.")


class TargetValidation(_Frozen):
    """A target's own gates, against the source of truth or a reference query of its own (an
    aggregated target checked against its upstream target's shadow, say)."""

    checks: list[Check] = Field(default_factory=list, description="Reconciliation gates of this "
        "target; they replace the plan's validation.checks for it.")
    reference: Transform | None = Field(
        default=None, description="The rows the checks compare the shadow with, computed like a "
            "transform (sql with {source}, {window}, {shadow:NAME}, or a callable); default: the "
            "source of truth.")


class ApprovalRecord(_Frozen):
    """One approval: who, in which role, when, for which plan fingerprint."""

    role: Role
    by: Person
    at: dt.datetime
    fingerprint: str = Field(pattern=r"^[0-9a-f]{64}$")
    content: str | None = Field(
        default=None, max_length=4_000_000, pattern=r"^[A-Za-z0-9+/=]*$",
        description="The approved canonical content (zlib, base64), so that a later edit can be "
                    "shown field by field; absent in approvals recorded before it existed.")


class Approvals(_Frozen):
    """Seed ``approvals``; ``granted`` is filled by ``sparkguard approve`` (sidecar file)."""

    required: list[Role] = Field(
        default_factory=list, description="Roles that must each approve this exact fingerprint.")
    granted: list[ApprovalRecord] = Field(
        default_factory=list, description="Filled by 'sparkguard approve' (sidecar file); not part of the "
            "fingerprint.")
    owner_may_self_approve: bool = Field(
        default=False, description="Allow the owner to be the only approver.")

    @field_validator("required")
    @classmethod
    def _v_unique(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise PlanValueError("a role is listed twice", "list each required role once")
        return v


class Status(_Frozen):
    """Seed ``status``: informational only; the ledger is the source of truth."""

    state: Literal["draft", "review", "approved", "running", "done", "rolled_back"] = Field(
        default="draft", description="Informational; not part of the fingerprint.")


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
            out.append(parse_partition_value(split_partition(raw)[1], ptype))
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

