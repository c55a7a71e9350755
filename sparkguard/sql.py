"""Pure SQL rendering: identifiers, typed literals, predicates and Delta statements.

Nothing here imports pyspark; every string Spark executes on behalf of a plan is built here
and tested for its exact text.
"""

from __future__ import annotations

import datetime as dt
import itertools
import os
import posixpath
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from urllib.parse import urlsplit

__all__ = [
    "CHANGE_OP",
    "IDENTIFIER_RE",
    "RESERVED_PREFIX",
    "PartitionType",
    "TableRef",
    "UnsafeSQLError",
    "canonical_location",
    "changed_condition",
    "check_expression",
    "column_named",
    "describe_detail_statement",
    "describe_history_statement",
    "has_control",
    "location_spellings",
    "merge_changes_statement",
    "merge_condition",
    "merge_statement",
    "parse_partition_value",
    "placeholders",
    "query_only",
    "query_problem",
    "quote_column",
    "quote_identifier",
    "render_literal",
    "reserved_names",
    "restore_statement",
    "spellings_of",
    "table_name_parts",
    "window_predicate",
]

# sparkguard's own working columns (``__sg_side``, ``__sg_op``, ...) start with this; a target
# column with the prefix, in any case, is refused by the guard (``target_reserved_column``)
RESERVED_PREFIX = "__sg_"
IDENTIFIER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_CONTROL_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})
_PATH_FORBIDDEN = re.compile(r"[`'\"\\;\x00-\x1f\x7f]")
_EXPR_FORBIDDEN = re.compile(r";|--|/\*|\*/")
_QUERY_HEADS_BARE = {"TABLE", "VALUES", "WITH", "FROM"}  # a query without SELECT: (TABLE t)
_QUOTED_NAME = re.compile(r"`(?:[^`]|``)*`")  # a backquoted name; a backquote inside doubled
_EXPR_SUBQUERY = re.compile(r"(?i)\bselect\b")
# Tokens of a SQL text: quoted strings and identifiers, comments, words, one other character.
_SQL_TOKEN = re.compile(r"""'(?:[^'\\]|\\.)*'?|"(?:[^"\\]|\\.)*"?|`(?:[^`]|``)*`?|--[^\n]*"""
                        r"|/\*.*?(?:\*/|\Z)|[A-Za-z_][A-Za-z0-9_]*|\S", re.S)
# The same with a backslash taken as itself inside a string, as Spark reads strings with
# spark.sql.parser.escapedStringLiterals=true: '\' || (TABLE t) || '\' is a subquery there.
_SQL_TOKEN_RAW = re.compile(r"""'[^']*'?|"[^"]*"?|`(?:[^`]|``)*`?|--[^\n]*"""
                            r"|/\*.*?(?:\*/|\Z)|[A-Za-z_][A-Za-z0-9_]*|\S", re.S)
_QUERY_START = {"SELECT", "FROM", "VALUES", "TABLE", "("}
_QUERY_HEADS = [["SELECT"], ["WITH"], ["FROM"], ["VALUES"], ["TABLE"], ["("]]
_DML = {"INSERT", "DELETE", "UPDATE", "MERGE"}
# String partition values made only of these characters are rendered as plain '...' literals;
# any other value is rendered from its UTF-8 bytes, which no parser setting can misread.
_PLAIN_STRING = re.compile(r"^[A-Za-z0-9 _.:/=+@,-]*$")
_INT64 = (-(2**63), 2**63 - 1)


def has_control(text: str, allow: str = "") -> bool:
    """True when ``text`` has a control, format (bidi override, zero-width) or line/paragraph
    separator character not in ``allow``: they make printed text lie about what it holds."""
    return any(unicodedata.category(c) in _CONTROL_CATEGORIES and c not in allow for c in text)


def reserved_names(names: Iterable[str]) -> list[str]:
    """The ``names`` that start with :data:`RESERVED_PREFIX`, in any case."""
    return [n for n in names if n.lower().startswith(RESERVED_PREFIX)]


class UnsafeSQLError(ValueError):
    """Raised when a name, path, value or expression cannot be rendered safely."""


class PartitionType(str, Enum):
    """Type of the partition column; decides how partition values are rendered."""

    DATE = "date"
    STRING = "string"
    INT = "int"


