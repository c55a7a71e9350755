"""What ``sparkguard plan init`` decides from what it read (pure: no Spark).

The Spark side (:mod:`sparkguard.draft.infer`) reads schemas, table details and aggregate
counts; everything it then decides lives here and is unit-tested without a JVM: the table
layout and whether the plan format can express it, the window's partition values, the order in
which business-key candidates are tried, the measure columns and their thresholds, and the
transform.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from itertools import combinations
from pathlib import Path

from sparkguard.errors import PlanError, PlanProblem
from sparkguard.sql import IDENTIFIER_RE, PartitionType, TableRef, UnsafeSQLError

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

SOURCE = "plan init"
# Relative tolerance of a float/double sum gate, in percent: 1e-6 of the sum. Summing the same
# doubles in another order (shuffles, slices) changes the last bits; 1e-6 absorbs that for any
# realistic row count while still catching a changed or lost row of ordinary magnitude.
FLOAT_TOLERANCE_PERCENT = 0.0001
MAX_SINGLE_CANDIDATES = 12
MAX_COMPOSITE_CANDIDATES = 24
_DAY_FORMATS_STRING = ("%Y-%m-%d", "%Y%m%d", "%Y/%m/%d")
_DAY_FORMATS_INT = ("%Y%m%d",)
_INTEGRAL = {"tinyint", "smallint", "int", "bigint"}
_FLOATS = {"float", "double"}
_KEY_COMMENT = re.compile(r"(?i)\b(primary[ _-]?key|unique|business[ _-]?key|natural[ _-]?key)\b")


def refuse(flag: str, message: str, fix: str, value: object = None) -> PlanError:
    """A PlanError for ``plan init`` (exit 2, nothing written), naming the option at fault."""
    return PlanError(SOURCE, [PlanProblem(flag, message, value, fix)])


def resolve_table(flag: str, value: str, cwd: Path | None = None) -> str:
    """A ``--source``/``--target`` argument as a plan dataset: an absolute path or URI, or a
    catalog name (1-3 plain parts). A local path may be relative; it is made absolute."""
    text = value.strip()
    if not text:
        raise refuse(flag, "is empty", "give a table path or a catalog name")
    looks_local = "/" in text and "://" not in text and not text.startswith("dbfs:")
    candidate = str((cwd or Path.cwd()) / text) if looks_local and not text.startswith("/") \
        else text
    if looks_local:
        candidate = str(Path(candidate).resolve())
    try:
        TableRef.parse(candidate)
    except UnsafeSQLError as exc:
        raise refuse(flag, str(exc), "give a path without quotes, backquotes, backslashes or ';', "
                     "or a catalog name of letters, digits and '_' (catalog.schema.table)",
                     value) from None
    return candidate


def parse_bound(flag: str, value: str) -> dt.datetime:
    """``--start``/``--end``: an ISO date or timestamp; naive means UTC; returned aware UTC."""
    text = value.strip().replace("Z", "+00:00").replace("z", "+00:00")
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise refuse(flag, "is not an ISO-8601 date or timestamp",
                     "write it like 2026-05-12 or 2026-05-12T00:00:00Z", value) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return moment.astimezone(dt.UTC)


def window_days(start: dt.datetime, end: dt.datetime) -> list[dt.date]:
    """The days of ``[start, end)`` for a day-partitioned table; refuses a window that is not
    whole days, inverted, or longer than a plan may be."""
    for flag, bound in (("--start", start), ("--end", end)):
        if bound.time() != dt.time(0):
            raise refuse(flag, f"{bound:%Y-%m-%dT%H:%M:%SZ} is inside a day, but the target is "
                         "partitioned by day: the window is whole days",
                         f"give a date, e.g. {bound:%Y-%m-%d}")
    if end <= start:
        raise refuse("--end", f"{end:%Y-%m-%d} is not after --start {start:%Y-%m-%d} (--end is "
                     "exclusive, like end_utc)", "give an --end later than --start")
    days = (end.date() - start.date()).days
    if days > 3660:
        raise refuse("--end", f"the window has {days} days; a plan covers at most 3660",
                      "split the backfill")
    return [start.date() + dt.timedelta(days=i) for i in range(days)]


@dataclass(frozen=True)
class Column:
    """A table column as read from its schema (Spark ``simpleString`` type)."""

    name: str
    type: str
    nullable: bool = True
    comment: str = ""
    identity: bool = False  # a Delta identity column (GENERATED ... AS IDENTITY)

    @property
    def base(self) -> str:
        return self.type.split("(", 1)[0].split("<", 1)[0].lower()

    @property
    def is_float(self) -> bool:
        return self.base in _FLOATS

    @property
    def is_numeric(self) -> bool:
        return self.base in _INTEGRAL or self.base in _FLOATS or self.base == "decimal"

    @property
    def is_exact_numeric(self) -> bool:
        return self.is_numeric and not self.is_float

    @property
    def is_timestamp(self) -> bool:
        return self.base in ("timestamp", "timestamp_ntz")

    @property
    def key_eligible(self) -> bool:
        """A type whose equality is exact and meaningful for a key."""
        if self.base == "decimal":
            return bool(re.fullmatch(r"decimal\(\d+,0\)", self.type.replace(" ", "")))
        return self.base in _INTEGRAL | {"string", "varchar", "char", "date", "timestamp",
                                         "timestamp_ntz", "binary"}


class LayoutKind(str, Enum):
    """How a table's files are organised."""

    PARTITIONED = "partitioned"
    CLUSTERED = "clustered"
    UNPARTITIONED = "unpartitioned"


