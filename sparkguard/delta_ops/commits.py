"""A table's commit history: versions, sparkguard's commit userMetadata, and what the commits
after a rollback point say about one run's promotion."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sparkguard.sql import TableRef, describe_history_statement

__all__ = ["DATA_NEUTRAL_OPERATIONS", "PromotionState", "commit_metadata", "commits_since",
           "current_version", "find_commit", "foreign_commits", "history", "listed_commits",
           "promoted_since", "promotion_state", "restored_to", "undone_by", "user_metadata"]


def history(spark: SparkSession, ref: TableRef, limit: int | None = None) -> DataFrame:
    """The table's commits, newest first (``DESCRIBE HISTORY``; what ``DeltaTable.history``
    runs, and also available over Spark Connect without Delta's server plugin)."""
    return spark.sql(describe_history_statement(ref, limit))


def current_version(spark: SparkSession, ref: TableRef) -> int:
    """Latest committed version of a Delta table."""
    row = history(spark, ref, 1).select("version").first()
    assert row is not None
    return int(row["version"])


def restored_to(spark: SparkSession, ref: TableRef, version: int, newest: int) -> int | None:
    """The version the RESTORE committed as ``version`` restored (its operation parameters);
    None when that commit is not a RESTORE to a version. ``newest``: the table's version now
    (the history is read back to ``version`` only)."""
    row = (history(spark, ref, newest - version + 1).filter(F.col("version") == version)
           .select("operation", "operationParameters").first())
    if row is None or row["operation"] != "RESTORE":
        return None
    to = (row["operationParameters"] or {}).get("version")
    return int(to) if to is not None and str(to).isdigit() else None


def user_metadata(run_id: str, fingerprint: str, action: str, **extra: Any) -> str:
    """The commit userMetadata sparkguard writes: JSON with run id, plan fingerprint, action."""
    return json.dumps({"sparkguard": {"run_id": run_id, "plan_fingerprint": fingerprint,
                                      "action": action, **extra}}, sort_keys=True)


def commit_metadata(raw: str | None) -> dict[str, Any] | None:
    """Parse a commit's userMetadata back; None when it is not sparkguard's."""
    if not raw:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    inner = data.get("sparkguard") if isinstance(data, dict) else None
    return inner if isinstance(inner, dict) else None


def commits_since(spark: SparkSession, ref: TableRef, version: int,
                  page: int = 1000) -> list[dict[str, Any]]:
    """Every commit after ``version``, newest first: version, timestamp, operation,
    userMetadata. One ``DESCRIBE HISTORY`` of ``page`` rows; when more commits than that landed
    since ``version`` (a busy target), a second one of exactly as many rows as landed."""
    rows = _history_from(spark, ref, version, page)
    if len(rows) == page and int(rows[-1]["version"]) > version:
        rows = _history_from(spark, ref, version, int(rows[0]["version"]) - version + 1)
    return [r for r in rows if int(r["version"]) > version]


def _history_from(spark: SparkSession, ref: TableRef, version: int,
                  limit: int) -> list[dict[str, Any]]:
    """Of the newest ``limit`` commits, those from ``version`` on (one small row each), newest
    first."""
    rows = (history(spark, ref, limit).filter(F.col("version") >= version)
            .select("version", "timestamp", "operation", "userMetadata")
            .orderBy(F.col("version").desc()).collect())
    return [r.asDict() for r in rows]


def find_commit(spark: SparkSession, ref: TableRef, run_id: str, action: str,
                after_version: int) -> int | None:
    """Version of this run's newest commit of ``action`` after ``after_version``, if any."""
    for c in commits_since(spark, ref, after_version):
        meta = commit_metadata(c.get("userMetadata"))
        if meta and meta.get("run_id") == run_id and meta.get("action") == action:
            return int(c["version"])
    return None


def undone_by(spark: SparkSession, ref: TableRef, run_id: str, seen: int,
              restored: int | None) -> list[dict[str, Any]]:
    """Other writers' data commits between ``seen`` (the newest version a check read) and
    ``restored`` (this run's RESTORE commit): that RESTORE undid them."""
    if restored is None or restored - 1 <= seen:
        return []
    return [c for c in foreign_commits(commits_since(spark, ref, seen), run_id, data_only=True)
            if int(c["version"]) < restored]


def listed_commits(commits: Sequence[dict[str, Any]], times: bool = False) -> str:
    """The first 10 of ``commits`` for a message: ``v12 WRITE, v13 MERGE``; with ``times``,
    ``v12 WRITE at <timestamp>; ...``."""
    if times:
        return "; ".join(f"v{c['version']} {c['operation']} at {c['timestamp']}"
                         for c in commits[:10])
    return ", ".join(f"v{c['version']} {c['operation']}" for c in commits[:10])


# Commits that change no row: a RESTORE over them loses nothing of their writer's.
DATA_NEUTRAL_OPERATIONS = frozenset({"VACUUM START", "VACUUM END", "OPTIMIZE"})


def foreign_commits(commits: Sequence[dict[str, Any]], run_id: str,
                    data_only: bool = False) -> list[dict[str, Any]]:
    """The commits (from :func:`commits_since`) not written by ``run_id``; with ``data_only``,
    without those that change no row (VACUUM, OPTIMIZE)."""
    out = []
    for c in commits:
        meta = commit_metadata(c.get("userMetadata"))
        if meta and meta.get("run_id") == run_id:
            continue
        if data_only and c.get("operation") in DATA_NEUTRAL_OPERATIONS:
            continue
        out.append(c)
    return out


@dataclass(frozen=True)
class PromotionState:
    """What a target's history says about one run's promotion of one target."""

    promoted_version: int | None  # the run's promote commit, unless a later restore undid it
    undone: int  # how many times the run restored this target after promoting it
    foreign: tuple[dict[str, Any], ...]  # commits by others after the run's newest commit
    promotes: int = 0  # the run's promote commits of this target in the commits folded

    @property
    def next_txn_version(self) -> int:
        """txnVersion for the next promotion attempt: the one of the promotion in place (a
        repeat is a no-op), else one past every promote commit of the run (Delta skips a
        txnVersion it has seen, so the fold must start before the run's first promotion)."""
        return self.promotes + (0 if self.promoted_version is not None else 1)


def promotion_state(commits: Sequence[dict[str, Any]], run_id: str, label: str) -> PromotionState:
    """Fold the commits after the rollback point (newest first) for one run and target."""
    promoted: int | None = None
    undone = promotes = 0
    foreign: list[dict[str, Any]] = []
    for c in sorted(commits, key=lambda c: int(c["version"])):
        meta = commit_metadata(c.get("userMetadata"))
        own = bool(meta and meta.get("run_id") == run_id and meta.get("target", label) == label)
        if not own:
            foreign.append(c)
            continue
        assert meta is not None
        foreign = []
        if meta.get("action") == "promote":
            promoted = int(c["version"])
            promotes += 1
        elif meta.get("action") in ("restore", "rollback") and promoted is not None:
            promoted = None
            undone += 1
    return PromotionState(promoted, undone, tuple(foreign), promotes)


def promoted_since(spark: SparkSession, ref: TableRef, version: int, run_id: str,
                   label: str) -> int | None:
    """The version of ``run_id``'s promotion of ``label`` in the commits after ``version``,
    unless a later restore of the run undid it."""
    return promotion_state(commits_since(spark, ref, version), run_id, label).promoted_version
