"""Field types and validators shared by the plan models (no pydantic model of a section here).

Every validator raises :class:`PlanValueError` (or :class:`~sparkguard.sql.UnsafeSQLError`)
with a message naming the rule and, where it helps, a ``fix`` the loader prints.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    model_validator,
)

from sparkguard.sql import TableRef, UnsafeSQLError, has_control, quote_identifier

__all__ = [
    "ADDED_LATER",
    "BOUND_YEARS",
    "HIDDEN_TEXT",
    "LABEL_RE",
    "MAX_RANGE_DAYS",
    "Dataset",
    "Label",
    "PartitionItem",
    "PathStr",
    "Person",
    "PlanValueError",
    "Role",
    "SqlName",
    "Text",
    "UtcBound",
    "split_partition",
    "utc_moment",
]

# A date window longer than this is never materialised partition by partition (the guard
# reports it as too large from its length alone).
MAX_RANGE_DAYS = 3660

_ROLE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")
# a fraction of a second with a non-zero digit past the microsecond (Spark's precision)
SUB_MICROSECOND_RE = re.compile(r":[0-9]{2}[.,][0-9]{6}[0-9]*[1-9]")


BOUND_YEARS = (1900, 9998)  # window bounds, in UTC


class PlanValueError(ValueError):
    """Raised by a plan validator; ``fix`` says what to write instead."""

    def __init__(self, message: str, fix: str = "") -> None:
        super().__init__(message)
        self.fix = fix


# said of text holding characters that make the printed plan lie about what it holds
HIDDEN_TEXT = ("contains a control character (or an invisible format or separator character "
               "such as U+202E)")


def _plain_text(value: str) -> str:
    if has_control(value, allow="\n\t"):
        raise PlanValueError(HIDDEN_TEXT, "write plain text")
    return value


def _identifier(value: str) -> str:
    quote_identifier(value)  # raises UnsafeSQLError (a ValueError) with the reason
    if "." in value:
        raise PlanValueError(f"column name {value!r} must not contain '.'",
                             "name one column (letters, digits, '_')")
    return value


def _dataset(value: str) -> str:
    TableRef.parse(value)  # raises UnsafeSQLError with the reason
    return value


def _path(value: str) -> str:
    fix = "give an absolute path or a URI (s3://, abfss://, dbfs:/ ...)"
    if not value.startswith(("/", "./", "../", "dbfs:")) and "://" not in value:
        try:  # not parsed as a table name: it would be told to use letters and digits
            TableRef.parse(value)
        except UnsafeSQLError:
            raise PlanValueError(f"{value!r} is not a path or a URI", fix) from None
        raise PlanValueError(f"{value!r} is a table name, not a path", fix)
    TableRef.parse(value)
    return value


LABEL_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")  # a target's label: names shadows, views


def _label(value: str) -> str:
    if not LABEL_RE.fullmatch(value):
        raise PlanValueError(f"{value!r} is not a plain name",
                             "use letters, digits and '_' (it names shadow tables and views)")
    return value


def _role(value: str) -> str:
    if not _ROLE_RE.fullmatch(value):
        raise PlanValueError(f"role {value!r} is not a plain role name",
                             "use letters, digits, '_', '.', '@' or '-' (at most 64)")
    return value


def _person(value: str) -> str:
    value = value.strip()
    if not value or len(value) > 200 or has_control(value):
        raise PlanValueError("is empty, longer than 200 characters or has control characters",
                             "give a plain name or e-mail address")
    return value


def _utc_bound(value: object) -> object:
    """Window bounds: an ISO-8601 timestamp or a date; naive means UTC; stored as aware UTC."""
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        moment = value
    elif isinstance(value, dt.date):
        moment = dt.datetime(value.year, value.month, value.day)
    elif isinstance(value, str):
        text = value.strip()
        if SUB_MICROSECOND_RE.search(text):
            raise PlanValueError(
                "is finer than a microsecond (Spark timestamps hold microseconds; the extra "
                "digits would be dropped, moving the bound)",
                "give the bound to the microsecond, at most 6 digits after the second")
        try:
            moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            raise PlanValueError(
                "is not an ISO-8601 UTC timestamp",
                "write it like 2026-05-01T00:00:00Z (or a date, 2026-05-01)") from None
    else:
        raise PlanValueError("is not a timestamp",
                             "write it like \"2026-05-01T00:00:00Z\" (quoted) or 2026-05-01")
    return utc_moment(moment)


def utc_moment(moment: dt.datetime) -> dt.datetime:
    """``moment`` as aware UTC (naive means UTC); PlanValueError outside :data:`BOUND_YEARS`,
    so window arithmetic (a day or an hour past the end) cannot overflow."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    try:
        utc: dt.datetime | None = moment.astimezone(dt.UTC)
    except OverflowError:
        utc = None
    lo, hi = BOUND_YEARS
    if utc is None or not lo <= utc.year <= hi:
        raise PlanValueError(f"is outside the years {lo} to {hi} (UTC)",
                             f"give a bound from {lo}-01-01 to {hi}-12-31")
    return utc


