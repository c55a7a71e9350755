"""Delta tables as sparkguard finds and reads them: existence, the committed log, the current
snapshot, time travel, ``DESCRIBE DETAIL``."""

from __future__ import annotations

from dataclasses import dataclass

from delta.tables import DeltaTable
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, Row, SparkSession

from sparkguard import compat
from sparkguard.delta_ops.conflicts import error_condition, protocol_refusal
from sparkguard.sql import (
    TableRef,
    UnsafeSQLError,
    canonical_location,
    describe_detail_statement,
    quote_column,
)

_CONSTRAINT = "delta.constraints."  # a CHECK constraint's table property: name -> expression

__all__ = ["WriteChecks", "delta_log_exists", "delta_table", "detail", "location_key", "lock_key",
           "not_delta", "read_resolved", "read_table", "read_version", "table_exists", "write_checks"]


def table_exists(spark: SparkSession, ref: TableRef) -> bool:
    """True when ``ref`` is a Delta table; False only when it genuinely is not one (no table of
    that name or path, or a table of another format).

    Any other error (permissions, an unreachable store, a corrupt log) propagates: calling such
    a table "missing" would hide the real problem. A Delta table whose protocol this client's
    Delta refuses (a newer Delta's table feature) exists: reading it says why.
    """
    try:
        if compat.is_connect(spark):  # the DeltaTable API needs Delta's server plugin there
            return _is_delta_sql(spark, ref)
        if ref.path is not None:
            return bool(DeltaTable.isDeltaTable(spark, ref.path))
        assert ref.name is not None
        if not spark.catalog.tableExists(ref.name):
            return False
        DeltaTable.forName(spark, ref.name)
    except Exception as exc:
        if protocol_refusal(exc) is not None:
            return True
        if isinstance(exc, AnalysisException) and error_condition(exc) in _NOT_DELTA_CONDITIONS:
            return False
        raise
    return True


def not_delta(spark: SparkSession, ref: TableRef, absent_fix: str | None = None
              ) -> tuple[str, str]:
    """(what ``ref`` is instead, the fix) for a dataset ``table_exists`` found not to be a Delta
    table: a view, a table in another format, or nothing at all (fixed by ``absent_fix`` when
    given)."""
    if ref.name is None:
        return "is not a Delta table (no _delta_log at that path)", absent_fix or "check the path"
    try:
        if not spark.catalog.tableExists(ref.name):
            return "is not in the catalog", absent_fix or (
                "check the name (catalog.schema.table) or give the path")
        kind = str(spark.catalog.getTable(ref.name).tableType or "").upper()
        if "VIEW" in kind or kind == "TEMPORARY":
            return ("is a view, not a Delta table: a run reads its source at one pinned Delta "
                    "version and promotes into one Delta table", "name the Delta table the view "
                    "reads and put the view's logic in the transform SQL")
        row = detail(spark, ref).select("format").first()
        fmt = str(row["format"] if row is not None else "").lower()
    except Exception as exc:  # the generic answer: the caller's finding still names the dataset
        if error_condition(exc) not in _LOG_GONE:
            return "is not a Delta table", "check the name or path"
        fmt = "delta"
    if fmt == "delta":  # the catalog says Delta, but its folder or log is gone
        return ("is registered as a Delta table but its transaction log (_delta_log) cannot be "
                "found", "check the table's location and that its _delta_log folder exists")
    return (f"is a {fmt or 'non-Delta'} table, not Delta", "convert it (CONVERT TO DELTA) or "
            "name a Delta table")


# Error conditions meaning "there is no Delta table there" (and nothing else); the last two
# for a catalog table whose folder or log is gone.
_LOG_GONE = frozenset({"DELTA_MISSING_TRANSACTION_LOG", "DELTA_PATH_DOES_NOT_EXIST"})
_NOT_DELTA_CONDITIONS = frozenset({"DELTA_MISSING_DELTA_TABLE", "DELTA_TABLE_NOT_FOUND",
                                   "TABLE_OR_VIEW_NOT_FOUND", *_LOG_GONE})


def _is_delta_sql(spark: SparkSession, ref: TableRef) -> bool:
    """Whether ``ref`` is a Delta table, from ``DESCRIBE DETAIL`` (any session kind)."""
    if ref.name is not None and not spark.catalog.tableExists(ref.name):
        return False
    try:
        row = detail(spark, ref).select("format").first()
    except AnalysisException as exc:
        if protocol_refusal(exc) is not None:
            raise
        return False
    return row is not None and str(row["format"]).lower() == "delta"


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


