"""Publish control: pause holds per target in an append-only Delta table outside the target.

A table property on the target would be rolled back by RESTORE and its metadata commit would
conflict with concurrent writers, so the state lives in ``<home>/control/publish``. Each row
sets or clears one *hold* on one target: a run holds its targets under its run id, an
operator under ``manual``. A target is paused while any hold on it is set, so a backfill
reopening publish never overrides an operator's pause. A run that finishes clears its own hold
and those left by earlier runs of the target (failed or dead; its lock proves they are not
active); an operator's ``resume`` clears every hold. Downstream jobs make one call,
:func:`is_paused`, or query the view from :func:`register_view` / the SQL of
:func:`status_sql` (see ``docs/publish-control.md``).
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sparkguard.ledger_model import CLOCK
from sparkguard.sql import IDENTIFIER_RE, TableRef, quote_identifier

# No pyspark at import: downstream jobs import this module for :func:`is_paused` with only
# ``deltalake`` installed. The Spark side imports it where it runs.
if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["MANUAL_HOLD", "PublishControl", "PublishStatus", "is_paused", "register_view",
           "status_sql"]

MANUAL_HOLD = "manual"
# Audit chain (sparkguard/audit.py): every control event carries ``event_hash`` and ``prev_hash``,
# chained per target (previous = the target's newest event). Tables written before auditing gain
# the columns by schema evolution on the next append; their old rows read as unchained.
_HASH_NAMES = ("event_hash", "prev_hash")


def _schema() -> Any:
    from pyspark.sql import types as T

    return T.StructType([
        T.StructField("target", T.StringType(), False),
        T.StructField("hold", T.StringType(), False),
        T.StructField("paused", T.BooleanType(), False),
        T.StructField("at", T.TimestampType(), False),
        T.StructField("run_id", T.StringType(), True),
        T.StructField("actor", T.StringType(), True),
        T.StructField("reason", T.StringType(), True),
    ])


def _write_schema() -> Any:
    """The columns written: the control event and its audit hashes."""
    from pyspark.sql import types as T

    return T.StructType([*_schema().fields,
                         *[T.StructField(n, T.StringType(), True) for n in _HASH_NAMES]])


@dataclass(frozen=True)
class PublishStatus:
    """A target's publish state: paused while any hold is set."""

    target: str
    paused: bool
    holds: tuple[dict[str, Any], ...]  # the set holds: hold, at, run_id, actor, reason
    last_change: dt.datetime | None

    def describe(self) -> str:
        if not self.paused:
            since = f" since {self.last_change:%Y-%m-%d %H:%M:%S} UTC" if self.last_change else ""
            return f"{self.target}: open{since}"
        held = "; ".join(f"{h['hold']} by {h.get('actor') or '?'} at {h['at']:%Y-%m-%d %H:%M:%S}"
                         f" UTC ({h.get('reason') or 'no reason given'})" for h in self.holds)
        return f"{self.target}: PAUSED ({held})"


def status_sql(home: str) -> str:
    """SQL giving ``target, paused, holds, last_change`` per target from the control table.

    For SQL-only downstream jobs and for ``CREATE VIEW ... AS <this>`` in a catalog.
    """
    path = f"{home.rstrip('/')}/control/publish"
    TableRef.parse(path)  # refuses quotes, backquotes and control characters
    return (
        "SELECT target, max(paused) AS paused, "
        "collect_list(CASE WHEN paused THEN hold END) AS holds, max(at) AS last_change "
        "FROM (SELECT target, hold, paused, at, row_number() OVER "
        "(PARTITION BY target, hold ORDER BY at DESC) AS rn "
        f"FROM delta.`{path}`) WHERE rn = 1 GROUP BY target")


