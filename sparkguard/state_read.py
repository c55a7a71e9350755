"""Read sparkguard's own tables without a JVM (delta-rs), or with Spark where delta-rs cannot.

The ledger (``<home>/ledger/runs``, ``slices``, ``locks``) and the publish control table
(``<home>/control/publish``) are small Delta tables. Read-only answers about them (``sparkguard
status``, ``report``, ``publish status``, :func:`sparkguard.publish.is_paused`) read them with
the ``deltalake`` package (delta-rs): no JVM, no Spark, about a second cold.

Two readers offer the same methods and return the same plain records (dicts with the tables'
columns, ``details``/``gates`` decoded from JSON, timestamps as naive datetimes converted the
way PySpark converts them), so one pure formatter (:mod:`sparkguard.status_view`) serves both:

- :class:`DeltaRsReader`: local paths and the object stores delta-rs opens (``s3://``,
  ``s3a://``, ``gs://``, ``az://``, ``abfs[s]://``, ``file://``); raises
  :class:`FastReadUnavailable` where it cannot serve (another scheme such as ``dbfs:`` or
  ``hdfs://``, missing credentials, a reader feature delta-rs lacks, ``deltalake`` not installed);
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
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TextIO, TypeVar
from urllib.parse import urlsplit

from sparkguard.errors import SparkguardError
from sparkguard.ledger_model import LockInfo, RunProgress, decode_row, lock_holders, run_progress

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
# URI schemes the deltalake wheels open (object_store); anything else goes to Spark.
DELTA_RS_SCHEMES = frozenset({"file", "s3", "s3a", "gs", "az", "abfs", "abfss", "adl", "azure"})
TABLES = {"runs": "ledger/runs", "slices": "ledger/slices", "locks": "ledger/locks",
          "evidence": "ledger/evidence", "publish": "control/publish"}
_JSON_COLUMNS = {"runs": ("details",), "slices": ("gates",), "locks": (), "evidence": ("leaves",),
                 "publish": ()}
T = TypeVar("T")
_HASH_COLUMNS = ("event_hash", "prev_hash")


class FastReadUnavailable(SparkguardError):
    """Raised when delta-rs cannot read sparkguard's tables at this home (scheme, credentials,
    a reader feature it lacks, or ``deltalake`` not installed); the message says which."""


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


def fold_publish_statuses(latest: Iterable[dict[str, Any]], targets: Sequence[str] | None
                          ) -> dict[str, PublishStatus]:
    """Publish state per target from the newest event of each (target, hold): paused while any
    hold is set; ``last_change`` the newest event of the target. Targets asked for and never
    paused are open."""
    from sparkguard.publish import PublishStatus

    by_target: dict[str, list[dict[str, Any]]] = {}
    for row in latest:
        by_target.setdefault(row["target"], []).append(row)
    out = {t: PublishStatus(t, False, (), None) for t in targets or []}
    for t, rows in by_target.items():
        holds = tuple(sorted((h for h in rows if h["paused"]), key=lambda h: h["at"]))
        out[t] = PublishStatus(t, bool(holds), holds, max(r["at"] for r in rows))
    return out


# -- delta-rs -------------------------------------------------------------------------------


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
        try:
            import deltalake  # noqa: F401
        except ImportError as exc:
            raise FastReadUnavailable(f"the deltalake package is not installed ({exc})") from exc
        self._tables: dict[str, Any] = {}

    @property
    def control_path(self) -> str:
        return f"{self.home}/{TABLES['publish']}"

    def _location(self, name: str) -> str:
        rel = TABLES[name]
        if self._local:
            base = self.home.removeprefix("file://") if self.home.startswith("file://") \
                else self.home
            return os.path.join(os.path.abspath(base), rel)
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
               hashes: bool = False) -> list[dict[str, Any]]:
        """Rows of one table as PySpark would return them (``where``: a SQL condition;
        ``latest_by``: keep only the newest row per these key columns; ``hashes``: with the
        audit hash columns, which only a verifier needs)."""
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
        for n, t in fields:
            if "timestamp" in t.lower():
                columns[n] = [_pyspark_datetime(v) for v in columns[n]]
        rows = [dict(zip(columns, values, strict=True)) for values in zip(*columns.values(),
                                                                           strict=True)]
        return [decode_row(r, *_JSON_COLUMNS[name]) for r in rows]

    def run_events(self, run_id: str) -> list[dict[str, Any]]:
        """One run's events, oldest first."""
        return self._query("runs", f"run_id = {_sql_str(run_id)}", hashes=True)

    def slice_events(self, run_id: str) -> list[dict[str, Any]]:
        """One run's slice events, oldest first."""
        return self._query("slices", f"run_id = {_sql_str(run_id)}", hashes=True)

    def latest_runs(self, limit: int = 20) -> list[RunProgress]:
        """The ``limit`` most recently started runs, newest first."""
        starts = (f"run_id IN (SELECT run_id FROM (SELECT run_id, min(at) AS first_at FROM t "
                  f"GROUP BY run_id ORDER BY first_at DESC LIMIT {int(limit)}) AS s)")
        by_run: dict[str, list[dict[str, Any]]] = {}
        for e in self._query("runs", starts):
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
        latest = self._query("publish", _in("target", targets), latest_by='"target", "hold"',
                             order="target")
        return fold_publish_statuses(latest, targets)

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

        if "://" not in dataset and not os.path.isdir(os.path.join(dataset, "_delta_log")):
            return None
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
