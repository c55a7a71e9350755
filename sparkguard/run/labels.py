"""Spark job labels for a run: the one place the run sets them (through :mod:`sparkguard.compat`,
which knows classic Spark and Spark Connect).

Every Spark job of a run carries the job group ``sparkguard-<run id>`` and a description
naming its stage, so the Spark UI and event logs show what each job was for. A label never
fails a run.
"""

from __future__ import annotations

import contextlib

from pyspark.sql import SparkSession

from sparkguard import compat

__all__ = ["job_labels", "restore_job_labels", "set_job_label"]


def set_job_label(spark: SparkSession, group: str, desc: str) -> None:
    """Label this thread's next Spark jobs with ``group`` and ``desc``."""
    with contextlib.suppress(Exception):
        compat.set_job_label(spark, group, desc)


def job_labels(spark: SparkSession) -> dict[str, str | None]:
    """The caller's labels, to put back after the run."""
    with contextlib.suppress(Exception):
        return compat.job_labels(spark)
    return {}


def restore_job_labels(spark: SparkSession, labels: dict[str, str | None]) -> None:
    """Put back what :func:`job_labels` returned."""
    with contextlib.suppress(Exception):
        compat.restore_job_labels(spark, labels)
