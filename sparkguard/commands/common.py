"""What the command handlers share: the Spark session, sparkguard's home, the evidence folder
and reads of sparkguard's own tables.

Handlers call these through the module (``common.session()``), so that replacing
``common.session`` (tests that must start no Spark) reaches every caller.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from sparkguard.errors import EXIT_USAGE, SparkguardError
from sparkguard.sql import TableRef, UnsafeSQLError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from sparkguard.state_read import StateReader

__all__ = [
    "HOME_CONF",
    "HomeError",
    "checked_home",
    "evidence_dir",
    "home",
    "read",
    "session",
    "spark_if_configured",
    "writable_evidence_dir",
]

T = TypeVar("T")


def session() -> SparkSession:
    """The session of an entry point (created here, or the one already running)."""
    from sparkguard.compat import set_log_level
    from sparkguard.session import get_or_create_session

    spark = get_or_create_session("sparkguard")
    set_log_level(spark, os.environ.get("SPARKGUARD_SPARK_LOG_LEVEL", "ERROR"))
    return spark


HOME_CONF = "spark.sparkguard.home"


def home(args: argparse.Namespace, spark: SparkSession | None = None) -> str:
    """sparkguard's home (ledger, publish control, shadows): ``--home``, else the Spark conf
    ``spark.sparkguard.home`` (cluster or Databricks job conf), else ``$SPARKGUARD_HOME``,
    else ``<plan dir>/_sparkguard`` (or ``./_sparkguard`` without a plan); see
    :func:`checked_home`."""
    if getattr(args, "home", None):
        return checked_home(str(args.home), "--home")
    if spark is not None:
        conf = spark.conf.get(HOME_CONF, None)
        if conf:
            return checked_home(str(conf), f"the Spark conf {HOME_CONF}")
    if os.environ.get("SPARKGUARD_HOME"):
        return checked_home(os.environ["SPARKGUARD_HOME"], "$SPARKGUARD_HOME")
    plan = getattr(args, "plan", None)
    base = Path(plan).resolve().parent if plan else Path.cwd()
    return checked_home(str(base / "_sparkguard"), "the default home (<plan dir>/_sparkguard)")


class HomeError(SparkguardError):
    """Raised when sparkguard's home cannot be used as a Delta path (exit 2, nothing written)."""

    exit_code = EXIT_USAGE


def checked_home(value: str, source: str) -> str:
    """``value`` as a home every table under it can be named by: a URI, or a local path made
    absolute; refuses what a Delta path in SQL cannot hold (quotes, backquotes, ``;``...)."""
    text = value.rstrip("/") or "/"
    if "://" not in text and not text.startswith("dbfs:"):
        text = os.path.abspath(text)
    try:
        TableRef.parse(text)
    except UnsafeSQLError as exc:
        raise HomeError(f"{source}: the home {value!r} cannot be used: {exc}; give --home a "
                        "path or URI without quotes, backquotes, backslashes, ';' or control "
                        "characters") from None
    return text


def evidence_dir(args: argparse.Namespace) -> str:
    """``--evidence-dir``, else ``<plan dir>/evidence`` (or ``./evidence`` without a plan)."""
    if getattr(args, "evidence_dir", None):
        return str(args.evidence_dir)
    plan = getattr(args, "plan", None)
    base = Path(plan).resolve().parent if plan else Path.cwd()
    return str(base / "evidence")


def writable_evidence_dir(args: argparse.Namespace) -> str:
    """:func:`evidence_dir`, refused (exit 2, nothing created) when it is not a folder this
    process can write, or a path under one: found only at the end of a run, the evidence would
    fail after the promotion, which is then undone, on every attempt."""
    where = evidence_dir(args)
    probe = Path(where).absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        problem = f"{str(probe)!r} is a file, not a folder"
    elif not os.access(probe, os.W_OK | os.X_OK):
        problem = f"this process cannot write in {str(probe)!r}"
    else:
        return where
    raise HomeError(f"--evidence-dir: {problem}; the run writes its evidence to {where!r}. Give "
                    "--evidence-dir a folder you can write (it is created if missing)")


def spark_if_configured(args: argparse.Namespace) -> SparkSession | None:
    """The session, only where its conf may name the home: no ``--home`` or
    ``$SPARKGUARD_HOME`` and a Spark already there (Databricks, spark-submit's driver, an active
    session in this process). Elsewhere read-only commands start no JVM."""
    if getattr(args, "home", None) or os.environ.get("SPARKGUARD_HOME"):
        return None
    if os.environ.get("DATABRICKS_RUNTIME_VERSION") or os.environ.get("PYSPARK_GATEWAY_PORT"):
        return session()
    if "pyspark" in sys.modules:
        from pyspark.sql import SparkSession

        active = SparkSession.getActiveSession()
        if active is not None:
            return session()
    return None


def read(args: argparse.Namespace, query: Callable[[StateReader], T]) -> tuple[str, T]:
    """``query`` over sparkguard's tables: delta-rs when it can serve, else Spark (one line on
    stderr says so); returns the home and the answer."""
    from sparkguard.state_read import read_state

    spark = spark_if_configured(args)
    where = home(args, spark)
    return where, read_state(where, query, spark=lambda: spark or session())
