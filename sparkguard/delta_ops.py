"""Every Delta read, write, promotion, restore and history look-up sparkguard performs."""

from __future__ import annotations

import contextlib
import json
import re
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import unquote

import delta.exceptions.captured  # noqa: F401  (makes pyspark raise Delta's conflict types)
from delta.exceptions import base as delta_exception_types
from delta.tables import DeltaTable
from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DataType, MapType, StructField, StructType

from sparkguard import compat
from sparkguard.sql import (
    CHANGE_OP,
    TableRef,
    changed_condition,
    describe_detail_statement,
    describe_history_statement,
    merge_changes_statement,
    merge_condition,
    merge_statement,
    quote_column,
    restore_statement,
)

__all__ = [
    "CONFLICT_TYPES",
    "DATA_NEUTRAL_OPERATIONS",
    "LOG_TABLE_PROPERTIES",
    "PromotionState",
    "append_rows",
    "commit_metadata",
    "commits_since",
    "create_log_table",
    "current_version",
    "delta_log_exists",
    "detail",
    "find_commit",
    "foreign_commits",
    "history",
    "is_conflict",
    "isolated_session",
    "literal_frame",
    "missing_files_for_version",
    "post_commit_failed",
    "promote_merge",
    "promote_replace_where",
    "promotion_state",
    "read_table",
    "read_version",
    "restore",
    "retention_properties",
    "revert_window",
    "snapshot_files",
    "table_exists",
    "user_metadata",
    "window_changes",
    "with_conflict_retry",
    "write_partitions",
]

T = TypeVar("T")
_USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"
_TXN_APP_CONF = "spark.databricks.delta.write.txnAppId"
_TXN_VERSION_CONF = "spark.databricks.delta.write.txnVersion"


def table_exists(spark: SparkSession, ref: TableRef) -> bool:
    """True when ``ref`` is a Delta table; False only when it genuinely is not one (no table of
    that name or path, or a table of another format).

    Any other error (permissions, an unreachable store, a corrupt log) propagates: calling such
    a table "missing" would hide the real problem.
    """
    if compat.is_connect(spark):  # the DeltaTable API needs Delta's server plugin over Connect
        return _is_delta_sql(spark, ref)
    if ref.path is not None:
        return bool(DeltaTable.isDeltaTable(spark, ref.path))
    assert ref.name is not None
    if not spark.catalog.tableExists(ref.name):
        return False
    try:
        DeltaTable.forName(spark, ref.name)
    except AnalysisException as exc:
        if _condition(exc) in _NOT_DELTA_CONDITIONS:
            return False
        raise
    return True


# Error conditions meaning "there is no Delta table there" (and nothing else).
_NOT_DELTA_CONDITIONS = frozenset({"DELTA_MISSING_DELTA_TABLE", "DELTA_TABLE_NOT_FOUND",
                                   "TABLE_OR_VIEW_NOT_FOUND", "DELTA_MISSING_TRANSACTION_LOG"})


def _condition(exc: BaseException) -> str | None:
    """The error condition (error class) of a PySpark exception, if it has one."""
    get = getattr(exc, "getCondition", None) or getattr(exc, "getErrorClass", None)
    try:
        return get() if get is not None else None
    except Exception:  # the JVM side may be gone
        return None


def _is_delta_sql(spark: SparkSession, ref: TableRef) -> bool:
    """Whether ``ref`` is a Delta table, from ``DESCRIBE DETAIL`` (any session kind)."""
    if ref.name is not None and not spark.catalog.tableExists(ref.name):
        return False
    try:
        row = detail(spark, ref).select("format").first()
    except AnalysisException:
        return False
    return row is not None and str(row["format"]).lower() == "delta"


# a path is read as a glob pattern; these characters of a folder's name are escaped
_GLOB_CHARS = re.compile(r"([*?\[\]{}\\])")
_FIRST_COMMIT = "00000000000000000000.json"


def delta_log_exists(spark: SparkSession, path: str) -> bool:
    """Whether a Delta table has been committed at ``path``: file-system calls, no Spark job.

    A ``_delta_log`` folder alone is not enough: a writer creating the table makes the folder
    before its first commit lands, and a reader that trusted the folder would fail with
    DELTA_TABLE_NOT_FOUND. The first commit file, or a checkpoint pointer once old commits have
    been cleaned up, is what makes the table readable.
    """
    if compat.is_connect(spark):
        # no file system in this process: the table is committed when Delta can resolve its
        # snapshot (an analysis, no job); a folder without a first commit is not a table yet
        try:
            spark.read.format("delta").load(path).columns  # noqa: B018
        except AnalysisException:
            return False
        return True
    log = path.rstrip("/") + "/_delta_log"
    return any(compat.path_exists(spark, f"{log}/{name}")
               for name in (_FIRST_COMMIT, "_last_checkpoint"))