def quote_identifier(name: str) -> str:
    """Quote a (possibly dotted, at most three-part) identifier after validating each part."""
    if not isinstance(name, str) or not name:
        raise UnsafeSQLError(f"empty identifier {name!r}")
    parts = name.split(".")
    if len(parts) > 3:
        raise UnsafeSQLError(f"identifier {name!r} has more than three parts")
    for part in parts:
        if not IDENTIFIER_RE.fullmatch(part):
            what = f"{name!r}" if part == name else f"part {part!r} of {name!r}"
            raise UnsafeSQLError(
                f"{what} is not a plain name (letters, digits, underscore; not starting with a "
                "digit)"
            )
    return ".".join(f"`{p}`" for p in parts)


# URI schemes that reach the same storage: Hadoop's S3A and the older S3N connectors, Databricks'
# and EMR's s3, address one S3 object; abfs (plain) and abfss, and wasb(s) through the account's
# blob endpoint, one ADLS Gen2 path (its dfs endpoint).
_SAME_STORAGE = {"s3a": "s3", "s3n": "s3", "abfs": "abfss", "wasb": "abfss", "wasbs": "abfss"}
_BLOB_SCHEMES = tuple(a for a in _SAME_STORAGE if a.startswith("wasb"))  # on blob endpoints
_BLOB_ENDPOINT = re.compile(r"\.blob\.core\.", re.I)


def canonical_location(location: str) -> str:
    """One spelling for a storage location, so that one table has one key (its lock, its
    publish state, the source-is-the-target check) whichever connector a plan or a catalog
    addresses it through: the scheme in lower case (``s3a://`` and ``s3n://`` as ``s3://``;
    ``abfs://``, ``wasb://`` and ``wasbs://`` as ``abfss://`` on the account's ``dfs``
    endpoint), no trailing slash. Bucket, container and path are kept as written."""
    text = location.rstrip("/")
    scheme, sep, rest = text.partition("://")
    if not sep or not scheme.isascii() or not scheme.isalnum():
        return text
    scheme = scheme.lower()
    canon = _SAME_STORAGE.get(scheme, scheme)
    if scheme in _BLOB_SCHEMES:
        host, slash, path = rest.partition("/")
        rest = _BLOB_ENDPOINT.sub(".dfs.core.", host) + slash + path
    return f"{canon}://{rest}"


# One part of a table's catalog name: a plain name, or one in backquotes that may also hold a
# hyphen (Unity Catalog names workspace catalogs after their workspace: `my-workspace`). Nothing
# else is let through: no dot, space, quote or backquote inside a part.
_NAME_PART = r"(?:[A-Za-z_][A-Za-z0-9_]{0,127}|`[A-Za-z0-9_-]{1,255}`)"
_NAME_PART_RE = re.compile(_NAME_PART)
_TABLE_NAME_RE = re.compile(rf"{_NAME_PART}(?:\.{_NAME_PART}){{0,2}}")
_DOT_OUTSIDE_QUOTES = re.compile(r"\.(?=(?:[^`]*`[^`]*`)*[^`]*$)")


def table_name_parts(name: str) -> tuple[str, ...]:
    """The parts of a table's catalog name (``catalog.schema.table``, at most three) without
    their backquotes, or UnsafeSQLError naming the part that is neither a plain name nor a
    backquoted one (`` `my-workspace`.sales.orders `` is three parts)."""
    if not isinstance(name, str) or not name:
        raise UnsafeSQLError(f"empty identifier {name!r}")
    if _TABLE_NAME_RE.fullmatch(name):
        return tuple(p.strip("`") for p in _NAME_PART_RE.findall(name))
    parts = _DOT_OUTSIDE_QUOTES.split(name)
    if len(parts) > 3:
        raise UnsafeSQLError(f"identifier {name!r} has more than three parts")
    bad = next((p for p in parts if not _NAME_PART_RE.fullmatch(p)), name)
    what = f"{name!r}" if bad == name else f"part {bad!r} of {name!r}"
    raise UnsafeSQLError(f"{what} is not a plain name (letters, digits, underscore; not starting "
                         "with a digit; in backquotes, '-' too)")


