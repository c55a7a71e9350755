"""Independent checks: the target's content against its two acceptable states (before the
backfill, and the clean recomputation from the source), and the ledger against the target's
Delta history."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sparkguard.demo import transform_orders
from tests.lakes import WINDOW, lock_key_of
from tests.system.harness.lakes import COLUMNS, KEY, LABEL, Lake, Row


def _rows(df: DataFrame) -> Counter[Row]:
    """The table as a multiset of rows (test lakes are a few thousand rows)."""
    return Counter(tuple(r) for r in df.select(*COLUMNS).collect())


def _read(spark: SparkSession, path: str) -> DataFrame:
    return spark.read.format("delta").load(path)


@dataclass(frozen=True)
class Expected:
    """The two acceptable contents of the target: before the backfill, and after it."""

    original: Counter[Row]
    clean: Counter[Row]

    def plus(self, extra: Counter[Row]) -> Expected:
        """Both states with rows another writer added (which must survive either way)."""
        return Expected(self.original + extra, self.clean + extra)


def expected_states(spark: SparkSession, lake: Lake) -> Expected:
    """Original target, and the clean result computed independently from the source.

    Clean = the target outside the window, unchanged, plus the demo Python transform of the
    source inside the window (the plan itself uses the SQL transform).
    """
    target = _read(spark, lake.target)
    in_window = F.col("order_date").isin(WINDOW)
    window = transform_orders(spark, _read(spark, lake.source).filter(in_window), list(WINDOW))
    clean = target.filter(~in_window).unionByName(window.select(*COLUMNS))
    return Expected(_rows(target), _rows(clean))


# -- table and ledger checks ------------------------------------------------------------------


def _outside(rows: Counter[Row]) -> Counter[Row]:
    return Counter({r: n for r, n in rows.items() if r[1] not in WINDOW})


@dataclass(frozen=True)
class TableCheck:
    """What the target holds, against the two acceptable states."""

    state: str  # "original" | "clean" | "between"
    rows: int
    duplicate_keys: int
    rows_lost: int  # rows of the nearest acceptable state missing from the table
    rows_lost_outside_window: int
    rows_extra: int  # rows in the table that the nearest acceptable state lacks

    def problems(self, want: str | None = None) -> list[str]:
        out = []
        if self.state == "between" or (want is not None and self.state != want):
            out.append(f"target is {self.state}, expected {want or 'original or clean'} "
                       f"({self.rows_lost} row(s) missing, {self.rows_extra} extra)")
        if self.duplicate_keys:
            out.append(f"{self.duplicate_keys} duplicate {KEY}(s)")
        if self.rows_lost_outside_window:
            out.append(f"{self.rows_lost_outside_window} row(s) lost outside the window")
        return out


def check_table(spark: SparkSession, lake: Lake, exp: Expected) -> TableCheck:
    """Read the target and place it against ``exp``."""
    rows = _rows(_read(spark, lake.target))
    keys = Counter(r[0] for r in rows.elements())
    dups = sum(1 for n in keys.values() if n > 1)
    if rows == exp.original:
        state = "original"
    elif rows == exp.clean:
        state = "clean"
    else:
        state = "between"
    near = min((exp.original, exp.clean), key=lambda s: sum(((s - rows) + (rows - s)).values()))
    return TableCheck(state=state, rows=sum(rows.values()), duplicate_keys=dups,
                      rows_lost=sum((near - rows).values()),
                      rows_lost_outside_window=sum((_outside(exp.original) - _outside(rows))
                                                   .values()),
                      rows_extra=sum((rows - near).values()))


@dataclass(frozen=True)
class LedgerCheck:
    """sparkguard's own record of the runs, and the target history it must agree with."""

    run_states: dict[str, str]  # run id -> newest state
    promote_commits: list[tuple[int, str]]  # (version, run id) of every promote commit
    ledger_promoted: dict[str, int]  # run id -> promoted version the ledger recorded
    locks_held: int  # targets whose lock is still held
    paused: bool

    def done_runs(self) -> list[str]:
        return [r for r, s in self.run_states.items() if s == "done"]

    def problems(self, resumed_run: str | None = None) -> list[str]:
        """After a successful finish: one done run, one promote commit, ledger = history."""
        out = []
        done = self.done_runs()
        if len(done) != 1:
            out.append(f"{len(done)} run(s) reached done (states {self.run_states})")
        open_runs = {r: s for r, s in self.run_states.items() if s not in _FINISHED}
        if open_runs:
            out.append(f"runs left unfinished in the ledger: {open_runs}")
        if resumed_run is not None and done and done[0] != resumed_run:
            out.append(f"the re-run started run {done[0]} instead of resuming {resumed_run}")
        if len(self.promote_commits) != 1:
            out.append(f"{len(self.promote_commits)} promote commit(s) in the target history: "
                       f"{self.promote_commits}")
        elif done:
            version, run = self.promote_commits[0]
            if run != done[0]:
                out.append(f"promote commit v{version} belongs to run {run}, not {done[0]}")
            if self.ledger_promoted.get(done[0]) != version:
                out.append(f"ledger says promoted version {self.ledger_promoted.get(done[0])}, "
                           f"history says {version}")
        if self.locks_held:
            out.append(f"{self.locks_held} lock(s) still held")
        if self.paused:
            out.append("publish still paused after a successful run")
        return out


_FINISHED = {"done", "gate_failed", "dry_run_passed", "rolled_back", "restored_after_failure"}


def _history(spark: SparkSession, path: str) -> list[tuple[int, dict[str, Any]]]:
    """(version, sparkguard userMetadata or {}) for every commit of a table."""
    from delta.tables import DeltaTable

    out = []
    for h in DeltaTable.forPath(spark, path).history().select("version", "userMetadata").collect():
        meta: dict[str, Any] = {}
        if h["userMetadata"]:
            try:
                meta = json.loads(h["userMetadata"]).get("sparkguard") or {}
            except ValueError:
                meta = {}
        out.append((int(h["version"]), meta))
    return sorted(out, key=lambda vm: vm[0])


def _delta_rows(spark: SparkSession, path: str) -> list[dict[str, Any]]:
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, path):
        return []
    return [r.asDict() for r in _read(spark, path).collect()]


def check_ledger(spark: SparkSession, lake: Lake) -> LedgerCheck:
    """Read the ledger's run events and the target history directly; locks and publish state
    through their one-call APIs (what an operator or a downstream job would ask)."""
    from sparkguard.ledger import Ledger
    from sparkguard.publish import PublishControl

    events = sorted(_delta_rows(spark, f"{lake.home}/ledger/runs"), key=lambda e: e["at"])
    states: dict[str, str] = {}
    promoted: dict[str, int] = {}
    for e in events:
        states[e["run_id"]] = e["state"]
        if e["state"] != "promoted":
            continue
        details = json.loads(e.get("details") or "{}")
        if LABEL in (details.get("promoted_versions") or {}):
            promoted[e["run_id"]] = int(details["promoted_versions"][LABEL])
        elif e.get("target_version_written") is not None:
            promoted[e["run_id"]] = int(e["target_version_written"])
    commits = [(v, m.get("run_id", "")) for v, m in _history(spark, lake.target)
               if m.get("action") == "promote"]
    locks = int(Ledger(spark, lake.home).lock_holder(lock_key_of(spark, lake.target)) is not None)
    paused = PublishControl(spark, lake.home).is_paused(lake.target)
    return LedgerCheck(states, commits, promoted, locks, paused)
