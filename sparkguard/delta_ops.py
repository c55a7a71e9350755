"""Every Delta read, write, promotion, restore and history look-up sparkguard performs."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sparkguard.sql import TableRef, merge_condition, restore_statement

__all__ = [
    "commit_metadata",
    "commits_since",
    "current_version",
    "find_commit",
    "missing_files_for_version",
    "promote_merge",
    "promote_replace_where",
    "read_table",
    "read_version",
    "restore",
    "retention_properties",
    "table_exists",
    "user_metadata",
    "with_conflict_retry",
    "write_partitions",
]

T = TypeVar("T")
_USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"


def table_exists(spark: SparkSession, ref: TableRef) -> bool:
    """True when ``ref`` is a Delta table."""
    if ref.path is not None:
        return bool(DeltaTable.isDeltaTable(spark, ref.path))
    assert ref.name is not None
    try:
        if not spark.catalog.tableExists(ref.name):
            return False
        DeltaTable.forName(spark, ref.name)
        return True
    except Exception:
        return False


def _delta(spark: SparkSession, ref: TableRef) -> DeltaTable:
    if ref.path is not None:
        return DeltaTable.forPath(spark, ref.path)
    return DeltaTable.forName(spark, ref.name)


def read_table(spark: SparkSession, ref: TableRef) -> DataFrame:
    """The current snapshot of a Delta table."""
    if ref.path is not None:
        return spark.read.format("delta").load(ref.path)
    assert ref.name is not None
    return spark.read.table(ref.name)


def read_version(spark: SparkSession, ref: TableRef, version: int) -> DataFrame:
    """A Delta table as of ``version`` (time travel)."""
    reader = spark.read.format("delta").option("versionAsOf", version)
    if ref.path is not None:
        return reader.load(ref.path)
    assert ref.name is not None
    return reader.table(ref.name)


def current_version(spark: SparkSession, ref: TableRef) -> int:
    """Latest committed version of a Delta table."""
    row = _delta(spark, ref).history(1).select("version").first()
    assert row is not None
    return int(row["version"])


def user_metadata(run_id: str, fingerprint: str, action: str, **extra: Any) -> str:
    """The commit userMetadata sparkguard writes: JSON with run id, plan fingerprint, action."""
    return json.dumps({"sparkguard": {"run_id": run_id, "plan_fingerprint": fingerprint,
                                      "action": action, **extra}}, sort_keys=True)


def commit_metadata(raw: str | None) -> dict[str, Any] | None:
    """Parse a commit's userMetadata back; None when it is not sparkguard's."""
    if not raw:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    inner = data.get("sparkguard") if isinstance(data, dict) else None
    return inner if isinstance(inner, dict) else None


def commits_since(spark: SparkSession, ref: TableRef, version: int,
                  limit: int = 1000) -> list[dict[str, Any]]:
    """Commits after ``version`` (newest first, bounded): version, operation, userMetadata."""
    rows = (_delta(spark, ref).history(limit).filter(F.col("version") > version)
            .select("version", "timestamp", "operation", "userMetadata")
            .orderBy(F.col("version").desc()).collect())
    return [r.asDict() for r in rows]


def find_commit(spark: SparkSession, ref: TableRef, run_id: str, action: str,
                after_version: int) -> int | None:
    """Version of this run's commit of ``action`` after ``after_version``, if it exists."""
    for c in commits_since(spark, ref, after_version):
        meta = commit_metadata(c.get("userMetadata"))
        if meta and meta.get("run_id") == run_id and meta.get("action") == action:
            return int(c["version"])
    return None


@contextmanager
def _commit_user_metadata(spark: SparkSession, metadata: str):  # type: ignore[no-untyped-def]
    previous = spark.conf.get(_USER_METADATA_CONF, None)
    spark.conf.set(_USER_METADATA_CONF, metadata)
    try:
        yield
    finally:
        if previous is None:
            spark.conf.unset(_USER_METADATA_CONF)
        else:
            spark.conf.set(_USER_METADATA_CONF, previous)


