"""Every Delta read, write, promotion, restore and history look-up sparkguard performs.

Callers use the names re-exported here (``delta_ops.restore(...)``), so a test that replaces
one of them on this package (``monkeypatch.setattr(delta_ops, "restore", ...)``) replaces it for
every caller outside the package. Inside it, modules import each other directly:

- ``tables``: existence, the committed log, snapshot and time-travel reads, ``DESCRIBE DETAIL``;
- ``log_tables``: the append-only ledger and control tables (creation, one-commit appends);
- ``commits``: history, versions, sparkguard's commit userMetadata, promotion state;
- ``sessions``: the isolated session for the confs MERGE and RESTORE take commit metadata from;
- ``writes``: shadow slices, promotion (replaceWhere, MERGE), RESTORE, the window revert;
- ``changes``: a window's change set (what ``merge_changed`` promotes);
- ``files``: a snapshot's data files and which are gone (rollback's check);
- ``conflicts``: Delta's concurrency conflicts by exception type, and their bounded retry.
"""

from __future__ import annotations

from sparkguard.delta_ops.changes import window_changes
from sparkguard.delta_ops.commits import (
    DATA_NEUTRAL_OPERATIONS,
    PromotionState,
    commit_metadata,
    commits_since,
    current_version,
    find_commit,
    foreign_commits,
    history,
    listed_commits,
    promoted_since,
    promotion_state,
    restored_to,
    undone_by,
    user_metadata,
)
from sparkguard.delta_ops.conflicts import (
    CONFLICT_TYPES,
    PROTOCOL_REFUSAL_FIX,
    conflict_summary,
    is_conflict,
    post_commit_failed,
    protocol_refusal,
    with_conflict_retry,
)
from sparkguard.delta_ops.files import (
    gone_file,
    missing_files_for_version,
    read_all_files,
    snapshot_files,
)
from sparkguard.delta_ops.log_tables import (
    LOG_TABLE_PROPERTIES,
    append_rows,
    create_log_table,
    literal_frame,
)
from sparkguard.delta_ops.sessions import isolated_session
from sparkguard.delta_ops.tables import (
    WriteChecks,
    delta_log_exists,
    detail,
    location_key,
    lock_key,
    not_delta,
    read_resolved,
    read_table,
    read_version,
    table_exists,
    write_checks,
)
from sparkguard.delta_ops.writes import (
    promote_merge,
    promote_replace_where,
    restore,
    revert_window,
    write_partitions,
)

__all__ = [
    "CONFLICT_TYPES",
    "DATA_NEUTRAL_OPERATIONS",
    "LOG_TABLE_PROPERTIES",
    "PROTOCOL_REFUSAL_FIX",
    "PromotionState",
    "WriteChecks",
    "append_rows",
    "commit_metadata",
    "commits_since",
    "conflict_summary",
    "create_log_table",
    "current_version",
    "delta_log_exists",
    "detail",
    "find_commit",
    "foreign_commits",
    "gone_file",
    "history",
    "is_conflict",
    "isolated_session",
    "listed_commits",
    "literal_frame",
    "location_key",
    "lock_key",
    "missing_files_for_version",
    "not_delta",
    "post_commit_failed",
    "promote_merge",
    "promote_replace_where",
    "promoted_since",
    "promotion_state",
    "protocol_refusal",
    "read_all_files",
    "read_resolved",
    "read_table",
    "read_version",
    "restore",
    "restored_to",
    "revert_window",
    "snapshot_files",
    "table_exists",
    "undone_by",
    "user_metadata",
    "window_changes",
    "with_conflict_retry",
    "write_checks",
    "write_partitions",
]