# Log tables (ledger, publish control) grow by one small commit per event. No column statistics
# on their appends (a quarter off each one-row commit): their reads compute the latest state per
# key over the whole table. Delta's auto compaction rewrites their small files into one as soon
# as 50 of them have piled up (``spark.databricks.delta.autoCompact.minNumFiles``), inside the
# append that crosses that count, so a read opens a bounded number of files at any size; a
# classic checkpoint every 100 commits bounds the log replay. Nothing is ever updated or
# deleted. All of it is readable by delta-rs: no table feature beyond the base protocol.
LOG_TABLE_PROPERTIES = {"delta.checkpointInterval": "100", "delta.appendOnly": "true",
                        "delta.dataSkippingNumIndexedCols": "0",
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


def append_rows(spark: SparkSession, path: str, schema: StructType,
                rows: Sequence[Sequence[Any]], txn: tuple[str, int] | None = None,
                metadata: str | None = None, merge_schema: bool = False) -> None:
    """Append ``rows`` in one commit (bounded retry on conflicts). With ``txn``, Delta skips
    the write when that txnAppId already committed that txnVersion or a later one;
    ``metadata`` becomes the commit's userMetadata; ``merge_schema`` adds the schema's new
    columns to an older table."""
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


def _delta(spark: SparkSession, ref: TableRef) -> DeltaTable:
    if ref.path is not None:
        return DeltaTable.forPath(spark, ref.path)
    assert ref.name is not None
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


def history(spark: SparkSession, ref: TableRef, limit: int | None = None) -> DataFrame:
    """The table's commits, newest first (``DESCRIBE HISTORY``; what ``DeltaTable.history``
    runs, and also available over Spark Connect without Delta's server plugin)."""
    return spark.sql(describe_history_statement(ref, limit))


def detail(spark: SparkSession, ref: TableRef) -> DataFrame:
    """One row: format, location, partition columns, properties (``DESCRIBE DETAIL``)."""
    return spark.sql(describe_detail_statement(ref))


def current_version(spark: SparkSession, ref: TableRef) -> int:
    """Latest committed version of a Delta table."""
    row = history(spark, ref, 1).select("version").first()
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
    rows = (history(spark, ref, limit).filter(F.col("version") > version)
            .select("version", "timestamp", "operation", "userMetadata")
            .orderBy(F.col("version").desc()).collect())
    return [r.asDict() for r in rows]


def find_commit(spark: SparkSession, ref: TableRef, run_id: str, action: str,
                after_version: int) -> int | None:
    """Version of this run's newest commit of ``action`` after ``after_version``, if any."""
    for c in commits_since(spark, ref, after_version):
        meta = commit_metadata(c.get("userMetadata"))
        if meta and meta.get("run_id") == run_id and meta.get("action") == action:
            return int(c["version"])
    return None


# Commits that change no row: a RESTORE over them loses nothing of their writer's.
DATA_NEUTRAL_OPERATIONS = frozenset({"VACUUM START", "VACUUM END", "OPTIMIZE"})


def foreign_commits(commits: Sequence[dict[str, Any]], run_id: str,
                    data_only: bool = False) -> list[dict[str, Any]]:
    """The commits (from :func:`commits_since`) not written by ``run_id``; with ``data_only``,
    without those that change no row (VACUUM, OPTIMIZE)."""
    out = []
    for c in commits:
        meta = commit_metadata(c.get("userMetadata"))
        if meta and meta.get("run_id") == run_id:
            continue
        if data_only and c.get("operation") in DATA_NEUTRAL_OPERATIONS:
            continue
        out.append(c)
    return out


@dataclass(frozen=True)
class PromotionState:
    """What a target's history says about one run's promotion of one target."""

    promoted_version: int | None  # the run's promote commit, unless a later restore undid it
    undone: int  # how many times the run restored this target after promoting it
    foreign: tuple[dict[str, Any], ...]  # commits by others after the run's newest commit

    @property
    def next_txn_version(self) -> int:
        """txnVersion for the next promotion attempt (a repeat of the same one is a no-op)."""
        return self.undone + 1


def promotion_state(commits: Sequence[dict[str, Any]], run_id: str, label: str) -> PromotionState:
    """Fold the commits after the rollback point (newest first) for one run and target."""
    promoted: int | None = None
    undone = 0
    foreign: list[dict[str, Any]] = []
    for c in sorted(commits, key=lambda c: int(c["version"])):
        meta = commit_metadata(c.get("userMetadata"))
        own = bool(meta and meta.get("run_id") == run_id and meta.get("target", label) == label)
        if not own:
            foreign.append(c)
            continue
        assert meta is not None
        foreign = []
        if meta.get("action") == "promote":
            promoted = int(c["version"])
        elif meta.get("action") in ("restore", "rollback") and promoted is not None:
            promoted = None
            undone += 1
    return PromotionState(promoted, undone, tuple(foreign))


@contextmanager
def _session_confs(spark: SparkSession, confs: dict[str, str]) -> Iterator[None]:
    """Set session confs for one statement, then put back what was there."""
    previous = {k: spark.conf.get(k, None) for k in confs}
    for k, v in confs.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, old in previous.items():
            if old is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, old)