def _partition_item(value: object) -> object:
    if isinstance(value, bool):
        raise PlanValueError("partition value is true/false: YAML reads an unquoted yes, no, "
                             "on, off, true or false as a boolean",
                             "quote it ('NO'), or write 'column=value'")
    if not isinstance(value, str | int | dt.date):
        raise PlanValueError(f"partition value of type {type(value).__name__} is not allowed",
                             "write 'column=value', a date, a string or an integer")
    if isinstance(value, dt.datetime):
        raise PlanValueError("partition value is a timestamp, not a date",
                             "daily partitions are dates: write 2026-05-01")
    if isinstance(value, str) and not value.strip():
        raise PlanValueError("partition value is empty", "remove it or fill it in")
    if isinstance(value, str):
        _plain_text(value)
    return value


def _not_bool(value: object) -> object:
    if isinstance(value, bool):  # pydantic would read true as 1
        raise PlanValueError("is true/false, not a number",
                             "write a number (true and false are for yes/no fields)")
    return value


NotBool = BeforeValidator(_not_bool)
SqlName = Annotated[str, Field(min_length=1, max_length=128), AfterValidator(_identifier)]
Dataset = Annotated[str, Field(min_length=1, max_length=1000), AfterValidator(_dataset)]
PathStr = Annotated[str, Field(min_length=1, max_length=1000), AfterValidator(_path)]
Label = Annotated[str, Field(min_length=1, max_length=64), AfterValidator(_label)]
Role = Annotated[str, AfterValidator(_role)]
Person = Annotated[str, AfterValidator(_person)]
Text = Annotated[str, Field(max_length=4000), AfterValidator(_plain_text)]
UtcBound = Annotated[dt.datetime | None, BeforeValidator(_utc_bound)]
PartitionItem = Annotated[str | int | dt.date, BeforeValidator(_partition_item)]


def split_partition(raw: object) -> tuple[str | None, object]:
    """``"event_date=2026-05-01"`` -> ``("event_date", "2026-05-01")``; other values unchanged.

    Only a plain column name before the first ``=`` counts as a prefix, so a string value that
    merely contains ``=`` is kept whole. The value is kept as written, spaces included (a string
    partition ``'US '`` is not ``'US'``).
    """
    if isinstance(raw, str) and "=" in raw:
        col, value = raw.split("=", 1)
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", col.strip()):
            return col.strip(), value
    return None, raw


class _Frozen(BaseModel):
    """Frozen, unknown keys rejected; a blank string in an optional field means "not set"."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_enum_values=False)

    @model_validator(mode="before")
    @classmethod
    def _blank_is_unset(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        out = dict(data)
        for key, value in data.items():
            field = cls.model_fields.get(key) if isinstance(key, str) else None
            if field is not None and field.default is None and isinstance(value, str) \
                    and not value.strip():
                out[key] = None
        return out



# Fields added after plans were approved: left out of the fingerprint while at their default,
# so a plan that loaded before they existed keeps its fingerprint (and its approvals).
ADDED_LATER: dict[str, JsonValue] = {"added_later": True}
