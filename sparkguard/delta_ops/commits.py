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
           "current_version", "find_commit", "foreign_commits", "history", "promotion_state",
           "user_metadata"]


def history(spark: SparkSession, ref: TableRef, limit: int | None = None) -> DataFrame:
    """The table's commits, newest first (``DESCRIBE HISTORY``; what ``DeltaTable.history``
    runs, and also available over Spark Connect without Delta's server plugin)."""
    return spark.sql(describe_history_statement(ref, limit))


def current_version(spark: SparkSession, ref: TableRef) -> int:
    """Latest committed version of a Delta table."""
    row = history(spark, ref, 1).select("version").first()
    assert row is not None
    return int(row["version"])


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
                  limit: int = 1000) -> list[dict[str, Any]]:
    """Commits after ``version`` (newest first, bounded): version, operation, userMetadata."""
    rows = (history(spark, ref, limit).filter(F.col("version") > version)
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

    @property
    def next_txn_version(self) -> int:
        """txnVersion for the next promotion attempt (a repeat of the same one is a no-op)."""
        return self.undone + 1


def promotion_state(commits: Sequence[dict[str, Any]], run_id: str, label: str) -> PromotionState:
    """Fold the commits after the rollback point (newest first) for one run and target."""
    promoted: int | None = None
    undone = 0
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
        elif meta.get("action") in ("restore", "rollback") and promoted is not None:
            promoted = None
            undone += 1
    return PromotionState(promoted, undone, tuple(foreign))