def delta_table(spark: SparkSession, ref: TableRef) -> DeltaTable:
    """The ``DeltaTable`` handle of ``ref`` (by path or by name)."""
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


def read_resolved(spark: SparkSession, ref: TableRef) -> tuple[DataFrame | None, str | None]:
    """The current snapshot of a Delta table with its schema resolved (Spark Connect reads
    lazily), or None and Delta's reason when this client's Delta refuses the table's protocol
    (:func:`~sparkguard.delta_ops.conflicts.protocol_refusal`); any other error propagates."""
    try:
        df = read_table(spark, ref)
        _ = df.schema
    except Exception as exc:
        reason = protocol_refusal(exc)
        if reason is None:
            raise
        return None, reason
    return df, None


def read_version(spark: SparkSession, ref: TableRef, version: int) -> DataFrame:
    """A Delta table as of ``version`` (time travel)."""
    reader = spark.read.format("delta").option("versionAsOf", version)
    if ref.path is not None:
        return reader.load(ref.path)
    assert ref.name is not None
    return reader.table(ref.name)


def detail(spark: SparkSession, ref: TableRef) -> DataFrame:
    """One row: format, location, partition columns, properties (``DESCRIBE DETAIL``)."""
    return spark.sql(describe_detail_statement(ref))


def lock_key(spark: SparkSession, ref: TableRef) -> str:
    """The key under which a run or a rollback locks ``ref``: the table's storage location.

    One table has one location however a plan spells it (``sales.orders``,
    ``SPARK_CATALOG.SALES.ORDERS``, its path with or without a trailing slash or ``file:``),
    so two runs naming it differently still exclude each other. A table that cannot be
    described (missing) is keyed by its name as written.
    """
    try:
        row = detail(spark, ref).select("location").first()
    except AnalysisException:
        return ref.display
    return location_key(row["location"] if row is not None else None) or ref.display


def location_key(location: object) -> str:
    """A ``DESCRIBE DETAIL`` location as one table's key ("" when there is none; the scheme's
    other spellings of one storage as one: ``sql.canonical_location``)."""
    return canonical_location(str(location or ""))


@dataclass(frozen=True)
class WriteChecks:
    """What Delta checks on every row written into a table beyond its types and NOT NULL."""

    checks: tuple[tuple[str, str], ...] = ()  # CHECK constraints: (name, expression)
    generated: tuple[tuple[str, str], ...] = ()  # generated columns: (column, expression)
    # identity columns: (column, explicit values allowed, i.e. GENERATED BY DEFAULT)
    identity: tuple[tuple[str, bool], ...] = ()
    write_refused: str | None = None  # Delta's reason this client may not write the table
    columns_known: bool = False  # generated and identity columns read (a classic session)

    @property
    def identity_columns(self) -> tuple[str, ...]:
        return tuple(c for c, _ in self.identity)

    def without_identity(self, df: DataFrame) -> DataFrame:
        """``df`` (the table's rows) without its identity columns, as a recomputation holds
        them (no ``drop()`` of nothing: Spark Connect refuses an empty one)."""
        return df.drop(*self.identity_columns) if self.identity else df

    def gates(self) -> tuple[tuple[str, str], ...]:
        """(gate name, SQL expression a row must make true) for each: a row where a CHECK is
        false or null is refused, and one whose generated column differs from its expression.
        A generated column whose name SQL cannot spell (a control character) is left to Delta."""
        generated = []
        for c, e in self.generated:
            try:
                generated.append((f"generated_column[{c}]", f"{quote_column(c)} <=> ({e})"))
            except UnsafeSQLError:
                continue
        return (*((f"check_constraint[{n}]", e) for n, e in self.checks), *generated)


def write_checks(spark: SparkSession, ref: TableRef, described: Row | None = None
                 ) -> WriteChecks:
    """``ref``'s CHECK constraints (``DESCRIBE DETAIL``'s properties; ``described`` when the
    caller has that row already), generated and identity columns (known on classic sessions
    only: :func:`~sparkguard.compat.column_rules`)."""
    row = described if described is not None else detail(spark, ref).first()
    props = dict(row["properties"] or {}) if row else {}
    location = row["location"] if row else None
    rules = compat.column_rules(spark, location) if location else None
    return WriteChecks(
        checks=tuple((k.removeprefix(_CONSTRAINT), v) for k, v in sorted(props.items())
                     if k.startswith(_CONSTRAINT)),
        generated=tuple(rules.generated.items()) if rules else (),
        identity=tuple(rules.identity.items()) if rules else (),
        write_refused=rules.write_refused if rules else None, columns_known=rules is not None)
