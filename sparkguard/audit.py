"""Tamper evidence (pure): hash chains over ledger events, leaf hashes and an optional HMAC seal
over evidence, and the findings a verifier reports.

* Every ledger event carries ``event_hash``, the sha256 of its canonical content and of the
  hash of the event before it in its chain (``prev_hash``); a chain is the events of one run (or,
  for lock and publish events, of one target) in the order they were written.
* Evidence carries the sha256 of its canonical content (a root over one hash per leaf value,
  so a verifier holding the recorded leaf hashes can name the edited field) and, with
  ``SPARKGUARD_AUDIT_KEY`` set, an HMAC-SHA256 seal of that root.

What each mode proves is in ``docs/audit.md``. Nothing here imports Spark.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

__all__ = [
    "AUDIT_KEY_ENV",
    "HASH_FIELDS",
    "Finding",
    "canonical",
    "chain",
    "content_hash",
    "event_hash",
    "leaf_differences",
    "leaf_hashes",
    "seal",
    "seal_matches",
    "verify_chain",
]

AUDIT_KEY_ENV = "SPARKGUARD_AUDIT_KEY"
HASH_FIELDS = ("event_hash", "prev_hash")
GENESIS = None  # the prev_hash of a chain's first event


def _plain(value: Any) -> Any:
    """A value as canonical JSON data: instants in UTC to the microsecond, decimals and
    non-finite floats as strings, mappings with string keys."""
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.UTC).replace(tzinfo=None)
        return value.isoformat(timespec="microseconds")
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def canonical(value: Any) -> str:
    """Canonical JSON: sorted keys, no white space, ASCII."""
    return json.dumps(_plain(value), sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def event_hash(table: str, event: Mapping[str, Any], prev: str | None) -> str:
    """Hash of one ledger event: its table, its content (hash fields aside) and its chain's
    previous hash."""
    body = {k: v for k, v in event.items() if k not in HASH_FIELDS}
    return _sha(canonical({"table": table, "prev": prev, "event": body}))


def chain(table: str, events: Iterable[Mapping[str, Any]], prev: str | None = GENESIS
          ) -> list[dict[str, Any]]:
    """The events (in writing order) with ``prev_hash`` and ``event_hash`` set, continuing a
    chain whose head is ``prev``."""
    out = []
    for e in events:
        row = {k: v for k, v in e.items() if k not in HASH_FIELDS}
        row["prev_hash"] = prev
        row["event_hash"] = prev = event_hash(table, row, prev)
        out.append(row)
    return out


@dataclass(frozen=True)
class Finding:
    """One thing a verifier found: ``tamper`` findings fail verification, ``info`` ones do not."""

    kind: str
    where: str
    detail: str
    severity: str = "tamper"

    def line(self) -> str:
        return f"{self.severity.upper()} {self.kind} {self.where}: {self.detail}"


def verify_chain(table: str, chain_name: str, events: Sequence[Mapping[str, Any]],
                 order_key: str, recorded_head: str | None = None) -> list[Finding]:
    """Findings for one chain's events as read back (any order): edited, deleted, inserted and
    reordered events, and a head that differs from the one recorded in the evidence.

    ``order_key`` names the field that orders events as written (a timestamp or a sequence
    number). Events written before auditing existed (no ``event_hash``) are reported as info.
    """
    where = f"{table}[{chain_name}]"
    found: list[Finding] = []
    chained = [e for e in events if e.get("event_hash")]
    if len(chained) < len(events):
        found.append(Finding("unchained", where, f"{len(events) - len(chained)} event(s) written "
                                                  "before audit hashing; not verifiable", "info"))
    by_hash: dict[str, Mapping[str, Any]] = {}
    for e in chained:
        label = f"{where} event at {_plain(e.get(order_key))}"
        if event_hash(table, e, e.get("prev_hash")) != e["event_hash"]:
            found.append(Finding("edited", label, "content does not match its event_hash"))
        if e["event_hash"] in by_hash:
            found.append(Finding("inserted", label, "a second event with the same hash"))
        by_hash[e["event_hash"]] = e
    successors: dict[str | None, list[Mapping[str, Any]]] = {}
    for e in chained:
        successors.setdefault(e.get("prev_hash"), []).append(e)
    for prev, succ in successors.items():
        if prev is not GENESIS and prev not in by_hash:
            for e in succ:
                found.append(Finding("deleted", f"{where} event at {_plain(e.get(order_key))}",
                                     f"the event before it ({prev[:12]}...) is missing"))
        if len(succ) > 1:
            found.append(Finding("inserted", where, f"{len(succ)} events claim the same "
                                                    "predecessor; one was inserted"))
    # walk from the genesis event: the written order must be the chain order
    walk: list[Mapping[str, Any]] = []
    nxt = successors.get(GENESIS, [])
    while len(nxt) == 1 and len(walk) <= len(chained):
        walk.append(nxt[0])
        nxt = successors.get(nxt[0]["event_hash"], [])
    keys = [_plain(e.get(order_key)) for e in walk]
    if keys != sorted(keys):
        found.append(Finding("reordered", where, "events are not in the order they were chained"))
    if recorded_head is not None:
        head = walk[-1]["event_hash"] if walk else None
        if head != recorded_head:
            found.append(Finding("head_mismatch", where,
                                 f"chain ends at {str(head)[:12]}..., evidence recorded "
                                 f"{recorded_head[:12]}... (events deleted, rewritten or restored)"))
    return found


def leaf_hashes(doc: Any, path: str = "") -> dict[str, str]:
    """One hash per leaf value of a document, by its path (``targets[0].gates[2].measured``).

    Two leaves whose paths read alike (``{"a": {"b": 1}}`` and a key ``"a.b"``) get one hash
    over both, so neither can stand in for the other's value."""
    if isinstance(doc, Mapping):
        out: dict[str, str] = {}
        for k, v in doc.items():
            _add(out, leaf_hashes(v, f"{path}.{k}" if path else str(k)))
        return out or {path: _sha(canonical({}))}
    if isinstance(doc, list | tuple):
        out = {}
        for i, v in enumerate(doc):
            _add(out, leaf_hashes(v, f"{path}[{i}]"))
        return out or {path: _sha(canonical([]))}
    return {path: _sha(canonical([path, doc]))}


def _add(out: dict[str, str], leaves: Mapping[str, str]) -> None:
    for p, h in leaves.items():
        out[p] = h if p not in out else _sha(canonical(["ambiguous", sorted([out[p], h])]))


def content_hash(leaves: Mapping[str, str]) -> str:
    """The root over a document's leaf hashes."""
    return _sha(canonical(sorted(leaves.items())))


def leaf_differences(recorded: Mapping[str, str], current: Mapping[str, str]) -> list[str]:
    """Paths whose value changed, appeared or disappeared."""
    out = [f"{p} changed" for p in recorded if p in current and current[p] != recorded[p]]
    out += [f"{p} removed" for p in recorded if p not in current]
    out += [f"{p} added" for p in current if p not in recorded]
    return sorted(out)


def seal(key: bytes, digest: str) -> str:
    """HMAC-SHA256 of a content hash under the audit key."""
    return hmac.new(key, digest.encode("ascii"), hashlib.sha256).hexdigest()


def seal_matches(key: bytes, digest: str, claimed: str | None) -> bool:
    return claimed is not None and hmac.compare_digest(seal(key, digest), claimed)