def _commit_user_metadata(spark: SparkSession, metadata: str) -> contextlib.AbstractContextManager[None]:
    return _session_confs(spark, {_USER_METADATA_CONF: metadata})


@contextmanager
def isolated_session(spark: SparkSession, confs: dict[str, str]) -> Iterator[SparkSession]:
    """A session of its own (``spark.newSession()``: same SparkContext, own SQL conf) carrying
    the caller's SQL confs and current catalog/database plus ``confs``.

    For the statements that take commit metadata or a transaction id only from session confs
    (MERGE, RESTORE): set on the caller's session, another write running there at the same time
    would carry them, and with a transaction id Delta could even skip it as a duplicate. The
    caller's session is never changed, except under Spark Connect, which has no
    ``newSession``: there the confs are set on ``spark`` for the statement and put back after.
    """
    if compat.is_connect(spark):
        with _session_confs(spark, confs):
            yield spark
        return
    iso = spark.newSession()
    for key, value in _sql_confs(spark).items():
        if key not in _COMMIT_CONFS:
            with contextlib.suppress(Exception):  # static or JVM-only confs cannot be set
                iso.conf.set(key, value)
    for key in _COMMIT_CONFS - set(confs):
        iso.conf.unset(key)
    for key, value in confs.items():
        iso.conf.set(key, value)
    iso.catalog.setCurrentCatalog(spark.catalog.currentCatalog())
    iso.catalog.setCurrentDatabase(spark.catalog.currentDatabase())
    yield iso


_COMMIT_CONFS = frozenset({_USER_METADATA_CONF, _TXN_APP_CONF, _TXN_VERSION_CONF})


def _sql_confs(spark: SparkSession) -> dict[str, str]:
    """The SQL confs set on ``spark`` (pyspark 4's ``RuntimeConfig.getAll``)."""
    get_all = getattr(spark.conf, "getAll", None)
    confs = get_all if isinstance(get_all, dict) else (get_all() if callable(get_all) else {})
    return {k: v for k, v in dict(confs).items() if k.startswith(("spark.sql.", "spark.databricks."))}


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


def _has_map(dtype: DataType) -> bool:
    """Whether a type holds a map anywhere (maps cannot be compared with ``<=>``)."""
    if isinstance(dtype, MapType):
        return True
    if isinstance(dtype, ArrayType):
        return _has_map(dtype.elementType)
    if isinstance(dtype, StructType):
        return any(_has_map(f.dataType) for f in dtype.fields)
    return False


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
    confs = {_USER_METADATA_CONF: metadata}
    if txn is not None:
        confs |= {_TXN_APP_CONF: txn[0], _TXN_VERSION_CONF: str(txn[1])}
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
            with _session_confs(spark, confs):
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
        builder = _delta(iso, ref).alias("t").merge(source.alias("s"), cond)
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