def canonical_location_sql(expr: str) -> str:
    """:func:`canonical_location` as a Spark SQL expression over the string ``expr`` (a column
    name or an expression sparkguard writes), for SQL-only readers of its tables."""
    text = f"trim(TRAILING '/' FROM {expr})"
    scheme = f"lower(regexp_extract({text}, '^([A-Za-z0-9]+)://', 1))"
    rest = f"regexp_extract({text}, '(?s)^[A-Za-z0-9]+://(.*)$', 1)"
    host = f"regexp_extract({rest}, '^([^/]*)', 1)"
    blob = (f"concat(regexp_replace({host}, '(?i)[.]blob[.]core[.]', '.dfs.core.'), "
            f"substring({rest}, length({host}) + 1))")
    mapped = " ".join(f"WHEN '{alias}' THEN '{same}'" for alias, same in _SAME_STORAGE.items())
    wasb = " OR ".join(f"{scheme} = '{a}'" for a in _BLOB_SCHEMES)
    return (f"CASE WHEN {text} RLIKE '^[A-Za-z0-9]+://' THEN concat(CASE {scheme} {mapped} "
            f"ELSE {scheme} END, '://', CASE WHEN {wasb} THEN {blob} ELSE {rest} END) "
            f"ELSE {text} END")


def location_spellings(location: str) -> list[str]:
    """``location`` in its one spelling (:func:`canonical_location`) and the others of the same
    storage that earlier versions recorded as they were given (``s3a://``, ``s3n://``;
    ``abfs://``, ``wasb(s)://`` on the blob endpoint): to find events written before locations
    had one spelling."""
    canon = canonical_location(location)
    scheme, sep, rest = canon.partition("://")
    if not sep:
        return [canon]
    host, slash, path = rest.partition("/")
    blob = re.sub(r"\.dfs\.core\.", ".blob.core.", host, flags=re.I) + slash + path
    return [canon, *(f"{alias}://{blob if alias in _BLOB_SCHEMES else rest}"
                     for alias, same in _SAME_STORAGE.items() if same == scheme)]


def spellings_of(locations: Iterable[str]) -> list[str]:
    """Every spelling (:func:`location_spellings`) of each of ``locations``, sorted, once."""
    return sorted({s for loc in locations for s in location_spellings(loc)})


@dataclass(frozen=True)
class TableRef:
    """A Delta table named in the catalog or addressed by path."""

    name: str | None = None
    path: str | None = None

    @staticmethod
    def parse(dataset: str) -> TableRef:
        """``/abs/path``, ``./rel``, ``scheme://...`` are paths; anything else is a table name."""
        if not isinstance(dataset, str) or not dataset.strip():
            raise UnsafeSQLError("empty dataset name")
        if dataset.startswith(("/", "./", "../")) or "://" in dataset or dataset.startswith("dbfs:"):
            if _PATH_FORBIDDEN.search(dataset) or has_control(dataset):
                raise UnsafeSQLError(
                    f"path {dataset!r} contains a quote, backquote, backslash, semicolon or "
                    "control character"
                )
            try:
                urlsplit(dataset)
            except ValueError as exc:
                raise UnsafeSQLError(f"path {dataset!r} is not a valid URI ({exc})") from None
            return TableRef(path=dataset)
        table_name_parts(dataset)
        return TableRef(name=dataset)

    @property
    def sql(self) -> str:
        """The reference as it appears in SQL: `a`.`b` or delta.`/path`."""
        if self.path is not None:
            return f"delta.`{self.path}`"
        assert self.name is not None
        return ".".join(f"`{p}`" for p in table_name_parts(self.name))

    @property
    def display(self) -> str:
        return self.path if self.path is not None else str(self.name)

    @property
    def path_location(self) -> str | None:
        """The location ``DESCRIBE DETAIL`` reports for a table at this path, worked out
        without reading anything (``/a/b/`` and ``file:///a/b`` are ``file:/a/b``); None for a
        catalog name, whose location only the catalog knows."""
        if self.path is None:
            return None
        parts = urlsplit(self.path)
        if parts.scheme in ("", "file"):
            local = parts.path if parts.scheme else self.path
            return "file:" + posixpath.normpath(posixpath.join(os.getcwd(), local))
        return canonical_location(self.path)

    def __str__(self) -> str:
        return self.display


