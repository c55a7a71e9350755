"""Load a plan from YAML into models, collecting every problem before failing.

Every problem becomes one line ``file: backfill_plan.a.b: message (got 'v'); fix``.
"""

from __future__ import annotations

import datetime as dt
import difflib
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from sparkguard.errors import PlanError, PlanProblem
from sparkguard.plan.fields import HIDDEN_TEXT, SUB_MICROSECOND_RE
from sparkguard.plan.model import ApprovalRecord, BackfillPlan, PlanDocument, field_names
from sparkguard.sql import UnsafeSQLError, has_control

__all__ = ["MAX_PLAN_BYTES", "approvals_path", "load_plan", "load_plan_text", "parse_yaml",
           "problems_from_validation", "yaml_path"]

MAX_PLAN_BYTES = 1_000_000
TEMPLATE = "templates/backfill-plan.yaml"
_ROOT = "backfill_plan"


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate and unhashable mapping keys."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: set[object] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            duplicate = key in seen
            seen.add(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                None, None, "a mapping key is a list or mapping", key_node.start_mark) from None
        if duplicate:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _construct_timestamp(loader: _UniqueKeyLoader, node: yaml.ScalarNode) -> Any:
    """A YAML timestamp, refused when finer than a microsecond (PyYAML drops the digits)."""
    if SUB_MICROSECOND_RE.search(str(node.value)):
        raise yaml.constructor.ConstructorError(
            None, None, "a timestamp is finer than a microsecond; give at most 6 digits after "
            "the second", node.start_mark)
    return loader.construct_yaml_timestamp(node)


_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:timestamp", _construct_timestamp)

_DECIMAL_INT = re.compile(r"[-+]?(0|[1-9][0-9]*)")


def _construct_int(loader: _UniqueKeyLoader, node: yaml.ScalarNode) -> Any:
    """A YAML integer written in decimal; any other spelling YAML 1.1 reads as a number
    (``010`` octal 8, ``0x1F``, ``1_000``, ``1:30`` base 60) stays the text as written, so a
    partition ``010`` is never partition 8 and a string partition ``07`` stays ``'07'``."""
    if not _DECIMAL_INT.fullmatch(str(node.value)):
        return str(node.value)
    return loader.construct_yaml_int(node)


_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)

_FIXES = {
    "extra_forbidden": f"remove it or check its spelling against {TEMPLATE}",
    "missing": f"add it (see {TEMPLATE})",
    "enum": "use one of the listed values",
    "literal_error": "use one of the listed values",
    "greater_than_equal": "use a value in the allowed range",
    "less_than_equal": "use a value in the allowed range",
    "greater_than": "use a value in the allowed range",
    "less_than": "use a value in the allowed range",
    "too_short": "add at least one entry",
    "too_long": "shorten it",
    "string_too_short": "fill it in",
    "string_too_long": "shorten it",
    "string_pattern_mismatch": f"see the allowed form in {TEMPLATE}",
    "string_type": "write a plain string",
    "bool_type": "write true or false",
    "bool_parsing": "write true or false",
    "int_type": "write a whole number",
    "int_parsing": "write a whole number",
    "int_from_float": "write a whole number",
    "float_type": "write a number",
    "float_parsing": "write a number",
    "finite_number": "write a finite number",
    "list_type": "write a YAML list ('- item' lines)",
    "model_type": "write a mapping ('key: value' lines)",
    "dict_type": "write a mapping ('key: value' lines)",
    "datetime_type": "write a timestamp like 2026-05-01T00:00:00Z",
    "datetime_parsing": "write a timestamp like 2026-05-01T00:00:00Z",
    "datetime_from_date_parsing": "write a timestamp like 2026-05-01T00:00:00Z",
    "date_type": "write a date like 2026-05-01",
    "date_parsing": "write a date like 2026-05-01",
    "date_from_datetime_parsing": "write a date like 2026-05-01",
}
_MESSAGES = {
    "model_type": "must be a mapping",
    "dict_type": "must be a mapping",
    "list_type": "must be a list",
    "missing": "is required",
    "extra_forbidden": "is not a known field",
}
# Parts pydantic adds to an error location that are not YAML keys (union members, validators).
_INTERNAL_PART = re.compile(
    r"^(dataset-name|target-spec|str|int|float|bool|date|datetime|TargetSpec|"
    r"function-.*|constrained-.*|.*\[.*)$")


def yaml_path(loc: tuple[int | str, ...], keep_last: bool = False) -> str:
    """A pydantic error location as a YAML path, without pydantic's internal parts.

    ``('backfill_plan', 'targets', 0, 'target-spec', 'transform')`` becomes
    ``backfill_plan.targets[0].transform``.

    ``keep_last`` keeps the final part verbatim (it is the user's key of an unknown-field error).
    """
    out = ""
    for i, part in enumerate(loc):
        last = i == len(loc) - 1
        if isinstance(part, int):
            out += f"[{part}]"
        elif (keep_last and last) or not _INTERNAL_PART.match(part):
            out += ("." if out else "") + part
    return out