def window_changes(spark: SparkSession, df: DataFrame, ref: TableRef, keys: Sequence[str],
                   window_predicate_target: str, delete_unmatched: bool) -> DataFrame:
    """The rows of ``df`` (the new window) that differ from the target's window, each with
    :data:`~sparkguard.sql.CHANGE_OP`: ``'I'`` a key only in ``df``, ``'U'`` a key in both
    whose non-key values differ (null-safe, :func:`~sparkguard.sql.changed_condition`), and,
    with ``delete_unmatched``, ``'D'`` a key only in the target (its key values, from the
    target). One full outer join on the keys; nothing is fetched to the driver."""
    cols = df.columns
    key_set = set(keys)
    compared = [f for f in df.schema.fields if f.name not in key_set]
    side_s, side_t = "__sg_in_s", "__sg_in_t"
    s = df.withColumn(side_s, F.lit(True)).alias("s")
    t = (read_table(spark, ref).alias("t").filter(window_predicate_target)
         .select(*[F.col(f"`t`.{quote_column(c)}").alias(c) for c in cols],
                 F.lit(True).alias(side_t)).alias("t"))
    def col(alias: str, name: str) -> Column:
        return F.col(f"`{alias}`.{quote_column(name)}")

    op = (F.when(col("s", side_s).isNull(), F.lit("D"))
          .when(col("t", side_t).isNull(), F.lit("I")))
    if compared:
        changed = changed_condition([f.name for f in compared],
                                    [f.name for f in compared if _has_map(f.dataType)])
        op = op.when(F.expr(changed), F.lit("U"))
    joined = s.join(t, F.expr(merge_condition(keys)), "full_outer").withColumn(CHANGE_OP, op)
    wanted = ["I", "U", "D"] if delete_unmatched else ["I", "U"]
    return (joined.filter(F.col(CHANGE_OP).isin(wanted))
            .select(*[F.when(F.col(CHANGE_OP) == "D", col("t", c)).otherwise(col("s", c))
                      .alias(c) for c in cols], F.col(CHANGE_OP)))


def restore(spark: SparkSession, ref: TableRef, version: int, metadata: str | None = None) -> None:
    """``RESTORE TABLE ... TO VERSION AS OF version`` (one new commit), in an isolated session
    carrying ``metadata`` as the commit's userMetadata (RESTORE takes it only from the session
    conf): ``DeltaTable.restoreToVersion``, or the SQL statement over Spark Connect."""
    with isolated_session(spark, {_USER_METADATA_CONF: metadata} if metadata else {}) as iso:
        if compat.is_connect(spark):
            iso.sql(restore_statement(ref, version))
        else:
            _delta(iso, ref).restoreToVersion(version)


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


def retention_properties(spark: SparkSession, ref: TableRef) -> dict[str, str]:
    """The table's Delta properties (log/file retention among them)."""
    row = detail(spark, ref).select("properties").first()
    return dict(row["properties"] or {}) if row else {}


def snapshot_files(spark: SparkSession, ref: TableRef, version: int | None = None) -> set[str]:
    """Data files of a snapshot, from the Delta log only (``DataFrame.inputFiles``; no scan)."""
    df = read_version(spark, ref, version) if version is not None else read_table(spark, ref)
    return set(df.inputFiles())


def missing_files_for_version(spark: SparkSession, ref: TableRef, version: int,
                              limit: int = 20) -> list[str]:
    """Data files the snapshot at ``version`` needs that are gone (e.g. VACUUMed); bounded.

    Only files absent from the current snapshot can have been vacuumed, so only those are
    checked, with one listing per parent directory (object stores: one LIST per partition
    instead of one HEAD per file): the files a ``binaryFile`` relation over that directory
    would read (``inputFiles``, no job, no content read), which classic and Spark Connect
    sessions both offer. Reading the old snapshot's file list itself failing (its log was
    cleaned up) is reported as one entry.
    """
    try:
        needed = snapshot_files(spark, ref, version) - snapshot_files(spark, ref)
    except Exception as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:300]
        return [f"cannot read the file list of version {version}: {first}"]
    by_dir: dict[str, list[str]] = {}
    for f in sorted(needed):
        by_dir.setdefault(f.rsplit("/", 1)[0], []).append(f)
    missing: list[str] = []
    for folder, files in by_dir.items():
        present = _file_names(spark, folder)
        for f in files:
            if f.rsplit("/", 1)[1] not in present and unquote(f.rsplit("/", 1)[1]) not in present:
                missing.append(f)
                if len(missing) >= limit:
                    return missing
    return missing


def _file_names(spark: SparkSession, folder: str) -> set[str]:
    """Names of the files under ``folder`` (hidden ``_``/``.`` entries excluded, as Spark lists
    data files); empty when the folder itself is gone."""
    try:
        listed = spark.read.format("binaryFile").load(_GLOB_CHARS.sub(r"\\\1", folder)).inputFiles()
    except AnalysisException:  # PATH_NOT_FOUND: the directory is gone
        return set()
    names = {f.rsplit("/", 1)[1] for f in listed}
    return names | {unquote(n) for n in names}