def parse_partition_value(value: object, ptype: PartitionType) -> object:
    """Turn a plan's partition value into a typed Python value, or raise UnsafeSQLError
    (spaces around a date or an integer are not part of it; a string is taken as written)."""
    if ptype is not PartitionType.STRING and isinstance(value, str):
        value = value.strip()
    if ptype is PartitionType.DATE:
        if isinstance(value, dt.datetime):
            return value.date()
        if isinstance(value, dt.date):
            return value
        if isinstance(value, str) and re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", value):
            try:
                return dt.date.fromisoformat(value)
            except ValueError as exc:
                raise UnsafeSQLError(f"{value!r} is not a calendar date") from exc
        raise UnsafeSQLError(f"{value!r} is not a date in YYYY-MM-DD form")
    if ptype is PartitionType.INT:
        number: int | None = None
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        elif isinstance(value, str) and re.fullmatch(r"-?[0-9]{1,19}", value):
            number = int(value)
        if number is None or not _INT64[0] <= number <= _INT64[1]:
            raise UnsafeSQLError(f"{value!r} is not a 64-bit integer")
        return number
    if isinstance(value, str | int | dt.date) and not isinstance(value, bool):
        text = value.isoformat() if isinstance(value, dt.date) else str(value)
        if any(ord(c) < 32 or ord(c) == 127 for c in text):
            raise UnsafeSQLError(f"{value!r} contains a control character")
        return text
    raise UnsafeSQLError(f"{value!r} is not a string partition value")


def render_literal(value: object, ptype: PartitionType) -> str:
    """Render a partition value as a typed SQL literal that cannot change the statement."""
    typed = parse_partition_value(value, ptype)
    if ptype is PartitionType.DATE:
        assert isinstance(typed, dt.date)
        return f"DATE'{typed.isoformat()}'"
    if ptype is PartitionType.INT:
        return str(typed)
    assert isinstance(typed, str)
    if _PLAIN_STRING.fullmatch(typed):
        return f"'{typed}'"
    return f"CAST(X'{typed.encode('utf-8').hex().upper()}' AS STRING)"


def window_predicate(column: str, ptype: PartitionType, values: Sequence[object],
                     alias: str | None = None) -> str:
    """``col IN (lit, ...)`` over exactly the given partitions (deduplicated, sorted)."""
    if not values:
        raise UnsafeSQLError("a window predicate needs at least one partition")
    typed = sorted({parse_partition_value(v, ptype) for v in values})  # type: ignore[type-var]
    lits = ", ".join(render_literal(v, ptype) for v in typed)
    col = quote_identifier(column)
    if alias:
        col = f"{quote_identifier(alias)}.{col}"
    return f"{col} IN ({lits})"


def merge_condition(keys: Iterable[str], target_alias: str = "t", source_alias: str = "s") -> str:
    """Null-safe equality on every business key: ``t.`k` <=> s.`k` AND ...``."""
    keys = list(keys)
    if not keys:
        raise UnsafeSQLError("a merge needs at least one business key")
    ta, sa = quote_identifier(target_alias), quote_identifier(source_alias)
    return " AND ".join(f"{ta}.{quote_identifier(k)} <=> {sa}.{quote_identifier(k)}" for k in keys)


def restore_statement(table: TableRef, version: int) -> str:
    """``RESTORE TABLE <ref> TO VERSION AS OF n``."""
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise UnsafeSQLError(f"version {version!r} is not a non-negative integer")
    return f"RESTORE TABLE {table.sql} TO VERSION AS OF {version}"


def describe_history_statement(table: TableRef, limit: int | None = None) -> str:
    """``DESCRIBE HISTORY <ref> [LIMIT n]``: the table's commits, newest first."""
    if limit is None:
        return f"DESCRIBE HISTORY {table.sql}"
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise UnsafeSQLError(f"history limit {limit!r} is not a positive integer")
    return f"DESCRIBE HISTORY {table.sql} LIMIT {limit}"


def describe_detail_statement(table: TableRef) -> str:
    """``DESCRIBE DETAIL <ref>``: format, location, partition columns, properties."""
    return f"DESCRIBE DETAIL {table.sql}"


def quote_column(name: str) -> str:
    """Any column name as a backquoted identifier (a backquote inside is doubled)."""
    if not isinstance(name, str) or not name or any(ord(c) < 32 for c in name):
        raise UnsafeSQLError(f"column name {name!r} is empty or has a control character")
    return "`" + name.replace("`", "``") + "`"


