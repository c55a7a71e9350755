"""Read sparkguard's own tables without a JVM (delta-rs), or with Spark where delta-rs cannot.

The ledger (``<home>/ledger/runs``, ``slices``, ``locks``) and the publish control table
(``<home>/control/publish``) are small Delta tables. Read-only answers about them (``sparkguard
status``, ``report``, ``publish status``, :func:`sparkguard.publish.is_paused`) read them with
the ``deltalake`` package (delta-rs): no JVM, no Spark, about a second cold.

Two readers offer the same methods and return the same plain records (dicts with the tables'
columns, ``details``/``gates`` decoded from JSON, timestamps as naive datetimes converted the
way PySpark converts them), so one pure formatter (:mod:`sparkguard.status_view`) serves both:

- :class:`DeltaRsReader` (:mod:`sparkguard.delta_reader`, re-exported here): local paths and
  the object stores delta-rs opens; raises :class:`FastReadUnavailable` where it cannot serve;
- :class:`SparkReader`: :class:`sparkguard.ledger.Ledger` and
  :class:`sparkguard.publish.PublishControl` on a session.

:func:`read_state` runs a query on the first and falls back to the second, saying so in one
line. The newest event decides every "latest state" here, whatever the number of rows: the
SQL picks it per key (``row_number() OVER (PARTITION BY key ORDER BY at DESC)``), nothing is cut
at a row limit.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TextIO, TypeVar

from sparkguard.delta_reader import (
    _JSON_COLUMNS,
    TABLES,
    DeltaRsReader,
    FastReadUnavailable,
    fold_publish_statuses,
)
from sparkguard.ledger_model import LockInfo, RunProgress, decode_row

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from sparkguard.publish import PublishStatus

__all__ = [
    "READER_ENV",
    "DeltaRsReader",
    "FastReadUnavailable",
    "SparkReader",
    "StateReader",
    "fold_publish_statuses",
    "read_state",
]

READER_ENV = "SPARKGUARD_READER"  # auto (default) | delta-rs | spark
T = TypeVar("T")


class StateReader(Protocol):
    """What both readers answer; every method reads the tables afresh."""

    engine: str
    home: str

    def run_events(self, run_id: str) -> list[dict[str, Any]]: ...
    def slice_events(self, run_id: str) -> list[dict[str, Any]]: ...
    def latest_runs(self, limit: int = 20) -> list[RunProgress]: ...
    def lock_holders(self, targets: Sequence[str]) -> dict[str, LockInfo]: ...
    def publish_statuses(self, targets: Sequence[str] | None = None
                         ) -> dict[str, PublishStatus]: ...
    def rows(self, name: str, column: str | None = None,
             values: Sequence[str] | None = None) -> list[dict[str, Any]]: ...
    def history(self, dataset: str) -> list[dict[str, Any]] | None: ...
    def table_location(self, name: str) -> str: ...

    @property
    def control_path(self) -> str: ...


# -- Spark ----------------------------------------------------------------------------------


class SparkReader:
    """The same answers through Spark (:class:`Ledger`, :class:`PublishControl`)."""

    engine = "spark"

    def __init__(self, spark: SparkSession, home: str) -> None:
        from sparkguard.ledger import Ledger
        from sparkguard.publish import PublishControl

        self.home = str(home).rstrip("/")
        self.ledger = Ledger(spark, self.home)
        self.publish = PublishControl(spark, self.home)

    @property
    def control_path(self) -> str:
        return self.publish.path

    def run_events(self, run_id: str) -> list[dict[str, Any]]:
        return self.ledger.run_events(run_id)

    def slice_events(self, run_id: str) -> list[dict[str, Any]]:
        return self.ledger.slice_events(run_id)

    def latest_runs(self, limit: int = 20) -> list[RunProgress]:
        return self.ledger.latest_runs(limit)

    def lock_holders(self, targets: Sequence[str]) -> dict[str, LockInfo]:
        return self.ledger.lock_holders(targets)

    def publish_statuses(self, targets: Sequence[str] | None = None
                         ) -> dict[str, PublishStatus]:
        return self.publish.statuses(targets)

    def table_location(self, name: str) -> str:
        return f"{self.home}/{TABLES[name]}"

    def rows(self, name: str, column: str | None = None,
             values: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """Every row of one of sparkguard's tables (where ``column`` is one of ``values``):
        what a verifier asked for, bounded by its own question."""
        from sparkguard import delta_ops

        spark = self.ledger.spark
        path = self.table_location(name)
        if not delta_ops.delta_log_exists(spark, path):
            return []
        df = spark.read.format("delta").load(path)
        if column:
            df = df.filter(df[column].isin(list(values or [])))
        rows = [decode_row(r.asDict(), *_JSON_COLUMNS[name]) for r in df.toLocalIterator()]
        order = ("generation", "at") if name == "locks" else ("at",)
        return sorted(rows, key=lambda r: tuple(r[c] for c in order))

    def history(self, dataset: str) -> list[dict[str, Any]] | None:
        """A table's commits, oldest first, as :meth:`DeltaRsReader.history` returns them."""
        from sparkguard import delta_ops
        from sparkguard.sql import TableRef

        spark = self.ledger.spark
        ref = TableRef.parse(dataset)
        if ref.path is not None and not delta_ops.delta_log_exists(spark, ref.path):
            return None
        out = []
        for r in delta_ops.history(spark, ref).toLocalIterator():
            ts = r["timestamp"]
            out.append({"version": int(r["version"]), "operation": r["operation"],
                        "timestamp": round(ts.astimezone(dt.UTC).timestamp() * 1000),
                        "operationParameters": dict(r["operationParameters"] or {}),
                        "userMetadata": r["userMetadata"]})
        return sorted(out, key=lambda c: c["version"])


# -- choosing ---------------------------------------------------------------------------------


def read_state(home: str, query: Callable[[StateReader], T], *,
               spark: Callable[[], SparkSession], engine: str | None = None,
               err: TextIO | None = None) -> T:
    """``query`` answered by delta-rs, or by Spark where delta-rs cannot serve (one line on
    ``err`` says why). ``engine`` (default ``$SPARKGUARD_READER``, else ``auto``): ``auto``,
    ``delta-rs`` (never Spark: :class:`FastReadUnavailable` propagates) or ``spark``.
    ``spark`` is called only when Spark is needed; ``query`` must not print (it may run twice).
    """
    engine = (engine or os.environ.get(READER_ENV) or "auto").strip().lower()
    if engine not in ("auto", "delta-rs", "spark"):
        raise FastReadUnavailable(
            f"{READER_ENV}={engine!r} is not a reader; use auto, delta-rs or spark")
    if engine != "spark":
        try:
            return query(DeltaRsReader(home))
        except FastReadUnavailable as exc:
            if engine == "delta-rs":
                raise
            print(f"sparkguard: {exc}; reading with Spark instead", file=err or sys.stderr)
    return query(SparkReader(spark(), home))
