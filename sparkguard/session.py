"""The SparkSession: the active one where it exists (Databricks), a Spark Connect one when
``SPARK_REMOTE`` names a server, else a local Delta session.

Only entry points (``jobs/``, the CLI, tests, the demo) call :func:`get_or_create_session`;
library code receives the session as a parameter.
"""

from __future__ import annotations

import os

from pyspark.sql import SparkSession

__all__ = ["DELTA_CONFS", "get_or_create_session", "local_session_builder", "remote_session"]

DELTA_CONFS = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}

_LOCAL_DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "4",
    "spark.sql.session.timeZone": "UTC",
    "spark.driver.memory": "4g",
    "spark.sql.adaptive.enabled": "true",
    # Delta rebuilds a table's state in this many tasks (default 50, sized for clusters); every
    # ledger, control and shadow read pays it, so a short local run is ~30% faster with 4
    "spark.databricks.delta.snapshotPartitions": "4",
    # generated classes kept for reuse (default 100): one backfill plans ~240 distinct queries,
    # so with 100 a warm session compiled ~240 classes per run again, with 1000 about 24
    "spark.sql.codegen.cache.maxEntries": "1000",
    # the throughput collector: on a 2-core machine G1's concurrent threads and write barriers
    # made a cold spark-submit backfill ~12% slower (bench figures in the README)
    "spark.driver.extraJavaOptions": "-XX:+UseParallelGC",
    "spark.executor.extraJavaOptions": "-XX:+UseParallelGC",
    # RESTORE and rollback checks need the history that VACUUM would otherwise bound
    "spark.databricks.delta.retentionDurationCheck.enabled": "true",
}


def local_session_builder(app_name: str = "sparkguard", master: str | None = None,
                          extra: dict[str, str] | None = None) -> SparkSession.Builder:
    """A builder for a local Spark with Delta; jars resolved by ``configure_spark_with_delta_pip``."""
    from delta import configure_spark_with_delta_pip

    builder = SparkSession.builder.appName(app_name).master(
        master or os.environ.get("SPARKGUARD_MASTER", "local[2]"))
    for key, value in {**_LOCAL_DEFAULTS, **DELTA_CONFS, **(extra or {})}.items():
        builder = builder.config(key, value)
    jars = os.environ.get("SPARKGUARD_DELTA_JARS")
    if jars:
        # Offline fallback: jars fetched with `mvn dependency:copy` (see README).
        return builder.config("spark.jars", jars)
    return configure_spark_with_delta_pip(builder)


def remote_session(url: str, app_name: str = "sparkguard") -> SparkSession:
    """A Spark Connect session to the server at ``url`` (``sc://host:port/;params``).

    The server owns Delta's configuration (extensions, catalog) and every static setting;
    nothing local is sent.
    """
    return SparkSession.builder.remote(url).appName(app_name).getOrCreate()


def get_or_create_session(app_name: str = "sparkguard") -> SparkSession:
    """Return the active session (Databricks, spark-submit with Delta configured), a Spark
    Connect session when ``SPARK_REMOTE`` is set, or a local Delta session."""
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    remote = os.environ.get("SPARK_REMOTE")
    if remote and not os.environ.get("DATABRICKS_RUNTIME_VERSION"):
        return remote_session(remote, app_name)
    # On Databricks the runtime owns the session (and Delta); never add local settings to it.
    if os.environ.get("DATABRICKS_RUNTIME_VERSION"):
        return SparkSession.builder.appName(app_name).getOrCreate()
    # spark-submit may have configured Delta already; if so, respect that configuration
    if os.environ.get("SPARK_ENV_LOADED") and os.environ.get("SPARKGUARD_USE_SUBMIT_CONF"):
        return SparkSession.builder.appName(app_name).getOrCreate()
    return local_session_builder(app_name).getOrCreate()