def changed_condition(columns: Sequence[str], binary_columns: Iterable[str] = (),
                      target_alias: str = "t", source_alias: str = "s") -> str:
    """True when any of ``columns`` differs between a matched target and source row:
    ``NOT (t.`c1` <=> s.`c1` AND ...)``, null-safe (null = null, NaN = NaN in Spark). Columns
    in ``binary_columns`` (collated text, which ``<=>`` compares in its collation: ``UTF8_LCASE``
    is blind to a change of case) are compared in ``UTF8_BINARY``. (Maps and variants, which
    ``<=>`` cannot compare, are given as columns of their exact JSON text:
    :func:`sparkguard.spark_types.exact_json`.)
    """
    if not columns:
        raise UnsafeSQLError("a change condition needs at least one column")
    ta, sa = quote_identifier(target_alias), quote_identifier(source_alias)
    as_binary = set(binary_columns)
    terms = []
    for c in columns:
        t, s = f"{ta}.{quote_column(c)}", f"{sa}.{quote_column(c)}"
        if c in as_binary:
            t, s = f"collate({t}, 'UTF8_BINARY')", f"collate({s}, 'UTF8_BINARY')"
        terms.append(f"{t} <=> {s}")
    return f"NOT ({' AND '.join(terms)})"


def merge_statement(table: TableRef, source_view: str, keys: Sequence[str], columns: Sequence[str],
                    window_predicate_target: str, delete_unmatched: bool) -> str:
    """``MERGE INTO`` the target (alias ``t``) from a temp view (alias ``s``) on the business keys.

    Matching and, with ``delete_unmatched``, deleting are both bounded by
    ``window_predicate_target`` (a predicate over ``t``, from :func:`window_predicate` with
    alias ``t``), so rows outside the window are never touched. Every column of the source is
    updated or inserted by name.
    """
    if not columns:
        raise UnsafeSQLError("a merge needs at least one column")
    cols = [quote_column(c) for c in columns]
    sets = ", ".join(f"`t`.{c} = `s`.{c}" for c in cols)
    lines = [f"MERGE INTO {table.sql} AS `t`",
             f"USING {quote_identifier(source_view)} AS `s`",
             f"ON ({merge_condition(keys)}) AND {window_predicate_target}",
             f"WHEN MATCHED THEN UPDATE SET {sets}",
             f"WHEN NOT MATCHED THEN INSERT ({', '.join(cols)}) "
             f"VALUES ({', '.join(f'`s`.{c}' for c in cols)})"]
    if delete_unmatched:
        lines.append(f"WHEN NOT MATCHED BY SOURCE AND {window_predicate_target} THEN DELETE")
    return "\n".join(lines)


CHANGE_OP = "__sg_op"  # the change-only MERGE's source column: I(nsert), U(pdate), D(elete)


def merge_changes_statement(table: TableRef, source_view: str, keys: Sequence[str],
                            columns: Sequence[str], window_predicate_target: str) -> str:
    """``MERGE INTO`` the target (alias ``t``) from a view holding only the changes (alias
    ``s``): each row carries :data:`CHANGE_OP` ``'I'``, ``'U'`` or ``'D'``.

    No ``NOT MATCHED BY SOURCE`` clause: the target rows matched are only those to update or
    delete, so Delta rewrites (or, with deletion vectors, marks) only the files holding them, and
    prunes the rest of the table with the window bound of the ``ON`` condition.
    """
    if not columns:
        raise UnsafeSQLError("a merge needs at least one column")
    cols = [quote_column(c) for c in columns]
    op = f"`s`.{quote_column(CHANGE_OP)}"
    sets = ", ".join(f"`t`.{c} = `s`.{c}" for c in cols)
    return "\n".join([
        f"MERGE INTO {table.sql} AS `t`",
        f"USING {quote_identifier(source_view)} AS `s`",
        f"ON ({merge_condition(keys)}) AND {window_predicate_target}",
        f"WHEN MATCHED AND {op} = 'D' THEN DELETE",
        f"WHEN MATCHED AND {op} = 'U' THEN UPDATE SET {sets}",
        f"WHEN NOT MATCHED AND {op} = 'I' THEN INSERT ({', '.join(cols)}) "
        f"VALUES ({', '.join(f'`s`.{c}' for c in cols)})"])