class PublishControl:
    """The publish control table at ``<home>/control/publish``."""

    def __init__(self, spark: SparkSession, home: str) -> None:
        self.spark = spark
        self.home = home.rstrip("/")
        self.ref = TableRef(path=f"{self.home}/control/publish")

    @property
    def path(self) -> str:
        assert self.ref.path is not None
        return self.ref.path

    def _events(self, targets: Sequence[str] | None = None) -> DataFrame | None:
        from pyspark.sql import functions as F

        from sparkguard.delta_ops import delta_log_exists

        if not delta_log_exists(self.spark, self.path):
            return None
        df = self.spark.read.format("delta").load(self.path)
        return df.filter(F.col("target").isin(list(targets))) if targets is not None else df

    def _append(self, rows: list[tuple[Any, ...]],
                heads: dict[str, str | None] | None = None) -> None:
        """Append control events in one commit, each chained to its target's previous event
        (``heads``: the targets' newest event hashes as just read; read here when not given).

        The rows of one append get strictly increasing ``at`` in the order given, so the newest
        event of a target (its chain head) is never a tie."""
        if not rows:
            return
        from sparkguard.delta_ops import append_rows, create_log_table
        from sparkguard.ledger_model import chained_hash

        targets = sorted({r[0] for r in rows})
        heads = dict(heads) if heads is not None else self._heads(targets)
        names = _schema().names
        chained = []
        step = dt.timedelta(microseconds=1)
        for i, r in enumerate(rows):
            row = (*r[:3], r[3] + i * step, *r[4:])
            prev = heads.get(row[0])
            h = chained_hash("publish", dict(zip(names, row, strict=True)), prev)
            heads[row[0]] = h
            chained.append((*row, h, prev))
        CLOCK.advance_past(r[3] for r in chained)  # the next append's events come after these
        create_log_table(self.spark, self.path, _write_schema())
        append_rows(self.spark, self.path, _write_schema(), chained, merge_schema=True)

    @staticmethod
    def _now() -> dt.datetime:
        """UTC now, strictly after every earlier value in this process (chain order)."""
        return CLOCK.now()

    def _heads(self, targets: Sequence[str]) -> dict[str, str | None]:
        """Each target's newest event hash (its publish chain head): one aggregation in Spark,
        one row per target to the driver."""
        return self._statuses_and_heads(targets)[1]

    def pause(self, targets: Sequence[str], *, run_id: str | None = None,
              actor: str | None = None, reason: str | None = None) -> None:
        """Set the hold of ``run_id`` (or the manual hold) on every target, in one append."""
        now, hold = self._now(), run_id or MANUAL_HOLD
        self._append([(t, hold, True, now, run_id, actor, reason) for t in targets])

    def release(self, targets: Sequence[str], run_id: str, *, actor: str | None = None,
                reason: str | None = None) -> None:
        """Clear only ``run_id``'s hold on every target (other holds stay), in one append."""
        now = self._now()
        self._append([(t, run_id, False, now, run_id, actor, reason) for t in targets])

    def finish(self, targets: Sequence[str], run_id: str, *, actor: str | None = None,
               reason: str | None = None) -> dict[str, PublishStatus]:
        """A run that holds the targets' locks finished: clear its hold and the holds other
        runs left behind (they ended or died: the lock says no other run is active); manual
        holds stay. One read and one append; returns the state after."""
        before, heads = self._statuses_and_heads(targets)
        now = self._now()
        rows: list[tuple[Any, ...]] = []
        after: dict[str, PublishStatus] = {}
        for t in targets:
            stale = [h for h in before[t].holds if h["hold"] not in (MANUAL_HOLD, run_id)]
            rows.append((t, run_id, False, now, run_id, actor, reason))
            rows += [(t, h["hold"], False, now, h.get("run_id"), actor,
                      f"cleared by run {run_id}: {reason or ''}".strip()) for h in stale]
            manual = tuple(h for h in before[t].holds if h["hold"] == MANUAL_HOLD)
            after[t] = PublishStatus(t, bool(manual), manual, now)
        self._append(rows, heads)
        return after

    def resume(self, targets: Sequence[str], *, actor: str | None = None,
               reason: str | None = None) -> list[str]:
        """Operator's reopen: clear every set hold on the targets; returns the holds cleared."""
        before, heads = self._statuses_and_heads(targets)
        now = self._now()
        rows, cleared = [], []
        for t in targets:
            st = before[t]
            for h in st.holds:
                rows.append((t, h["hold"], False, now, h.get("run_id"), actor, reason))
                cleared.append(f"{t}: {h['hold']}")
            if not st.holds:  # record the operator's decision even when already open
                rows.append((t, MANUAL_HOLD, False, now, None, actor, reason))
        self._append(rows, heads)
        return cleared

    def statuses(self, targets: Sequence[str] | None = None) -> dict[str, PublishStatus]:
        """State of each target (every target in the table when ``targets`` is None).

        The newest event of each (target, hold) is chosen in Spark; only the holds still set and
        one row per target (its last change) reach the driver, at any table size.
        """
        return self._statuses_and_heads(targets)[0]

    def _statuses_and_heads(self, targets: Sequence[str] | None
                            ) -> tuple[dict[str, PublishStatus], dict[str, str | None]]:
        """:meth:`statuses` and each target's publish chain head, from one read."""
        df = self._events(targets)
        rows = [] if df is None else [r.asDict() for r in _current(df).collect()]
        heads: dict[str, str | None] = {}
        set_holds: dict[str, list[dict[str, Any]]] = {}
        changed: dict[str, dt.datetime] = {}
        for r in rows:
            head = r.pop("_head")
            if r["hold"] is None:
                changed[r["target"]] = r["at"]
                heads[r["target"]] = head
            else:
                set_holds.setdefault(r["target"], []).append(r)
        out = {t: PublishStatus(t, False, (), None) for t in targets or []}
        for t in set(changed) | set(set_holds):
            holds = tuple(sorted(set_holds.get(t, []), key=lambda h: h["at"]))
            out[t] = PublishStatus(t, bool(holds), holds, changed.get(t))
        return out, heads

    def status(self, target: str) -> PublishStatus:
        return self.statuses([target])[target]

    def is_paused(self, target: str) -> bool:
        """The one call a downstream job makes before publishing ``target``."""
        return self.status(target).paused


