"""The data writes: shadow slices, promotion (replaceWhere or MERGE, and the empty append that
records a MERGE with nothing to change), RESTORE and the window revert. Each commit carries
sparkguard's userMetadata and, where idempotence needs it, a transaction id."""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession

from sparkguard import compat
from sparkguard.delta_ops.changes import window_changes
from sparkguard.delta_ops.commits import current_version
from sparkguard.delta_ops.sessions import (
    TXN_APP_CONF,
    TXN_VERSION_CONF,
    USER_METADATA_CONF,
    isolated_session,
    session_confs,
)
from sparkguard.delta_ops.tables import delta_table, read_version, table_exists
from sparkguard.spark_types import field_names
from sparkguard.sql import (
    CHANGE_OP,
    TableRef,
    merge_changes_statement,
    merge_condition,
    merge_statement,
    quote_column,
    restore_statement,
)

__all__ = ["promote_merge", "promote_replace_where", "restore", "revert_window",
           "write_partitions"]

# characters Delta refuses in a column name without column mapping
_NEEDS_MAPPING = re.compile(r"[ ,;{}()\n\t=]")


def write_partitions(df: DataFrame, ref: TableRef, predicate: str,
                     partition_column: str | Sequence[str],
                     metadata: str | None = None, txn: tuple[str, int] | None = None) -> None:
    """Replace exactly the rows matching ``predicate`` with ``df`` (creating the table if new,
    partitioned by ``partition_column``: one name, several, or none).

    Rows of ``df`` outside the predicate fail the write (Delta's replaceWhere constraint check).
    """
    cols = [partition_column] if isinstance(partition_column, str) else list(partition_column)
    writer = df.write.format("delta").mode("overwrite").option("replaceWhere", predicate)
    if cols:
        writer = writer.partitionBy(*cols)
    if any(_NEEDS_MAPPING.search(c) for c in field_names(df.schema)) and not table_exists(
            df.sparkSession, ref):
        # Parquet names cannot hold these characters: a table whose columns or nested fields do
        # (a target with column mapping) gets a shadow with column mapping too, set as it is
        # created
        writer = writer.option("delta.columnMapping.mode", "name")
    _save(writer, ref, metadata, txn)


def _save(writer: Any, ref: TableRef, metadata: str | None, txn: tuple[str, int] | None) -> None:
    """Run a Delta write into ``ref`` with its commit's userMetadata and idempotent txn as
    per-write options (never session confs)."""
    if metadata:
        writer = writer.option("userMetadata", metadata)
    if txn:
        writer = writer.option("txnAppId", txn[0]).option("txnVersion", txn[1])
    if ref.path is not None:
        writer.save(ref.path)
    else:
        assert ref.name is not None
        writer.saveAsTable(ref.name)


def promote_replace_where(df: DataFrame, ref: TableRef, predicate: str, metadata: str,
                          txn: tuple[str, int]) -> None:
    """Promote the window in one commit with replaceWhere; idempotent through txnAppId/Version."""
    _save(df.write.format("delta").mode("overwrite").option("replaceWhere", predicate), ref,
          metadata, txn)


def promote_merge(spark: SparkSession, df: DataFrame, ref: TableRef, keys: Sequence[str],
                  window_predicate_target: str, delete_unmatched: bool, metadata: str,
                  txn: tuple[str, int] | None = None, changed_only: bool = False) -> None:
    """Promote the window in one MERGE commit on the business keys.

    ``window_predicate_target`` is the window predicate qualified with alias ``t``; it bounds
    both matching and, when ``delete_unmatched``, the deletion of rows the recomputation no
    longer produces, so rows outside the window are never touched. With ``changed_only`` the
    MERGE's source is only the changes (:func:`window_changes`): unchanged rows are neither
    matched, rewritten nor reported by the change data feed. ``txn`` sets Delta's
    ``write.txnAppId``/``write.txnVersion`` for the statement (a repeat is a no-op); they and the
    userMetadata are set in an isolated session, never on ``spark`` (Spark Connect, which has
    no isolated sessions, excepted).
    """
    confs = {USER_METADATA_CONF: metadata}
    if txn is not None:
        confs |= {TXN_APP_CONF: txn[0], TXN_VERSION_CONF: str(txn[1])}
    cols = df.columns
    source = (window_changes(spark, df, ref, keys, window_predicate_target, delete_unmatched)
              if changed_only else df)
    if changed_only:  # record the commit even when no row changed (Delta skips empty ones)
        confs |= {"spark.databricks.delta.skipRecordingEmptyCommits": "false"}
    before = current_version(spark, ref) if changed_only else None
    _merge(spark, source, ref, keys, cols, window_predicate_target, delete_unmatched, confs,
           changed_only)
    if before is not None and current_version(spark, ref) == before:
        # Delta skipped the MERGE of an empty change set: the promotion still needs its
        # commit, which a resumed run finds by its userMetadata (the txn makes it non-empty)
        _save(df.limit(0).write.format("delta").mode("append"), ref, metadata, txn)


