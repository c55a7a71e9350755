"""The audit section of a run's evidence and the checks ``sparkguard verify`` makes (pure).

Writing: :func:`attach_audit` adds ``audit`` to an evidence document: the heads of the run's
ledger chains, the Delta commits the run made, the content hash over the document (its own
``content_hash`` and ``seal`` aside) and, with ``SPARKGUARD_AUDIT_KEY`` set, an HMAC seal of
heads and content hash. Checking: one function per kind of record, each returning
:class:`sparkguard.audit.Finding` lines. What each check can and cannot prove is in
``docs/audit.md``. Nothing here imports Spark; the readers are in :mod:`sparkguard.verify`.
"""

from __future__ import annotations

import copy
import datetime as dt
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from sparkguard import audit
from sparkguard.audit import Finding
from sparkguard.doc_io import dump_yaml
from sparkguard.ledger_model import CHAIN_ORDER, audit_body, instant

__all__ = [
    "EVIDENCE_HASH_FIELDS",
    "attach_audit",
    "audit_key",
    "check_chain",
    "check_commits",
    "check_evidence",
    "check_ledger_history",
    "commit_record",
    "evidence_digest",
    "evidence_record",
    "seal_digest",
]

EVIDENCE_HASH_FIELDS = ("content_hash", "seal")
# What an append-only log table's history may hold: appends, its creation, schema evolution of an
# append, auto compaction. Anything else rewrote or removed rows.
_LOG_OPERATIONS = frozenset({"WRITE", "CREATE TABLE", "CREATE OR REPLACE TABLE", "OPTIMIZE",
                             "STREAMING UPDATE", "VACUUM START", "VACUUM END"})
_REWRITES = frozenset({"UPDATE", "DELETE", "MERGE", "RESTORE", "TRUNCATE", "REPLACE TABLE",
                       "CREATE OR REPLACE TABLE AS SELECT", "REPLACE TABLE AS SELECT"})


def audit_key(environ: Mapping[str, str] | None = None) -> bytes | None:
    """The HMAC key from ``SPARKGUARD_AUDIT_KEY`` (UTF-8), or None when unset or empty."""
    value = (environ if environ is not None else os.environ).get(audit.AUDIT_KEY_ENV, "")
    return value.encode("utf-8") if value else None


def _roundtrip(data: Mapping[str, Any]) -> Any:
    """The document as a reader of its YAML gets it (what the verifier will hash)."""
    return yaml.safe_load(dump_yaml(dict(data)))


def evidence_digest(data: Mapping[str, Any]) -> tuple[dict[str, str], str]:
    """Leaf hashes and content hash of an evidence document, ``audit.content_hash`` and
    ``audit.seal`` aside."""
    doc = copy.deepcopy(dict(data))
    section = doc.get("audit")
    if isinstance(section, dict):
        for k in EVIDENCE_HASH_FIELDS:
            section.pop(k, None)
    leaves = audit.leaf_hashes(doc)
    return leaves, audit.content_hash(leaves)


def seal_digest(chains: Any, content: str) -> str:
    """What the seal signs: the chain heads and the content hash."""
    text = audit.canonical({"chains": chains, "content_hash": content})
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def commit_record(table: str, commit: Mapping[str, Any]) -> dict[str, Any]:
    """One Delta commit as the evidence records it (``timestamp`` in ms since the epoch in the
    commit, recorded as UTC ISO text)."""
    return {"table": table, "version": int(commit["version"]),
            "timestamp": _iso_ms(commit.get("timestamp")),
            "operation": commit.get("operation"), "userMetadata": commit.get("userMetadata")}


# Spark's DESCRIBE HISTORY dates a commit by its log file's modification time, delta-rs by the
# time in the commit: the two differ by the few milliseconds the write took.
_TIMESTAMP_SLACK_MS = 5000


