"""``plan init``'s options and output file (pure): the refusal naming the option at fault,
table names, window bounds, the transform file, and the plan file written only if new."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

from sparkguard.errors import PlanError, PlanProblem
from sparkguard.plan.fields import HIDDEN_TEXT, SUB_MICROSECOND_RE, PlanValueError, utc_moment
from sparkguard.sql import TableRef, UnsafeSQLError, has_control

__all__ = ["SOURCE", "check_new_file", "parse_bound", "read_sql_file", "refuse", "resolve_table",
           "window_days", "write_new_file"]

SOURCE = "plan init"


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
    if SUB_MICROSECOND_RE.search(text):
        raise refuse(flag, "is finer than a microsecond (Spark timestamps hold microseconds)",
                     "give at most 6 digits after the second", value)
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise refuse(flag, "is not an ISO-8601 date or timestamp",
                     "write it like 2026-05-12 or 2026-05-12T00:00:00Z", value) from None
    try:
        return utc_moment(moment)
    except PlanValueError as exc:
        raise refuse(flag, str(exc), exc.fix, value) from None


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


def read_sql_file(path: str) -> str:
    """The text of ``--transform-sql FILE``; a refusal naming the option when unreadable."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise refuse("--transform-sql", f"cannot read {path!r}: {exc}",
                     "give the path of a UTF-8 file holding one SELECT") from None
    if has_control(text, allow="\n\t"):  # a plan refuses them: a reviewer cannot see them
        raise refuse("--transform-sql", f"{path!r} {HIDDEN_TEXT}",
                     "spell such a character as an escape in a SQL string literal ('\\u000B')")
    return text  # read_text turned \r\n and \r into \n


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
