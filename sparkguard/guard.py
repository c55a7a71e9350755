"""The guard's static red flags (no Spark): everything a plan must say before it can run."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import PurePosixPath

from sparkguard.errors import PlanProblem
from sparkguard.plan.approvals import approval_problems
from sparkguard.plan.model import BackfillPlan, CheckType, TargetSpec
from sparkguard.sql import PartitionType, TableRef, UnsafeSQLError

__all__ = ["Finding", "Severity", "blocking", "render_findings", "static_findings",
           "target_order", "window_partitions"]


class Severity(str, Enum):
    """BLOCK stops the run; WARN and INFO are reported."""

    BLOCK = "block"
    WARN = "warn"
    INFO = "info"


@dataclass(frozen=True)
class Finding:
    """One guard finding: a rule code, where in the plan, what is wrong, how to fix it."""

    severity: Severity
    code: str
    path: str
    message: str
    fix: str = ""

    def render(self, source: str) -> str:
        fix = f"; fix: {self.fix}" if self.fix else ""
        return f"[{self.severity.value.upper():5}] {self.code}: {source}: {self.path}: " \
               f"{self.message}{fix}"

    def as_problem(self) -> PlanProblem:
        return PlanProblem(self.path, f"{self.code}: {self.message}", fix=self.fix)


def blocking(findings: Sequence[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity is Severity.BLOCK]


def render_findings(findings: Sequence[Finding], source: str) -> str:
    order = {Severity.BLOCK: 0, Severity.WARN: 1, Severity.INFO: 2}
    return "\n".join(f.render(source) for f in sorted(findings, key=lambda f: order[f.severity]))


P = "backfill_plan"


def window_partitions(plan: BackfillPlan) -> list[object]:
    """The window's partitions: as listed, or derived from [start_utc, end_utc) for dates."""
    listed = plan.partition_values()
    if listed:
        return sorted(dict.fromkeys(listed), key=str)
    if plan.partitioning and plan.partitioning.type is PartitionType.DATE:
        return list(plan.window_partitions_from_range() or [])
    return []


def target_order(plan: BackfillPlan) -> list[TargetSpec]:
    """Targets in dependency order (``depends_on``); raises ValueError on unknown or cycles."""
    specs = plan.target_specs()
    by_label = {t.label: t for t in specs}
    order: list[TargetSpec] = []
    state: dict[str, int] = {}

    def visit(t: TargetSpec, trail: tuple[str, ...]) -> None:
        if state.get(t.label) == 2:
            return
        if state.get(t.label) == 1:
            raise ValueError("targets depend on each other in a cycle: "
                             + " -> ".join([*trail, t.label]))
        state[t.label] = 1
        for dep in t.depends_on:
            if dep not in by_label:
                raise ValueError(f"target {t.label!r} depends on unknown target {dep!r}")
            visit(by_label[dep], (*trail, t.label))
        state[t.label] = 2
        order.append(t)

    for t in specs:
        visit(t, ())
    return order


def _allowed_roots() -> list[str]:
    raw = os.environ.get("SPARKGUARD_ALLOWED_ROOTS", "")
    return [r for r in raw.split(":") if r]


def _outside_roots(path: str, roots: list[str]) -> bool:
    if not roots or "://" in path or path.startswith("dbfs:"):
        return False
    norm = os.path.normpath(os.path.abspath(path))
    return not any(norm == os.path.normpath(os.path.abspath(r)) or
                   norm.startswith(os.path.normpath(os.path.abspath(r)) + os.sep) for r in roots)


