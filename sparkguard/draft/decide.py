"""What ``sparkguard plan init`` decides from what it read (pure: no Spark).

The Spark side (:mod:`sparkguard.draft.infer`) reads schemas, table details and aggregate
counts; everything it then decides lives here and is unit-tested without a JVM: the table
layout and whether the plan format can express it, the window's partition values, the order in
which business-key candidates are tried, the measure columns and their thresholds, and the
transform.

The decisions live in small modules re-exported here: :mod:`~sparkguard.draft.inputs`
(options, bounds, files), :mod:`~sparkguard.draft.layout` (columns, layout, window column) and
:mod:`~sparkguard.draft.keys` (business-key candidates); this module holds the measures and the
transform.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from sparkguard.draft.inputs import (
    SOURCE,
    check_new_file,
    parse_bound,
    read_sql_file,
    refuse,
    resolve_table,
    window_days,
    write_new_file,
)
from sparkguard.draft.keys import KeyCandidate, KeyEvidence, _entity, _name_rank, key_candidates
from sparkguard.draft.layout import (
    Column,
    Layout,
    LayoutKind,
    WindowColumn,
    day_format,
    window_column,
)
from sparkguard.sql import IDENTIFIER_RE, quote_column

__all__ = [
    "FLOAT_TOLERANCE_PERCENT",
    "SOURCE",
    "Column",
    "KeyCandidate",
    "KeyEvidence",
    "Layout",
    "LayoutKind",
    "Measure",
    "TransformDraft",
    "WindowColumn",
    "check_new_file",
    "day_format",
    "identity_transform",
    "key_candidates",
    "measures",
    "parse_bound",
    "read_sql_file",
    "refuse",
    "resolve_table",
    "window_column",
    "window_days",
    "write_new_file",
]

# Relative tolerance of a float/double sum gate, in percent: 1e-6 of the sum. Summing the same
# doubles in another order (shuffles, slices) changes the last bits; 1e-6 absorbs that for any
# realistic row count while still catching a changed or lost row of ordinary magnitude.
FLOAT_TOLERANCE_PERCENT = 0.0001


@dataclass(frozen=True)
class Measure:
    """A numeric column reconciled by a ``sum`` gate."""

    column: str
    exact: bool
    source_expr: str | None  # None: the source has no such column (a field to fill)
    has_nan: bool = False  # NaN or an infinity in the window today, either side

    @property
    def threshold_percent(self) -> float:
        return 0.0 if self.exact else FLOAT_TOLERANCE_PERCENT


def measures(target: Sequence[Column], source: Sequence[Column], keys: Sequence[str],
             window_col: str, label: str, nan_columns: Sequence[str] = ()) -> list[Measure]:
    """Numeric target columns that measure something: not keys, not the window column, not
    id-like names (summing ids means nothing)."""
    entity = _entity(label)
    src = {c.name for c in source}
    out: list[Measure] = []
    for c in target:
        if not c.is_numeric or c.name in keys or c.name == window_col or \
                _name_rank(c, entity) <= 3:
            continue
        out.append(Measure(c.name, c.is_exact_numeric, c.name if c.name in src else None,
                           c.name in nan_columns))
    return out


@dataclass
class TransformDraft:
    """The drafted transform SQL, the columns left to fill and the casts added."""

    sql: str
    unfilled: list[str] = field(default_factory=list)
    casts: list[str] = field(default_factory=list)


def identity_transform(target: Sequence[Column], source: Sequence[Column],
                       reordered: Collection[str] = ()) -> TransformDraft:
    """``SELECT <target columns> FROM {source} WHERE {window}``: each target column taken from
    the source column of the same name (cast when the types differ); a column the source lacks
    becomes a ``{fill:COLUMN}`` hole that the guard names until someone writes it, and so does
    a ``reordered`` one (struct fields the source names or orders otherwise: a CAST would
    match them by position)."""
    src = {c.name: c for c in source}
    items: list[str] = []
    draft = TransformDraft("")
    for c in target:
        # a name with a dot, a hyphen or a space is written backquoted
        name = c.name if IDENTIFIER_RE.fullmatch(c.name) else quote_column(c.name)
        s = src.get(c.name)
        if s is None or c.name in reordered:
            items.append(f"{{fill:{c.name}}} AS {name}")
            draft.unfilled.append(c.name)
        elif (s.sql_type or s.type.replace(" ", "")) != (c.sql_type or c.type.replace(" ", "")):
            items.append(f"CAST({name} AS {c.sql_type or c.type.upper()}) AS {name}")
            draft.casts.append(f"{c.name}: {s.type} -> {c.type}")
        else:
            items.append(name)
    lines, line = [], "SELECT"
    for i, item in enumerate(items):
        piece = f" {item}" + ("," if i < len(items) - 1 else "")
        if len(line) + len(piece) > 88:
            lines.append(line)
            line = "       " + piece[1:]
        else:
            line += piece
    lines.append(line)
    draft.sql = "\n".join(lines) + "\nFROM {source}\nWHERE {window}\n"
    return draft
