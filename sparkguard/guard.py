"""The guard's static red flags (no Spark): everything a plan must say before it can run.

Each rule has a stable code (see :data:`RULES`); :func:`static_findings` returns every finding
with its severity. ``BLOCK`` stops ``guard`` (exit 2), ``approve`` and ``run``; ``WARN`` and
``INFO`` are reported. Self-declared claims in the plan (``dry_run_completed``,
``publish_paused``, ``status.state``) are never taken as proof: they are reported as INFO and
sparkguard establishes the facts itself (ledger, publish control table).

This module runs the rule groups; the window rules are in ``guard_window_rules``, the check
rules in ``guard_checks``, the path and name rules in ``guard_paths``, and the finding record
with the rule table in ``guard_findings``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from sparkguard.guard_checks import check_rules
from sparkguard.guard_findings import (
    APPROVAL_CODES,
    RULES,
    Collector,
    Finding,
    P,
    Severity,
    blocking,
    render_findings,
    to_fill,
)
from sparkguard.guard_paths import allowed_roots, outside_roots, target_rules
from sparkguard.guard_window_rules import window_rules
from sparkguard.plan.approvals import approval_issues
from sparkguard.plan.model import BackfillPlan, ExecutionMode, Promotion
from sparkguard.plan.window import target_order, window_partitions  # re-exported

__all__ = ["RULES", "Finding", "Severity", "allowed_roots", "approvable_findings", "blocking",
           "draft_notice", "live_checks_possible", "outside_roots", "pre_approval_findings",
           "render_findings", "static_findings", "target_order", "to_fill", "window_partitions"]


def draft_notice(plan: BackfillPlan) -> str | None:
    """A line saying that a plan in the seed template's shape loaded as a draft, or None."""
    bare = [t for t in plan.targets if isinstance(t, str)]
    windowed = plan.partitioning is not None or plan.window_column is not None
    if not bare and windowed:
        return None
    lacks = []
    if not windowed:
        lacks.append("partitioning")
    if bare:
        lacks.append(f"{len(bare)} target(s) as bare names (no business_keys or transform)")
    return ("loaded as a draft in the seed template's shape: it lacks " + " and ".join(lacks)
            + ", which execution needs; the findings below list everything it still lacks")


def _completeness(plan: BackfillPlan, c: Collector) -> None:
    for field, value in (("name", plan.name), ("owner", plan.owner), ("reason", plan.reason),
                         ("source_of_truth.system", plan.source_of_truth.system),
                         ("source_of_truth.dataset", plan.source_of_truth.dataset),
                         ("execution.mode", plan.execution.mode),
                         ("execution.write_strategy", plan.execution.write_strategy)):
        if value is None:
            c.add("template_incomplete", field, "is missing", "fill it in as the template shows",
                  unfilled=True)
    if not plan.targets:
        c.add("template_incomplete", "targets", "no targets", "list at least one target",
              unfilled=True)


def _safeguards(plan: BackfillPlan, c: Collector) -> None:
    if plan.safeguards.publish_paused is not True:
        c.add("publish_not_paused", "safeguards.publish_paused",
              "publish must be paused for the duration of the backfill",
              "set publish_paused: true (sparkguard pauses and records it in its control table)",
              unfilled=plan.safeguards.publish_paused is None)
    if not plan.safeguards.downstream_notifications:
        c.add("no_notifications", "safeguards.downstream_notifications",
              "no downstream owner will be told that publish is paused",
              "list the downstream owners", unfilled=True)
    if plan.safeguards.rollback_strategy is None:
        c.add("rollback_missing", "safeguards.rollback_strategy", "no rollback strategy",
              "describe the rollback (sparkguard records the Delta version to RESTORE)",
              unfilled=True)
    if plan.execution.idempotent is not True:
        c.add("not_idempotent", "execution.idempotent",
              "the write strategy is not declared idempotent",
              "set idempotent: true; sparkguard proves it by writing the proof slice twice",
              unfilled=plan.execution.idempotent is None)
    if not plan.execution.proof_slice:
        c.add("no_proof_slice", "execution.proof_slice",
              "a one-slice proof before the full window is mandatory", "set proof_slice: true")



def _claims(plan: BackfillPlan, c: Collector) -> None:
    if plan.status.state != "draft":
        c.add("claim_untrusted", "status.state",
              f"status.state {plan.status.state!r} is informational; the approvals for this "
              "fingerprint and the run ledger decide")
    if plan.execution.dry_run_completed:
        c.add("claim_untrusted", "execution.dry_run_completed",
              "dry_run_completed is a claim; sparkguard runs its own proof slice and records "
              "dry runs in its ledger")
    if plan.safeguards.publish_paused:
        c.add("claim_untrusted", "safeguards.publish_paused",
              "publish_paused is an intent; sparkguard pauses publish itself in its control "
              "table before writing")


