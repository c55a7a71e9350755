"""Publish control: pause holds per target in an append-only Delta table outside the target.

A table property on the target would be rolled back by RESTORE and its metadata commit would
conflict with concurrent writers, so the state lives in ``<home>/control/publish``. Each row
sets or clears one *hold* on one target: a run holds its targets under its run id, an
operator under ``manual``. A target is paused while any hold on it is set, so a backfill
reopening publish never overrides an operator's pause. A run that finishes clears its own hold
and those left by earlier runs of the target (failed or dead; its lock proves they are not
active); an operator's ``resume`` clears every hold. Each event also records the target's
storage location, so one table named two ways (``main.sales.orders`` in one plan, its path in
another, or in the downstream job's check) has one publish state. Downstream jobs make one call,
:func:`is_paused`, or query the view from :func:`register_view` / the SQL of
:func:`status_sql` (see ``docs/publish-control.md``).
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sparkguard.ledger_model import CLOCK, instant, plus
from sparkguard.sql import (
    IDENTIFIER_RE,
    TableRef,
    UnsafeSQLError,
    canonical_location,
    canonical_location_sql,
    quote_identifier,
    spellings_of,
)

# No pyspark at import: downstream jobs import this module for :func:`is_paused` with only
# ``deltalake`` installed. The Spark side imports it where it runs.
if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["MANUAL_HOLD", "PublishControl", "PublishStatus", "fold_statuses", "is_paused",
           "register_view", "status_sql"]

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
        # the target's storage location (DESCRIBE DETAIL); null on rows written before it was
        # recorded, which match by their spelling only
        T.StructField("location", T.StringType(), True),
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
            since = (f" since {instant(self.last_change):%Y-%m-%d %H:%M:%S} UTC"
                     if self.last_change else "")
            return f"{self.target}: open{since}"
        held = "; ".join(f"{h['hold']} by {h.get('actor') or '?'} at "
                         f"{instant(h['at']):%Y-%m-%d %H:%M:%S}"
                         f" UTC ({h.get('reason') or 'no reason given'})"
                         + (f" as {h['target']}" if h.get("target", self.target) != self.target
                            else "") for h in self.holds)
        return f"{self.target}: PAUSED ({held})"


def status_sql(home: str, *, with_location: bool = True) -> str:
    """SQL giving ``target, paused, holds, last_change`` per target from the control table.

    For SQL-only downstream jobs and for ``CREATE VIEW ... AS <this>`` in a catalog. A target
    is paused while a hold is set on it or on another name of the same table (a catalog name
    and a path whose events recorded one location). ``with_location=False`` is for a control
    table no event of this version has written yet (it lacks the ``location`` column).
    """
    path = f"{home.rstrip('/')}/control/publish"
    TableRef.parse(path)  # refuses quotes, backquotes and control characters
    # a location in its one spelling, for events earlier versions recorded as given (s3a://,
    # wasbs:// on the blob endpoint)
    location = (canonical_location_sql("location")
                if with_location else "CAST(NULL AS STRING)")
    return (
        f"WITH e AS (SELECT target, hold, paused, at, {location} AS location "
        f"FROM delta.`{path}`), "
        "held AS (SELECT target, hold, location FROM (SELECT *, row_number() OVER "
        "(PARTITION BY target, hold ORDER BY at DESC) AS rn FROM e) AS r "
        "WHERE rn = 1 AND paused), "
        "links AS (SELECT DISTINCT target, location FROM e WHERE location IS NOT NULL), "
        "matched AS (SELECT target, hold FROM held UNION "
        "SELECT l.target, h.hold FROM links l JOIN held h ON h.location = l.location), "
        "peers AS (SELECT DISTINCT target, target AS peer FROM e UNION "
        "SELECT a.target, b.target FROM links a JOIN links b ON a.location = b.location), "
        "changes AS (SELECT target, max(at) AS at FROM e GROUP BY target), "
        "last AS (SELECT p.target, max(c.at) AS last_change FROM peers p "
        "JOIN changes c ON c.target = p.peer GROUP BY p.target) "
        "SELECT l.target, count(m.hold) > 0 AS paused, collect_list(m.hold) AS holds, "
        "l.last_change FROM last l LEFT JOIN matched m ON m.target = l.target "
        "GROUP BY l.target, l.last_change")


def fold_statuses(held: Iterable[Mapping[str, Any]], last: Iterable[Mapping[str, Any]],
                  targets: Sequence[str] | None,
                  keys: Mapping[str, Iterable[str]] | None = None) -> dict[str, PublishStatus]:
    """Publish state per target from the holds still set (``held``: their newest event, with
    ``target`` and ``location``) and one summary per name in the table (``last``: ``target``,
    ``at`` its newest event, ``locations`` its events recorded). A hold counts for target T
    when it was set under T or under any name whose event recorded a location of T: one of
    ``keys[T]`` (where T is stored, as resolved by the caller) or one T's own events recorded.
    Targets asked for and never paused are open; ``targets`` None: every name in the table."""
    # locations compared in their one spelling (earlier versions kept s3a://), made once
    holds_at = [(h, canonical_location(h.get("location") or "")) for h in held]
    events = [(x, {canonical_location(loc) for loc in x.get("locations") or () if loc})
              for x in last]
    recorded: dict[str, set[str]] = {}
    for x, locs in events:
        recorded.setdefault(x["target"], set()).update(locs)
    names = list(targets) if targets is not None else sorted(recorded)
    out: dict[str, PublishStatus] = {}
    for t in names:
        same = recorded.get(t, set()) | {canonical_location(k)
                                         for k in (keys or {}).get(t, ()) if k}
        holds = tuple(sorted((dict(h) for h, loc in holds_at if h["target"] == t or loc in same),
                             key=lambda h: (h["at"], h["target"], h["hold"])))
        changed = [x["at"] for x, locs in events if x["target"] == t or same & locs]
        out[t] = PublishStatus(t, bool(holds), holds, max(changed, default=None))
    return out


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

    def _resolve(self, targets: Sequence[str], known: Mapping[str, str] | None = None,
                 ) -> dict[str, tuple[str, frozenset[str]]]:
        """Each target's location to record and the keys naming its table: the location
        ``DESCRIBE DETAIL`` gives (the lock key; taken from ``known`` when the caller holds the
        target's lock under it) and, for a path, that path's location form. A target that
        cannot be described (missing, or not a table name) is recorded as its path's location
        form, else as written."""
        from sparkguard import delta_ops

        out: dict[str, tuple[str, frozenset[str]]] = {}
        for t in dict.fromkeys(targets):
            try:
                ref = TableRef.parse(t)
            except UnsafeSQLError:
                out[t] = (t, frozenset())
                continue
            spelled = ref.path_location
            try:
                key = (known or {}).get(t) or delta_ops.lock_key(self.spark, ref)
            except Exception:  # no file system for its scheme here, say: the spelling still
                key = ref.display  # names the table, and a pause must not fail on it
            location = spelled if key == ref.display and spelled else key
            out[t] = (location, frozenset(k for k in (key, spelled) if k))
        return out

    def _events(self, targets: Sequence[str] | None,
                keys: Mapping[str, Iterable[str]] | None = None) -> DataFrame | None:
        """The control events (every one, or those of the targets' tables: set under their
        names, under their keys, or under a location one of their own events recorded)."""
        from pyspark.sql import functions as F

        from sparkguard.delta_ops import delta_log_exists

        if not delta_log_exists(self.spark, self.path):
            return None
        df = self.spark.read.format("delta").load(self.path)
        if "location" not in df.columns:  # written before locations were recorded
            df = df.withColumn("location", F.lit(None).cast("string"))
        if targets is None:
            return df
        named = F.col("target").isin(list(targets))
        found = spellings_of(k for ks in (keys or {}).values() for k in ks)
        recorded = (df.filter(named & F.col("location").isNotNull()).select("location")
                    .distinct().withColumn("_recorded", F.lit(True)))
        same = named | F.col("_recorded").isNotNull()
        if found:
            same = same | F.col("location").isin(found)
        return (df.join(F.broadcast(recorded), "location", "left").filter(same)
                .select(*df.columns))

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
            row = (*r[:3], plus(r[3], i * step), *r[4:])
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
        """Each target's newest event hash (its publish chain head, over every event written
        under that name): one aggregation in Spark, one row per target to the driver."""
        from pyspark.sql import functions as F

        df = self._events(None)
        if df is None:
            return {}
        df = df.filter(F.col("target").isin(list(targets)))
        return {r["target"]: r["_head"] for r in _current(df).collect() if r["hold"] is None}

    def _append_clearing(self, targets: Sequence[str], rows: list[tuple[Any, ...]],
                         heads: dict[str, str | None]) -> None:
        """Append events clearing holds; those set under other names than ``targets`` chain
        to those names' heads, read over all their events."""
        others = sorted({r[0] for r in rows} - set(targets))
        self._append(rows, {**heads, **self._heads(others)} if others else heads)

    def pause(self, targets: Sequence[str], *, run_id: str | None = None,
              actor: str | None = None, reason: str | None = None,
              locations: Mapping[str, str] | None = None) -> None:
        """Set the hold of ``run_id`` (or the manual hold) on every target, in one append.
        ``locations``: targets' lock keys the caller already has (not described again)."""
        now, hold = self._now(), run_id or MANUAL_HOLD
        where = self._resolve(targets, locations)
        self._append([(t, hold, True, now, run_id, actor, reason, where[t][0]) for t in targets])

    def release(self, targets: Sequence[str], run_id: str, *, actor: str | None = None,
                reason: str | None = None, locations: Mapping[str, str] | None = None) -> None:
        """Clear only ``run_id``'s hold on every target (other holds stay), in one append."""
        now, where = self._now(), self._resolve(targets, locations)
        self._append([(t, run_id, False, now, run_id, actor, reason, where[t][0])
                      for t in targets])

    def finish(self, targets: Sequence[str], run_id: str, *, actor: str | None = None,
               reason: str | None = None, locations: Mapping[str, str] | None = None,
               ) -> dict[str, PublishStatus]:
        """A run that holds the targets' locks finished: clear its hold and the holds other
        runs left behind on the same tables, under whichever name they were set (those runs
        ended or died: the lock says no other run is active); manual holds stay. One read and
        one append; returns the state after."""
        where = self._resolve(targets, locations)
        before, heads = self._statuses_and_heads(targets, where)
        now = self._now()
        rows: dict[tuple[str, str], tuple[Any, ...]] = {}
        after: dict[str, PublishStatus] = {}
        for t in targets:
            rows[(t, run_id)] = (t, run_id, False, now, run_id, actor, reason, where[t][0])
            for h in before[t].holds:  # its own hold too, when set under another name
                if h["hold"] != MANUAL_HOLD:
                    rows.setdefault((h["target"], h["hold"]), (
                        h["target"], h["hold"], False, now, h.get("run_id"), actor,
                        reason if h["hold"] == run_id
                        else f"cleared by run {run_id}: {reason or ''}".strip(),
                        h.get("location") or where[t][0]))
            manual = tuple(h for h in before[t].holds if h["hold"] == MANUAL_HOLD)
            after[t] = PublishStatus(t, bool(manual), manual, now)
        self._append_clearing(targets, list(rows.values()), heads)
        return after

    def resume(self, targets: Sequence[str], *, actor: str | None = None,
               reason: str | None = None) -> list[str]:
        """Operator's reopen: clear every set hold on the targets' tables, under whichever name
        it was set; returns the holds cleared."""
        where = self._resolve(targets)
        before, heads = self._statuses_and_heads(targets, where)
        now = self._now()
        rows: dict[tuple[str, str], tuple[Any, ...]] = {}
        cleared = []
        for t in targets:
            for h in before[t].holds:
                if (h["target"], h["hold"]) not in rows:
                    cleared.append(f"{h['target']}: {h['hold']}")
                rows[(h["target"], h["hold"])] = (h["target"], h["hold"], False, now,
                                                  h.get("run_id"), actor, reason,
                                                  h.get("location") or where[t][0])
            if not before[t].holds:  # record the operator's decision even when already open
                rows.setdefault((t, MANUAL_HOLD), (t, MANUAL_HOLD, False, now, None, actor,
                                                   reason, where[t][0]))
        self._append_clearing(targets, list(rows.values()), heads)
        return cleared

    def statuses(self, targets: Sequence[str] | None = None,
                 known: Mapping[str, str] | None = None) -> dict[str, PublishStatus]:
        """State of each target (every name in the table when ``targets`` is None), counting
        the holds set under any name of the same table (``known``: locations the caller already
        holds, as for :meth:`_resolve`).

        The newest event of each (target, hold) is chosen in Spark; only the holds still set and
        one row per name (its last change and locations) reach the driver, at any table size.
        """
        where = self._resolve(targets, known) if targets is not None else None
        return self._statuses_and_heads(targets, where)[0]

    def _statuses_and_heads(self, targets: Sequence[str] | None,
                            where: Mapping[str, tuple[str, frozenset[str]]] | None
                            ) -> tuple[dict[str, PublishStatus], dict[str, str | None]]:
        """:meth:`statuses` and each name's publish chain head, from one read."""
        keys = {t: w[1] for t, w in (where or {}).items()}
        df = self._events(targets, keys)
        rows = [] if df is None else [r.asDict() for r in _current(df).collect()]
        heads: dict[str, str | None] = {}
        held, last = [], []
        for r in rows:
            head, locations = r.pop("_head"), r.pop("_locations")
            if r["hold"] is None:
                heads[r["target"]] = head
                last.append({"target": r["target"], "at": r["at"], "locations": locations})
            else:
                held.append(r)
        return fold_statuses(held, last, targets, keys), heads

    def status(self, target: str) -> PublishStatus:
        return self.statuses([target])[target]

    def is_paused(self, target: str) -> bool:
        """The one call a downstream job makes before publishing ``target``."""
        return self.status(target).paused


