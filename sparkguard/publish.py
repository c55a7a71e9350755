"""Publish control: pause state per target in an append-only Delta table outside the target.

A table property on the target would be rolled back by RESTORE and its metadata commit would
conflict with concurrent writers, so the state lives here. Downstream jobs call
:func:`is_paused` (or query the view from :func:`register_view`) before publishing.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.window import Window

from sparkguard.delta_ops import table_exists, with_conflict_retry
from sparkguard.sql import TableRef, quote_identifier

__all__ = ["PublishControl"]

_SCHEMA = T.StructType([
    T.StructField("target", T.StringType(), False),
    T.StructField("paused", T.BooleanType(), False),
    T.StructField("at", T.TimestampType(), False),
    T.StructField("run_id", T.StringType(), True),
    T.StructField("actor", T.StringType(), True),
    T.StructField("reason", T.StringType(), True),
])


class PublishControl:
    """The publish control table at ``<home>/control/publish``."""

    def __init__(self, spark: SparkSession, home: str) -> None:
        self.spark = spark
        self.ref = TableRef(path=f"{home.rstrip('/')}/control/publish")

    def _events(self) -> DataFrame:
        if not table_exists(self.spark, self.ref):
            return self.spark.createDataFrame([], _SCHEMA)
        assert self.ref.path is not None
        return self.spark.read.format("delta").load(self.ref.path)

    def _set(self, target: str, paused: bool, run_id: str | None, actor: str | None,
             reason: str | None) -> None:
        now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
        df = self.spark.createDataFrame([(target, paused, now, run_id, actor, reason)], _SCHEMA)
        assert self.ref.path is not None
        path = self.ref.path
        with_conflict_retry(lambda: df.write.format("delta").mode("append").save(path),
                            attempts=5, delay_s=0.5, log=lambda _m: None)

    def pause(self, target: str, run_id: str | None = None, actor: str | None = None,
              reason: str | None = None) -> None:
        self._set(target, True, run_id, actor, reason)

    def resume(self, target: str, run_id: str | None = None, actor: str | None = None,
               reason: str | None = None) -> None:
        self._set(target, False, run_id, actor, reason)

    def current(self) -> DataFrame:
        """Latest state per target: target, paused, at, run_id, actor, reason."""
        w = Window.partitionBy("target").orderBy(F.col("at").desc())
        return (self._events().withColumn("_rn", F.row_number().over(w))
                .filter("_rn = 1").drop("_rn"))

    def status(self, target: str) -> dict[str, Any] | None:
        row = self.current().filter(F.col("target") == target).first()
        return row.asDict() if row else None

    def is_paused(self, target: str) -> bool:
        """The one call a downstream job makes before publishing ``target``."""
        st = self.status(target)
        return bool(st and st["paused"])

    def register_view(self, name: str = "sparkguard_publish_status") -> str:
        """Register a temp view of the current state per target; returns its quoted name."""
        quoted = quote_identifier(name)
        self.current().createOrReplaceTempView(name)
        return quoted