def write_partitions(df: DataFrame, ref: TableRef, predicate: str, partition_column: str,
                     metadata: str | None = None, txn: tuple[str, int] | None = None) -> None:
    """Replace exactly the rows matching ``predicate`` with ``df`` (creating the table if new).

    Rows of ``df`` outside the predicate fail the write (Delta's replaceWhere constraint check).
    """
    writer = (df.write.format("delta").mode("overwrite").option("replaceWhere", predicate)
              .partitionBy(partition_column))
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
    writer = (df.write.format("delta").mode("overwrite").option("replaceWhere", predicate)
              .option("userMetadata", metadata)
              .option("txnAppId", txn[0]).option("txnVersion", txn[1]))
    if ref.path is not None:
        writer.save(ref.path)
    else:
        assert ref.name is not None
        writer.saveAsTable(ref.name)


def promote_merge(spark: SparkSession, df: DataFrame, ref: TableRef, keys: Sequence[str],
                  window_predicate_target: str, delete_unmatched: bool, metadata: str) -> None:
    """Promote the window in one MERGE commit on the business keys.

    ``window_predicate_target`` is the window predicate qualified with alias ``t``; it bounds
    both matching and, when ``delete_unmatched``, the deletion of rows the recomputation no
    longer produces, so rows outside the window are never touched.
    """
    cols = df.columns
    cond = f"({merge_condition(keys)}) AND {window_predicate_target}"
    builder = (_delta(spark, ref).alias("t").merge(df.alias("s"), cond)
               .whenMatchedUpdate(set={f"`{c}`": f"s.`{c}`" for c in cols})
               .whenNotMatchedInsert(values={f"`{c}`": f"s.`{c}`" for c in cols}))
    if delete_unmatched:
        builder = builder.whenNotMatchedBySourceDelete(condition=window_predicate_target)
    with _commit_user_metadata(spark, metadata):
        builder.execute()


def restore(spark: SparkSession, ref: TableRef, version: int, metadata: str | None = None) -> None:
    """``RESTORE TABLE ... TO VERSION AS OF version`` (one new commit)."""
    if metadata:
        with _commit_user_metadata(spark, metadata):
            spark.sql(restore_statement(ref, version))
    else:
        spark.sql(restore_statement(ref, version))


def retention_properties(spark: SparkSession, ref: TableRef) -> dict[str, str]:
    """The table's Delta properties (log/file retention among them)."""
    row = _delta(spark, ref).detail().select("properties").first()
    return dict(row["properties"] or {}) if row else {}


def missing_files_for_version(spark: SparkSession, ref: TableRef, version: int,
                              limit: int = 20) -> list[str]:
    """Data files the snapshot at ``version`` needs that are gone (e.g. VACUUMed); bounded."""
    import os
    from urllib.parse import unquote, urlparse

    files = read_version(spark, ref, version).select(F.input_file_name().alias("f")).distinct()
    # input_file_name needs the scan; collect only the distinct file names (bounded below)
    missing: list[str] = []
    try:
        paths = [r["f"] for r in files.limit(100000).collect()]
    except Exception as exc:  # reading the old snapshot itself failed: files are gone
        return [f"cannot read version {version}: {str(exc).splitlines()[0]}"]
    for f in paths:
        local = unquote(urlparse(f).path) if f.startswith("file:") else f
        if local.startswith("/") and not os.path.exists(local):
            missing.append(f)
            if len(missing) >= limit:
                break
    return missing


def with_conflict_retry(action: Callable[[], T], attempts: int = 3, delay_s: float = 2.0,
                        log: Callable[[str], None] = print) -> T:
    """Run ``action``; on a Delta concurrency conflict retry a bounded number of times."""
    for attempt in range(1, attempts + 1):
        try:
            return action()
        except Exception as exc:
            name = type(exc).__name__ + " " + str(exc)[:300]
            conflict = any(k in name for k in ("Concurrent", "ProtocolChanged", "MetadataChanged",
                                               "DELTA_CONCURRENT"))
            if not conflict or attempt == attempts:
                raise
            log(f"delta conflict on attempt {attempt}/{attempts}: {name.splitlines()[0]}; "
                f"retrying in {delay_s * attempt:.0f}s")
            time.sleep(delay_s * attempt)
    raise AssertionError("unreachable")