_SAYS_MERGE = re.compile(r"(?i)\b(merge|upsert)")
_SAYS_REPLACE = re.compile(r"(?i)(replace[ _-]?where|\breplace|\boverwrite|\brewrite)")


def _seed_text(plan: BackfillPlan, c: Collector) -> None:
    """The seed's free-text fields describe the write; they must not contradict how the
    targets are really promoted (``promotion``, default replace_where)."""
    specs = plan.target_specs()
    if not specs:
        return
    promos = {t.promotion for t in specs}
    actual = " and ".join(sorted(p.value for p in promos))
    if Promotion.MERGE_CHANGED in promos:  # a merge too, as far as the seed's words go
        promos = promos | {Promotion.MERGE}
    defaulted = " (the default when promotion is not set)" if Promotion.REPLACE_WHERE in promos \
        else ""
    mode = plan.execution.mode
    if mode is ExecutionMode.MERGE and Promotion.MERGE not in promos:
        c.add("seed_text_contradicts", "execution.mode",
              f"mode says merge, but the targets are promoted by {actual}{defaulted}: the "
              "window's partitions are replaced, not merged",
              "set promotion: merge on the targets to merge, or set mode: replay")
    elif mode is ExecutionMode.OVERWRITE and Promotion.REPLACE_WHERE not in promos:
        c.add("seed_text_contradicts", "execution.mode",
              f"mode says overwrite, but the targets are promoted by {actual}",
              "set promotion: replace_where, or set mode: merge")
    text = plan.execution.write_strategy or ""
    merge, replace = bool(_SAYS_MERGE.search(text)), bool(_SAYS_REPLACE.search(text))
    if merge and not replace and Promotion.MERGE not in promos:
        c.add("seed_text_contradicts", "execution.write_strategy",
              f"write_strategy {text[:60]!r} describes a merge, but the targets are promoted by "
              f"{actual}{defaulted}",
              "set promotion: merge on the targets to merge, or describe the replaceWhere write")
    elif replace and not merge and Promotion.REPLACE_WHERE not in promos:
        c.add("seed_text_contradicts", "execution.write_strategy",
              f"write_strategy {text[:60]!r} describes a replacement, but the targets are "
              f"promoted by {actual}",
              "set promotion: replace_where, or describe the MERGE write")


def _approvals(plan: BackfillPlan, c: Collector) -> None:
    for code, prob in approval_issues(plan):
        c.add(code, prob.path.removeprefix(f"{P}."), prob.message, prob.fix)


_RULE_GROUPS: tuple[Callable[[BackfillPlan, Collector], None], ...] = (
    _completeness, window_rules, _safeguards, check_rules, target_rules, _seed_text, _claims)


def static_findings(plan: BackfillPlan, *, check_approvals: bool = True) -> list[Finding]:
    """Every static red flag of the seed checklist, plus what execution needs."""
    c = Collector()
    for rule in _RULE_GROUPS:
        rule(plan, c)
    if check_approvals:
        _approvals(plan, c)
    return c.findings


def pre_approval_findings(plan: BackfillPlan) -> list[Finding]:
    """What ``guard --pre-approval`` checks: everything but granted approvals; an empty
    ``approvals.required`` is reported as a field still to fill in."""
    c = Collector()
    for rule in _RULE_GROUPS:
        rule(plan, c)
    if not plan.approvals.required:
        c.add("approvals_undefined", "approvals.required", "no approval roles are required",
              "list at least one role that must approve the backfill", unfilled=True)
    return c.findings


# Fields the live checks need: while one of them is still empty they cannot run.
_LIVE_NEEDS = ("partitioning", "window_column", "affected_window", "source_of_truth.dataset", "targets")


def live_checks_possible(findings: Sequence[Finding]) -> bool:
    """True when nothing blocks but empty fields the live checks do not read."""
    for f in blocking(findings):
        field = f.path.removeprefix(f"{P}.")
        if not f.unfilled or (field.startswith(_LIVE_NEEDS) and not field.startswith("targets[")):
            return False
    return True


def approvable_findings(plan: BackfillPlan) -> list[Finding]:
    """Blocking findings other than approvals: a plan with any cannot be approved yet."""
    return [f for f in blocking(static_findings(plan, check_approvals=False))
            if f.code not in APPROVAL_CODES]
