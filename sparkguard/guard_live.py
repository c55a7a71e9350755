"""The guard's live checks: what only the lake itself can answer."""

from __future__ import annotations

import re

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sparkguard import delta_ops
from sparkguard.guard import Finding, Severity, window_partitions
from sparkguard.plan.model import BackfillPlan
from sparkguard.sql import PartitionType, TableRef, window_predicate

__all__ = ["live_findings"]

P = "backfill_plan"
_TYPE_OK = {
    PartitionType.DATE: (T.DateType,),
    PartitionType.STRING: (T.StringType,),
    PartitionType.INT: (T.IntegerType, T.LongType, T.ShortType),
}


def _interval_days(value: str | None, default: float) -> float:
    if not value:
        return default
    m = re.match(r"(?i)\s*interval\s+(\d+)\s+(day|days|hour|hours|week|weeks)", value)
    if not m:
        return default
    n, unit = int(m.group(1)), m.group(2).lower()
    return n / 24 if unit.startswith("hour") else n * 7 if unit.startswith("week") else n


def live_findings(spark: SparkSession, plan: BackfillPlan,
                  rollback_horizon_days: float = 7.0) -> list[Finding]:
    """Existence, columns and types, window present in the source, retention, blast radius."""
    out: list[Finding] = []

    def add(sev: Severity, code: str, path: str, msg: str, fix: str = "") -> None:
        out.append(Finding(sev, code, f"{P}.{path}", msg, fix))

    assert plan.partitioning is not None and plan.source_of_truth.dataset is not None
    p, ptype = plan.partitioning.column, plan.partitioning.type
    parts = window_partitions(plan)
    src_ref = TableRef.parse(plan.source_of_truth.dataset)
    if not delta_ops.table_exists(spark, src_ref):
        add(Severity.BLOCK, "source_missing", "source_of_truth.dataset",
            f"source {src_ref.display!r} is not a Delta table", "check the name or path")
    else:
        src = delta_ops.read_table(spark, src_ref)
        field = next((f for f in src.schema.fields if f.name == p), None)
        if field is None:
            add(Severity.BLOCK, "partition_column_missing", "partitioning.column",
                f"source has no column {p!r}", f"use one of {src.columns[:20]}")
        elif not isinstance(field.dataType, _TYPE_OK[ptype]):
            add(Severity.BLOCK, "partition_type_mismatch", "partitioning.type",
                f"source column {p!r} is {field.dataType.simpleString()}, plan says {ptype.value}",
                "make partitioning.type match the table")
        else:
            counts = {r[p]: r["n"] for r in src.filter(window_predicate(p, ptype, parts))
                      .groupBy(p).agg(F.count(F.lit(1)).alias("n")).collect()}
            missing = [str(x) for x in parts if counts.get(x, 0) == 0]
            if missing:
                add(Severity.BLOCK, "window_not_in_source", "affected_window.partitions",
                    f"{len(missing)} partition(s) have no rows in the source: {missing[:10]}",
                    "fix the window or load the source first")
            rows = sum(counts.values())
            detail = delta_ops._delta(spark, src_ref).detail().select(
                "sizeInBytes", "numFiles").first()
            total = src.count() or 1
            est_bytes = int((detail["sizeInBytes"] or 0) * rows / total) if detail else 0
            add(Severity.INFO, "blast_radius", "affected_window",
                f"{len(parts)} partitions, {rows} source rows, about {est_bytes / 1e6:.1f} MB "
                "in the window")
    for i, t in enumerate(plan.target_specs()):
        ref = TableRef.parse(t.dataset)
        if not delta_ops.table_exists(spark, ref):
            add(Severity.BLOCK, "target_missing", f"targets[{i}].dataset",
                f"target {ref.display!r} is not a Delta table", "create it before backfilling")
            continue
        df = delta_ops.read_table(spark, ref)
        names = {f.name: f for f in df.schema.fields}
        for k in [p, *t.business_keys]:
            if k not in names:
                add(Severity.BLOCK, "column_missing", f"targets[{i}].business_keys",
                    f"target {ref.display!r} has no column {k!r}", f"use one of {list(names)[:20]}")
        if p in names and not isinstance(names[p].dataType, _TYPE_OK[ptype]):
            add(Severity.BLOCK, "partition_type_mismatch", f"targets[{i}].dataset",
                f"target column {p!r} is {names[p].dataType.simpleString()}, plan says "
                f"{ptype.value}", "make partitioning.type match the table")
        props = delta_ops.retention_properties(spark, ref)
        log_days = _interval_days(props.get("delta.logRetentionDuration"), 30)
        file_days = _interval_days(props.get("delta.deletedFileRetentionDuration"), 7)
        if min(log_days, file_days) < rollback_horizon_days:
            add(Severity.BLOCK, "retention_too_short", f"targets[{i}].dataset",
                f"log retention {log_days:g} days / deleted-file retention {file_days:g} days "
                f"do not cover the {rollback_horizon_days:g}-day rollback horizon",
                "raise delta.deletedFileRetentionDuration / delta.logRetentionDuration")
    return out
