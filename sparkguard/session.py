"""The SparkSession: the active one where it exists (Databricks), a Spark Connect one when
``SPARK_REMOTE`` names a server, else a local Delta session.

Only entry points (``jobs/``, the CLI, tests, the demo) call :func:`get_or_create_session`;
library code receives the session as a parameter.
"""

from __future__ import annotations

import os
import sys
from importlib.metadata import version
from pathlib import Path

from pyspark.sql import SparkSession

__all__ = ["DELTA_CONFS", "get_or_create_session", "local_jars", "local_session_builder",
           "remote_session", "submit_conf_dir", "write_submit_conf"]

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
    jars = os.environ.get("SPARKGUARD_DELTA_JARS") or local_jars()
    if jars:
        # Offline fallback: jars fetched with `mvn dependency:copy` (see README); or the jars
        # `make warm` resolved once: no Ivy resolution (and no Ivy banner) on each start.
        return builder.config("spark.jars", jars)
    return configure_spark_with_delta_pip(builder)


def remote_session(url: str, app_name: str = "sparkguard") -> SparkSession:
    """A Spark Connect session to the server at ``url`` (``sc://host:port/;params``).

    The server owns Delta's configuration (extensions, catalog) and every static setting;
    nothing local is sent.
    """
    return SparkSession.builder.remote(url).appName(app_name).getOrCreate()


# -- jars resolved once -------------------------------------------------------------------------

SUBMIT_CONF = Path(sys.prefix) / "spark-conf"  # written by `make warm`, in the venv


def _conf_lines(path: Path) -> dict[str, str]:
    conf = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.strip().partition(" ")
            conf[key] = value.strip()
    return conf


def local_jars(conf_dir: Path | None = None) -> str | None:
    """The Delta jars ``make warm`` resolved (``spark.jars`` of the generated
    ``spark-defaults.conf``), when every file is still there and they are the pinned
    delta-spark version; else None (the builder resolves them through Ivy)."""
    path = (conf_dir or SUBMIT_CONF) / "spark-defaults.conf"
    if not path.is_file():
        return None
    jars = _conf_lines(path).get("spark.jars", "")
    files = [j.removeprefix("file://").removeprefix("file:") for j in jars.split(",") if j]
    pinned = f"delta-spark_2.13-{version('delta-spark')}.jar"
    if not files or not any(f.endswith(pinned) for f in files) or \
            not all(os.path.isfile(f) for f in files):
        return None
    return ",".join(files)


def write_submit_conf(spark: SparkSession, source: Path, out: Path | None = None) -> Path:
    """Write ``out`` (default: the venv's ``spark-conf``), a ``SPARK_CONF_DIR`` for local
    ``spark-submit``: ``source``'s ``spark-defaults.conf`` with ``spark.jars.packages`` replaced by
    the jar files this session resolved (``spark.jars``), and its ``log4j2.properties``. Runs
    started with it skip Ivy's resolution and its banner on stderr."""
    out = out or SUBMIT_CONF
    jars = [j.removeprefix("file://").removeprefix("file:")
            for j in (spark.conf.get("spark.jars", "") or "").split(",") if j]
    if not jars:
        raise RuntimeError("this session has no resolved jars (spark.jars is empty)")
    lines = []
    for line in (source / "spark-defaults.conf").read_text(encoding="utf-8").splitlines():
        if line.strip().startswith("spark.jars.packages"):
            lines.append("# resolved once by `make warm` from " + line.split(None, 1)[1].strip())
            line = "spark.jars " + ",".join(jars)
        lines.append(line)
    out.mkdir(parents=True, exist_ok=True)
    (out / "log4j2.properties").write_text(
        (source / "log4j2.properties").read_text(encoding="utf-8"), encoding="utf-8")
    tmp = out / "spark-defaults.conf.tmp"
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tmp.replace(out / "spark-defaults.conf")
    return out


def submit_conf_dir(source: Path) -> Path:
    """The ``SPARK_CONF_DIR`` for a local ``spark-submit``: the generated one when its jars are
    there, else ``source`` (which resolves them through Ivy)."""
    return SUBMIT_CONF if local_jars(SUBMIT_CONF) else source


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