def _current(events: DataFrame) -> DataFrame:
    """From the control events: one row per hold still set (newest event of its (target, hold)
    pauses) and one row per target with ``hold`` null, ``at`` its last change and ``_head`` the
    hash of its newest event (null on the hold rows, and for tables written before auditing)."""
    from pyspark.sql import functions as F

    names = _schema().names
    newest = events.groupBy("target", "hold").agg(
        F.max_by(F.struct(*[F.col(c) for c in names]), F.col("at")).alias("_row"))
    held = newest.select(*[F.col("_row")[c].alias(c) for c in names],
                         F.lit(None).cast("string").alias("_head")).filter(F.col("paused"))
    head = (F.max_by("event_hash", "at") if "event_hash" in events.columns
            else F.lit(None).cast("string"))
    last = events.groupBy("target").agg(F.max("at").alias("at"), head.alias("_head")).select(
        "target", F.lit(None).cast("string").alias("hold"), F.lit(None).cast("boolean")
        .alias("paused"), "at", *[F.lit(None).cast("string").alias(c)
                                  for c in ("run_id", "actor", "reason")], "_head")
    return held.unionByName(last)


def is_paused(home_or_spark: str | os.PathLike[str] | SparkSession, /, target: str,
              home: str | None = None, *, storage_options: Mapping[str, str] | None = None
              ) -> bool:
    """One call for downstream jobs: is publish of ``target`` paused (by any hold)?

    ``is_paused(home, target)`` reads the control table with delta-rs (``deltalake``): no
    Spark, no JVM. ``home`` is sparkguard's home (a local path or an ``s3://``, ``gs://``,
    ``abfss://``... URI; credentials from the environment or ``storage_options``); ``target``
    is the dataset exactly as the backfill plan names it. Raises
    :class:`sparkguard.state_read.FastReadUnavailable` when delta-rs cannot read the table (it
    never answers "open" then).

    ``is_paused(spark, target, home)`` asks the same through a Spark session.
    """
    if isinstance(home_or_spark, (str, os.PathLike)):
        if home is not None:
            raise TypeError("is_paused(home, target): give the home once")
        from sparkguard.state_read import DeltaRsReader

        reader = DeltaRsReader(os.fspath(home_or_spark), storage_options)
        return reader.publish_statuses([target])[target].paused
    if home is None:
        raise TypeError("is_paused(spark, target, home): name sparkguard's home")
    return PublishControl(home_or_spark, home).is_paused(target)


def register_view(spark: SparkSession, home: str, name: str = "sparkguard_publish_status") -> str:
    """Register a temp view ``target, paused, holds, last_change``; returns its quoted name."""
    if not IDENTIFIER_RE.match(name):
        raise ValueError(f"view name {name!r} must be a plain identifier")
    from sparkguard.delta_ops import delta_log_exists

    control = PublishControl(spark, home)
    if delta_log_exists(spark, control.path):
        spark.sql(status_sql(home)).createOrReplaceTempView(name)
    else:  # nothing ever paused: an empty view of the same shape
        spark.sql("SELECT CAST(NULL AS STRING) AS target, false AS paused, "
                  "array(CAST(NULL AS STRING)) AS holds, CAST(NULL AS TIMESTAMP) AS last_change "
                  "WHERE false").createOrReplaceTempView(name)
    return quote_identifier(name)