def check_expression(expr: str) -> str:
    """Accept a single SQL expression from a plan; refuse statement separators and comments."""
    if not isinstance(expr, str) or not expr.strip():
        raise UnsafeSQLError("empty expression")
    if _EXPR_FORBIDDEN.search(expr):
        raise UnsafeSQLError(
            f"expression {expr!r} contains ';' or a comment; write one plain SQL expression "
            "over the row's columns"
        )
    toks = _SQL_TOKEN.findall(expr)
    if any(t.startswith("`") and not _QUOTED_NAME.fullmatch(t) for t in toks):
        raise UnsafeSQLError(
            f"expression {expr!r} has an unterminated backquote; write a column name with "
            "spaces or dots as `name`, a backquote inside it doubled"
        )
    if _EXPR_SUBQUERY.search(expr) or any(  # whichever way the session reads backslashes
            a == "(" and b in _QUERY_HEADS_BARE
            for tokens in (toks, _SQL_TOKEN_RAW.findall(expr))
            for a, b in itertools.pairwise(t.upper() for t in tokens)):
        raise UnsafeSQLError(
            f"expression {expr!r} contains a subquery (SELECT, TABLE, VALUES); "
            "write one expression over the columns of the row"
        )
    return expr.strip()


_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_QUOTED_OR_COMMENT = ("'", '"', "`", "--", "/*")


def placeholders(sql: str) -> list[str]:
    """The names of the ``{name}`` placeholders in a transform's SQL, outside string literals,
    backquoted names and comments: a regex's ``{2}`` or a JSON literal's braces are SQL."""
    code = _SQL_TOKEN.sub(lambda m: " " * len(m.group())
                          if m.group().startswith(_QUOTED_OR_COMMENT) else m.group(), sql)
    return _PLACEHOLDER.findall(code)


def column_named(expr: str) -> str | None:
    """The column ``expr`` is, when it is one column name (plain or backquoted); else None."""
    text = expr.strip()
    if _QUOTED_NAME.fullmatch(text):
        return text[1:-1].replace("``", "`")
    return text if IDENTIFIER_RE.fullmatch(text) else None


def query_only(sql: str) -> str:
    """``sql`` as a subquery: Spark then parses one query and refuses a command (``WITH ...
    DELETE``, ``INSERT``, ``MERGE``) instead of running it eagerly. Substitute placeholders
    first; the newlines keep a trailing ``--`` comment off the closing parenthesis."""
    return "SELECT * FROM (\n" + sql + "\n) AS `__sg_query`"


def query_problem(sql: str) -> str | None:
    """Why ``sql`` is not one query (a ``;``, or a command such as ``WITH ... DELETE``), or None.

    Looks at the text outside quotes and comments; Spark's parser, through :func:`query_only`,
    is the real guard.
    """
    toks = [t for t in _SQL_TOKEN.findall(sql) if not t.startswith(("--", "/*"))]
    if ";" in toks:
        return "it contains ';' outside quotes, and only one query may run"
    words = [t.upper() for t in toks]
    i = 0
    if words[:1] == ["WITH"]:
        i = 1 + (words[1:2] == ["RECURSIVE"])
        while i < len(words):  # name [(columns)] [AS] (query) [, ...]
            i += 1  # the name
            if words[i:i + 1] == ["("] and words[i + 1:i + 2] not in _QUERY_HEADS:
                i = _after_parens(words, i)  # column aliases
            i += words[i:i + 1] == ["AS"]
            if words[i:i + 1] != ["("]:
                break
            i = _after_parens(words, i)
            if words[i:i + 1] != [","]:
                break
            i += 1
    head = words[i] if i < len(words) else ""
    if head not in _QUERY_START:
        if head in _DML:
            return f"it is a command ({head}), not a query"
        return f"{head or 'nothing'} stands where the query should start"
    depth = 0
    for j, w in enumerate(words):
        depth += (w == "(") - (w == ")")
        if depth == 0 and w == "INSERT" and words[j + 1:j + 2] in (["INTO"], ["OVERWRITE"]):
            return "it is a command (INSERT), not a query"
    return None


def _after_parens(words: list[str], i: int) -> int:
    """The index after the parenthesis that closes the one at ``i``."""
    depth = 0
    for j in range(i, len(words)):
        depth += (words[j] == "(") - (words[j] == ")")
        if depth == 0:
            return j + 1
    return len(words)
