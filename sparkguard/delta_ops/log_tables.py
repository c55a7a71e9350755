"""The append-only log tables (ledger, publish control): creation and one-commit appends."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType, TimestampType

from sparkguard import compat
from sparkguard.delta_ops.conflicts import post_commit_failed, with_conflict_retry
from sparkguard.delta_ops.tables import delta_log_exists

__all__ = ["LOG_TABLE_PROPERTIES", "append_rows", "create_log_table", "literal_frame"]


# Log tables (ledger, publish control) grow by one small commit per event. Column statistics on
# their first two columns only (about 6 % on a one-row append): ``status`` reads the runs table
# newest first from its ``run_id`` and ``at`` statistics (``sparkguard/newest_runs.py``); other
# reads compute the latest state per key over the whole table. Delta's auto compaction rewrites
# their small files into one as soon as 50 of them have piled up
# (``spark.databricks.delta.autoCompact.minNumFiles``), inside the append that crosses that
# count, so a read opens a bounded number of files at any size; a classic checkpoint every 100
# commits bounds the log replay. Nothing is ever updated or deleted. All of it is readable by
# delta-rs: no table feature beyond the base protocol.
LOG_TABLE_PROPERTIES = {"delta.checkpointInterval": "100", "delta.appendOnly": "true",
                        "delta.dataSkippingNumIndexedCols": "2",
                        "delta.autoOptimize.autoCompact": "true"}


def literal_frame(spark: SparkSession, schema: StructType, rows: Sequence[Sequence[Any]]
                  ) -> DataFrame:
    """A small DataFrame of ``rows`` built from literals in the JVM (no Python worker job).

    Every value becomes a typed literal cast to its field's type, so nothing is rendered as SQL
    text. Several times cheaper than ``createDataFrame`` for the one-row appends of the ledger.
    """
    if not rows:
        return spark.createDataFrame([], schema)
    structs = [F.struct(*[F.lit(v).cast(f.dataType).alias(f.name)
                          for v, f in zip(row, schema.fields, strict=True)]) for row in rows]
    return spark.range(1).select(F.inline(F.array(*structs)))


def create_log_table(spark: SparkSession, path: str, schema: StructType) -> bool:
    """Create an append-only log table (ledger, publish control) unless it exists; whether
    this call created it (and so knows it empty).

    Checkpoints every 100 commits instead of 10: a run appends a dozen small events and reads
    the table once, and each checkpoint costs several Spark jobs.
    """
    if delta_log_exists(spark, path):
        return False
    # columns nullable, as a DataFrame write makes them (the ledger checks its own fields)
    schema = StructType([StructField(f.name, f.dataType, True, f.metadata) for f in schema.fields])
    if not compat.is_connect(spark):  # DeltaTable.create needs Delta's plugin over Connect
        builder = DeltaTable.create(spark).location(path).addColumns(schema)
        for key, value in LOG_TABLE_PROPERTIES.items():
            builder = builder.property(key, value)
        try:
            builder.execute()  # a metadata-only commit: no write job, a third of the cost
            return True
        except Exception:
            if delta_log_exists(spark, path):
                return False  # another run created it at the same moment
    # DeltaTable.create takes a ``_delta_log`` folder without a commit (a creator that died, or
    # one still at it) for a table; an empty append takes version 0 there
    empty = spark.createDataFrame([], schema).write.format("delta").mode("append")
    try:
        empty.options(**LOG_TABLE_PROPERTIES).save(path)
    except Exception:
        # Another run created it at the same moment: its first commit is what made ours fail.
        if not delta_log_exists(spark, path):
            raise
        return False
    return True


_LITERAL_ROWS = 64  # above this, a batch goes through createDataFrame (one Python job)


def _instants(schema: StructType, rows: Sequence[Sequence[Any]]) -> list[tuple[Any, ...]]:
    """Naive datetimes of ``TIMESTAMP`` fields as aware UTC instants. PySpark would read a naive
    one as local time through ``time.mktime``, which ignores ``fold`` (the repeated autumn
    hour) and shifts a time that does not exist (the skipped spring hour); an aware one it
    converts exactly. Naive values are local time, as PySpark reads timestamps back."""
    stamps = [i for i, f in enumerate(schema.fields) if isinstance(f.dataType, TimestampType)]
    out = []
    for row in rows:
        values = list(row)
        for i in stamps:
            if isinstance(values[i], dt.datetime) and values[i].tzinfo is None:
                values[i] = values[i].astimezone(dt.UTC)
        out.append(tuple(values))
    return out


def append_rows(spark: SparkSession, path: str, schema: StructType,
                rows: Sequence[Sequence[Any]], txn: tuple[str, int] | None = None,
                metadata: str | None = None, merge_schema: bool = False) -> None:
    """Append ``rows`` in one commit (bounded retry on conflicts). With ``txn``, Delta skips
    the write when that txnAppId already committed that txnVersion or a later one;
    ``metadata`` becomes the commit's userMetadata; ``merge_schema`` adds the schema's new
    columns to an older table."""
    rows = _instants(schema, rows)
    frame = (literal_frame(spark, schema, rows) if len(rows) <= _LITERAL_ROWS
             else spark.createDataFrame([tuple(r) for r in rows], schema).coalesce(1))
    writer = frame.write.format("delta").mode("append")
    if metadata is not None:
        writer = writer.option("userMetadata", metadata)
    if merge_schema:
        writer = writer.option("mergeSchema", "true")
    if txn is not None:
        writer = writer.option("txnAppId", txn[0]).option("txnVersion", txn[1])
    def save() -> None:
        try:
            writer.save(path)
        except Exception as exc:
            if not post_commit_failed(exc):
                raise
            # the rows are committed; only the auto compaction after it failed (another process
            # compacting the same files at the same moment): the next append compacts instead

    with_conflict_retry(save, attempts=5, delay_s=0.5, log=lambda _m: None)