@dataclass(frozen=True)
class Layout:
    """A table's layout as read from ``DESCRIBE DETAIL`` and its schema."""

    partition_columns: tuple[str, ...]
    clustering_columns: tuple[str, ...]
    timestamp_columns: tuple[str, ...]
    date_columns: tuple[str, ...]

    @property
    def kind(self) -> LayoutKind:
        if self.partition_columns:
            return LayoutKind.PARTITIONED
        if self.clustering_columns:
            return LayoutKind.CLUSTERED
        return LayoutKind.UNPARTITIONED

    def describe(self) -> str:
        """One line for the draft's comments and refusals."""
        parts = [f"{self.kind.value}"]
        if self.partition_columns:
            parts.append(f"partition columns {list(self.partition_columns)}")
        if self.clustering_columns:
            parts.append(f"clustering columns {list(self.clustering_columns)}")
        parts.append(f"timestamp columns {list(self.timestamp_columns) or 'none'}")
        parts.append(f"date columns {list(self.date_columns) or 'none'}")
        return "; ".join(parts)


@dataclass(frozen=True)
class WindowColumn:
    """The column that bounds the window, its plan type, and how a day is written in it."""

    column: str
    type: PartitionType
    day_format: str | None = None  # strftime format of a day, for string/int partitions

    def values(self, days: Sequence[dt.date]) -> list[object]:
        """The partition values of ``days``."""
        if self.type is PartitionType.DATE:
            return list(days)
        assert self.day_format is not None
        texts = [d.strftime(self.day_format) for d in days]
        return [int(t) for t in texts] if self.type is PartitionType.INT else list(texts)


def window_column(layout: Layout, columns: Sequence[Column]) -> tuple[str, PartitionType]:
    """The window column and its plan type, or a refusal saying what the layout is and why the
    plan format cannot bound a window on it yet."""
    by_name = {c.name: c for c in columns}
    seen = f"the target is {layout.describe()}"
    if layout.kind is not LayoutKind.PARTITIONED:
        raise refuse("--target", f"{seen}: plans bound the window by one partition column, "
                     "and this table has none",
                     "write the plan from templates/backfill-plan.yaml once the plan format "
                     "supports timestamp-range windows, or partition the table by day")
    if len(layout.partition_columns) > 1:
        raise refuse("--target", f"{seen}: plans bound the window by one partition column",
                     "backfill a table partitioned by one date, string or int column")
    col = by_name[layout.partition_columns[0]]
    if col.base == "date":
        return col.name, PartitionType.DATE
    if col.base in ("string", "varchar", "char"):
        return col.name, PartitionType.STRING
    if col.base in _INTEGRAL:
        return col.name, PartitionType.INT
    raise refuse("--target", f"{seen}: partition column {col.name!r} is {col.type}; plans "
                 "support date, string and int partition columns",
                 "backfill a table partitioned by a date, string or int column")


