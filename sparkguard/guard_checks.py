"""Guard rules on the reconciliation checks of the plan and of each target (static, no Spark)."""

from __future__ import annotations

from collections.abc import Sequence

from sparkguard.guard_findings import Collector
from sparkguard.guard_paths import placeholder_rules
from sparkguard.plan.model import BackfillPlan, Check, CheckType, TargetSpec
from sparkguard.reconcile.spec import unknown_column_reason, unknown_columns

__all__ = ["check_rules", "contract_column_findings", "not_null_findings"]


_IGNORED: dict[CheckType, tuple[str, ...]] = {
    CheckType.ROW_COUNT_PARITY: ("metric", "key_columns", "source_expr", "shadow_expr",
                                 "drift_threshold_percent", "drift_threshold_absolute",
                                 "table_wide"),
    CheckType.DUPLICATE_CHECK: ("metric", "source_expr", "shadow_expr", "per_partition",
                                "drift_threshold_percent", "drift_threshold_absolute"),
    CheckType.METRIC_RECONCILIATION: ("key_columns", "table_wide"),
}


def check_rules(plan: BackfillPlan, c: Collector) -> None:
    """The plan's checks and each target's own checks and reference query."""
    _check_list(plan, plan.validation.checks, "validation.checks", c)
    for j, t in enumerate(plan.target_specs()):
        declared = [cc.name for cc in t.contract.columns]
        if declared:  # a partial list: only a name in another case is known to be wrong
            for path, msg, fix in not_null_findings(t, f"targets[{j}]", declared,
                                                    "contract.columns", complete=False):
                c.add("contract_column_unknown", path, msg, fix)
        if t.validation is None:
            continue
        if t.validation.checks:
            _check_list(plan, t.validation.checks, f"targets[{j}].validation.checks", c)
        ref = t.validation.reference
        if ref is not None and ref.sql is not None:
            placeholder_rules(plan, t, ref.sql, f"targets[{j}].validation.reference.sql", c)


def _check_list(plan: BackfillPlan, checks: list[Check], where: str, c: Collector) -> None:
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


def _check(plan: BackfillPlan, path: str, k: Check, c: Collector) -> None:
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


def not_null_findings(t: TargetSpec, path: str, columns: Sequence[str], what: str,
                      complete: bool = True) -> list[tuple[str, str, str]]:
    """(path, message, fix) for each ``contract.not_null`` name of ``t`` (at ``path``) that is
    not exactly one of ``columns`` (those of ``what``): in another case, or, when ``columns``
    is ``complete`` (a table's), missing. The run would fail its not-null gate on them; the live
    guard refuses them before anything is written."""
    unknown = unknown_columns(t.contract.not_null, columns)
    out = []
    for k, name in enumerate(t.contract.not_null):
        if name not in unknown or (unknown[name] is None and not complete):
            continue
        near = unknown[name]
        fix = f"write {near!r}" if near else f"use one of {sorted(columns)[:20]}"
        out.append((f"{path}.contract.not_null[{k}]", unknown_column_reason(name, near, what), fix))
    return out


def contract_column_findings(t: TargetSpec, path: str, columns: Sequence[str], what: str
                             ) -> list[tuple[str, str, str]]:
    """(path, message, fix) for each ``contract.columns`` name of ``t`` that is one of
    ``columns`` (the target's) in another case only: the shadow holds the target's names, so
    the contract gate would not find it."""
    near = unknown_columns([c.name for c in t.contract.columns], columns)
    return [(f"{path}.contract.columns[{k}].name",
             f"contract.columns names column {cc.name!r}, which {what} does not have: it has "
             f"{near[cc.name]!r} (names match exactly, case included)", f"write {near[cc.name]!r}")
            for k, cc in enumerate(t.contract.columns) if near.get(cc.name)]