def _merge(spark: SparkSession, source: DataFrame, ref: TableRef, keys: Sequence[str],
           cols: Sequence[str], window_predicate_target: str, delete_unmatched: bool,
           confs: dict[str, str], changed_only: bool) -> None:
    """The MERGE statement of :func:`promote_merge`, from ``source`` (the changes only, with
    ``changed_only``)."""
    if compat.is_connect(spark):  # the DeltaTable merge builder needs Delta's server plugin
        view = f"sparkguard_merge_{uuid.uuid4().hex}"
        source.createOrReplaceTempView(view)
        try:
            with session_confs(spark, confs):
                spark.sql(merge_changes_statement(ref, view, keys, cols, window_predicate_target)
                          if changed_only else
                          merge_statement(ref, view, keys, cols, window_predicate_target,
                                          delete_unmatched))
        finally:
            spark.catalog.dropTempView(view)
        return
    cond = f"({merge_condition(keys)}) AND {window_predicate_target}"
    sets: dict[str, str | Column] = {quote_column(c): f"`s`.{quote_column(c)}" for c in cols}
    op = f"`s`.{quote_column(CHANGE_OP)}"
    with isolated_session(spark, confs) as iso:  # MERGE takes these only from session confs
        builder = delta_table(iso, ref).alias("t").merge(source.alias("s"), cond)
        if changed_only:
            builder = (builder.whenMatchedDelete(condition=f"{op} = 'D'")
                       .whenMatchedUpdate(condition=f"{op} = 'U'", set=sets)
                       .whenNotMatchedInsert(condition=f"{op} = 'I'", values=sets))
        else:
            builder = (builder.whenMatchedUpdate(set=sets)
                       .whenNotMatchedInsert(values=sets))
            if delete_unmatched:
                builder = builder.whenNotMatchedBySourceDelete(condition=window_predicate_target)
        builder.execute()


def restore(spark: SparkSession, ref: TableRef, version: int, metadata: str | None = None) -> None:
    """``RESTORE TABLE ... TO VERSION AS OF version`` (one new commit), in an isolated session
    carrying ``metadata`` as the commit's userMetadata (RESTORE takes it only from the session
    conf): ``DeltaTable.restoreToVersion``, or the SQL statement over Spark Connect."""
    with isolated_session(spark, {USER_METADATA_CONF: metadata} if metadata else {}) as iso:
        if compat.is_connect(spark):
            iso.sql(restore_statement(ref, version))
        else:
            delta_table(iso, ref).restoreToVersion(version)


def revert_window(spark: SparkSession, ref: TableRef, version: int, predicate: str,
                  metadata: str) -> None:
    """Put the rows matching ``predicate`` back as they were at ``version``, in one commit.

    Unlike RESTORE, commits of other writers outside the window are kept.
    """
    old = read_version(spark, ref, version).filter(predicate)
    writer = (old.write.format("delta").mode("overwrite").option("replaceWhere", predicate)
              .option("userMetadata", metadata))
    if ref.path is not None:
        writer.save(ref.path)
    else:
        assert ref.name is not None
        writer.saveAsTable(ref.name)
