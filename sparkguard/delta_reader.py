"""sparkguard's tables read with delta-rs (the ``deltalake`` package): no JVM, no Spark.

:class:`DeltaRsReader` answers what :class:`sparkguard.state_read.StateReader` asks, in the
records :class:`sparkguard.state_read.SparkReader` returns: dicts with the tables' columns,
``details``/``gates`` decoded from JSON, timestamps as naive datetimes converted the way
PySpark converts them. It opens local paths and the object stores delta-rs opens (``s3://``,
``s3a://``, ``gs://``, ``az://``, ``abfs[s]://``, ``file://``) and raises
:class:`FastReadUnavailable` where it cannot serve (another scheme such as ``dbfs:`` or
``hdfs://``, missing credentials, a reader feature delta-rs lacks, ``deltalake`` not installed).
The newest event decides every "latest state": the SQL picks it per key, nothing is cut at a
row limit. ``latest_runs`` reads newest first where the files carry statistics
(:mod:`sparkguard.newest_runs`).
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from sparkguard.errors import SparkguardError
from sparkguard.ledger_model import LockInfo, RunProgress, decode_row, lock_holders, run_progress
from sparkguard.newest_runs import file_stats, newest_runs
from sparkguard.sql import spellings_of

if TYPE_CHECKING:
    from sparkguard.publish import PublishStatus

__all__ = ["DELTA_RS_SCHEMES", "TABLES", "DeltaRsReader", "FastReadUnavailable",
           "fold_publish_statuses"]

# URI schemes the deltalake wheels open (object_store); anything else goes to Spark.
DELTA_RS_SCHEMES = frozenset({"file", "s3", "s3a", "gs", "az", "abfs", "abfss", "adl", "azure"})
TABLES = {"runs": "ledger/runs", "slices": "ledger/slices", "locks": "ledger/locks",
          "evidence": "ledger/evidence", "publish": "control/publish"}
_JSON_COLUMNS = {"runs": ("details",), "slices": ("gates",), "locks": (), "evidence": ("leaves",),
                 "publish": ()}
_HASH_COLUMNS = ("event_hash", "prev_hash")


class FastReadUnavailable(SparkguardError):
    """Raised when delta-rs cannot read sparkguard's tables at this home (scheme, credentials,
    a reader feature it lacks, or ``deltalake`` not installed); the message says which."""


def _sql_str(value: str) -> str:
    """A SQL string literal (DataFusion: quotes doubled; backslashes are plain characters)."""
    if "\x00" in value:
        raise ValueError("a NUL character cannot be part of a key")
    return "'" + value.replace("'", "''") + "'"


def _pyspark_datetime(micros: int | None) -> dt.datetime | None:
    """A Delta timestamp (microseconds since the epoch, UTC) as PySpark's ``collect()`` returns
    it: a naive datetime in this process's local time zone."""
    if micros is None:
        return None
    return dt.datetime.fromtimestamp(micros // 1_000_000).replace(microsecond=micros % 1_000_000)


def fold_publish_statuses(latest: Iterable[dict[str, Any]], targets: Sequence[str] | None,
                          keys: Mapping[str, Iterable[str]] | None = None
                          ) -> dict[str, PublishStatus]:
    """Publish state per target from the newest event of each (name, hold), as
    :func:`sparkguard.publish.fold_statuses` folds it: paused while any hold on the target's
    table is set, under its name or another name whose events recorded one of its locations;
    ``last_change`` the newest event of those names. Targets asked for and never paused are
    open."""
    from sparkguard.publish import fold_statuses

    latest = list(latest)
    last: dict[str, dict[str, Any]] = {}
    for row in latest:
        x = last.setdefault(row["target"], {"target": row["target"], "at": row["at"],
                                             "locations": set()})
        x["at"] = max(x["at"], row["at"])
        if row.get("location"):
            x["locations"].add(row["location"])
    return fold_statuses([r for r in latest if r["paused"]], last.values(), targets, keys)


class DeltaRsReader:
    """sparkguard's tables at ``home`` read with delta-rs (``deltalake``), no JVM."""

    engine = "delta-rs"

    def __init__(self, home: str, storage_options: Mapping[str, str] | None = None) -> None:
        self.home = str(home).rstrip("/")
        self.storage_options = dict(storage_options or {})
        scheme = urlsplit(self.home).scheme.lower()
        self._local = scheme in ("", "file") or (len(scheme) == 1 and os.name == "nt")
        if not self._local and scheme not in DELTA_RS_SCHEMES:
            raise FastReadUnavailable(f"delta-rs does not open {scheme}: URIs ({self.home})")
        if self._local and not os.path.isdir(self._local_base()):
            # a path without a scheme is the cluster's default file system to Spark (dbfs:/,
            # hdfs://, a Connect server's disk): nothing here is no answer, never "open"
            raise FastReadUnavailable(
                f"no directory {self.home} on this machine (a home on the cluster's file "
                "system is read with Spark; give an object store's URI for delta-rs)")
        try:
            import deltalake  # noqa: F401
        except ImportError as exc:
            raise FastReadUnavailable(f"the deltalake package is not installed ({exc})") from exc
        self._tables: dict[str, Any] = {}

    def _local_base(self) -> str:
        return os.path.abspath(self.home.removeprefix("file://") if self.home.startswith(
            "file://") else self.home)

    @property
    def control_path(self) -> str:
        return f"{self.home}/{TABLES['publish']}"

    def _location(self, name: str) -> str:
        rel = TABLES[name]
        if self._local:
            return os.path.join(self._local_base(), rel)
        return f"{self.home}/{rel}"

    def _table(self, name: str) -> Any | None:
        """The table, or None when it does not exist (nothing was ever recorded there)."""
        if name in self._tables:
            return self._tables[name]
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        location = self._location(name)
        if self._local and not os.path.isdir(os.path.join(location, "_delta_log")):
            table = None
        else:
            try:
                table = DeltaTable(location, storage_options=self.storage_options or None)
            except TableNotFoundError:
                table = None
            except Exception as exc:  # credentials, network, protocol: Spark may still serve
                raise FastReadUnavailable(
                    f"delta-rs cannot open {location}: {_first_line(exc)}") from exc
        self._tables[name] = table
        return table

    def _query(self, name: str, where: str = "", *, latest_by: str = "", order: str = "at",
               hashes: bool = False, raw: bool = False) -> list[dict[str, Any]]:
        """Rows of one table as PySpark would return them (``where``: a SQL condition;
        ``latest_by``: keep only the newest row per these key columns; ``hashes``: with the
        audit hash columns, which only a verifier needs; ``raw``: timestamps as microseconds
        since the epoch and JSON undecoded, for :meth:`_records`)."""
        table = self._table(name)
        if table is None:
            return []
        from deltalake import QueryBuilder

        fields = [(f.name, str(f.type)) for f in table.schema().fields
                  if hashes or f.name not in _HASH_COLUMNS]
        cols = [f'"{n}"' for n, _ in fields]
        select = ", ".join(f"arrow_cast({c}, 'Int64') AS {c}" if "timestamp" in t.lower() else c
                           for c, (_, t) in zip(cols, fields, strict=True))
        src = f"SELECT {select} FROM t" + (f" WHERE {where}" if where else "")
        if latest_by:
            src = (f"SELECT {', '.join(cols)} FROM (SELECT *, row_number() OVER (PARTITION BY "
                   f"{latest_by} ORDER BY at DESC) AS sg_rn FROM ({src}) AS s) AS r "
                   "WHERE sg_rn = 1")
        sql = f"SELECT * FROM ({src}) AS q ORDER BY {order}"
        try:
            result = QueryBuilder().register("t", table).execute(sql).read_all()
        except Exception as exc:  # an unsupported reader feature surfaces here
            raise FastReadUnavailable(
                f"delta-rs cannot read {self._location(name)}: {_first_line(exc)}") from exc
        columns: dict[str, list[Any]] = {n: list(result.column(n).to_pylist()) for n, _ in fields}
        rows = [dict(zip(columns, values, strict=True)) for values in zip(*columns.values(),
                                                                           strict=True)]
        return rows if raw else self._records(name, rows)

    def _records(self, name: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Raw rows of one table (:meth:`_query` with ``raw``) as PySpark would return them."""
        table = self._table(name)
        stamps = [f.name for f in table.schema().fields if "timestamp" in str(f.type).lower()] \
            if table is not None else []
        for r in rows:
            for n in stamps:
                if n in r:
                    r[n] = _pyspark_datetime(r[n])
        return [decode_row(r, *_JSON_COLUMNS[name]) for r in rows]

    def run_events(self, run_id: str) -> list[dict[str, Any]]:
        """One run's events, oldest first."""
        return self._query("runs", f"run_id = {_sql_str(run_id)}", hashes=True)

    def slice_events(self, run_id: str) -> list[dict[str, Any]]:
        """One run's slice events, oldest first."""
        return self._query("slices", f"run_id = {_sql_str(run_id)}", hashes=True)

    def latest_runs(self, limit: int = 20) -> list[RunProgress]:
        """The ``limit`` most recently started runs, newest first: read newest first where the
        runs table's files carry statistics (:mod:`sparkguard.newest_runs`), else whole."""
        table = self._table("runs")
        if table is None:
            return []
        files = file_stats(_add_actions(table))
        newest = newest_runs(files, int(limit), lambda where: self._query(
            "runs", where, raw=True)) if files else None
        if newest is not None:
            events = self._records("runs", sorted(newest, key=lambda r: r["at"]))
        else:
            events = self._query("runs", (
                "run_id IN (SELECT run_id FROM (SELECT run_id, min(at) AS first_at FROM t "
                f"GROUP BY run_id ORDER BY first_at DESC LIMIT {int(limit)}) AS s)"))
        by_run: dict[str, list[dict[str, Any]]] = {}
        for e in events:
            by_run.setdefault(e["run_id"], []).append(e)
        return sorted((run_progress(ev) for ev in by_run.values()),
                      key=lambda p: p.started_at, reverse=True)

    def lock_holders(self, targets: Sequence[str] | None = None) -> dict[str, LockInfo]:
        """Newest lock event of each target (every target when ``targets`` is None)."""
        rows = self._query("locks", _in("target", targets), order="target", hashes=True)
        return lock_holders(_newest(rows, ("target",), ("generation", "at")))

    def publish_statuses(self, targets: Sequence[str] | None = None
                         ) -> dict[str, PublishStatus]:
        """Publish state of each target (every target ever paused when ``targets`` is None)."""
        aliases = self._catalog_aliases(targets)
        asked = None if targets is None else list(dict.fromkeys(
            [*targets, *(n for t in targets for n in sorted(aliases.get(t, ())))]))
        keys = {t: _path_keys(t) for t in asked or ()}
        where = _in("target", asked)
        table = self._table("publish")
        if asked is not None and table is not None and "location" in {
                f.name for f in table.schema().fields}:
            found = spellings_of(k for ks in keys.values() for k in ks)
            where = " OR ".join([f"({where})", *([f"({_in('location', found)})"] if found else []),
                                 f'"location" IN (SELECT "location" FROM t WHERE ({where}) '
                                 'AND "location" IS NOT NULL)'])
        latest = self._query("publish", where, latest_by='"target", "hold"', order="target")
        out = fold_publish_statuses(latest, asked, keys)
        if targets is None:
            return out
        return {t: _merged(t, [out[t], *(out[n] for n in sorted(aliases.get(t, ())))])
                for t in targets}

    def _catalog_aliases(self, targets: Sequence[str] | None) -> dict[str, set[str]]:
        """Names recorded in the control table that may be the same catalog table as a target
        asked by name: only Spark resolves a name, so names equal but for case and backquotes,
        or one a qualified form of the other (``sales.orders``, ``main.sales.orders``), count
        as one table here. Wider than the catalog may be; a hold is then reported on a table
        it is not on, never the other way."""
        named = {t: p for t in targets or () if (p := _name_parts(t))}
        if not named:
            return {}
        recorded = {r["target"] for r in self._query("publish", latest_by='"target"')
                    } if self._table("publish") is not None else set()
        out: dict[str, set[str]] = {}
        for t, parts in named.items():
            for name in recorded - {t}:
                other = _name_parts(name)
                if other and (other[-len(parts):] == parts or parts[-len(other):] == other):
                    out.setdefault(t, set()).add(name)
        return out

    def rows(self, name: str, column: str | None = None,
             values: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """Every row of one of sparkguard's tables (where ``column`` is one of ``values``)."""
        return self._query(name, _in(column, values) if column else "",
                           order="generation, at" if name == "locks" else "at", hashes=True)

    def table_location(self, name: str) -> str:
        return self._location(name)

    def history(self, dataset: str) -> list[dict[str, Any]] | None:
        """A path table's commits, oldest first (version, timestamp in ms since the epoch,
        operation, operationParameters, userMetadata); None when there is no table there.
        Raises :class:`FastReadUnavailable` for a catalog name (Spark reads it)."""
        if not (dataset.startswith(("/", "./", "../")) or "://" in dataset):
            raise FastReadUnavailable(f"{dataset} is a catalog table; delta-rs reads paths only")
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        scheme = urlsplit(dataset).scheme.lower() if "://" in dataset else ""
        if scheme and scheme != "file" and scheme not in DELTA_RS_SCHEMES:
            raise FastReadUnavailable(f"delta-rs does not open {scheme}: URIs ({dataset})")
        if not scheme and not os.path.isdir(os.path.join(dataset, "_delta_log")):
            if os.path.isdir(dataset) or (self._local and os.path.abspath(dataset).startswith(
                    self._local_base() + os.sep)):
                return None
            # no such directory here: perhaps on the cluster's file system, which Spark reads
            raise FastReadUnavailable(f"no directory {dataset} on this machine")
        try:
            commits = DeltaTable(dataset, storage_options=self.storage_options or None).history()
        except TableNotFoundError:
            return None
        except Exception as exc:
            raise FastReadUnavailable(f"delta-rs cannot read the history of {dataset}: "
                                      f"{_first_line(exc)}") from exc
        return sorted(({k: c.get(k) for k in ("version", "timestamp", "operation",
                                               "operationParameters", "userMetadata")}
                       for c in commits), key=lambda c: c["version"])


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_STATS = ("num_records", "min.at", "max.at", "min.run_id", "max.run_id", "null_count.at")


def _add_actions(table: Any) -> dict[str, list[Any]]:
    """The statistics :func:`sparkguard.newest_runs.file_stats` reads, per data file (``at`` in
    microseconds since the epoch); the columns the table has no statistics for are missing, and
    all of them when delta-rs cannot list them (the table is then read whole)."""
    try:
        actions = table.get_add_actions(flatten=True)
    except Exception:  # statistics only save reads; the whole-table read answers the same
        return {}
    names = set(actions.schema.names)
    out: dict[str, list[Any]] = {}
    for key in _STATS:
        if key in names:
            values = list(actions.column(key).to_pylist())
            if key in ("min.at", "max.at"):
                values = [None if v is None else (v.replace(tzinfo=v.tzinfo or dt.UTC) - _EPOCH)
                          // dt.timedelta(microseconds=1) for v in values]
            out[key] = values
    return out


def _name_parts(target: str) -> tuple[str, ...]:
    """A catalog name's parts, unquoted and in lower case (none for a path)."""
    from sparkguard.sql import TableRef, UnsafeSQLError, table_name_parts

    try:
        ref = TableRef.parse(target)
    except UnsafeSQLError:
        return ()
    if ref.name is None:
        return ()
    try:
        return tuple(p.lower() for p in table_name_parts(ref.name))
    except UnsafeSQLError:
        return ()


def _merged(target: str, statuses: Sequence[PublishStatus]) -> PublishStatus:
    """One target's state from those of the names it may be recorded under."""
    from sparkguard.publish import PublishStatus

    if len(statuses) == 1:
        return statuses[0]
    holds = {(h["target"], h["hold"], h["at"]): h for s in statuses for h in s.holds}
    changes = [s.last_change for s in statuses if s.last_change is not None]
    return PublishStatus(target, bool(holds), tuple(holds[k] for k in sorted(
        holds, key=lambda k: (k[2], k[0], k[1]))), max(changes, default=None))


def _path_keys(target: str) -> set[str]:
    """The location a table at this path has (none for a catalog name: only Spark resolves it;
    a name no sparkguard table can hold matches nothing but itself)."""
    from sparkguard.sql import TableRef, UnsafeSQLError

    try:
        location = TableRef.parse(target).path_location
    except UnsafeSQLError:
        return set()
    return {location} if location else set()


def _in(column: str, values: Sequence[str] | None) -> str:
    if values is None:
        return ""
    if not values:
        return "false"
    return f'"{column}" IN ({", ".join(_sql_str(v) for v in values)})'


def _newest(rows: list[dict[str, Any]], key: tuple[str, ...], order: tuple[str, ...]
            ) -> list[dict[str, Any]]:
    best: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in rows:
        k = tuple(r[c] for c in key)
        if k not in best or tuple(r[c] for c in order) > tuple(best[k][c] for c in order):
            best[k] = r
    return list(best.values())


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}"
