"""Data files of a snapshot and which of them are gone: what a RESTORE to an old version
needs (rollback's blast-radius check). A snapshot also needs its deletion vectors' files, which
no file listing names; a read of the snapshot finds those (:func:`read_all_files`)."""

from __future__ import annotations

import re
from urllib.parse import unquote

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sparkguard.delta_ops.tables import read_table, read_version
from sparkguard.sql import TableRef

__all__ = ["gone_file", "missing_files_for_version", "read_all_files", "snapshot_files"]


# a path is read as a glob pattern; these characters of a folder's name are escaped
_GLOB_CHARS = re.compile(r"([*?\[\]{}\\])")
# how a failed read names a file that is gone, most precise first: the JVM's cause (a deletion
# vector's file; S3A words it differently), else the data file whose read failed (Spark's
# error class, all a Spark Connect client may get)
_GONE = [re.compile(p) for p in (
    r"FileNotFoundException: File ([^\n]+?) does not exist",
    r"FileNotFoundException: No such file or directory: ([^\n\s]+)",
    r"FileNotFoundException: ([^\n\s]+) \(No such file or directory\)",
    r"FAILED_READ_FILE\.FILE_NOT_EXIST\]? Encountered error while reading file ([^\n]+?)\.? "
    r"File does not exist")]
# a read failing on a missing file whose message names none this module can parse
_GONE_UNNAMED = ("FileNotFoundException", "FILE_NOT_EXIST", "DELTA_FILE_NOT_FOUND")
# a folder listing the storage refused (Unity Catalog: path access to a managed table's
# folder), not a failure of the storage itself
_LIST_REFUSED = ("PERMISSION_DENIED", "INSUFFICIENT_PERMISSIONS", "UNAUTHORIZED", "AccessDenied",
                 "Forbidden", "not allowed", "UC_")


def snapshot_files(spark: SparkSession, ref: TableRef, version: int | None = None) -> set[str]:
    """Data files of a snapshot, from the Delta log only (``DataFrame.inputFiles``; no scan)."""
    df = read_version(spark, ref, version) if version is not None else read_table(spark, ref)
    return set(df.inputFiles())


def missing_files_for_version(spark: SparkSession, ref: TableRef, version: int,
                              limit: int = 20, unlisted: list[str] | None = None) -> list[str]:
    """Data files the snapshot at ``version`` needs that are gone (e.g. VACUUMed); bounded.
    A folder the storage refuses to list is skipped and added to ``unlisted``: the caller then
    reads the snapshot's files instead (:func:`read_all_files`).

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
        if present is None:
            if unlisted is not None:
                unlisted.append(folder)
            continue
        for f in files:
            if f.rsplit("/", 1)[1] not in present and unquote(f.rsplit("/", 1)[1]) not in present:
                missing.append(f)
                if len(missing) >= limit:
                    return missing
    return missing


def _file_names(spark: SparkSession, folder: str) -> set[str] | None:
    """Names of the files under ``folder`` (hidden ``_``/``.`` entries excluded, as Spark lists
    data files); empty when the folder itself is gone; None when listing it is refused (Unity
    Catalog refuses path access to a managed table's folder, say)."""
    try:
        listed = spark.read.format("binaryFile").load(_GLOB_CHARS.sub(r"\\\1", folder)).inputFiles()
    except Exception as exc:
        if isinstance(exc, AnalysisException) and "PATH_NOT_FOUND" in str(exc):
            return set()
        if any(word in str(exc) for word in _LIST_REFUSED):
            return None
        raise
    names = {f.rsplit("/", 1)[1] for f in listed}
    return names | {unquote(n) for n in names}


def read_all_files(df: DataFrame) -> None:
    """Open every file ``df`` (a Delta snapshot) reads, with its deletion vector, reading no
    data column; one row comes back. A plain count would not do: Delta answers it from the
    log's statistics without opening a file. The file path comes from the ``_metadata``
    column (``input_file_name()`` is refused on Unity Catalog and by Databricks Runtime 17.3
    and later)."""
    path = df.metadataColumn("_metadata").getField("file_path")
    df.select(path.alias("f")).agg(F.sum(F.length("f"))).first()


def gone_file(exc: BaseException) -> str | None:
    """The file a failed read could not find (a data file, or a deletion vector's file), or
    None when ``exc`` is another failure."""
    text = str(exc)
    for pattern in _GONE:
        found = pattern.search(text)
        if found:
            return found.group(1)
    if any(word in text for word in _GONE_UNNAMED):
        return "a file the error does not name"
    return None