def day_format(ptype: PartitionType, samples: Sequence[object]) -> str | None:
    """The strftime format in which every sampled string/int partition value writes a day, or
    None when the values are not days (then the window cannot come from --start/--end)."""
    formats = _DAY_FORMATS_INT if ptype is PartitionType.INT else _DAY_FORMATS_STRING
    texts = [str(s) for s in samples if s is not None]
    if not texts:
        return None
    for fmt in formats:
        try:
            if all(dt.datetime.strptime(t, fmt).strftime(fmt) == t for t in texts):
                return fmt
        except ValueError:
            continue
    return None


# -- business keys ----------------------------------------------------------------------------

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
    if col.identity or _KEY_COMMENT.search(col.comment or ""):
        return 0
    if entity and n in (f"{entity}_id", f"{entity}id", f"{entity}_key", f"{entity}_uuid"):
        return 1
    if n in ("id", "uuid", "key", "pk", "guid"):
        return 2
    if re.search(r"(_id|_key|_uuid|_pk|_no|_number|_nr)$", n) or re.search(r"[a-z]Id$", col.name):
        return 3
    return 4


_WHY = {0: "declared unique (identity column or key comment)", 1: "the table's own id name",
        2: "a primary-key-like name", 3: "an id-like name", 4: "another column of an exact type"}


@dataclass(frozen=True)
class KeyCandidate:
    """A set of columns tried as the business key, and why it was tried."""

    columns: tuple[str, ...]
    why: str


@dataclass(frozen=True)
class KeyEvidence:
    """What the window said about one candidate: rows, rows with a null key, and distinct keys
    within each partition (duplicates = non-null rows - distinct)."""

    candidate: KeyCandidate
    rows: int
    null_rows: int
    distinct: int

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
                    f"keys per partition ({self.candidate.why})")
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


# -- measures, transform --------------------------------------------------------------------

@dataclass(frozen=True)
class Measure:
    """A numeric column reconciled by a ``sum`` gate."""

    column: str
    exact: bool
    source_expr: str | None  # None: the source has no such column (a field to fill)
    has_nan: bool = False  # NaN in the window today: the gate compares finite values

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


def identity_transform(target: Sequence[Column], source: Sequence[Column]) -> TransformDraft:
    """``SELECT <target columns> FROM {source} WHERE {window}``: each target column taken from
    the source column of the same name (cast when the types differ); a column the source lacks
    becomes a ``{fill:COLUMN}`` hole that the guard names until someone writes it."""
    src = {c.name: c for c in source}
    items: list[str] = []
    draft = TransformDraft("")
    for c in target:
        if not IDENTIFIER_RE.fullmatch(c.name):
            raise refuse("--target", f"column {c.name!r} is not a plain name", "rename it, or "
                         "give --transform-sql / --transform-callable", c.name)
        s = src.get(c.name)
        if s is None:
            items.append(f"{{fill:{c.name}}} AS {c.name}")
            draft.unfilled.append(c.name)
        elif s.type.replace(" ", "") != c.type.replace(" ", ""):
            items.append(f"CAST({c.name} AS {c.type.upper()}) AS {c.name}")
            draft.casts.append(f"{c.name}: {s.type} -> {c.type}")
        else:
            items.append(c.name)
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


def read_sql_file(path: str) -> str:
    """The text of ``--transform-sql FILE``; a refusal naming the option when unreadable."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise refuse("--transform-sql", f"cannot read {path!r}: {exc}",
                     "give the path of a UTF-8 file holding one SELECT") from None


def check_new_file(path: str) -> Path:
    """Refuse an output file that exists already or whose folder does not (checked before any
    table is read, and again when writing)."""
    target = Path(path)
    if target.exists():
        raise refuse("-o", f"{path!r} already exists; plan init never overwrites a plan",
                      "choose another file name or remove it first")
    if not target.parent.is_dir():
        raise refuse("-o", f"folder {str(target.parent)!r} does not exist", "create it first")
    return target


def write_new_file(path: str, text: str) -> None:
    """Write ``text`` to a file that must not exist yet (an existing plan, perhaps approved,
    is never overwritten); atomic: the file appears whole or not at all."""
    target = check_new_file(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    try:
        os.link(tmp, target)  # fails if the file appeared meanwhile
    except FileExistsError:
        raise refuse("-o", f"{path!r} already exists; plan init never overwrites a plan",
                     "choose another file name or remove it first") from None
    finally:
        tmp.unlink()
