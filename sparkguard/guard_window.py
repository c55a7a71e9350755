"""Live-guard rules of ``window_column`` windows that need only a schema or figures (pure)."""

from __future__ import annotations

from sparkguard.plan.model import WindowType
from sparkguard.plan.window_spec import RangeWindow

__all__ = ["MOST", "rewrites_most", "window_column_problem"]

MOST = 0.5  # a promotion rewriting more than this share of an unpartitioned table is flagged
_TYPES = {WindowType.TIMESTAMP: ("timestamp",), WindowType.TIMESTAMP_NTZ: ("timestamp_ntz",),
          WindowType.DATE_HOUR: ("date",)}
_HOUR_TYPES = ("tinyint", "smallint", "int", "bigint")


def _type_of(schema: object, name: str) -> str | None:
    for f in getattr(schema, "fields", []):
        if f.name == name:
            return str(f.dataType.simpleString())
    return None


def window_column_problem(schema: object, rw: RangeWindow) -> tuple[str, str, str] | None:
    """(rule code, message, fix) when the window column(s) are missing or of another type."""
    names = [getattr(f, "name", "") for f in getattr(schema, "fields", [])]
    wanted: list[tuple[str, tuple[str, ...]]] = [(rw.column, _TYPES[rw.type])]
    if rw.hour_column is not None:
        wanted.append((rw.hour_column, _HOUR_TYPES))
    for name, types in wanted:
        got = _type_of(schema, name)
        if got is None:
            return ("partition_column_missing", f"no column {name!r}",
                    f"name one of {names[:20]} in window_column")
        if got not in types:
            return ("partition_type_mismatch", f"column {name!r} is {got}, window_column.type "
                    f"{rw.type.value} needs {' or '.join(types)}",
                    "make window_column.type match the table (timestamp, timestamp_ntz, "
                    "date_hour)")
    return None


def rewrites_most(window_files: int, table_files: int, window_bytes: int,
                  table_bytes: int) -> str | None:
    """The figures, when the window's files are most of the table's (by count or by size)."""
    if table_files <= 0:
        return None
    share_files = window_files / table_files
    share_bytes = window_bytes / table_bytes if table_bytes > 0 else 0.0
    if max(share_files, share_bytes) <= MOST:
        return None
    return (f"the promotion rewrites {window_files} of its {table_files} file(s) "
            f"({share_files:.0%}), {window_bytes / 1e6:.2f} of {table_bytes / 1e6:.2f} MB "
            f"({share_bytes:.0%})")