def _current(events: DataFrame) -> DataFrame:
    """From the control events: one row per hold still set (newest event of its (target, hold)
    pauses) and one row per target with ``hold`` null, ``at`` its last change, ``_head`` the
    hash of its newest event (null on the hold rows, and for tables written before auditing)
    and ``_locations`` the locations its events recorded."""
    from pyspark.sql import functions as F

    names = _schema().names
    newest = events.groupBy("target", "hold").agg(
        F.max_by(F.struct(*[F.col(c) for c in names]), F.col("at")).alias("_row"))
    held = newest.select(*[F.col("_row")[c].alias(c) for c in names],
                         F.lit(None).cast("string").alias("_head"),
                         F.lit(None).cast("array<string>").alias("_locations")
                         ).filter(F.col("paused"))
    head = (F.max_by("event_hash", "at") if "event_hash" in events.columns
            else F.lit(None).cast("string"))
    last = events.groupBy("target").agg(
        F.max("at").alias("at"), head.alias("_head"),
        F.collect_set("location").alias("_locations")).select(
        "target", F.lit(None).cast("string").alias("hold"), F.lit(None).cast("boolean")
        .alias("paused"), "at", *[F.lit(None).cast("string").alias(c)
                                  for c in ("run_id", "actor", "reason", "location")],
        "_head", "_locations")
    return held.unionByName(last)


def is_paused(home_or_spark: str | os.PathLike[str] | SparkSession, /, target: str,
              home: str | None = None, *, storage_options: Mapping[str, str] | None = None
              ) -> bool:
    """One call for downstream jobs: is publish of ``target`` paused (by any hold)?

    ``is_paused(home, target)`` reads the control table with delta-rs (``deltalake``): no
    Spark, no JVM. ``home`` is sparkguard's home (a local path or an ``s3://``, ``gs://``,
    ``abfss://``... URI; credentials from the environment or ``storage_options``); ``target``
    is the dataset as the backfill plan names it or a path of the same table (a catalog name
    the plan did not use needs Spark; see ``docs/publish-control.md``). Raises
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
        with_location = "location" in spark.read.format("delta").load(control.path).columns
        spark.sql(status_sql(home, with_location=with_location)).createOrReplaceTempView(name)
    else:  # nothing ever paused: an empty view of the same shape
        spark.sql("SELECT CAST(NULL AS STRING) AS target, false AS paused, "
                  "array(CAST(NULL AS STRING)) AS holds, CAST(NULL AS TIMESTAMP) AS last_change "
                  "WHERE false").createOrReplaceTempView(name)
    return quote_identifier(name)