# Delta's optimistic-concurrency conflicts as pyspark raises them once ``delta.exceptions`` is
# imported (the captured classes subclass these base ones).
CONFLICT_TYPES: tuple[type[BaseException], ...] = (
    delta_exception_types.DeltaConcurrentModificationException,
    delta_exception_types.ConcurrentWriteException,
    delta_exception_types.MetadataChangedException,
    delta_exception_types.ProtocolChangedException,
    delta_exception_types.ConcurrentAppendException,
    delta_exception_types.ConcurrentDeleteReadException,
    delta_exception_types.ConcurrentDeleteDeleteException,
    delta_exception_types.ConcurrentTransactionException,
)
# The JVM root of every Delta conflict (io.delta.exceptions.* and Delta's internal ones extend it).
_JVM_CONFLICT_ROOTS = frozenset({"java.util.ConcurrentModificationException",
                                 "io.delta.exceptions.DeltaConcurrentModificationException"})


def post_commit_failed(exc: BaseException) -> bool:
    """Whether ``exc`` reports a failed post-commit hook (auto compaction, checkpoint) of a
    commit that itself landed (error condition ``DELTA_POST_COMMIT_HOOK_FAILED``)."""
    if _condition(exc) == _POST_COMMIT_FAILED:
        return True
    java = getattr(exc, "java_exception", None)
    try:
        for _ in range(10):
            if java is None:
                return False
            with contextlib.suppress(Exception):  # not every throwable has an error class
                if java.getErrorClass() == _POST_COMMIT_FAILED:
                    return True
            java = java.getCause()
    except Exception:  # the JVM side may be gone
        return False
    return False


_POST_COMMIT_FAILED = "DELTA_POST_COMMIT_HOOK_FAILED"


# Their error conditions, as Spark Connect reports them (it has no Delta exception types).
_CONFLICT_CONDITIONS = ("DELTA_CONCURRENT_", "DELTA_METADATA_CHANGED", "DELTA_PROTOCOL_CHANGED")


def is_conflict(exc: BaseException) -> bool:
    """Whether ``exc`` is one of Delta's optimistic-concurrency conflicts, by type: a
    ``delta.exceptions`` class, or a raw Py4J error whose JVM exception (or a cause of it) is a
    ``ConcurrentModificationException`` (Delta's conflicts all extend it), or, over Spark
    Connect, an error condition of Delta's conflicts. Never by message text.
    A failed post-commit hook is not a conflict of the commit (it landed), whatever its cause."""
    if post_commit_failed(exc):
        return False
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, CONFLICT_TYPES):
            return True
        java = getattr(cur, "java_exception", None)
        if java is not None and _jvm_is_conflict(java):
            return True
        if (_condition(cur) or "").startswith(_CONFLICT_CONDITIONS):  # Spark Connect's errors
            return True
        cur = cur.__cause__ or cur.__context__
    return False


def _jvm_is_conflict(java: Any) -> bool:
    """Whether a JVM throwable or one of its causes is a concurrent-modification conflict."""
    try:
        for _ in range(10):  # bounded walk of the cause chain
            if java is None:
                return False
            cls = java.getClass()
            while cls is not None:
                if cls.getName() in _JVM_CONFLICT_ROOTS:
                    return True
                cls = cls.getSuperclass()
            java = java.getCause()
    except Exception:  # the JVM side may be gone: not a conflict we can prove
        return False
    return False


def conflict_summary(exc: BaseException) -> str:
    """One line naming the conflict: the JVM exception's class and message when ``exc`` wraps
    one (a Py4JJavaError's own first line says nothing), else Python's."""
    java = getattr(exc, "java_exception", None)
    if java is not None:
        try:
            text = f"{java.getClass().getSimpleName()}: {java.getMessage()}"
        except Exception:  # the JVM side may be gone
            text = f"{type(exc).__name__}: {exc}"
    else:
        text = f"{type(exc).__name__}: {exc}"
    return (text.strip().splitlines() or [""])[0][:300]


def with_conflict_retry(action: Callable[[], T], attempts: int = 3, delay_s: float = 2.0,
                        log: Callable[[str], None] = print,
                        before_retry: Callable[[], None] | None = None) -> T:
    """Run ``action``; on a Delta concurrency conflict retry a bounded number of times.

    Each conflict is logged with the attempt number; ``before_retry`` runs before each retry
    (e.g. to re-check that the write did not land after all). Other errors propagate at once.
    """
    for attempt in range(1, attempts + 1):
        try:
            return action()
        except Exception as exc:
            if not is_conflict(exc) or attempt == attempts:
                raise
            first = conflict_summary(exc)
            log(f"delta conflict on attempt {attempt}/{attempts}: {first}; retrying in "
                f"{delay_s * attempt:.1f}s")
            time.sleep(delay_s * attempt)
            if before_retry is not None:
                before_retry()
    raise AssertionError("unreachable")