def _same_instant(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a == b
    try:
        ta, tb = (dt.datetime.fromisoformat(str(x).replace("Z", "+00:00")) for x in (a, b))
    except ValueError:
        return False
    return abs((ta - tb).total_seconds()) * 1000 <= _TIMESTAMP_SLACK_MS


def _iso_ms(ms: Any) -> str | None:
    if ms is None:
        return None
    return (dt.datetime.fromtimestamp(int(ms) / 1000, dt.UTC)
            .isoformat(timespec="milliseconds").replace("+00:00", "Z"))


def attach_audit(data: dict[str, Any], *, home: str, chains: Mapping[str, Any],
                 commits: Sequence[Mapping[str, Any]], key: bytes | None,
                 commits_error: str | None = None
                 ) -> tuple[dict[str, Any], dict[str, str], str, str | None]:
    """The evidence with its ``audit`` section; also its leaf hashes, content hash and seal
    (for the ledger's evidence record)."""
    data["audit"] = {"ledger_home": home, "chains": dict(chains), "commits": list(commits),
                     "content_hash": None, "seal": None}
    if commits_error:
        data["audit"]["commits_error"] = commits_error
    leaves, root = evidence_digest(_roundtrip(data))
    sealed = audit.seal(key, seal_digest(data["audit"]["chains"], root)) if key else None
    data["audit"]["content_hash"] = root
    data["audit"]["seal"] = sealed
    return data, leaves, root, sealed


# -- checks -------------------------------------------------------------------------------------


def evidence_record(where: str, data: Mapping[str, Any], records: Sequence[Mapping[str, Any]]
                    ) -> tuple[Mapping[str, Any] | None, list[Finding]]:
    """The ledger record (``records``: the run's, oldest first) to check one evidence document
    against: the newest, or an earlier one whose content hash the document matches exactly (a
    genuine copy taken before a rollback rewrote the evidence), reported as superseded."""
    if not records:
        return None, []
    newest = records[-1]
    if not isinstance(data.get("audit"), dict):
        return newest, []
    root = evidence_digest(data)[1]
    if root == newest.get("content_hash"):
        return newest, []
    for older in reversed(records[:-1]):
        if older.get("content_hash") == root:
            if _same_file(where, newest.get("path")):
                return older, [Finding(
                    "evidence_reverted", where,
                    f"the run's evidence file holds an earlier copy (the ledger's evidence "
                    f"record of {_utc(older.get('at'))}); the evidence was rewritten since "
                    f"(newest record {_utc(newest.get('at'))}, by a rollback) and this copy put "
                    "back in its place: the file no longer states the run's outcome")]
            return older, [Finding(
                "evidence_superseded", where,
                f"a genuine earlier copy: it matches the ledger's evidence record of "
                f"{_utc(older.get('at'))}; the run's evidence was rewritten since (newest record "
                f"{_utc(newest.get('at'))}, by a rollback): verify the current file for the "
                "run's outcome", "info")]
    return newest, []


def _same_file(a: str, b: Any) -> bool:
    """Whether two evidence paths name one file (as written, or on this machine's disk)."""
    if not isinstance(b, str) or not b:
        return False
    if a == b:
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.normpath(os.path.abspath(a)) == os.path.normpath(os.path.abspath(b))


def _utc(at: Any) -> str:
    """A ledger instant (naive values are local time, as PySpark reads them) in UTC."""
    if isinstance(at, dt.datetime):
        return instant(at).isoformat(timespec="seconds")
    return str(at)


def check_evidence(where: str, data: Mapping[str, Any], record: Mapping[str, Any] | None,
                   key: bytes | None) -> list[Finding]:
    """Findings for one evidence document against its ledger record (the newest row of the
    ledger's evidence table for its run; None when there is none) and the seal."""
    section = data.get("audit")
    if not isinstance(section, dict) and record is not None and record.get("content_hash"):
        # the ledger recorded an audited file: its audit section was removed afterwards
        removed = [Finding("evidence_edited", where, "the audit section was removed; the ledger "
                                                     "recorded this evidence with content hash "
                                                     f"{str(record['content_hash'])[:12]}...")]
        if isinstance(record.get("leaves"), dict) and record["leaves"]:
            before = {p: h for p, h in record["leaves"].items() if not p.startswith("audit.")}
            now = {p: h for p, h in evidence_digest(data)[0].items()
                   if not p.startswith("audit")}
            removed += [Finding("evidence_edited", where, n)
                        for n in audit.leaf_differences(before, now)]
        return removed
    if not isinstance(section, dict):
        return [Finding("unaudited", where, "written before audit hashing (no audit section); "
                                            "its content cannot be verified", "info")]
    leaves, root = evidence_digest(data)
    found: list[Finding] = []
    claimed = section.get("content_hash")
    recorded = record.get("content_hash") if record else None
    if root != claimed or (recorded is not None and root != recorded):
        names: list[str] = []
        if record and isinstance(record.get("leaves"), dict) and record["leaves"]:
            names = audit.leaf_differences(record["leaves"], leaves)
        if names:
            found += [Finding("evidence_edited", where, n) for n in names]
        else:
            found.append(Finding("evidence_edited", where,
                                 "content does not match its content hash"))
        if recorded is not None and claimed != recorded:
            found.append(Finding("evidence_edited", where, "audit.content_hash differs from the "
                                                           "one the ledger recorded"))
    if record is None:
        found.append(Finding("evidence_unrecorded", where, "the ledger holds no record of this "
                                                           "evidence; checked its own hash only",
                             "info"))
    claimed_seal = section.get("seal")
    if key is None:
        if claimed_seal:
            found.append(Finding("seal_unchecked", where, f"sealed; set {audit.AUDIT_KEY_ENV} "
                                                          "to check the seal", "info"))
    elif claimed_seal or (record and record.get("seal")):
        if not audit.seal_matches(key, seal_digest(section.get("chains"), str(claimed)),
                                  claimed_seal):
            found.append(Finding("seal_mismatch", where, "the seal does not match the chain "
                                                         "heads and content hash under this key "
                                                         "(forged, edited or another key)"))
        elif record and record.get("seal") not in (None, claimed_seal):
            found.append(Finding("seal_mismatch", where, "the seal differs from the one the "
                                                         "ledger recorded"))
    else:
        found.append(Finding("unsealed", where, "written without an audit key; no seal to check",
                             "info"))
    return found


def check_chain(table: str, name: str, events: Sequence[Mapping[str, Any]],
                recorded_heads: Sequence[str] = ()) -> list[Finding]:
    """Findings for one chain (a run's events in ``table``, or a target's lock events) as read
    back: edited, deleted, inserted, reordered events, and heads recorded in evidence that the
    chain no longer holds."""
    bodies = [{**audit_body(table, dict(e)), "event_hash": e.get("event_hash"),
               "prev_hash": e.get("prev_hash")} for e in events]
    found = audit.verify_chain(table, name, bodies, CHAIN_ORDER[table])
    hashes = {e.get("event_hash") for e in events}
    for head in recorded_heads:
        if head and head not in hashes:
            found.append(Finding("head_missing", f"{table}[{name}]",
                                 f"the evidence recorded head {head[:12]}..., which the ledger "
                                 "no longer holds (events deleted, rewritten or restored)"))
    return found


def check_ledger_history(table: str, history: Sequence[Mapping[str, Any]] | None
                         ) -> list[Finding]:
    """Commits on an append-only ledger table that rewrote or removed rows (tampering) or that
    sparkguard does not make (information)."""
    found: list[Finding] = []
    first = min((int(c["version"]) for c in history or [] if c.get("version") is not None),
                default=0)
    if first > 0:  # the log's cleanup (delta.logRetentionDuration) removed the commits before
        found.append(Finding(
            "history_truncated", f"{'control' if table == 'publish' else 'ledger'}/{table}",
            f"the table's history starts at version {first}: the commits before it are gone "
            "from its log (log retention), so a rewrite among them cannot be seen here; "
            "the chains still are", "info"))
    for c in history or []:
        op = str(c.get("operation") or "")
        params = c.get("operationParameters") or {}
        mode = str(params.get("mode") or "").strip('"').lower()
        where = f"{'control' if table == 'publish' else 'ledger'}/{table}@v{c.get('version')}"
        said = json.dumps(params).lower()
        if op in _REWRITES or (op == "WRITE" and mode not in ("", "append", "errorifexists")):
            found.append(Finding("ledger_rewritten", where, f"{op}"
                                 + (f" ({mode})" if op == "WRITE" else "")
                                 + " on an append-only ledger table"))
        elif op.startswith("CREATE") and int(c.get("version") or 0) > 0:
            found.append(Finding("ledger_rewritten", where, f"{op} over the existing table: its "
                                 "rows before this version are gone from the current one"))
        elif "appendonly" in said and (op == "UNSET TBLPROPERTIES" or (
                op == "SET TBLPROPERTIES" and "false" in said)):
            found.append(Finding("ledger_rewritten", where, "append-only protection switched off"))
        elif op not in _LOG_OPERATIONS:
            found.append(Finding("ledger_commit", where, f"{op}: not a commit sparkguard makes",
                                 "info"))
    return found


def check_commits(dataset: str, recorded: Sequence[Mapping[str, Any]],
                  history: Sequence[Mapping[str, Any]] | None,
                  baseline: int | None) -> list[Finding]:
    """Recorded commits of one table against its history; commits after the last recorded one
    (or after ``baseline``, the version the run read) are reported as information."""
    if history is None:
        return [Finding("commit_missing", dataset, "the table no longer exists")] if recorded \
            else []
    by_version = {int(c["version"]): c for c in history}
    found: list[Finding] = []
    for rec in recorded:
        v = int(rec["version"])
        have = by_version.get(v)
        if have is None:
            found.append(Finding("commit_missing", f"{dataset}@v{v}",
                                 f"recorded {rec.get('operation')} is not in the table's history"))
            continue
        now = commit_record(dataset, have)
        diffs = [k for k in ("operation", "userMetadata") if now[k] != rec.get(k)]
        if not _same_instant(now["timestamp"], rec.get("timestamp")):
            diffs.append("timestamp")
        if diffs:
            found.append(Finding("commit_different", f"{dataset}@v{v}",
                                 "; ".join(f"{k}: recorded {rec.get(k)!r}, history {now[k]!r}"
                                           for k in diffs)))
    last = max([int(r["version"]) for r in recorded] + ([baseline] if baseline is not None
                                                          else []), default=None)
    if last is not None:
        for v in sorted(x for x in by_version if x > last):
            c = by_version[v]
            found.append(Finding("later_commit", f"{dataset}@v{v}",
                                 f"{c.get('operation')} after this run, not recorded by it",
                                 "info"))
    return found
