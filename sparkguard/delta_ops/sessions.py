"""Commit metadata and transaction ids that Delta takes only from session confs (MERGE,
RESTORE), set in a session of their own so no other write of the caller's session sees them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager

from pyspark.sql import SparkSession

from sparkguard import compat

__all__ = ["TXN_APP_CONF", "TXN_VERSION_CONF", "USER_METADATA_CONF", "isolated_session",
           "session_confs"]


USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"
TXN_APP_CONF = "spark.databricks.delta.write.txnAppId"
TXN_VERSION_CONF = "spark.databricks.delta.write.txnVersion"


@contextmanager
def session_confs(spark: SparkSession, confs: dict[str, str]) -> Iterator[None]:
    """Set session confs for one statement, then put back what was there (also when setting
    one of them fails: those set before it must not stay on the caller's session)."""
    previous: dict[str, str | None] = {}
    try:
        for k, v in confs.items():
            old = spark.conf.get(k, None)
            spark.conf.set(k, v)
            previous[k] = old
        yield
    finally:
        for k, old in previous.items():
            if old is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, old)


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
        with session_confs(spark, confs):
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


_COMMIT_CONFS = frozenset({USER_METADATA_CONF, TXN_APP_CONF, TXN_VERSION_CONF})


def _sql_confs(spark: SparkSession) -> dict[str, str]:
    """The SQL confs set on ``spark`` (pyspark 4's ``RuntimeConfig.getAll``)."""
    get_all = getattr(spark.conf, "getAll", None)
    confs = get_all if isinstance(get_all, dict) else (get_all() if callable(get_all) else {})
    return {k: v for k, v in dict(confs).items() if k.startswith(("spark.sql.", "spark.databricks."))}
