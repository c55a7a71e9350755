"""``sparkguard approve``: record an approval once the guard says the plan can be approved.

Sits above :mod:`sparkguard.guard` and :mod:`sparkguard.plan.approvals`, so that the plan
layer never imports the guard.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from sparkguard.errors import PlanError, PlanProblem
from sparkguard.guard import approvable_findings
from sparkguard.plan.approvals import append_approval, new_approval
from sparkguard.plan.loader import load_plan
from sparkguard.plan.model import ApprovalRecord

__all__ = ["record_approval"]


def record_approval(plan_path: str | Path, role: str, by: str,
                    now: dt.datetime | None = None) -> ApprovalRecord:
    """Append an approval for the plan's current fingerprint (and its canonical content) to
    ``<plan>.approvals.yaml``.

    Refuses (PlanError, nothing written) a role the plan does not require, an empty or odd
    approver name, and a plan the static guard still blocks for reasons other than approvals.
    """
    plan = load_plan(plan_path)
    source = str(plan_path)
    record = new_approval(plan, source, role, by, now)
    blocks = approvable_findings(plan)
    if blocks:
        raise PlanError(source, [f.as_problem() for f in blocks] + [PlanProblem(
            "backfill_plan", "the plan is not complete enough to approve",
            fix="fix the problems above, run 'sparkguard guard', then approve")])
    append_approval(plan_path, record)
    return record
