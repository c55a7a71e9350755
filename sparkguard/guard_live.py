"""The guard's live checks: what only the lake itself can answer.

Run after the static checks pass. Reads metadata and schemas, analyses (without running) the
transform and the metric expressions, and runs two small aggregations bounded by the window's
partition count: rows per window partition in the source, and rows/files/bytes of the target
inside the window (the blast radius). Nothing is written and nothing unbounded is collected.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import importlib
import re
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from pyspark.errors import ParseException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sparkguard import compat, delta_ops
from sparkguard.delta_ops.sessions import session_confs
from sparkguard.errors import first_line
from sparkguard.guard import Finding, Severity, window_partitions
from sparkguard.guard_checks import contract_column_findings, not_null_findings
from sparkguard.guard_window import rewrites_most, window_column_problem
from sparkguard.plan.model import (
    Aggregation,
    BackfillPlan,
    Check,
    CheckType,
    Promotion,
    TargetSpec,
    Transform,
    WindowType,
)
from sparkguard.plan.window_spec import range_window
from sparkguard.spark_types import holds_type, leaf_fields
from sparkguard.sql import (
    RESERVED_PREFIX,
    PartitionType,
    TableRef,
    query_only,
    reserved_names,
    window_predicate,
)

__all__ = ["LIVE_RULES", "live_check", "live_findings", "retention_days"]

P = "backfill_plan"
LIVE_RULES: dict[str, tuple[Severity, str]] = {
    "source_missing": (Severity.BLOCK, "the source of truth is not a Delta table"),
    "target_missing": (Severity.BLOCK, "a target is not a Delta table"),
    "partition_column_missing": (Severity.BLOCK, "the source or a target lacks the partition "
                                 "column"),
    "partition_type_mismatch": (Severity.BLOCK, "the partition column's type differs from "
                                "partitioning.type"),
    "column_missing": (Severity.BLOCK, "a business key / duplicate_check key / "
                       "contract.not_null name is not a target column"),
    "targets_same_table": (Severity.BLOCK, "two targets name one table (same storage location, "
                           "spelt differently)"),
    "source_is_target_table": (Severity.BLOCK, "the source of truth and a target are one table "
                               "(same storage location, spelt differently)"),
    "target_reserved_column": (Severity.BLOCK, "a target column's name starts with __sg_, the "
                               "prefix of sparkguard's own working columns"),
    "target_not_partitioned": (Severity.WARN, "the target is not partitioned by the column"),
    "window_not_in_source": (Severity.BLOCK, "a window partition has no rows in the source"),
    "transform_invalid": (Severity.BLOCK, "the transform does not analyse against the source"),
    "metric_expr_invalid": (Severity.BLOCK, "a metric expression does not resolve on its side, "
                            "or is not a per-row value its aggregation takes"),
    "metric_percent_of_instant": (Severity.BLOCK, "a percent threshold on a date or timestamp "
                                  "metric: measured from 1970, 0.01 % lets two days pass"),
    "retention_too_short": (Severity.BLOCK, "log or deleted-file retention shorter than "
                            "safeguards.rollback_horizon_days"),
    "retention_unreadable": (Severity.WARN, "a retention property cannot be parsed"),
    "target_append_only": (Severity.BLOCK, "a target is append-only (delta.appendOnly): Delta "
                           "refuses the promotion's deletes and updates"),
    "variant_deletion_vectors": (Severity.WARN, "a promotion that leaves deletion vectors in a "
                                 "target with a VARIANT column, which Spark 4.0 reads without "
                                 "code generation (a wide table): it cannot read those files "
                                 "(SPARK-55552)"),
    "table_unreadable": (Severity.BLOCK, "this client's Delta cannot read the source or a target "
                         "(a reader version or table feature it does not support)"),
    "target_not_writable": (Severity.BLOCK, "this client's Delta cannot write a target (a writer "
                            "version or table feature it does not support): the promotion "
                            "would fail at its commit, after the whole shadow was built"),
    "identity_replace_where": (Severity.BLOCK, "a target has an identity column and the "
                               "promotion is replace_where, which would give every row of the "
                               "window a new identity value"),
    "identity_column_named": (Severity.BLOCK, "a business key, not-null or contract column, or "
                              "duplicate-check key is an identity column of its target, whose "
                              "values the target generates: the recomputation cannot produce "
                              "them"),
    "blast_radius": (Severity.INFO, "rows and bytes the window covers in source and target"),
    "window_rewrites_most": (Severity.WARN, "the promotion rewrites most of an unpartitioned "
                             "table's files"),
    "window_zone_dependent": (Severity.BLOCK, "the window reads fewer rows of a table in the "
                              "session time zone than the table holds (a partition column "
                              "generated from the window column, pruned by the session zone's "
                              "dates, written in another zone)"),
}
_TYPE_OK: dict[PartitionType, tuple[type[T.DataType], ...]] = {
    PartitionType.DATE: (T.DateType,),
    PartitionType.STRING: (T.StringType, T.CharType, T.VarcharType),
    PartitionType.INT: (T.ByteType, T.ShortType, T.IntegerType, T.LongType),
}


def _conf(spark: SparkSession, key: str, default: str) -> str:
    """A session conf, or ``default`` where the platform does not let it be read (Databricks
    serverless answers only the confs it lists)."""
    try:
        return str(spark.conf.get(key, default)).strip()
    except Exception:
        return default


def _flag(props: dict[str, Any], key: str) -> bool:
    """Whether the table property ``key`` is set to true (in any case and spacing)."""
    return str(props.get(key, "")).strip().lower() == "true"


# Delta's columns a read of a table with deletion vectors adds to its own against
# spark.sql.codegen.maxFields: measured 8 on Spark 4.0.1 (92 flat fields read in columnar
# batches, 93 not, at the default 100); 10 keeps the warning on the safe side of that edge
_DELTA_READ_FIELDS = 10
# Delta adds partition filters derived from a generated column's expression in the session zone
_GENERATED_PRUNING = "spark.databricks.delta.generatedColumn.partitionFilterOptimization.enabled"
_ZONE_BUCKETS = 400  # buckets one query of the time-zone check counts (a scan each)
_UNIT_DAYS = {"second": 1 / 86400, "minute": 1 / 1440, "hour": 1 / 24, "day": 1.0, "week": 7.0}
_DEFAULT_LOG_DAYS, _DEFAULT_FILE_DAYS = 30.0, 7.0


def retention_days(value: str | None, default: float) -> float | None:
    """Delta interval property (``interval 1 day 12 hours``) in days; default if unset, None if
    it is not a sum of second/minute/hour/day/week amounts."""
    if value is None or not value.strip():
        return default
    text = re.sub(r"(?i)^\s*interval\s+", "", value).strip().lower()
    pairs = re.findall(r"(\d+(?:\.\d+)?)\s*(second|minute|hour|day|week)s?\s*", text)
    if not pairs or re.sub(r"(\d+(?:\.\d+)?)\s*(second|minute|hour|day|week)s?\s*", "", text):
        return None
    return sum(float(n) * _UNIT_DAYS[unit] for n, unit in pairs)


class _Live:
    def __init__(self, spark: SparkSession, plan: BackfillPlan) -> None:
        assert plan.source_of_truth.dataset is not None, \
            "live checks run only on plans the static guard passed"
        self.spark, self.plan = spark, plan
        self.rw = range_window(plan)
        self.parts = window_partitions(plan)
        if self.rw is not None:
            self.p, self.ptype = self.rw.column, PartitionType.STRING
            self.pred = self.rw.predicate(self.parts)
            self.key = F.expr(self.rw.bucket_expr())
        else:
            assert plan.partitioning is not None
            self.p, self.ptype = plan.partitioning.column, plan.partitioning.type
            self.pred = window_predicate(self.p, self.ptype, self.parts)
            self.key = F.col(self.p)
        self.out: list[Finding] = []
        self.instant_seen: set[str] = set()  # checks told metric_percent_of_instant
        self.rows: dict[str, int] = {}  # source rows per window partition
        self.locations: dict[str, str] = {}  # target location -> path of its first target
        self.source_location: str | None = None

    def add(self, code: str, path: str, msg: str, fix: str = "") -> None:
        self.out.append(Finding(LIVE_RULES[code][0], code, f"{P}.{path}", msg, fix))

    def _partition_column_ok(self, df: DataFrame, what: str, path: str) -> bool:
        if self.rw is not None:
            problem = window_column_problem(df.schema, self.rw)
            if problem is not None:
                code, msg, fix = problem
                self.add(code, "window_column", f"{what}: {msg}", fix)
                return False
            return True
        field = next((f for f in df.schema.fields if f.name == self.p), None)
        if field is None:
            self.add("partition_column_missing", path, f"{what} has no column {self.p!r}",
                     f"use one of {df.columns[:20]}")
            return False
        if not isinstance(field.dataType, _TYPE_OK[self.ptype]):
            self.add("partition_type_mismatch", path,
                     f"{what} column {self.p!r} is {field.dataType.simpleString()}, the plan "
                     f"says {self.ptype.value}", "make partitioning.type match the table")
            return False
        return True

    def source(self) -> DataFrame | None:
        ref = TableRef.parse(self.plan.source_of_truth.dataset or "")
        if not delta_ops.table_exists(self.spark, ref):
            what, fix = delta_ops.not_delta(self.spark, ref)
            self.add("source_missing", "source_of_truth.dataset",
                     f"source {ref.display!r} {what}", fix)
            return None
        src = self._read(ref, "source_of_truth.dataset", "source")
        if src is None:
            return None
        # one DESCRIBE DETAIL: a target spelt another way may be this very table
        row = delta_ops.detail(self.spark, ref).select("location").first()
        self.source_location = delta_ops.location_key(row["location"] if row else None)
        if not self._partition_column_ok(src, "source", "partitioning.column"):
            return None
        # one aggregation; at most len(window) rows come back
        counts = {r[0]: r[1] for r in src.filter(self.pred).groupBy(self.key.alias("k"))
                  .agg(F.count(F.lit(1))).collect()}
        self.rows = {str(k): int(v) for k, v in counts.items()}
        if self.rw is not None and self.rw.type is WindowType.TIMESTAMP:  # the zone check only
            rules = compat.column_rules(self.spark, row["location"]) \
                if row is not None and row["location"] else None
            self._zone_loss(src, "source", "window_column", rules.generated if rules else None)
        missing = [str(x) for x in self.parts if counts.get(x, 0) == 0]
        if missing and self.rw is not None and len(missing) < len(self.parts):
            # a time range may have quiet hours: only a window with no source row at all blocks
            self.add("blast_radius", "affected_window",
                     f"{len(missing)} of {len(self.parts)} bucket(s) have no rows in the source: "
                     f"{missing[:10]}")
        elif missing:
            self.add("window_not_in_source", "affected_window.partitions",
                     f"{len(missing)} of {len(self.parts)} partition(s) have no rows in the "
                     f"source: {missing[:10]}", "fix the window or load the source first")
        self.add("blast_radius", "affected_window",
                 f"source: {sum(counts.values())} rows in {len(self.parts)} window partition(s)")
        for where, checks in self._check_sets(against_source=True):
            self._metric_exprs(src, "source_expr", checks, where)
        return src

    def _check_sets(self, against_source: bool = False) -> list[tuple[str, list[Check]]]:
        """The plan's checks and each target's own, with the path each is written at; with
        ``against_source``, not the own checks of a target that compares with a reference query
        (their source side is that query's rows, computed during the run)."""
        own = [(f"targets[{j}].validation.checks", t.validation.checks)
               for j, t in enumerate(self.plan.target_specs())
               if t.validation is not None and t.validation.checks
               and not (against_source and t.validation.reference is not None)]
        return [("validation.checks", self.plan.validation.checks), *own]

    def _read(self, ref: TableRef, path: str, what: str) -> DataFrame | None:
        """The table, or None with a finding when this client's Delta refuses to read it (a
        reader version or table feature it does not support)."""
        df, refused = delta_ops.read_resolved(self.spark, ref)
        if refused is not None:
            self.add("table_unreadable", path,
                     f"this client's Delta cannot read {what} {ref.display!r}: {refused}",
                     delta_ops.PROTOCOL_REFUSAL_FIX)
        return df

    def _checks_of(self, i: int, t: TargetSpec) -> tuple[str, list[Check]]:
        if t.validation is not None and t.validation.checks:
            return f"targets[{i}].validation.checks", t.validation.checks
        return "validation.checks", self.plan.validation.checks

    def target(self, i: int, t: TargetSpec, src: DataFrame | None) -> None:
        ref = TableRef.parse(t.dataset)
        path = f"targets[{i}]"
        if not delta_ops.table_exists(self.spark, ref):
            what, fix = delta_ops.not_delta(
                self.spark, ref, absent_fix="create it before backfilling, or check the name or "
                "path")
            self.add("target_missing", f"{path}.dataset", f"target {ref.display!r} {what}", fix)
            return
        df = self._read(ref, f"{path}.dataset", "target")
        if df is None:
            return
        names = set(df.columns)
        reserved = reserved_names(df.columns)
        if reserved:
            self.add("target_reserved_column", f"{path}.dataset",
                     f"target {ref.display!r} has column(s) {reserved} named with the prefix "
                     f"{RESERVED_PREFIX!r} of sparkguard's own working columns: the "
                     "reconciliation and the check after promotion would read them in place of "
                     "their own", "rename those columns (ALTER TABLE ... RENAME COLUMN, with "
                     "column mapping on) before backfilling")
        part_ok = self._partition_column_ok(df, f"target {ref.display!r}", f"{path}.dataset")
        for j, k in enumerate(t.business_keys):
            if k not in names:
                self.add("column_missing", f"{path}.business_keys[{j}]",
                         f"target {ref.display!r} has no column {k!r}",
                         f"use one of {sorted(names)[:20]}")
        for np_, msg, fix in not_null_findings(t, path, df.columns, f"target {ref.display!r}"):
            self.add("column_missing", np_, msg, fix)
        for cp, msg, fix in contract_column_findings(t, path, df.columns,
                                                     f"target {ref.display!r}"):
            self.add("column_missing", cp, msg, fix)
        where, checks = self._checks_of(i, t)
        for ci, check in enumerate(checks):
            if check.type is CheckType.DUPLICATE_CHECK:
                for k in check.key_columns or []:
                    if k not in names:
                        self.add("column_missing", f"{where}[{ci}].key_columns",
                                 f"target {ref.display!r} has no column {k!r}",
                                 f"use one of {sorted(names)[:20]}")
        detail = delta_ops.detail(self.spark, ref).select(
            "location", "partitionColumns", "properties", "numFiles", "sizeInBytes").first()
        location = delta_ops.location_key(detail["location"] if detail is not None else None)
        if location and location == self.source_location:
            self.add("source_is_target_table", f"{path}.dataset",
                     f"target {ref.display!r} is the source of truth's table "
                     f"({self.plan.source_of_truth.dataset!r}, at {location}): the gates would "
                     "compare the recomputation with the data it replaces",
                     "recompute from an upstream dataset")
        if location in self.locations:
            self.add("targets_same_table", f"{path}.dataset",
                     f"target {ref.display!r} is the table of {self.locations[location]} "
                     f"(at {location})", "give each table one target")
        elif location:
            self.locations[location] = f"{path} ({ref.display!r})"
        if detail is not None and self.rw is None and self.p not in (detail["partitionColumns"]
                                                                     or []):
            self.add("target_not_partitioned", f"{path}.dataset",
                     f"target {ref.display!r} is not partitioned by {self.p!r}; the window "
                     "replacement rewrites files across the table", "partition it by the column")
        props = dict(detail["properties"] or {}) if detail else {}
        self._retention(path, ref, props)
        if _flag(props, "delta.appendOnly"):
            self.add("target_append_only", f"{path}.dataset",
                     f"target {ref.display!r} is append-only (delta.appendOnly = true): Delta "
                     "refuses the promotion, which deletes or updates the window's rows",
                     f"for the backfill, ALTER TABLE {ref.sql} SET TBLPROPERTIES "
                     "('delta.appendOnly' = 'false'); set it back after")
        if _flag(props, "delta.enableDeletionVectors") and holds_type(df.schema, T.VariantType):
            self._variant_deletion_vectors(path, ref, t, df.schema,
                                           detail["partitionColumns"] if detail else None)
        rules = delta_ops.write_checks(self.spark, ref, detail)
        if rules.write_refused:
            self.add("target_not_writable", f"{path}.dataset",
                     f"this client's Delta cannot write target {ref.display!r}: "
                     f"{rules.write_refused}",
                     delta_ops.PROTOCOL_REFUSAL_FIX)
        self._identity(path, i, ref, t, rules)
        self._metric_exprs(rules.without_identity(df), "shadow_expr", checks, where,
                           f"target {ref.display!r}")
        if src is not None:
            self._transform(f"{path}.transform", t.transform, src)
            if t.validation is not None and t.validation.reference is not None:
                self._transform(f"{path}.validation.reference", t.validation.reference, src)
        if part_ok:
            self._blast_radius(path, ref, df, detail)
            self._zone_loss(df, f"target {ref.display!r}", f"{path}.dataset",
                            dict(rules.generated) if rules.columns_known else None)

    def _variant_deletion_vectors(self, path: str, ref: TableRef, t: TargetSpec,
                                  schema: T.StructType, partitioned_by: list[str] | None) -> None:
        """Spark 4.0 (SPARK-55552; 4.0.1 to 4.0.5 measured) fails to read a VARIANT column from a
        file with a deletion vector when its vectorized Parquet reader hands rows on without
        whole-stage code generation: a session with it off, or a read of more fields than
        ``spark.sql.codegen.maxFields`` counting Delta's own columns (with the vectorized
        reader off, Parquet's row reader reads such files). A promotion that leaves such files
        (a MERGE; a replaceWhere over columns the table is not partitioned by) then fails its
        verification (restored, exit 3), and a rollback to it fails before restoring."""
        window = ((self.p,) if self.rw is None
                  else tuple(c for c in (self.rw.column, self.rw.hour_column) if c))
        parts = {c.lower() for c in partitioned_by or []}
        whole_files = all(c.lower() in parts for c in window)
        if t.promotion is Promotion.REPLACE_WHERE and whole_files:
            return
        fields = leaf_fields(schema)
        codegen = _conf(self.spark, "spark.sql.codegen.wholeStage", "true").lower() == "true"
        try:
            most = int(_conf(self.spark, "spark.sql.codegen.maxFields", "100"))
        except ValueError:
            most = 100
        vectorized = _conf(self.spark, "spark.sql.parquet.enableVectorizedReader",
                           "true").lower() == "true"
        if not vectorized or (codegen and fields + _DELTA_READ_FIELDS <= most):
            return  # Parquet's own row reader, or columnar batches: both read such files
        why = ("this session reads without whole-stage code generation "
               "(spark.sql.codegen.wholeStage = false)" if not codegen else
               f"its {fields} fields and Delta's own columns pass spark.sql.codegen.maxFields "
               f"({most}), so Spark reads its rows without whole-stage code generation")
        how = ("marks the rows it replaces in deletion vectors"
               if t.promotion is not Promotion.REPLACE_WHERE else
               f"over {', '.join(window)}, which the table is not partitioned by, deletes the "
               "window's rows from files it keeps, in deletion vectors")
        fixes = [f"run with --conf spark.sql.codegen.maxFields={fields + 2 * _DELTA_READ_FIELDS}"
                 if codegen else "turn spark.sql.codegen.wholeStage on for the run",
                 f"turn deletion vectors off for the backfill (ALTER TABLE {ref.sql} SET "
                 "TBLPROPERTIES ('delta.enableDeletionVectors' = 'false'))"]
        if whole_files:
            fixes.append("set promotion: replace_where (it replaces whole files)")
        self.add("variant_deletion_vectors", f"{path}.promotion",
                 f"target {ref.display!r} has a VARIANT column and deletion vectors, and {why}: "
                 f"a {t.promotion.value} promotion {how}, and this Spark cannot read a VARIANT "
                 "column from such a file without code generation (SPARK-55552, in Spark 4.0.1 "
                 "to 4.0.5): the verification would fail and restore the target (exit 3), and a "
                 "rollback to a version holding such files fails before restoring (exit 3)",
                 "; or ".join(fixes))

    def _identity(self, path: str, index: int, ref: TableRef, t: TargetSpec,
                  rules: delta_ops.WriteChecks) -> None:
        """A target's identity columns are the target's to fill: a MERGE keeps them for the
        keys it updates; a replaceWhere would renumber the window, and a key among them cannot
        come out of a recomputation."""
        identity = rules.identity_columns
        if not identity:
            return
        shown = ", ".join(identity)
        if t.promotion is Promotion.REPLACE_WHERE:
            self.add("identity_replace_where", f"{path}.promotion",
                     f"target {ref.display!r} has identity column(s) {shown}: replace_where "
                     "deletes the window's rows and inserts new ones, each with a new identity "
                     "value, so every row of the window would change key",
                     "set promotion: merge_changed (or merge), which keeps the identity value of "
                     "every key the target holds; leave the identity column(s) out of the "
                     "transform")
        lowered = {c.lower() for c in identity}
        named = [(f"{path}.business_keys[{j}]", k) for j, k in enumerate(t.business_keys)]
        named += [(f"{path}.contract.not_null[{j}]", k)
                  for j, k in enumerate(t.contract.not_null)]
        named += [(f"{path}.contract.columns[{j}].name", c.name)
                  for j, c in enumerate(t.contract.columns)]
        where, checks = self._checks_of(index, t)
        named += [(f"{where}[{ci}].key_columns", k) for ci, check in enumerate(checks)
                  if check.type is CheckType.DUPLICATE_CHECK for k in check.key_columns or []]
        for field, name in named:
            if name.lower() in lowered:
                self.add("identity_column_named", field,
                         f"{name!r} is an identity column of target {ref.display!r}: the target "
                         "generates its values, so the recomputed rows do not have it",
                         "name the target's other columns (a business key: the natural key that "
                         "identifies a row in the source)")

    def _retention(self, path: str, ref: TableRef, props: dict[str, str]) -> None:
        horizon = self.plan.safeguards.rollback_horizon_days
        days: dict[str, float] = {}
        for key, default in (("delta.logRetentionDuration", _DEFAULT_LOG_DAYS),
                             ("delta.deletedFileRetentionDuration", _DEFAULT_FILE_DAYS)):
            value = retention_days(props.get(key), default)
            if value is None:
                self.add("retention_unreadable", f"{path}.dataset",
                         f"{key} = {props.get(key)!r} cannot be read as an interval",
                         "write it as 'interval N days'")
            else:
                days[key] = value
        short = {k: v for k, v in days.items() if v < horizon}
        if short:
            shown = ", ".join(f"{k} = {v:g} days" for k, v in short.items())
            self.add("retention_too_short", f"{path}.dataset",
                     f"target {ref.display!r}: {shown} does not cover the {horizon:g}-day "
                     "rollback horizon (RESTORE needs the old log and files)",
                     "raise the retention (ALTER TABLE ... SET TBLPROPERTIES) or lower "
                     "safeguards.rollback_horizon_days deliberately")

    def _metric_exprs(self, df: DataFrame, side: str, checks: list[Check], where: str,
                      what: str = "source") -> None:
        for i, check in enumerate(checks):
            expr = getattr(check, side)
            if check.type is not CheckType.METRIC_RECONCILIATION or not expr:
                continue
            agg = check.aggregation
            try:  # the gate aggregates the value of each row itself: one analysis when valid
                _analyse(df.agg(_AGGREGATE[agg](F.expr(expr))))
                self._instant_percent(df, expr, check, f"{where}[{i}]")
                continue
            except Exception as exc:
                not_aggregable = exc
            try:  # which fault: the expression itself, or its aggregation
                _analyse(df.select(F.expr(expr)))
            except Exception as exc:
                self.add("metric_expr_invalid", f"{where}[{i}].{side}",
                         f"{expr!r} does not resolve on the {what}: {first_line(exc)}",
                         "use columns of that side")
                continue
            self.add("metric_expr_invalid", f"{where}[{i}].{side}",
                     f"{expr!r} cannot be aggregated with {agg.value} on the {what}: "
                     f"{first_line(not_aggregable)}",
                     "write a deterministic expression of one row's columns, without "
                     f"aggregate or window functions (the gate applies {agg.value} itself: "
                     f"'amount', not 'sum(amount)'), of a type {agg.value} takes")

    def _instant_percent(self, df: DataFrame, expr: str, check: Check, path: str) -> None:
        """A date or timestamp metric (min, max, avg, sum) compares in days or seconds since
        1970: a percent of that alone is no tolerance anyone means (0.01 % of the days since
        1970 is about two days); with an absolute threshold beside it, which must hold too, it
        only tightens. For the gate's threshold and the drift threshold; said once per check,
        whichever side resolves it first."""
        loose = [(f, pct) for f, pct, absolute in (
            ("threshold_percent", check.threshold_percent, check.threshold_absolute),
            ("drift_threshold_percent", check.drift_threshold_percent,
             check.drift_threshold_absolute)) if pct and absolute is None]
        if not loose or check.aggregation in (Aggregation.COUNT, Aggregation.COUNT_DISTINCT) \
                or path in self.instant_seen:
            return
        dtype = _analyse(df.select(F.expr(expr))).fields[0].dataType
        unit = ("days" if isinstance(dtype, T.DateType) else "seconds" if isinstance(
            dtype, (T.TimestampType, T.TimestampNTZType)) else None)
        if unit is None:
            return
        self.instant_seen.add(path)
        for field, pct in loose:
            days = (dt.date.today() - dt.date(1970, 1, 1)).days * pct / 100
            self.add("metric_percent_of_instant", f"{path}.{field}",
                     f"metric {check.metric or '(unnamed)'} compares {check.aggregation.value} "
                     f"of a {'date' if unit == 'days' else 'timestamp'} in {unit} since "
                     f"1970-01-01, so {field} {pct:g} lets it move by about {days:.2g} days",
                     f"write {field.replace('percent', 'absolute')} in {unit} (0 for exact) "
                     f"beside it or instead, or set {field}: 0")

    def _transform(self, path: str, tr: Transform, src: DataFrame) -> None:
        """A transform (or a target's reference query) imports or analyses on the source."""
        if tr.callable:
            mod_name, fn_name = tr.callable.split(":")
            try:
                fn = getattr(importlib.import_module(mod_name), fn_name)
            except Exception as exc:
                self.add("transform_invalid", f"{path}.callable",
                         f"{tr.callable!r} cannot be imported: {first_line(exc)}",
                         "check the module path and function name")
                return
            if not callable(fn):
                self.add("transform_invalid", f"{path}.callable",
                         f"{tr.callable!r} is not callable", "point it at a function")
            return
        assert tr.sql is not None
        if "{shadow:" in tr.sql:
            return  # upstream shadows exist only during the run
        view = f"__sg_guard_{uuid.uuid4().hex[:12]}"
        src.filter(self.pred).createOrReplaceTempView(view)
        # a {fill:COLUMN} hole left by plan init is a static finding; analyse the rest
        sql = re.sub(r"\{fill:[^{}]*\}", "NULL", tr.sql)
        try:
            _analyse(self.spark.sql(query_only(sql.replace("{source}", f"`{view}`")
                                               .replace("{window}", self.pred))))
        except ParseException as exc:
            self.add("transform_invalid", f"{path}.sql",
                     f"it does not parse as one query (a command such as DELETE, INSERT or "
                     f"MERGE is never run): {first_line(exc)}",
                     "write one SELECT (or WITH ... SELECT) reading {source}")
        except Exception as exc:
            self.add("transform_invalid", f"{path}.sql",
                     f"the query does not analyse against the source: {first_line(exc)}",
                     "fix the SQL (column and function names)")
        finally:
            self.spark.catalog.dropTempView(view)

    def _zone_loss(self, df: DataFrame, what: str, path: str,
                   generated: Mapping[str, str] | None) -> None:
        """A time-range window reads the same rows whatever the session zone, unless Delta
        prunes a generated partition column (``CAST(event_ts AS DATE)``) by the session zone's
        dates of a query's bounds and the table's writers used another zone: then rows are read
        by no slice, left wrong and reported fixed. Each slice reads a run of whole buckets, and
        a bucket's pruning is never wider than its slice's, so the check counts every bucket on
        its own as the run reads them (a scan per bucket, one query per ``_ZONE_BUCKETS`` of
        them: the window's buckets are bounded by the plan's ``max_partitions``), and all of
        them in one grouped query with that pruning off, and blocks when any bucket reads fewer
        rows as the run would (pruning only ever drops rows). Only for a table with a column
        generated from the window column (``generated``: column -> expression, None when
        unknown: Spark Connect, a restricted cluster). Where
        the pruning cannot be turned off (a serverless session refusing the setting), a UTC
        session is the baseline, as the zone writers normally use."""
        zone = str(self.spark.conf.get("spark.sql.session.timeZone"))
        if self.rw is None or self.rw.type is not WindowType.TIMESTAMP \
                or not self._generated_from_window(generated):
            return
        rw, buckets = self.rw, list(self.parts)
        index = {str(b): i for i, b in enumerate(buckets)}

        def per_bucket() -> dict[int, int]:  # new plans each time: optimised as confs are set
            counts: dict[int, int] = {}
            for first in range(0, len(buckets), _ZONE_BUCKETS):
                scans = [df.filter(F.expr(rw.predicate([b]))).select(F.lit(i).alias("b"))
                         for i, b in enumerate(buckets[first:first + _ZONE_BUCKETS], first)]
                union = functools.reduce(DataFrame.unionAll, scans).groupBy("b").count()
                counts.update((int(r[0]), int(r[1])) for r in union.collect())  # <= a chunk
            return counts

        def grouped() -> dict[int, int]:  # unpruned, a bucket's count needs no scan of its own
            rows = (df.filter(F.expr(rw.predicate(buckets))).groupBy(F.expr(rw.bucket_expr()))
                    .count().collect())  # <= one row per bucket
            return {index[str(r[0])]: int(r[1]) for r in rows if str(r[0]) in index}

        here = per_bucket()
        truth = self._with_conf(_GENERATED_PRUNING, "false", grouped)
        if truth is None:
            if zone == "UTC":
                return
            truth = self._with_conf("spark.sql.session.timeZone", "UTC", per_bucket)
            if truth is None:
                return
        short = {buckets[i]: n - here.get(i, 0) for i, n in truth.items() if n > here.get(i, 0)}
        if short:
            lost, total = sum(short.values()), sum(truth.values())
            self.add("window_zone_dependent", path,
                     f"{what}: in session time zone {zone} the window's buckets read "
                     f"{total - lost} of their {total} rows; Delta prunes a partition column "
                     f"generated from {self.rw.column!r} by the session zone's dates, and the "
                     f"table's writers used another zone, so {lost} window row(s) would be "
                     f"read by no slice and left as they are "
                     f"(buckets {sorted(map(str, short))[:5]})",
                     "set spark.sql.session.timeZone to the zone the table's writers use "
                     "(UTC, normally)")

    def _generated_from_window(self, generated: Mapping[str, str] | None) -> bool:
        """Whether a generated column's expression names the window column (True when the
        table's generated columns are unknown)."""
        if generated is None or self.rw is None:
            return True
        name = self.rw.column.lower()
        return any(name in expr.lower() for expr in generated.values())

    def _with_conf(self, key: str, value: str, count: Callable[[], dict[int, int]]
                   ) -> dict[int, int] | None:
        """``count()`` with the session setting ``key`` at ``value``, then put back
        (``delta_ops.session_confs``); None when the session refuses to show or take it."""
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(session_confs(self.spark, {key: value}))
            except Exception:  # a serverless session refuses settings it does not expose
                return None
            return count()

    def _blast_radius(self, path: str, ref: TableRef, df: DataFrame, detail: Any) -> None:
        """Report what the promotion replaces."""
        meta = df.metadataColumn("_metadata")  # Delta's, even if the table has a `_metadata`
        files = (df.filter(self.pred)
                 .select(meta.getField("file_path").alias("f"),
                         meta.getField("file_size").alias("s"))
                 .groupBy("f").agg(F.count(F.lit(1)).alias("n"), F.max("s").alias("s")))
        row = files.agg(F.sum("n"), F.count(F.lit(1)), F.sum("s")).first()
        rows, nfiles, size = (int(row[0] or 0), int(row[1] or 0), int(row[2] or 0)) if row \
            else (0, 0, 0)
        self.add("blast_radius", f"{path}.dataset",
                 f"target {ref.display!r}: {rows} rows in {nfiles} file(s), {size / 1e6:.2f} MB "
                 "inside the window will be replaced in one commit")
        if self.rw is not None and detail is not None and not detail["partitionColumns"]:
            flag = rewrites_most(nfiles, int(detail["numFiles"] or 0), size,
                                 int(detail["sizeInBytes"] or 0))
            if flag:
                self.add("window_rewrites_most", f"{path}.dataset",
                         f"target {ref.display!r} is not partitioned: {flag}",
                         "expected for a small table; otherwise cluster it (CLUSTER BY the "
                         "window column) or narrow the window, so a promotion rewrites less")


# how a metric's rows are aggregated (avg: a sum and a count; count_distinct: a count of values)
_AGGREGATE = {Aggregation.SUM: F.sum, Aggregation.AVG: F.sum, Aggregation.MIN: F.min,
              Aggregation.MAX: F.max, Aggregation.COUNT: F.count,
              Aggregation.COUNT_DISTINCT: F.count_distinct}


def _analyse(df: DataFrame) -> T.StructType:
    """Resolve a DataFrame's plan (names, types, functions) without running a job."""
    return df.schema


def live_findings(spark: SparkSession, plan: BackfillPlan) -> list[Finding]:
    """Existence, columns and types, window present in the source, transform and metric
    expressions analysable, retention covering the rollback horizon, blast radius."""
    return live_check(spark, plan)[0]


def live_check(spark: SparkSession, plan: BackfillPlan) -> tuple[list[Finding], dict[str, int]]:
    """:func:`live_findings`, and the source rows per window partition they counted (keyed by
    ``str(partition)``; the run sizes ``auto`` slices from them)."""
    live = _Live(spark, plan)
    src = live.source()
    for i, t in enumerate(plan.targets):
        if isinstance(t, TargetSpec):
            live.target(i, t, src)
    return live.out, live.rows