def static_findings(plan: BackfillPlan, *, check_approvals: bool = True) -> list[Finding]:
    """Every static red flag of the seed checklist, plus what execution needs."""
    f: list[Finding] = []

    def block(code: str, path: str, msg: str, fix: str = "") -> None:
        f.append(Finding(Severity.BLOCK, code, f"{P}.{path}" if path else P, msg, fix))

    def warn(code: str, path: str, msg: str, fix: str = "") -> None:
        f.append(Finding(Severity.WARN, code, f"{P}.{path}" if path else P, msg, fix))

    # -- template completeness ------------------------------------------------------------
    for field, value in (("name", plan.name), ("owner", plan.owner), ("reason", plan.reason),
                         ("source_of_truth.dataset", plan.source_of_truth.dataset),
                         ("execution.mode", plan.execution.mode),
                         ("execution.write_strategy", plan.execution.write_strategy)):
        if value in (None, ""):
            block("template_incomplete", field, "is missing", "fill it in as the template shows")
    if not plan.targets:
        block("template_incomplete", "targets", "no targets", "list at least one target")

    # -- partitioning and window ----------------------------------------------------------
    if plan.partitioning is None:
        hint = ""
        for raw in plan.affected_window.partitions or []:
            if isinstance(raw, str) and "=" in raw:
                hint = f" (the partitions suggest column {raw.split('=', 1)[0]!r})"
                break
        block("partitioning_missing", "partitioning", "the partition column and type are not "
              f"declared{hint}", "add partitioning: {column: <col>, type: date|string|int}")
    w = plan.affected_window
    if w.start_utc is None or w.end_utc is None:
        block("window_unbounded", "affected_window", "start_utc and end_utc must both be set",
              "bound the window: start_utc inclusive, end_utc exclusive")
    else:
        start, end = w.start_utc, w.end_utc
        try:
            inverted = end <= start  # type: ignore[operator]
        except TypeError:
            inverted = False
        if inverted:
            block("window_inverted", "affected_window.end_utc",
                  f"end_utc {end} is not after start_utc {start}",
                  "end_utc is exclusive and must be later than start_utc")
    parts: list[object] = []
    try:
        parts = window_partitions(plan)
    except UnsafeSQLError as exc:
        block("partition_value_invalid", "affected_window.partitions", str(exc),
              "write partition values as plain literals of the partition type")
    if plan.partitioning is not None and not parts and not any(x.code.startswith("window_")
                                                               for x in f):
        block("window_empty", "affected_window.partitions", "the window has no partitions",
              "list the partitions or give a start_utc/end_utc range")
    if len(parts) > w.max_partitions:
        block("window_too_large", "affected_window",
              f"{len(parts)} partitions exceed the plan's max_partitions {w.max_partitions}",
              "split the backfill or raise affected_window.max_partitions deliberately")
    if (plan.partitioning is not None and plan.partitioning.type is PartitionType.DATE
            and w.partitions and w.start_utc is not None and w.end_utc is not None):
        implied = set(plan.window_partitions_from_range() or [])
        try:
            listed = set(plan.partition_values())
        except UnsafeSQLError:
            listed = implied
        if listed != implied:
            extra = sorted(str(x) for x in listed - implied)
            missing = sorted(str(x) for x in implied - listed)
            block("partitions_inconsistent", "affected_window.partitions",
                  f"partitions disagree with [start_utc, end_utc): outside the range {extra}, "
                  f"missing from the list {missing}",
                  "end_utc is exclusive; make the list match the range")

    # -- safeguards -----------------------------------------------------------------------
    if plan.safeguards.publish_paused is not True:
        block("publish_not_paused", "safeguards.publish_paused",
              "publish must be paused for the duration of the backfill",
              "set publish_paused: true (sparkguard pauses and proves it in its control table)")
    if not plan.safeguards.downstream_notifications:
        warn("no_notifications", "safeguards.downstream_notifications",
             "no downstream owner will be notified", "list the downstream owners")
    if not (plan.safeguards.rollback_strategy or "").strip():
        block("rollback_missing", "safeguards.rollback_strategy", "no rollback strategy",
              "describe the rollback (sparkguard records the Delta version to RESTORE)")
    if plan.execution.idempotent is not True:
        block("not_idempotent", "execution.idempotent",
              "the write strategy is not declared idempotent",
              "set idempotent: true; sparkguard proves it by writing the proof slice twice")
    if not plan.execution.proof_slice:
        block("no_proof_slice", "execution.proof_slice",
              "a one-slice proof before the full window is mandatory", "set proof_slice: true")

    # -- validation gates -----------------------------------------------------------------
    checks = plan.validation.checks
    types = {c.type for c in checks}
    if not checks:
        block("thresholds_undefined", "validation.checks", "no reconciliation checks",
              "add row_count_parity, duplicate_check and metric_reconciliation checks")
    for needed in (CheckType.ROW_COUNT_PARITY, CheckType.DUPLICATE_CHECK):
        if checks and needed not in types:
            block("gate_missing", "validation.checks", f"no {needed.value} check",
                  f"add a {needed.value} check (a minimum gate of the checklist)")
    if checks and CheckType.METRIC_RECONCILIATION not in types:
        warn("gate_missing", "validation.checks", "no metric_reconciliation check",
             "reconcile at least one business-critical aggregate")
    for i, c in enumerate(checks):
        path = f"validation.checks[{i}]"
        if c.type in (CheckType.ROW_COUNT_PARITY, CheckType.METRIC_RECONCILIATION) and \
                c.threshold_percent is None and c.threshold_absolute is None:
            block("thresholds_undefined", f"{path}.threshold_percent",
                  f"{c.type.value} has no threshold",
                  "set threshold_percent (or threshold_absolute); 0 means exact")
        if c.type is CheckType.METRIC_RECONCILIATION:
            if not c.metric:
                block("metric_undefined", f"{path}.metric", "metric name missing",
                      "name the metric")
            if plan.target_specs() and not (c.source_expr or c.shadow_expr):
                block("metric_undefined", f"{path}.source_expr",
                      f"metric {c.metric!r} has no expression",
                      "give source_expr and shadow_expr (SQL expressions per side)")
        if c.type is CheckType.DUPLICATE_CHECK and not c.key_columns and not plan.target_specs():
            block("keys_undefined", f"{path}.key_columns", "duplicate_check names no keys",
                  "list the business key columns")

    # -- targets and shadow -----------------------------------------------------------------
    roots = _allowed_roots()
    datasets: list[str] = []
    for i, t in enumerate(plan.targets):
        if isinstance(t, str):
            block("target_incomplete", f"targets[{i}]",
                  f"target {t!r} has no business_keys, transform or promotion",
                  "write the target as a mapping: {dataset, business_keys, transform, promotion}")
            datasets.append(t)
            continue
        datasets.append(t.dataset)
    if len(set(datasets)) != len(datasets):
        block("target_duplicated", "targets", "a target is listed twice", "list each target once")
    if plan.source_of_truth.dataset and plan.source_of_truth.dataset in datasets:
        block("source_is_target", "source_of_truth.dataset",
              "the source of truth is also a target", "recompute from an upstream dataset")
    shadow = plan.execution.shadow_location
    if shadow:
        for d in datasets:
            if _same_or_inside(shadow, d):
                block("no_shadow", "execution.shadow_location",
                      f"shadow location {shadow!r} is the target {d!r} itself",
                      "point shadow_location at a separate location")
    for label, ds in [("source_of_truth.dataset", plan.source_of_truth.dataset),
                      ("execution.shadow_location", shadow),
                      *[(f"targets[{i}].dataset", d) for i, d in enumerate(datasets)]]:
        if ds and TableRef.parse(ds).path and _outside_roots(ds, roots):
            block("path_outside_roots", label, f"path {ds!r} is outside the allowed roots {roots}",
                  "use a location under SPARKGUARD_ALLOWED_ROOTS")
    try:
        target_order(plan)
    except ValueError as exc:
        block("target_dependencies", "targets", str(exc), "fix depends_on")
    labels = [t.label for t in plan.target_specs()]
    if len(set(labels)) != len(labels):
        block("target_duplicated", "targets", "two targets share a name",
              "give each target a distinct name")
    for i, t in enumerate(plan.target_specs()):
        if plan.partitioning and plan.partitioning.column in t.business_keys:
            pass
        for c in checks:
            if c.type is CheckType.DUPLICATE_CHECK and c.key_columns and plan.partitioning:
                extra = set(c.key_columns) - set(t.business_keys) - {plan.partitioning.column}
                if extra:
                    warn("keys_mismatch", f"targets[{i}].business_keys",
                         f"duplicate_check keys {c.key_columns} differ from business_keys "
                         f"{t.business_keys}", "check them separately costs one more pass")

    # -- claims and approvals ---------------------------------------------------------------
    if plan.status.state != "draft":
        f.append(Finding(Severity.INFO, "claim_untrusted", f"{P}.status.state",
                         f"status.state {plan.status.state!r} is informational; approvals and "
                         "the ledger decide"))
    if plan.execution.dry_run_completed:
        f.append(Finding(Severity.INFO, "claim_untrusted", f"{P}.execution.dry_run_completed",
                         "dry_run_completed is checked against the ledger at run time"))
    if check_approvals:
        for prob in approval_problems(plan):
            block("approvals_missing", prob.path.removeprefix(f"{P}."), prob.message, prob.fix)
    return f


def _same_or_inside(a: str, b: str) -> bool:
    if a == b:
        return True
    pa, pb = PurePosixPath(a.rstrip("/")), PurePosixPath(b.rstrip("/"))
    return pa == pb or pb in pa.parents
