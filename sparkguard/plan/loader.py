"""Load a plan from YAML into models, collecting every problem before failing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from sparkguard.errors import PlanError, PlanProblem
from sparkguard.plan.model import ApprovalRecord, BackfillPlan, PlanDocument

__all__ = ["approvals_path", "load_plan", "load_plan_text", "problems_from_validation"]

MAX_PLAN_BYTES = 1_000_000


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys instead of keeping the last one."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: set[object] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping  # type: ignore[arg-type]
)

_FIXES = {
    "extra_forbidden": "remove it or check its spelling against templates/backfill-plan.yaml",
    "missing": "add it (see templates/backfill-plan.yaml)",
    "enum": "use one of the listed values",
    "literal_error": "use one of the listed values",
}


def _yaml_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            # union members show up as type names in pydantic's loc; they are not YAML keys
            if part in ("str", "TargetSpec", "function-after[_v_targets(), list[union[str,TargetSpec]]]"):
                continue
            if part.startswith(("function-", "union[")):
                continue
            out += ("." if out else "") + part
    return out


def problems_from_validation(exc: ValidationError) -> list[PlanProblem]:
    """One PlanProblem per pydantic error, with YAML paths and a fix."""
    problems: list[PlanProblem] = []
    seen: set[tuple[str, str]] = set()
    for err in exc.errors(include_url=False):
        path = _yaml_path(tuple(err["loc"]))
        msg = str(err["msg"]).removeprefix("Value error, ")
        key = (path, msg)
        if key in seen:
            continue
        seen.add(key)
        value = err.get("input") if err["type"] != "missing" else None
        if isinstance(value, dict | list):
            value = None
        problems.append(PlanProblem(path, msg, value, _FIXES.get(err["type"], "")))
    return problems


def approvals_path(plan_path: str | Path) -> Path:
    """Where ``sparkguard approve`` records approvals: ``<plan>.approvals.yaml`` beside it."""
    p = Path(plan_path)
    return p.with_name(p.name + ".approvals.yaml")


def load_plan_text(text: str, source: str = "<plan>") -> BackfillPlan:
    """Parse and validate plan YAML text; raise PlanError listing every problem."""
    if len(text.encode("utf-8", "replace")) > MAX_PLAN_BYTES:
        raise PlanError(source, [PlanProblem("backfill_plan", "plan file is larger than 1 MB",
                                             fix="a plan is a short YAML document")])
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise PlanError(source, [PlanProblem("backfill_plan", f"not valid YAML{where}: {problem}",
                                             fix="fix the YAML syntax")]) from None
    if not isinstance(data, dict) or "backfill_plan" not in data:
        raise PlanError(source, [PlanProblem(
            "backfill_plan", "the document has no top-level 'backfill_plan:' mapping",
            fix="start the file with 'backfill_plan:' as in templates/backfill-plan.yaml")])
    try:
        return PlanDocument.model_validate(data).backfill_plan
    except ValidationError as exc:
        raise PlanError(source, problems_from_validation(exc)) from None


def _sidecar_approvals(path: Path) -> list[ApprovalRecord]:
    side = approvals_path(path)
    if not side.exists():
        return []
    try:
        data = yaml.safe_load(side.read_text(encoding="utf-8")) or {}
        return [ApprovalRecord.model_validate(r) for r in data.get("approvals", [])]
    except (yaml.YAMLError, ValidationError, AttributeError) as exc:
        raise PlanError(str(side), [PlanProblem(
            "approvals", f"approvals file is malformed: {exc}".splitlines()[0],
            fix="delete it and record approvals again with 'sparkguard approve'")]) from None


def load_plan(path: str | Path) -> BackfillPlan:
    """Load a plan file and merge in the approvals recorded beside it."""
    p = Path(path)
    if not p.is_file():
        raise PlanError(str(path), [PlanProblem("backfill_plan", "plan file not found",
                                                fix="pass the path of an existing plan YAML")])
    plan = load_plan_text(p.read_text(encoding="utf-8"), str(path))
    extra = _sidecar_approvals(p)
    if extra:
        approvals = plan.approvals.model_copy(update={"granted": [*plan.approvals.granted, *extra]})
        plan = plan.model_copy(update={"approvals": approvals})
    return plan
