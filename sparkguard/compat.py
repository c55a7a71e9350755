"""The one place that knows the difference between a classic session and a Spark Connect one.

Spark Connect (Databricks serverless, standard access mode clusters, Databricks Connect, a
``sc://`` URL) has no ``SparkContext`` and no JVM gateway in the client process. Everything else
in sparkguard uses only APIs both kinds of session offer; this module is the only one allowed to
touch the classic-only handles, and it does so only after :func:`is_connect` said the session is
classic. ``tests/system/test_connect.py`` fails when another module under ``sparkguard/`` names them.

What differs, and what each kind of session gets:

- job labels: classic sessions set the job group and description (Spark UI "Jobs" page,
  ``cancelJobGroup``); Connect sessions carry the same two labels as operation tags
  (``spark.addTag``; Spark UI job tags, ``spark.interruptTag``);
- the driver's log level: classic sessions set it; over Connect the server owns its logging;
- whether a file exists: classic sessions ask the Hadoop file system directly (no Spark job;
  the ledger checks its tables this way on every run); over Connect ``delta_ops`` asks Delta;
- a target's generated columns: Spark's reader leaves their expressions out of the schema, so
  classic sessions read them from the Delta log's metadata; over Connect they stay unknown and
  Delta alone checks them, at promotion.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "JOB_LABEL_KEYS",
    "TAG_PREFIX",
    "generation_expressions",
    "is_connect",
    "job_labels",
    "path_exists",
    "restore_job_labels",
    "set_job_label",
    "set_log_level",
]

_GENERATED = "delta.generationExpression"  # a generated column's field metadata
# the classic labels (thread-local properties of the SparkContext)
JOB_LABEL_KEYS = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")
# Connect: the snapshot of a thread's tags is kept under this key, comma-joined (a tag holds no
# comma), so one dict type carries both kinds of labels
_TAGS_KEY = "spark.connect.tags"
# tags sparkguard sets; only these are replaced when a new stage is labelled
TAG_PREFIX = "sparkguard"
_TAG_UNSAFE = re.compile(r"[,\x00-\x1f]")


def is_connect(spark: SparkSession) -> bool:
    """Whether ``spark`` is a Spark Connect session (no SparkContext, no JVM in this process).

    Decided by the session's class, as PySpark's own dispatch does; Databricks Connect's session
    is the same class.
    """
    return type(spark).__module__.startswith("pyspark.sql.connect")


def _tag(text: str) -> str:
    """``text`` as an operation tag: no comma or control character, never empty."""
    return _TAG_UNSAFE.sub(" ", text).strip() or "-"


def set_job_label(spark: SparkSession, group: str, desc: str) -> None:
    """Label this thread's next Spark jobs with ``group`` and the stage ``desc``.

    Classic: job group and description. Connect: the tags ``group`` and ``sparkguard: desc``
    replace the sparkguard tags this thread carried; the caller's own tags stay.
    """
    if is_connect(spark):
        for tag in list(spark.getTags()):  # getTags is the live set
            if tag.startswith(TAG_PREFIX):
                spark.removeTag(tag)
        spark.addTag(_tag(group))
        spark.addTag(_tag(f"{TAG_PREFIX}: {desc}"))
        return
    spark.sparkContext.setJobGroup(group, desc, False)


def job_labels(spark: SparkSession) -> dict[str, str | None]:
    """This thread's current labels, for :func:`restore_job_labels`."""
    if is_connect(spark):
        return {_TAGS_KEY: ",".join(sorted(spark.getTags()))}
    sc = spark.sparkContext
    return {k: sc.getLocalProperty(k) for k in JOB_LABEL_KEYS}


def restore_job_labels(spark: SparkSession, labels: dict[str, str | None]) -> None:
    """Put back what :func:`job_labels` returned (a classic label that was unset is unset)."""
    if is_connect(spark):
        spark.clearTags()
        for tag in (labels.get(_TAGS_KEY) or "").split(","):
            if tag:
                spark.addTag(tag)
        return
    sc = spark.sparkContext
    for key, value in labels.items():
        sc.setLocalProperty(key, value)  # type: ignore[arg-type]  # None unsets


def set_log_level(spark: SparkSession, level: str) -> None:
    """The driver's log level on a classic session; a no-op over Connect (the server's own
    log4j configuration applies)."""
    if not is_connect(spark):
        spark.sparkContext.setLogLevel(level)


def path_exists(spark: SparkSession, path: str) -> bool:
    """Whether ``path`` exists, through the Hadoop file system of a classic session's
    configuration (one metadata call, no Spark job). Classic sessions only."""
    if is_connect(spark):
        raise TypeError("path_exists needs a classic session; over Spark Connect ask Delta")
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    hpath = jvm.org.apache.hadoop.fs.Path(path)
    fs = hpath.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    return bool(fs.exists(hpath))


def generation_expressions(spark: SparkSession, location: str) -> dict[str, str] | None:
    """Each generated column of the Delta table at ``location`` with its expression, as Delta
    itself enforces them (its protocol allowing generated columns), from a fresh snapshot
    through the classic session's JVM; None over Connect, or where the cluster refuses JVM
    access (standard access mode)."""
    if is_connect(spark):
        return None
    try:
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        delta = jvm.org.apache.spark.sql.delta
        snapshot = delta.DeltaLog.forTableWithSnapshot(spark._jsparkSession, location)._2()
        cols = delta.GeneratedColumn.getGeneratedColumns(snapshot)
        return {str(f.name()): str(f.metadata().getString(_GENERATED))
                for f in (cols.apply(i) for i in range(cols.length()))}
    except Exception:  # py4j or the cluster's security refused: unknown, not fatal
        return None
