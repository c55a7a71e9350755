"""The guard's static red flags (no Spark): everything a plan must say before it can run.

Each rule has a stable code (see :data:`RULES`); :func:`static_findings` returns every finding
with its severity. ``BLOCK`` stops ``guard`` (exit 2), ``approve`` and ``run``; ``WARN`` and
``INFO`` are reported. Self-declared claims in the plan (``dry_run_completed``,
``publish_paused``, ``status.state``) are never taken as proof: they are reported as INFO and
sparkguard establishes the facts itself (ledger, publish control table).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import PurePosixPath
from urllib.parse import urlsplit

from sparkguard.errors import PlanProblem
from sparkguard.plan.approvals import approval_issues
from sparkguard.plan.model import (
    BackfillPlan,
    Check,
    CheckType,
    ExecutionMode,
    Promotion,
    TargetSpec,
)
from sparkguard.plan.window import target_order, window_partitions  # re-exported
from sparkguard.plan.window_spec import window_problems
from sparkguard.sql import PartitionType, TableRef, UnsafeSQLError

__all__ = ["RULES", "Finding", "Severity", "approvable_findings", "blocking", "draft_notice",
           "live_checks_possible", "pre_approval_findings", "render_findings", "static_findings",
           "target_order", "to_fill", "window_partitions"]


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
                                "end_utc) (end exclusive)"),
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
_APPROVAL_CODES = frozenset({"approvals_undefined", "approvals_missing", "approval_stale",
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


P = "backfill_plan"


# -- paths ---------------------------------------------------------------------------------

def allowed_roots() -> list[str]:
    """``SPARKGUARD_ALLOWED_ROOTS``: ':'-separated local roots or URI prefixes (',' also works)."""
    raw = os.environ.get("SPARKGUARD_ALLOWED_ROOTS", "")
    out: list[str] = []
    for chunk in raw.split(","):
        # a URI root contains "://" whose ':' must not split it
        out += [r for r in re.split(r":(?!//)", chunk.strip()) if r]
    return out


def _norm(path: str) -> tuple[str, str]:
    """(scheme+authority, normalised absolute path) for a local path or a URI."""
    if path.startswith("dbfs:") and "://" not in path:
        path = "dbfs://" + path[len("dbfs:"):]
    if "://" in path:
        parts = urlsplit(path)
        where = f"{parts.scheme.lower()}://{parts.netloc}"
        if parts.scheme.lower() == "file":
            where = ""
        return where, os.path.normpath("/" + parts.path.lstrip("/"))
    return "", os.path.realpath(os.path.abspath(path))


def outside_roots(path: str, roots: Sequence[str]) -> bool:
    """True when roots are configured and ``path`` is not one of them or below one."""
    if not roots:
        return False
    where, p = _norm(path)
    for root in roots:
        rwhere, rp = _norm(root)
        if rwhere == where and (p == rp or p.startswith(rp.rstrip("/") + "/")):
            return False
    return True


def _overlaps(a: str, b: str) -> bool:
    """Same location, or one inside the other."""
    (wa, pa), (wb, pb) = _norm(a), _norm(b)
    if wa != wb:
        return False
    ppa, ppb = PurePosixPath(pa), PurePosixPath(pb)
    return ppa == ppb or ppa in ppb.parents or ppb in ppa.parents


# -- rules ---------------------------------------------------------------------------------

class _Collector:
    def __init__(self) -> None:
        self.findings: list[Finding] = []

    def add(self, code: str, path: str, msg: str, fix: str = "",
            severity: Severity | None = None, unfilled: bool = False) -> None:
        sev = severity or RULES[code][0]
        self.findings.append(Finding(sev, code, f"{P}.{path}" if path else P, msg, fix,
                                     unfilled))


def _completeness(plan: BackfillPlan, c: _Collector) -> None:
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


def _window(plan: BackfillPlan, c: _Collector) -> None:
    w = plan.affected_window
    if plan.window_column is not None:
        _range_window(plan, c)
        return
    if plan.partitioning is None:
        cols = sorted(set(plan.partition_prefixes()))
        hint = f" (the partitions suggest column {cols[0]!r})" if len(cols) == 1 else ""
        c.add("partitioning_missing", "partitioning",
              f"the partition column and type are not declared{hint}",
              "add partitioning: {column: <col>, type: date|string|int}", unfilled=True)
    elif plan.partition_prefixes():
        others = sorted(set(plan.partition_prefixes()) - {plan.partitioning.column})
        if others:
            c.add("partition_column_mismatch", "affected_window.partitions",
                  f"partitions name column(s) {others} but partitioning.column is "
                  f"{plan.partitioning.column!r}", "make them name the same column")
    bounded = w.start_utc is not None and w.end_utc is not None
    if not bounded:
        missing = [n for n, v in (("start_utc", w.start_utc), ("end_utc", w.end_utc)) if v is None]
        c.add("window_unbounded", "affected_window." + missing[0],
              f"{' and '.join(missing)} not set: the window is unbounded",
              "bound the window: start_utc inclusive, end_utc exclusive", unfilled=True)
    elif w.end_utc <= w.start_utc:  # type: ignore[operator]
        c.add("window_inverted", "affected_window.end_utc",
              f"end_utc {w.end_utc:%Y-%m-%dT%H:%M:%SZ} is not after start_utc "
              f"{w.start_utc:%Y-%m-%dT%H:%M:%SZ}",
              "end_utc is exclusive and must be later than start_utc")
    is_date = plan.partitioning is not None and plan.partitioning.type is PartitionType.DATE
    if bounded and is_date:
        for name, bound in (("start_utc", w.start_utc), ("end_utc", w.end_utc)):
            assert bound is not None
            if bound.hour or bound.minute or bound.second or bound.microsecond:
                c.add("window_not_aligned", f"affected_window.{name}",
                      f"{name} {bound:%Y-%m-%dT%H:%M:%SZ} is not midnight UTC; whole daily "
                      "partitions are recomputed", "align the window to partition boundaries")
    try:
        listed = plan.partition_values()
    except UnsafeSQLError as exc:
        c.add("partition_value_invalid", "affected_window.partitions", str(exc),
              "write partition values as plain literals of the partition type")
        return
    if len(set(listed)) != len(listed):
        c.add("partitions_duplicated", "affected_window.partitions", "a partition is listed twice",
              "list each partition once")
    range_days = plan.range_days() if is_date and bounded else None
    count = max(len(set(listed)), range_days or 0)
    if count > w.max_partitions:
        c.add("window_too_large", "affected_window",
              f"{count} partitions exceed the plan's max_partitions {w.max_partitions}",
              "split the backfill, or raise affected_window.max_partitions deliberately")
        return
    if plan.partitioning is not None and count == 0 and not any(
            f.code.startswith("window_") for f in c.findings):
        c.add("window_empty", "affected_window.partitions", "the window has no partitions",
              "list the partitions (or give start_utc/end_utc for date partitions)")
    if listed and range_days:
        implied = set(plan.window_partitions_from_range() or [])
        if set(listed) != implied:
            extra = sorted(str(x) for x in set(listed) - implied)
            missing = sorted(str(x) for x in implied - set(listed))
            c.add("partitions_inconsistent", "affected_window.partitions",
                  f"partitions disagree with [start_utc, end_utc): outside the range "
                  f"{_few(extra)}, missing from the list {_few(missing)}",
                  "end_utc is exclusive; make the list match the range")


def _range_window(plan: BackfillPlan, c: _Collector) -> None:
    """A ``window_column`` window: bounded, not inverted, exactly expressible, not too large."""
    w = plan.affected_window
    if w.start_utc is None or w.end_utc is None:
        missing = [n for n, v in (("start_utc", w.start_utc), ("end_utc", w.end_utc)) if v is None]
        c.add("window_unbounded", "affected_window." + missing[0],
              f"{' and '.join(missing)} not set: the window is unbounded",
              "bound the window: start_utc inclusive, end_utc exclusive", unfilled=True)
    elif w.end_utc <= w.start_utc:
        c.add("window_inverted", "affected_window.end_utc",
              f"end_utc {w.end_utc.isoformat()} is not after start_utc {w.start_utc.isoformat()}",
              "end_utc is exclusive and must be later than start_utc")
    problems = window_problems(plan)
    for path, msg, fix in problems:
        c.add("window_not_exact", path, msg, fix)
    if problems or w.start_utc is None or w.end_utc is None or w.end_utc <= w.start_utc:
        return
    count = len(window_partitions(plan))
    if count > w.max_partitions:
        c.add("window_too_large", "affected_window",
              f"{count} buckets exceed the plan's max_partitions {w.max_partitions}",
              "split the backfill, use window_column.bucket: day, or raise "
              "affected_window.max_partitions deliberately")


def _few(items: list[str], n: int = 5) -> str:
    return str(items[:n])[:-1] + f", ... {len(items) - n} more]" if len(items) > n else str(items)


def _safeguards(plan: BackfillPlan, c: _Collector) -> None:
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


_IGNORED: dict[CheckType, tuple[str, ...]] = {
    CheckType.ROW_COUNT_PARITY: ("metric", "key_columns", "source_expr", "shadow_expr",
                                 "drift_threshold_percent", "drift_threshold_absolute"),
    CheckType.DUPLICATE_CHECK: ("metric", "source_expr", "shadow_expr", "per_partition",
                                "drift_threshold_percent", "drift_threshold_absolute"),
    CheckType.METRIC_RECONCILIATION: ("key_columns",),
}


def _checks(plan: BackfillPlan, c: _Collector) -> None:
    _check_list(plan, plan.validation.checks, "validation.checks", c)
    for j, t in enumerate(plan.target_specs()):
        if t.validation is None:
            continue
        if t.validation.checks:
            _check_list(plan, t.validation.checks, f"targets[{j}].validation.checks", c)
        ref = t.validation.reference
        if ref is not None and ref.sql is not None:
            _placeholders(plan, t, ref.sql, f"targets[{j}].validation.reference.sql", c)


def _check_list(plan: BackfillPlan, checks: list[Check], where: str, c: _Collector) -> None:
    if not checks:
        c.add("thresholds_undefined", where, "no reconciliation checks",
              "add row_count_parity, duplicate_check and metric_reconciliation checks")
        return
    types = [k.type for k in checks]
    for needed in (CheckType.ROW_COUNT_PARITY, CheckType.DUPLICATE_CHECK):
        if needed not in types:
            c.add("gate_missing", where, f"no {needed.value} check",
                  f"add a {needed.value} check (a minimum gate of the checklist)")
    if CheckType.METRIC_RECONCILIATION not in types:
        c.add("metric_gate_missing", where, "no metric_reconciliation check",
              "reconcile at least one business-critical aggregate")
    if types.count(CheckType.ROW_COUNT_PARITY) > 1:
        c.add("check_duplicated", where, "row_count_parity is declared twice",
              "keep one row_count_parity check")
    metrics: list[str] = []
    for i, k in enumerate(checks):
        _check(plan, f"{where}[{i}]", k, c)
        if k.type is CheckType.METRIC_RECONCILIATION and k.metric:
            if k.metric in metrics:
                c.add("check_duplicated", f"{where}[{i}].metric",
                      f"metric {k.metric!r} is declared twice", "give each metric its own name")
            metrics.append(k.metric)


def _check(plan: BackfillPlan, path: str, k: Check, c: _Collector) -> None:
    if k.type is not CheckType.DUPLICATE_CHECK and k.threshold_percent is None \
            and k.threshold_absolute is None:
        c.add("thresholds_undefined", f"{path}.threshold_percent", f"{k.type.value} has no threshold",
              "set threshold_percent (or threshold_absolute); 0 means exact", unfilled=True)
    if k.type is CheckType.METRIC_RECONCILIATION:
        if not k.metric:
            c.add("metric_undefined", f"{path}.metric", "metric name missing", "name the metric",
                  unfilled=True)
        if not (k.source_expr and k.shadow_expr):
            side = "source_expr" if not k.source_expr else "shadow_expr"
            c.add("metric_undefined", f"{path}.{side}",
                  f"metric {k.metric or path!r} needs an expression per side (source_expr and "
                  "shadow_expr)", "give the SQL expression computing it on each side",
                  unfilled=True)
    for name in _IGNORED[k.type]:
        if getattr(k, name) not in (None, False):
            c.add("check_field_ignored", f"{path}.{name}",
                  f"{name} has no effect on a {k.type.value} check", "remove it")
    if k.type is CheckType.DUPLICATE_CHECK and k.key_columns and plan.partitioning:
        for j, t in enumerate(plan.target_specs()):
            extra = set(k.key_columns) - set(t.business_keys) - {plan.partitioning.column}
            if extra:
                c.add("keys_mismatch", f"targets[{j}].business_keys",
                      f"duplicate_check keys {k.key_columns} differ from business_keys "
                      f"{t.business_keys}", "align them (each extra key set costs one more pass)")


_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")


def _targets(plan: BackfillPlan, c: _Collector) -> None:
    datasets: list[str] = []
    for i, t in enumerate(plan.targets):
        if isinstance(t, str):
            c.add("target_incomplete", f"targets[{i}]",
                  f"target {t!r} has no business_keys or transform",
                  "write it as a mapping: {dataset, business_keys, transform, promotion}")
            datasets.append(t)
        else:
            datasets.append(t.dataset)
            _transform(plan, i, t, c)
    if len(set(datasets)) != len(datasets):
        c.add("target_duplicated", "targets", "a target is listed twice", "list each target once")
    labels = [t.label for t in plan.target_specs()]
    if len(set(labels)) != len(labels):
        c.add("target_duplicated", "targets", "two targets share a name",
              "give each target a distinct name")
    src = plan.source_of_truth.dataset
    if src and any(_same_dataset(src, d) for d in datasets):
        c.add("source_is_target", "source_of_truth.dataset", "the source of truth is also a target",
              "recompute from an upstream dataset")
    shadow = plan.execution.shadow_location
    if shadow:
        for label, d in [("source_of_truth.dataset", src), *[
                (f"targets[{i}].dataset", d) for i, d in enumerate(datasets)]]:
            if d and TableRef.parse(d).path and _overlaps(shadow, d):
                c.add("no_shadow", "execution.shadow_location",
                      f"shadow location {shadow!r} overlaps {label} {d!r}",
                      "point shadow_location at a separate folder")
    roots = allowed_roots()
    for label, d in [("source_of_truth.dataset", src), ("execution.shadow_location", shadow),
                     *[(f"targets[{i}].dataset", d) for i, d in enumerate(datasets)]]:
        if not d or TableRef.parse(d).path is None:
            continue
        if outside_roots(d, roots):
            c.add("path_outside_roots", label, f"path {d!r} is outside the allowed roots {roots}",
                  "use a location under SPARKGUARD_ALLOWED_ROOTS")
        if d.startswith(("./", "../")):
            c.add("relative_path", label, f"path {d!r} is relative to the driver's working "
                  "directory", "use an absolute path or a URI")
    try:
        target_order(plan)
    except ValueError as exc:
        c.add("target_dependencies", "targets", str(exc), "fix depends_on")


def _same_dataset(a: str, b: str) -> bool:
    ra, rb = TableRef.parse(a), TableRef.parse(b)
    if ra.path is not None and rb.path is not None:
        return _norm(ra.path) == _norm(rb.path)
    return a.lower() == b.lower()


def _transform(plan: BackfillPlan, i: int, t: TargetSpec, c: _Collector) -> None:
    if t.transform.sql is not None:
        _placeholders(plan, t, t.transform.sql, f"targets[{i}].transform.sql", c)


def _placeholders(plan: BackfillPlan, t: TargetSpec, sql: str, path: str,
                  c: _Collector) -> None:
    """The placeholders of a transform's (or a reference's) SQL: it reads the source or an
    upstream shadow, names only known placeholders and upstream targets it depends on."""
    labels = {x.label for x in plan.target_specs()}
    names = _PLACEHOLDER.findall(sql)
    if "source" not in names and not any(n.startswith("shadow:") for n in names):
        c.add("transform_placeholder", path, "the query reads neither {source} nor an upstream "
              "{shadow:NAME}", "read the pinned source as FROM {source} (sparkguard filters it "
              "to the slice)")
    for name in names:
        if name in ("source", "window"):
            continue
        if name.startswith("fill:"):
            c.add("transform_unfilled", path, f"column {name[5:]!r} has no expression yet "
                  f"({{{name}}})", f"replace {{{name}}} with the SQL expression computing it from "
                  "the source's columns", unfilled=True)
            continue
        if name.startswith("shadow:"):
            up = name.split(":", 1)[1]
            if up not in labels or up == t.label:
                c.add("transform_placeholder", path, f"{{{name}}} names no other target",
                      f"use one of {sorted(labels - {t.label})}")
            elif up not in t.depends_on:
                c.add("transform_placeholder", path, f"{{{name}}} is read but {up!r} is not in "
                      "depends_on", f"add depends_on: [{up}]")
        else:
            c.add("transform_placeholder", path, f"unknown placeholder {{{name}}}",
                  "use {source}, {window} or {shadow:NAME}")


def _claims(plan: BackfillPlan, c: _Collector) -> None:
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


def _seed_text(plan: BackfillPlan, c: _Collector) -> None:
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


def _approvals(plan: BackfillPlan, c: _Collector) -> None:
    for code, prob in approval_issues(plan):
        c.add(code, prob.path.removeprefix(f"{P}."), prob.message, prob.fix)


_RULE_GROUPS: tuple[Callable[[BackfillPlan, _Collector], None], ...] = (
    _completeness, _window, _safeguards, _checks, _targets, _seed_text, _claims)


def static_findings(plan: BackfillPlan, *, check_approvals: bool = True) -> list[Finding]:
    """Every static red flag of the seed checklist, plus what execution needs."""
    c = _Collector()
    for rule in _RULE_GROUPS:
        rule(plan, c)
    if check_approvals:
        _approvals(plan, c)
    return c.findings


def pre_approval_findings(plan: BackfillPlan) -> list[Finding]:
    """What ``guard --pre-approval`` checks: everything but granted approvals; an empty
    ``approvals.required`` is reported as a field still to fill in."""
    c = _Collector()
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
            if f.code not in _APPROVAL_CODES]