def _fix_for(err: Any) -> str:
    ctx = err.get("ctx") or {}
    exc = ctx.get("error")
    fix = getattr(exc, "fix", "")
    if fix:
        return str(fix)
    if isinstance(exc, UnsafeSQLError):
        text = str(exc)
        if str(err["loc"][-1]).endswith("_expr"):
            return "keep it to one expression over the row's columns"
        if "in backquotes" in text:  # a table's catalog name (sql.table_name_parts)
            return ("use letters, digits and '_' (up to catalog.schema.table; a part holding "
                    "'-' in backquotes, the value quoted: \"`my-workspace`.sales.orders\")")
        if "not a plain name" in text or "three parts" in text:
            return "use letters, digits and '_' only (tables: up to catalog.schema.table)"
        if text.startswith("path "):
            return "use a path without quotes, backquotes, backslashes or ';'"
        return f"see {TEMPLATE}"
    if err["type"] == "extra_forbidden":
        key = str(err["loc"][-1])
        if key in field_names():
            return "it is a field of another section: check its indentation"
        close = difflib.get_close_matches(key, sorted(field_names()), n=1, cutoff=0.75)
        if close:
            return f"did you mean '{close[0]}'? otherwise remove it"
    return _FIXES.get(err["type"], f"see {TEMPLATE}")


def problems_from_validation(exc: ValidationError) -> list[PlanProblem]:
    """One PlanProblem per pydantic error, with clean YAML paths, the bad value and a fix."""
    problems: list[PlanProblem] = []
    seen: set[tuple[str, str]] = set()
    for err in exc.errors(include_url=False):
        path = yaml_path(tuple(err["loc"]), keep_last=err["type"] == "extra_forbidden")
        msg = _MESSAGES.get(err["type"]) or str(err["msg"]).removeprefix("Value error, ")
        fix = _fix_for(err)
        if err["type"] == "model_type" and err["loc"][-1] == "target-spec":
            msg = "must be a dataset name or a target mapping"
            fix = "write a table name or path, or a mapping {dataset, business_keys, transform}"
        key = (path, msg)
        if key in seen:
            continue
        seen.add(key)
        value = err.get("input") if err["type"] != "missing" else None
        if isinstance(value, dict | list):
            value = None
        problems.append(PlanProblem(path, msg, value, fix))
    return problems


def approvals_path(plan_path: str | Path) -> Path:
    """Where ``sparkguard approve`` records approvals: ``<plan>.approvals.yaml`` beside it."""
    p = Path(plan_path)
    return p.with_name(p.name + ".approvals.yaml")


def _refuse(source: str, message: str, fix: str, path: str = _ROOT, value: object = None
            ) -> PlanError:
    return PlanError(source, [PlanProblem(path, message, value, fix)])


MAX_DEPTH = 32


