"""Plan sections other than targets and checks: partitioning, window, source, execution,
safeguards, approvals and status."""

from __future__ import annotations

import datetime as dt
import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator

from sparkguard.plan.enums import ExecutionMode, WindowType
from sparkguard.plan.fields import (
    MAX_RANGE_DAYS,
    Dataset,
    NotBool,
    PartitionItem,
    PathStr,
    Person,
    PlanValueError,
    Role,
    SqlName,
    Text,
    UtcBound,
    _Frozen,
    _person,
    utc_moment,
)
from sparkguard.sql import PartitionType

__all__ = ["AffectedWindow", "ApprovalRecord", "Approvals", "Execution", "Partitioning",
           "Safeguards", "SourceOfTruth", "Status", "WindowColumn"]


class Partitioning(_Frozen):
    """The partition column of source, shadow and target, and its type."""

    column: SqlName = Field(description="Partition column of source, shadow and target.")
    type: PartitionType = Field(
        default=PartitionType.DATE, description="date | string | int; decides how partition values are "
            "rendered as SQL literals.")



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
    max_partitions: Annotated[int, NotBool] = Field(
        default=31, ge=1, le=MAX_RANGE_DAYS, description="Largest window this plan may touch; a bigger "
            "window is refused.")


class SourceOfTruth(_Frozen):
    """Seed ``source_of_truth``: ``dataset`` is a table name or a path."""

    system: Text | None = Field(default=None, description="Where the truth comes from (documentation).")
    dataset: Dataset | None = Field(
        default=None, description="Source Delta table: a name (db.table, catalog.db.table) or a path.")



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
    slice_partitions: Annotated[Annotated[int, Field(ge=1, le=366)] | Literal["auto"],
                                NotBool] = Field(
        default="auto", description="Partitions per slice, or auto: the proof slice is the first "
            "partition, the rest is grouped towards 2,000,000 source rows per slice (from the "
            "live guard's row counts).")
    max_concurrent_slices: Annotated[int, NotBool] = Field(
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
    rollback_horizon_days: Annotated[float, NotBool] = Field(
        default=7.0, ge=0, le=3650, allow_inf_nan=False,
        description="How long after promotion a rollback must stay possible; the target's "
                    "retention must cover it.")



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

    @field_validator("at")
    @classmethod
    def _v_at(cls, v: dt.datetime) -> dt.datetime:
        """Aware UTC (naive means UTC), so records compare by time."""
        return utc_moment(v)


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
