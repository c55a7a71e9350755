"""The ledger's Delta tables under ``<home>/ledger``: creation, appends, bounded reads, and the
audit chains that every appended event continues.

:class:`LedgerTables` is the plumbing that :class:`sparkguard.ledger.Ledger` (run and slice
events) and :class:`sparkguard.ledger_locks.TargetLocks` (lock events) both write through.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sparkguard.delta_ops import append_rows, create_log_table, delta_log_exists
from sparkguard.errors import SparkguardError
from sparkguard.ledger_model import chained_hash, decode_row
from sparkguard.ledger_schema import MAX_ROWS, SCHEMAS, WRITE_SCHEMAS
from sparkguard.sql import TableRef

__all__ = ["LedgerTables"]

_known_tables: set[str] = set()


class LedgerTables:
    """Run, slice, lock and evidence tables under ``<home>/ledger``."""

    def __init__(self, spark: SparkSession, home: str) -> None:
        self.spark = spark
        self.home = home.rstrip("/")
        self.refs = {n: TableRef(path=f"{self.home}/ledger/{n}") for n in WRITE_SCHEMAS}
        self._empty: set[str] = set()  # tables created empty by this instance, not yet written
        self._batch: dict[str, list[tuple[Any, ...]]] | None = None  # see batched()
        # audit chain heads known in memory: (table, run id or target) -> newest event hash
        self._heads: dict[tuple[str, str], str | None] = {}

    @property
    def runs_ref(self) -> TableRef:
        return self.refs["runs"]

    @property
    def slices_ref(self) -> TableRef:
        return self.refs["slices"]

    @property
    def locks_ref(self) -> TableRef:
        return self.refs["locks"]

    def _path(self, name: str) -> str:
        path = self.refs[name].path
        assert path is not None
        return path

    # -- plumbing -------------------------------------------------------------------------

    def _exists(self, name: str) -> bool:
        path = self._path(name)
        if path in _known_tables:
            return True
        if delta_log_exists(self.spark, path):
            _known_tables.add(path)
            return True
        return False

    def ensure(self) -> None:
        """Create the ledger tables that do not exist yet (a file-system check when they do).

        A table this call created is known to be empty, so reading it is skipped.
        """
        for name in SCHEMAS:
            if not self._exists(name):
                if create_log_table(self.spark, self._path(name), WRITE_SCHEMAS[name]):
                    self._empty.add(name)
                _known_tables.add(self._path(name))

    def _append(self, name: str, rows: list[tuple[Any, ...]],
                txn: tuple[str, int] | None = None, metadata: str | None = None) -> None:
        width = len(WRITE_SCHEMAS[name].fields)  # rows without their hashes: unchained
        rows = [(*r, *(None,) * (width - len(r))) for r in rows]
        if self._batch is not None and txn is None:
            self._batch.setdefault(name, []).extend(rows)
            return
        if not self._exists(name):
            if name in SCHEMAS:
                self.ensure()
            else:
                create_log_table(self.spark, self._path(name), WRITE_SCHEMAS[name])
                _known_tables.add(self._path(name))
        append_rows(self.spark, self._path(name), WRITE_SCHEMAS[name], rows, txn, metadata,
                    merge_schema=True)
        self._empty.discard(name)

    @contextmanager
    def batched(self) -> Iterator[None]:
        """Buffer the run and slice events recorded inside the block and append them in one
        commit per table when it ends (imports of history, benchmarks). Lock events are never
        buffered: each is its own commit with its transaction id."""
        if self._batch is not None:
            yield
            return
        self._batch = {}
        try:
            yield
            batch, self._batch = self._batch, None
            for name, rows in batch.items():
                if rows:
                    self._append(name, rows)
        finally:
            self._batch = None

    def _read(self, name: str) -> DataFrame | None:
        if name in self._empty or not self._exists(name):
            return None
        return self.spark.read.format("delta").load(self._path(name))

    def _collect(self, df: DataFrame | None, *json_fields: str, order: str = "at"
                 ) -> list[dict[str, Any]]:
        """Rows of a result bounded by construction, sorted by ``order`` on the driver.

        Never truncates: a result above ``MAX_ROWS`` rows raises instead of dropping rows.
        """
        if df is None:
            return []
        rows = df.limit(MAX_ROWS + 1).collect()
        if len(rows) > MAX_ROWS:
            raise SparkguardError(
                f"a ledger read under {self.home} returned more than {MAX_ROWS} rows; it "
                "should return the latest state per key only (a bug: report it)")
        out = [decode_row(r.asDict(), *json_fields) for r in rows]
        return sorted(out, key=lambda r: r[order])

    @staticmethod
    def _latest(df: DataFrame, keys: Sequence[str], *order: str) -> DataFrame:
        """The newest row per ``keys`` (the greatest ``order`` values), computed in Spark by one
        aggregation (partial aggregates before the shuffle: no sort of the whole table)."""
        cols = df.columns
        newest = F.max_by(F.struct(*[F.col(c) for c in cols]), F.struct(*[F.col(c) for c in order]))
        return df.groupBy(*keys).agg(newest.alias("_row")).select(
            *[F.col("_row")[c].alias(c) for c in cols])

    # -- audit chains -----------------------------------------------------------------------

    def _chained(self, name: str, key: str, row: tuple[Any, ...],
                 prev: str | None = None, *, known: bool = False) -> tuple[Any, ...]:
        """``row`` with its ``event_hash`` and ``prev_hash``, continuing chain ``(name, key)``
        (``known``: ``prev`` is the head, else the head in memory or read once)."""
        if not known:
            prev = self._head(name, key)
        names = [f.name for f in WRITE_SCHEMAS[name].fields][:len(row)]
        h = chained_hash(name, dict(zip(names, row, strict=True)), prev, raw_json=True)
        self._heads[(name, key)] = h
        return (*row, h, prev)

    def _head(self, name: str, run_id: str) -> str | None:
        """The newest event hash of a run's chain in table ``name``: from memory, else one
        bounded read (the run's newest row; a run seen by load/run_events is in memory)."""
        if (name, run_id) in self._heads:
            return self._heads[(name, run_id)]
        df = self._read(name)
        head = None
        if df is not None and "event_hash" in df.columns:
            row = (df.filter(F.col("run_id") == run_id)
                   .agg(F.max_by("event_hash", "at").alias("h")).first())
            head = row["h"] if row is not None else None
        self._heads[(name, run_id)] = head
        return head

    def _seed(self, name: str, events: Sequence[dict[str, Any]]) -> None:
        """Remember the chain heads of runs whose events were just read (oldest first)."""
        newest: dict[str, str | None] = {}
        for e in events:
            newest[e["run_id"]] = e.get("event_hash") or newest.get(e["run_id"])
        for run_id, h in newest.items():
            self._heads.setdefault((name, run_id), h)

    def chain_heads(self, run_id: str, targets: Sequence[str]) -> dict[str, Any]:
        """The heads of a run's chains as this instance wrote them (for its evidence)."""
        return {"runs": self._heads.get(("runs", run_id)),
                "slices": self._heads.get(("slices", run_id)),
                "locks": {t: self._heads.get(("locks", t)) for t in sorted(set(targets))}}
