"""Approvals bound to the plan fingerprint: record them, and check that a plan is approved."""

from __future__ import annotations

import datetime as dt
import os
import tempfile
from pathlib import Path

import yaml

from sparkguard.errors import PlanError, PlanProblem
from sparkguard.plan.fingerprint import fingerprint
from sparkguard.plan.loader import approvals_path, load_plan
from sparkguard.plan.model import ApprovalRecord, BackfillPlan

__all__ = ["approval_problems", "record_approval", "valid_approvals"]


def valid_approvals(plan: BackfillPlan) -> list[ApprovalRecord]:
    """Approvals that match this plan's current fingerprint."""
    fp = fingerprint(plan)
    return [a for a in plan.approvals.granted if a.fingerprint == fp]


def approval_problems(plan: BackfillPlan) -> list[PlanProblem]:
    """Why this plan is not approved to run (empty list: it is)."""
    problems: list[PlanProblem] = []
    required = plan.approvals.required
    if not required:
        problems.append(PlanProblem(
            "backfill_plan.approvals.required", "no approval roles are required",
            fix="list at least one role that must approve the backfill"))
        return problems
    fp = fingerprint(plan)
    valid = valid_approvals(plan)
    stale = {a.role for a in plan.approvals.granted if a.fingerprint != fp}
    have = {a.role for a in valid}
    for role in required:
        if role in have:
            continue
        if role in stale:
            msg = f"role {role!r} approved an earlier version of this plan; the plan changed since"
        else:
            msg = f"role {role!r} has not approved this plan"
        problems.append(PlanProblem(
            "backfill_plan.approvals.granted", msg,
            fix=f"run: sparkguard approve PLAN --role {role} --by NAME (fingerprint {fp[:12]})"))
    if not problems and not plan.approvals.owner_may_self_approve and plan.owner:
        approvers = {a.by for a in valid if a.role in required}
        if approvers == {plan.owner}:
            problems.append(PlanProblem(
                "backfill_plan.approvals.granted",
                f"the owner {plan.owner!r} is the only approver",
                fix="have someone other than the owner approve at least one required role"))
    return problems


def record_approval(plan_path: str | Path, role: str, by: str,
                    now: dt.datetime | None = None) -> ApprovalRecord:
    """Append an approval for the plan's current fingerprint to ``<plan>.approvals.yaml``."""
    plan = load_plan(plan_path)
    source = str(plan_path)
    if role not in plan.approvals.required:
        raise PlanError(source, [PlanProblem(
            "backfill_plan.approvals.required", f"role {role!r} is not a required role",
            value=role, fix=f"use one of {plan.approvals.required}")])
    if not by or not by.strip() or any(ord(c) < 32 for c in by):
        raise PlanError(source, [PlanProblem("--by", "approver name is empty or has control "
                                             "characters", value=by, fix="give a plain name")])
    record = ApprovalRecord(role=role, by=by.strip(), fingerprint=fingerprint(plan),
                            at=now or dt.datetime.now(dt.timezone.utc))
    side = approvals_path(plan_path)
    existing: list[dict[str, object]] = []
    if side.exists():
        existing = (yaml.safe_load(side.read_text(encoding="utf-8")) or {}).get("approvals", [])
    existing.append(record.model_dump(mode="json"))
    fd, tmp = tempfile.mkstemp(dir=side.parent, prefix=".approvals.")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        yaml.safe_dump({"approvals": existing}, fh, sort_keys=False)
    os.replace(tmp, side)
    return record
