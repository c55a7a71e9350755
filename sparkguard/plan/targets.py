"""Target models (transform, contract, merge options) and their reconciliation checks."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from sparkguard.plan.enums import Aggregation, CheckType, NanRule, Promotion
from sparkguard.plan.fields import (
    ADDED_LATER,
    LABEL_RE,
    Dataset,
    Label,
    NotBool,
    PlanValueError,
    SqlName,
    _Frozen,
)
from sparkguard.sql import check_expression, query_problem

__all__ = ["Check", "ColumnContract", "Contract", "MergeSpec", "TargetItem", "TargetSpec",
           "TargetValidation", "Transform", "Validation"]

_CALLABLE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*")
_TARGET_TAGS = ("dataset-name", "target-spec")  # union tags; the loader hides them from paths


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
        problem = query_problem(body)
        if problem is None and not re.match(r"(?is)^\s*(select|with)\b", body):
            problem = "start it with SELECT or WITH"
        if problem:
            raise PlanValueError(f"transform SQL must be a query: {problem}",
                                 "write one SELECT (or WITH ... SELECT) reading {source}; "
                                 "sparkguard writes the result itself")
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
                                 "keep sql (a SELECT) or callable (module:function), not both"
                                 if self.sql is not None else
                                 "add sql (a SELECT) or callable (module:function)")
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

    @model_validator(mode="after")
    def _v_label(self) -> TargetSpec:
        if self.name is None and not LABEL_RE.fullmatch(self.label):
            raise PlanValueError(
                f"the target's label derived from dataset ({self.label!r}) is not a plain name",
                "give the target a name: (letters, digits and '_', not starting with a digit)")
        return self

    @property
    def label(self) -> str:
        """Short name used in the ledger, shadow path and placeholders."""
        if self.name:
            return self.name
        # a catalog name's backquotes are not part of it: `sales`.orders is sales_orders
        tail = self.dataset.rstrip("/").split("/")[-1].replace("`", "")
        return re.sub(r"[^A-Za-z0-9_]", "_", tail)


def _target_kind(value: Any) -> str:
    return _TARGET_TAGS[0] if isinstance(value, str) else _TARGET_TAGS[1]


TargetItem = Annotated[
    Annotated[Dataset, Tag(_TARGET_TAGS[0])] | Annotated[TargetSpec, Tag(_TARGET_TAGS[1])],
    Discriminator(_target_kind),
]



class Check(_Frozen):
    """One reconciliation gate (seed ``validation.checks[]``)."""

    type: CheckType = Field(description="row_count_parity | metric_reconciliation | duplicate_check.")
    threshold_percent: Annotated[float | None, NotBool] = Field(
        default=None, ge=0, le=100, allow_inf_nan=False,
        description="Allowed relative difference in percent (0 = exact).")
    threshold_absolute: Annotated[float | None, NotBool] = Field(
        default=None, ge=0, allow_inf_nan=False, description="Allowed absolute difference.")
    metric: SqlName | None = Field(default=None, description="Name of the reconciled metric.")
    key_columns: list[SqlName] | None = Field(
        default=None, description="duplicate_check keys; default: the target's business_keys (plus the "
            "partition column).")
    aggregation: Aggregation = Field(
        default=Aggregation.SUM, description="How the metric expression is aggregated on each side.")
    source_expr: str | None = Field(
        default=None, max_length=2000, description="SQL expression of one source row; the gate "
            "applies the aggregation itself ('amount', not 'sum(amount)').")
    shadow_expr: str | None = Field(
        default=None, max_length=2000, description="SQL expression of one shadow (target-shaped) "
            "row, aggregated like source_expr.")
    per_partition: bool = Field(default=False, description="Also apply the threshold to each partition.")
    drift_threshold_percent: Annotated[float | None, NotBool] = Field(
        default=None, ge=0, allow_inf_nan=False, json_schema_extra=ADDED_LATER,
        description="metric_reconciliation only: also gate the metric's move from the current "
            "target to the shadow (per window and partition), in percent of the target's value.")
    drift_threshold_absolute: Annotated[float | None, NotBool] = Field(
        default=None, ge=0, allow_inf_nan=False, json_schema_extra=ADDED_LATER,
        description="Like drift_threshold_percent, as an absolute difference.")
    table_wide: bool = Field(
        default=False, json_schema_extra=ADDED_LATER,
        description="duplicate_check only: the keys are unique across the whole target, not "
            "only within a partition; also fail (gate keys_outside_window) when a key of the "
            "recomputed window is held by the target outside the window, as a row moved across "
            "the window's edge (a corrected timestamp or date) leaves it.")
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