def _prescan(text: str, source: str) -> None:
    """Refuse aliases (alias bombs) and absurd nesting from the event stream, before building
    any object; syntax errors are left to the real load, which reports their position."""
    depth = 0
    try:
        for ev in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(ev, yaml.AliasEvent):
                raise _refuse(source, "YAML anchors and aliases (&name / *name) are not allowed "
                              "in a plan", "write every value out in full")
            if isinstance(ev, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    raise _refuse(source, f"the YAML is nested deeper than {MAX_DEPTH} levels",
                                  "a plan is a shallow document")
            elif isinstance(ev, yaml.CollectionEndEvent):
                depth -= 1
    except yaml.YAMLError:
        return


def parse_yaml(text: str, source: str = "<plan>") -> Any:
    """YAML text -> Python data, refusing what a plan never needs (aliases, odd keys)."""
    if len(text.encode("utf-8", "replace")) > MAX_PLAN_BYTES:
        raise _refuse(source, "plan file is larger than 1 MB", "a plan is a short YAML document")
    _prescan(text, source)
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        fix = ("put a value starting with a backquote in quotes: dataset: "
               "\"`my-workspace`.sales.orders\"" if "'`'" in problem else "fix the YAML syntax")
        raise _refuse(source, f"not valid YAML{where}: {problem}", fix) from None
    except (ValueError, OverflowError) as exc:  # e.g. an unquoted 2026-13-45 timestamp
        raise _refuse(source, f"a value cannot be read: {exc}",
                      "quote dates and timestamps and check they exist") from None
    return data


_PLAIN = (str, int, float, bool, type(None), dict, list, dt.date)  # what YAML's plain tags give
_HIDDEN_FIX = ("write plain text; in SQL, spell such a character as an escape in a string "
               "literal ('\\u200B')")


def _document_problems(data: Any, path: str, out: list[PlanProblem]) -> None:
    """What no field of a plan holds, wherever it is: a key that is not a string (YAML turns
    ``on:``/``yes:`` into booleans, ``1:`` into ints), a value of another YAML tag (``!!binary``
    bytes, ``!!set``, ``!!omap``: a reviewer cannot read what runs), and text with characters
    that make the printed plan lie about what it holds (bidi overrides, zero-width spaces;
    newlines and tabs are plain)."""
    if isinstance(data, dict):
        for key, value in data.items():
            where = f"{path}.{key!s}" if path else str(key)
            if not isinstance(key, str):
                out.append(PlanProblem(where, f"key {key!r} is not a string", key,
                                       "quote the key or check its spelling"))
                continue
            if has_control(key, allow="\n\t"):
                out.append(PlanProblem(where, f"key {HIDDEN_TEXT}", None, _HIDDEN_FIX))
                continue
            _document_problems(value, where, out)
    elif isinstance(data, list):
        for i, item in enumerate(data):
            _document_problems(item, f"{path}[{i}]", out)
    elif isinstance(data, str):
        if has_control(data, allow="\n\t"):
            out.append(PlanProblem(path, HIDDEN_TEXT, None, _HIDDEN_FIX))
    elif not isinstance(data, _PLAIN):
        kind = "binary data (!!binary)" if isinstance(data, bytes) else \
            f"a YAML {type(data).__name__} (a !!set, !!omap or !!pairs tag)"
        out.append(PlanProblem(path, f"is {kind}", None,
                               "write the value as plain text, a list or a mapping"))


def load_plan_text(text: str, source: str = "<plan>") -> BackfillPlan:
    """Parse and validate plan YAML text; raise PlanError listing every problem."""
    data = parse_yaml(text, source)
    if not isinstance(data, dict) or _ROOT not in data:
        got = type(data).__name__ if not isinstance(data, dict) else f"keys {sorted(map(str, data))}"
        raise _refuse(source, f"the document has no top-level '{_ROOT}:' mapping (got {got})",
                      f"start the file with '{_ROOT}:' as in {TEMPLATE}")
    problems: list[PlanProblem] = []
    _document_problems(data, "", problems)
    if problems:
        raise PlanError(source, problems)
    try:
        return PlanDocument.model_validate(data).backfill_plan
    except ValidationError as exc:
        raise PlanError(source, problems_from_validation(exc)) from None


def _read_text(path: Path, source: str) -> str:
    try:
        if path.stat().st_size > MAX_PLAN_BYTES:
            raise _refuse(source, "file is larger than 1 MB", "a plan is a short YAML document")
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _refuse(source, f"file is not UTF-8 text (byte {exc.start})",
                      "save the plan as UTF-8") from None
    except OSError as exc:
        raise _refuse(source, f"file cannot be read: {exc.strerror}",
                      "check the path and its permissions") from None


def read_sidecar(plan_path: str | Path) -> list[ApprovalRecord]:
    """The approvals recorded beside the plan by ``sparkguard approve`` (validated)."""
    side = approvals_path(plan_path)
    if not side.exists():
        return []
    fix = "delete it and record approvals again with 'sparkguard approve'"
    data = parse_yaml(_read_text(side, str(side)), str(side))
    if data is None:
        return []
    if not isinstance(data, dict) or set(data) != {"approvals"} \
            or not isinstance(data["approvals"], list):
        raise _refuse(str(side), "approvals file must hold one key 'approvals:' with a list", fix,
                      path="approvals")
    records: list[ApprovalRecord] = []
    problems: list[PlanProblem] = []
    _document_problems(data, "", problems)
    if problems:
        raise PlanError(str(side), problems)
    for i, rec in enumerate(data["approvals"]):
        try:
            records.append(ApprovalRecord.model_validate(rec))
        except ValidationError as exc:
            for p in problems_from_validation(exc):
                problems.append(PlanProblem(f"approvals[{i}].{p.path}".rstrip("."), p.message,
                                            p.value, fix))
    if problems:
        raise PlanError(str(side), problems)
    return records


def load_plan(path: str | Path) -> BackfillPlan:
    """Load a plan file and merge in the approvals recorded beside it."""
    p = Path(path)
    if not p.is_file():
        raise _refuse(str(path), "plan file not found", "pass the path of an existing plan YAML")
    plan = load_plan_text(_read_text(p, str(path)), str(path))
    extra = read_sidecar(p)
    if extra:
        approvals = plan.approvals.model_copy(update={"granted": [*plan.approvals.granted, *extra]})
        plan = plan.model_copy(update={"approvals": approvals})
    return plan
