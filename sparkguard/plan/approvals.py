"""Approvals bound to the plan fingerprint: record them, and check that a plan is approved.

An approval is a record ``{role, by, at, fingerprint}`` in ``<plan>.approvals.yaml`` beside
the plan. It counts only while the plan's fingerprint is unchanged, so any edit of meaning
(including the list of required roles) needs fresh approvals.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml
from pydantic import ValidationError

from sparkguard.errors import PlanError, PlanProblem
from sparkguard.plan.fingerprint import fingerprint
from sparkguard.plan.loader import approvals_path, load_plan, problems_from_validation, read_sidecar
from sparkguard.plan.model import ApprovalRecord, BackfillPlan

__all__ = ["approval_issues", "approval_problems", "record_approval", "valid_approvals"]

_P = "backfill_plan.approvals"


def _same_person(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and a.strip().casefold() == b.strip().casefold()


def valid_approvals(plan: BackfillPlan) -> list[ApprovalRecord]:
    """Approvals of a required role that match this plan's current fingerprint."""
    fp = fingerprint(plan)
    required = set(plan.approvals.required)
    return [a for a in plan.approvals.granted if a.fingerprint == fp and a.role in required]


def approval_issues(plan: BackfillPlan) -> list[tuple[str, PlanProblem]]:
    """Why this plan is not approved to run, as ``(rule code, problem)``; empty: it is.

    Codes: ``approvals_undefined`` (no required roles), ``approval_stale`` (the role approved
    an earlier version), ``approvals_missing`` (never approved), ``owner_self_approval``.
    """
    required = plan.approvals.required
    if not required:
        return [("approvals_undefined", PlanProblem(
            f"{_P}.required", "no approval roles are required",
            fix="list at least one role that must approve the backfill"))]
    fp = fingerprint(plan)
    valid = valid_approvals(plan)
    have = {a.role for a in valid}
    stale = {a.role for a in plan.approvals.granted if a.fingerprint != fp}
    issues: list[tuple[str, PlanProblem]] = []
    for role in required:
        if role in have:
            continue
        fix = f"run: sparkguard approve PLAN --role {role} --by NAME (fingerprint {fp[:12]})"
        if role in stale:
            issues.append(("approval_stale", PlanProblem(
                f"{_P}.granted", f"role {role!r} approved an earlier version of this plan; "
                "the plan changed since", fix=fix)))
        else:
            issues.append(("approvals_missing", PlanProblem(
                f"{_P}.granted", f"role {role!r} has not approved this plan", fix=fix)))
    if not issues and not plan.approvals.owner_may_self_approve and plan.owner \
            and all(_same_person(a.by, plan.owner) for a in valid):
        issues.append(("owner_self_approval", PlanProblem(
            f"{_P}.granted", f"the owner {plan.owner!r} is the only approver",
            fix="have someone other than the owner approve at least one required role "
                "(or set approvals.owner_may_self_approve: true deliberately)")))
    return issues


def approval_problems(plan: BackfillPlan) -> list[PlanProblem]:
    """:func:`approval_issues` without the rule codes."""
    return [p for _, p in approval_issues(plan)]


@contextmanager
def _locked(side: Path) -> Iterator[None]:
    """Serialise concurrent ``approve`` calls on one plan (read-modify-write of the sidecar)."""
    lock = side.with_name(side.name + ".lock")
    fd = os.open(lock, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def record_approval(plan_path: str | Path, role: str, by: str,
                    now: dt.datetime | None = None) -> ApprovalRecord:
    """Append an approval for the plan's current fingerprint to ``<plan>.approvals.yaml``.

    Refuses (PlanError, nothing written) a role the plan does not require, an empty or odd
    approver name, and a plan the static guard still blocks for reasons other than approvals.
    """
    from sparkguard.guard import approvable_findings

    plan = load_plan(plan_path)
    source = str(plan_path)
    if role not in plan.approvals.required:
        raise PlanError(source, [PlanProblem(
            f"{_P}.required", f"role {role!r} is not a required role", value=role,
            fix=f"use one of {plan.approvals.required}" if plan.approvals.required
            else "list the role under approvals.required first")])
    try:
        record = ApprovalRecord(role=role, by=by, fingerprint=fingerprint(plan),
                                at=now or dt.datetime.now(dt.UTC))
    except ValidationError as exc:
        raise PlanError(source, [PlanProblem("--by", p.message, by, p.fix)
                                 for p in problems_from_validation(exc)]) from None
    blocks = approvable_findings(plan)
    if blocks:
        raise PlanError(source, [f.as_problem() for f in blocks] + [PlanProblem(
            "backfill_plan", "the plan is not complete enough to approve",
            fix="fix the problems above, run 'sparkguard guard', then approve")])
    side = approvals_path(plan_path)
    with _locked(side):
        existing = [r.model_dump(mode="json") for r in read_sidecar(plan_path)]
        existing.append(record.model_dump(mode="json"))
        fd, tmp = tempfile.mkstemp(dir=side.parent, prefix=".approvals.")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            yaml.safe_dump({"approvals": existing}, fh, sort_keys=False)
        os.replace(tmp, side)
    return record
