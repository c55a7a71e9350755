"""Approvals bound to the plan fingerprint: record them, and check that a plan is approved.

An approval is a record ``{role, by, at, fingerprint}`` in ``<plan>.approvals.yaml`` beside
the plan. It counts only while the plan's fingerprint is unchanged, so any edit of meaning
(including the list of required roles) needs fresh approvals.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import fcntl
import hashlib
import json
import os
import tempfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from sparkguard.errors import PlanError, PlanProblem
from sparkguard.plan.fingerprint import canonical_content, fingerprint
from sparkguard.plan.loader import (
    MAX_PLAN_BYTES,
    approvals_path,
    problems_from_validation,
    read_sidecar,
)
from sparkguard.plan.model import ApprovalRecord, BackfillPlan

__all__ = ["append_approval", "approval_issues", "approval_problems", "approved_content",
           "changes_since", "new_approval", "valid_approvals"]

_P = "backfill_plan.approvals"
_MAX_CHANGES = 8
_MAX_CONTENT = 4 * MAX_PLAN_BYTES  # a plan's canonical content is never larger


def _same_person(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and a.strip().casefold() == b.strip().casefold()


def valid_approvals(plan: BackfillPlan) -> list[ApprovalRecord]:
    """Approvals of a required role that match this plan's current fingerprint."""
    fp = fingerprint(plan)
    required = set(plan.approvals.required)
    return [a for a in plan.approvals.granted if a.fingerprint == fp and a.role in required]


def approved_content(record: ApprovalRecord) -> dict[str, Any] | None:
    """The canonical content an approval was given for, or None when the record predates
    recorded content or its content does not hash to its fingerprint."""
    if not record.content:
        return None
    try:
        inflate = zlib.decompressobj()
        raw = inflate.decompress(base64.b64decode(record.content, validate=True), _MAX_CONTENT)
        if inflate.unconsumed_tail:
            return None  # larger than any plan's content
        text = raw.decode("ascii")
    except (binascii.Error, zlib.error, UnicodeDecodeError):
        return None
    if hashlib.sha256(text.encode("ascii")).hexdigest() != record.fingerprint:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _show(value: Any) -> str:
    text = "(absent)" if value is _ABSENT else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


_ABSENT = object()


def _diff(old: Any, new: Any, path: str, out: list[str]) -> None:
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new)):
            _diff(old.get(key, _ABSENT), new.get(key, _ABSENT), f"{path}.{key}" if path else key,
                  out)
    elif isinstance(old, list) and isinstance(new, list):
        for i in range(max(len(old), len(new))):
            _diff(old[i] if i < len(old) else _ABSENT, new[i] if i < len(new) else _ABSENT,
                  f"{path}[{i}]", out)
    elif old != new or type(old) is not type(new):
        out.append(f"{path}: {_show(old)} -> {_show(new)}")


def changes_since(record: ApprovalRecord, plan: BackfillPlan) -> list[str] | None:
    """``path: old -> new`` for every field changed since ``record`` was given (paths below
    ``backfill_plan``), or None when the record does not carry the approved content."""
    old = approved_content(record)
    if old is None:
        return None
    out: list[str] = []
    _diff(old, json.loads(canonical_content(plan)), "", out)
    return out


def _stale_message(role: str, records: list[ApprovalRecord], plan: BackfillPlan) -> str:
    latest = max(records, key=lambda r: r.at)
    head = f"role {role!r} approved an earlier version of this plan"
    changes = changes_since(latest, plan)
    if changes is None:
        return (f"{head}; the plan changed since (that approval does not record the approved "
                "content, so the changed fields cannot be listed)")
    more = f"; and {len(changes) - _MAX_CHANGES} more" if len(changes) > _MAX_CHANGES else ""
    return f"{head}; changed since: " + "; ".join(changes[:_MAX_CHANGES]) + more


def approval_issues(plan: BackfillPlan) -> list[tuple[str, PlanProblem]]:
    """Why this plan is not approved to run, as ``(rule code, problem)``; empty: it is.

    Codes: ``approvals_undefined`` (no required roles), ``approval_stale`` (the role approved
    an earlier version; the message lists the fields changed since, from what to what),
    ``approvals_missing`` (never approved), ``owner_self_approval``.
    """
    required = plan.approvals.required
    if not required:
        return [("approvals_undefined", PlanProblem(
            f"{_P}.required", "no approval roles are required",
            fix="list at least one role that must approve the backfill"))]
    fp = fingerprint(plan)
    valid = valid_approvals(plan)
    have = {a.role for a in valid}
    stale: dict[str, list[ApprovalRecord]] = {}
    for a in plan.approvals.granted:
        if a.fingerprint != fp:
            stale.setdefault(a.role, []).append(a)
    issues: list[tuple[str, PlanProblem]] = []
    for role in required:
        if role in have:
            continue
        fix = f"run: sparkguard approve PLAN --role {role} --by NAME (fingerprint {fp[:12]})"
        if role in stale:
            issues.append(("approval_stale", PlanProblem(
                f"{_P}.granted", _stale_message(role, stale[role], plan), fix=fix)))
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


def new_approval(plan: BackfillPlan, source: str, role: str, by: str,
                 now: dt.datetime | None = None) -> ApprovalRecord:
    """An approval record for the plan's current fingerprint and content; refuses (PlanError)
    a role the plan does not require and an empty or odd approver name.

    It does not check that the plan is complete enough to approve: the guard does that
    (:func:`sparkguard.approve.record_approval` runs both).
    """
    if role not in plan.approvals.required:
        raise PlanError(source, [PlanProblem(
            f"{_P}.required", f"role {role!r} is not a required role", value=role,
            fix=f"use one of {plan.approvals.required}" if plan.approvals.required
            else "list the role under approvals.required first")])
    content = canonical_content(plan)
    try:
        return ApprovalRecord(
            role=role, by=by, fingerprint=fingerprint(plan), at=now or dt.datetime.now(dt.UTC),
            content=base64.b64encode(zlib.compress(content.encode("ascii"), 9)).decode("ascii"))
    except ValidationError as exc:
        raise PlanError(source, [PlanProblem("--by", p.message, by, p.fix)
                                 for p in problems_from_validation(exc)]) from None


def append_approval(plan_path: str | Path, record: ApprovalRecord) -> None:
    """Append ``record`` to ``<plan>.approvals.yaml`` (serialised against concurrent calls,
    replaced atomically)."""
    side = approvals_path(plan_path)
    with _locked(side):
        existing = [r.model_dump(mode="json", exclude_none=True) for r in read_sidecar(plan_path)]
        existing.append(record.model_dump(mode="json", exclude_none=True))
        fd, tmp = tempfile.mkstemp(dir=side.parent, prefix=".approvals.")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            yaml.safe_dump({"approvals": existing}, fh, sort_keys=False, width=120)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # as a plain new file: readable by a run under another user
        os.replace(tmp, side)
