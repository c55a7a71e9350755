"""Business-key candidates in the order ``plan init`` tries them, and what the window said about
each (pure)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations

from sparkguard.draft.layout import Column

__all__ = ["KeyCandidate", "KeyEvidence", "key_candidates"]

MAX_SINGLE_CANDIDATES = 12
MAX_COMPOSITE_CANDIDATES = 24
_KEY_COMMENT = re.compile(r"(?i)\b(primary[ _-]?key|unique|business[ _-]?key|natural[ _-]?key)\b")


def _entity(label: str) -> str:
    """``orders_clean`` -> ``order``: the first word of the table name, singular."""
    word = re.split(r"[_.]", label.lower())[0] if label else ""
    if word.endswith("ies"):
        return word[:-3] + "y"
    if word.endswith("ses"):
        return word[:-2]
    return word[:-1] if word.endswith("s") and len(word) > 3 else word


def _name_rank(col: Column, entity: str) -> int:
    """0 declared unique, 1 the table's own id, 2 a bare id, 3 an id-like name, 4 other."""
    n = col.name.lower()
    if _KEY_COMMENT.search(col.comment or ""):
        return 0
    if entity and n in (f"{entity}_id", f"{entity}id", f"{entity}_key", f"{entity}_uuid"):
        return 1
    if n in ("id", "uuid", "key", "pk", "guid"):
        return 2
    if re.search(r"(_id|_key|_uuid|_pk|_no|_number|_nr)$", n) or re.search(r"[a-z]Id$", col.name):
        return 3
    return 4


_WHY = {0: "declared unique (key comment)", 1: "the table's own id name",
        2: "a primary-key-like name", 3: "an id-like name", 4: "another column of an exact type"}


@dataclass(frozen=True)
class KeyCandidate:
    """A set of columns tried as the business key, and why it was tried."""

    columns: tuple[str, ...]
    why: str


@dataclass(frozen=True)
class KeyEvidence:
    """What the window said about one candidate: rows, rows with a null key, and distinct keys
    within each partition, or across the window with ``across`` (a MERGE promotion matches on
    the key alone); duplicates = non-null rows - distinct."""

    candidate: KeyCandidate
    rows: int
    null_rows: int
    distinct: int
    across: bool = False

    @property
    def duplicates(self) -> int:
        return max(0, self.rows - self.null_rows - self.distinct)

    @property
    def exact(self) -> bool:
        return self.rows > 0 and self.null_rows == 0 and self.duplicates == 0

    def describe(self) -> str:
        key = "(" + ", ".join(self.candidate.columns) + ")" if len(self.candidate.columns) > 1 \
            else self.candidate.columns[0]
        if self.exact:
            return (f"{key}: exact: {self.rows:,} rows, no nulls, {self.distinct:,} distinct "
                    f"keys {'across the window' if self.across else 'per partition'} "
                    f"({self.candidate.why})")
        why = []
        if self.duplicates:
            why.append(f"{self.duplicates:,} duplicate row(s)")
        if self.null_rows:
            why.append(f"{self.null_rows:,} row(s) with a null key")
        return f"{key}: not a key: {' and '.join(why)} in {self.rows:,} rows ({self.candidate.why})"


def key_candidates(columns: Sequence[Column], label: str, window_col: str,
                   composites: bool = False) -> list[KeyCandidate]:
    """Business-key candidates in the order they are tried: declared unique columns first, then
    primary-key-like names, then other exact-typed columns (``composites``: pairs, then triples
    of the best-ranked columns). The window column is never part of a key (keys identify a row
    within a partition; the duplicate check adds the partition column itself)."""
    entity = _entity(label)
    eligible = [c for c in columns if c.key_eligible and c.name != window_col]
    ranked = sorted(enumerate(eligible),
                    key=lambda ic: (_name_rank(ic[1], entity), ic[1].nullable, ic[0]))
    singles = [KeyCandidate((c.name,), _WHY[_name_rank(c, entity)]) for _, c in ranked]
    if not composites:
        return singles[:MAX_SINGLE_CANDIDATES]
    cols = [c for _, c in ranked][:8]
    pairs = sorted(combinations(range(len(cols)), 2), key=lambda ij: (
        _name_rank(cols[ij[0]], entity) + _name_rank(cols[ij[1]], entity), ij))
    out = [KeyCandidate((cols[i].name, cols[j].name), "a composite of the columns above")
           for i, j in pairs]
    idlike = [c for c in cols if _name_rank(c, entity) <= 3][:5]
    out += [KeyCandidate(tuple(c.name for c in trio), "a composite of id-like columns")
            for trio in combinations(idlike, 3)]
    return out[:MAX_COMPOSITE_CANDIDATES]
