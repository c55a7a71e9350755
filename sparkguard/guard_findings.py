"""Guard findings: rule codes and severities, the finding record, rendering and filtering."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from sparkguard.errors import PlanProblem

__all__ = ["APPROVAL_CODES", "RULES", "Collector", "Finding", "P", "Severity", "blocking",
           "render_findings", "to_fill"]


class Severity(str, Enum):
    """BLOCK stops the run; WARN and INFO are reported."""

    BLOCK = "block"
    WARN = "warn"
    INFO = "info"


# code -> (severity, what the rule catches). The live rules are listed in guard_live.LIVE_RULES.
RULES: dict[str, tuple[Severity, str]] = {
    "template_incomplete": (Severity.BLOCK, "a seed template field is empty (name, owner, reason, "
                            "source_of_truth, targets, execution.mode/write_strategy)"),
    "partitioning_missing": (Severity.BLOCK, "partition column and type not declared"),
    "window_unbounded": (Severity.BLOCK, "affected_window.start_utc or end_utc missing"),
    "window_inverted": (Severity.BLOCK, "end_utc (exclusive) not after start_utc"),
    "window_too_large": (Severity.BLOCK, "more partitions than affected_window.max_partitions"),
    "window_empty": (Severity.BLOCK, "the window has no partitions"),
    "window_not_exact": (Severity.BLOCK, "a window_column window cannot be expressed exactly "
                         "(see docs/windows.md)"),
    "window_not_aligned": (Severity.WARN, "a date window bound is not at midnight UTC"),
    "partitions_inconsistent": (Severity.BLOCK, "listed partitions differ from [start_utc, "
                                "end_utc) (end exclusive; date partitions, and integer ones "
                                "that are all yyyymmdd dates)"),
    "partition_value_invalid": (Severity.BLOCK, "a partition value is not a literal of the "
                                "partition type"),
    "partition_column_mismatch": (Severity.BLOCK, "'col=value' partitions name another column "
                                  "than partitioning.column"),
    "partitions_duplicated": (Severity.WARN, "a partition is listed twice"),
    "publish_not_paused": (Severity.BLOCK, "safeguards.publish_paused is not true"),
    "no_notifications": (Severity.BLOCK, "no downstream owner to notify"),
    "rollback_missing": (Severity.BLOCK, "no rollback strategy"),
    "not_idempotent": (Severity.BLOCK, "execution.idempotent is not true"),
    "no_proof_slice": (Severity.BLOCK, "execution.proof_slice is false"),
    "thresholds_undefined": (Severity.BLOCK, "no checks, or a parity/metric check without "
                             "threshold"),
    "gate_missing": (Severity.BLOCK, "no row_count_parity or no duplicate_check"),
    "metric_gate_missing": (Severity.WARN, "no metric_reconciliation check"),
    "metric_undefined": (Severity.BLOCK, "metric check without name or per-side expression"),
    "check_duplicated": (Severity.BLOCK, "row_count_parity twice or a metric name twice"),
    "check_field_ignored": (Severity.WARN, "a check field that its type does not use"),
    "keys_mismatch": (Severity.WARN, "duplicate_check keys differ from business_keys"),
    "contract_column_unknown": (Severity.BLOCK, "contract.not_null names a contract.columns "
                                "column in another case"),
    "target_incomplete": (Severity.BLOCK, "a target given as a bare name (seed shape)"),
    "target_duplicated": (Severity.BLOCK, "a target or target name listed twice"),
    "source_is_target": (Severity.BLOCK, "the source of truth is also a target"),
    "no_shadow": (Severity.BLOCK, "shadow location is, contains or lies inside a source/target"),
    "path_outside_roots": (Severity.BLOCK, "a path outside SPARKGUARD_ALLOWED_ROOTS"),
    "relative_path": (Severity.WARN, "a relative path (resolved against the driver's cwd)"),
    "target_dependencies": (Severity.BLOCK, "depends_on names an unknown target or a cycle"),
    "transform_placeholder": (Severity.BLOCK, "transform SQL misses {source}/{window} or names "
                              "an unknown placeholder"),
    "transform_unfilled": (Severity.BLOCK, "transform SQL still holds a {fill:COLUMN} hole left "
                           "by 'sparkguard plan init'"),
    "seed_text_contradicts": (Severity.BLOCK, "execution.mode or write_strategy names another "
                              "write than the targets' promotion"),
    "claim_untrusted": (Severity.INFO, "a self-declared claim sparkguard verifies itself"),
    "approvals_undefined": (Severity.BLOCK, "approvals.required is empty"),
    "approvals_missing": (Severity.BLOCK, "a required role has not approved"),
    "approval_stale": (Severity.BLOCK, "a role approved an earlier fingerprint"),
    "owner_self_approval": (Severity.BLOCK, "the owner is the only approver"),
}
APPROVAL_CODES = frozenset({"approvals_undefined", "approvals_missing", "approval_stale",
                            "owner_self_approval"})


@dataclass(frozen=True)
class Finding:
    """One guard finding: a rule code, where in the plan, what is wrong, how to fix it."""

    severity: Severity
    code: str
    path: str
    message: str
    fix: str = ""
    unfilled: bool = False  # the field is empty: a person must fill it in (--pre-approval)

    def render(self, source: str, pre_approval: bool = False) -> str:
        """``[BLOCK] code: plan.yaml: backfill_plan.x: message; fix: ...`` (``[FILL ]`` for a
        field still to fill in, with ``pre_approval``)."""
        fix = f"; fix: {self.fix}" if self.fix else ""
        tag = "FILL" if pre_approval and self.unfilled else self.severity.value.upper()
        return f"[{tag:5}] {self.code}: {source}: {self.path}: {self.message}{fix}"

    def as_problem(self) -> PlanProblem:
        return PlanProblem(self.path, f"{self.code}: {self.message}", fix=self.fix)


def blocking(findings: Sequence[Finding]) -> list[Finding]:
    """The findings that stop the run."""
    return [f for f in findings if f.severity is Severity.BLOCK]


def render_findings(findings: Sequence[Finding], source: str, pre_approval: bool = False) -> str:
    """Every finding, one line each, blocking ones first (``pre_approval``: the fields still
    to fill in first, tagged ``[FILL ]``)."""
    order = {Severity.BLOCK: 1, Severity.WARN: 2, Severity.INFO: 3}

    def rank(f: Finding) -> int:
        return 0 if pre_approval and f.unfilled else order[f.severity]

    return "\n".join(f.render(source, pre_approval) for f in sorted(findings, key=rank))


def to_fill(findings: Sequence[Finding]) -> list[Finding]:
    """The blocking findings that are empty fields a person must fill in."""
    return [f for f in blocking(findings) if f.unfilled]


P = "backfill_plan"


class Collector:
    """Gathers the findings of one guard pass; paths are relative to ``backfill_plan``."""

    def __init__(self) -> None:
        self.findings: list[Finding] = []

    def add(self, code: str, path: str, msg: str, fix: str = "",
            severity: Severity | None = None, unfilled: bool = False) -> None:
        sev = severity or RULES[code][0]
        self.findings.append(Finding(sev, code, f"{P}.{path}" if path else P, msg, fix,
                                     unfilled))
