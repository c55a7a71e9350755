"""Evidence for audit: a YAML file (a superset of the seed's release-gate-evidence shape) and a
Markdown summary beside it."""

from __future__ import annotations

import datetime as dt
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from sparkguard.sql import restore_statement

__all__ = ["build_evidence", "load_evidence", "render_markdown", "write_evidence"]


def build_evidence(run: Any, outcome: str, error: str | None = None) -> dict[str, Any]:
    """Evidence dict from a run in progress or finished (duck-typed on the runner's state)."""
    plan = run.plan
    targets: list[dict[str, Any]] = []
    all_gates: list[dict[str, Any]] = []
    for label, st in run.targets.items():
        window = st.window.to_dict() if st.window else None
        if st.window:
            all_gates += [{"target": label, **g.to_dict()} for g in st.window.gates]
        rb = st.rollback_version
        targets.append({
            "name": label,
            "dataset": st.ref.display,
            "promotion": st.spec.promotion.value,
            "shadow": st.shadow.display,
            "version_reconciled_against": st.reconciled_version,
            "rollback_point": {
                "version_before_promotion": rb,
                "restore_statement": restore_statement(st.ref, rb) if rb is not None else None,
                "rollback_command": (f"spark-submit jobs/rollback.py --run-id {run.run_id} "
                                     f"--home {run.home}") if st.promoted_version is not None
                else None,
            },
            "promoted_version": st.promoted_version,
            "verified": st.verified,
            "restored_after_failure": st.restored,
            "slices": [r.to_dict() for r in st.slice_results],
            "skipped_slices_already_reconciled": sorted(st.skipped_slices),
            "full_window": window,
        })
    failed = [g for g in all_gates if not g["passed"]]
    row_gates = [g for g in all_gates if g["check_type"] == "row_count_parity"]
    metric_gates = [g for g in all_gates if g["check_type"] == "metric_reconciliation"]
    granted = [a.model_dump(mode="json") for a in plan.approvals.granted
               if a.fingerprint == run.fp]
    promoted = outcome == "promoted"

    def status(gates: list[dict[str, Any]]) -> str:
        if not gates:
            return "not_run"
        return "pass" if all(g["passed"] for g in gates) else "fail"

    return {
        "release_gate_evidence": {
            "release_name": plan.name,
            "owner": plan.owner,
            "environment": os.environ.get("SPARKGUARD_ENVIRONMENT", "local"),
            "release_surface": {"datasets": [t["dataset"] for t in targets]},
            "staged_validation": {
                "shadow_run": "pass" if all_gates and not failed else
                ("fail" if failed else "not_run"),
                "canary_scope": "proof slice: " + ", ".join(str(p) for p in run.slices[0])
                if run.slices else None,
                "notes": error or f"outcome: {outcome}",
            },
            "reconciliation": {
                "row_count_status": status(row_gates),
                "metric_parity_status": status(metric_gates),
                "checked_metrics": sorted({g["gate"] for g in metric_gates}),
            },
            "publish_control": {
                "deployment_complete": promoted,
                "publish_unblocked": promoted or outcome == "dry_run_passed",
                "cutover_strategy": "delta_single_commit",
            },
            "rollback": {
                "strategy": plan.safeguards.rollback_strategy,
                "tested": False,
            },
            "approvals": {"required": list(plan.approvals.required),
                          "granted": sorted({a["role"] for a in granted})},
            "decision": {"ready_to_ship": promoted},
        },
        "sparkguard": {
            "run_id": run.run_id,
            "outcome": outcome,
            "error": error,
            "written_at": dt.datetime.now(dt.timezone.utc).isoformat(),
            "plan": {"name": plan.name, "path": run.plan_path, "fingerprint": run.fp,
                     "reason": plan.reason},
            "approvals_used": granted,
            "source": {"dataset": run.source_ref.display, "version_read": run.source_version},
            "window": {"partition_column": run.p,
                       "partitions": [str(p) for p in run.parts]},
            "gates": all_gates,
            "failed_gates": failed,
            "targets": targets,
        },
    }


def _dump(data: dict[str, Any]) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True,
                          width=100)


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)


def write_evidence(run: Any, outcome: str, error: str | None = None) -> str:
    """Write ``<evidence_dir>/<run_id>.yaml`` and ``.md``; return the YAML path."""
    data = build_evidence(run, outcome, error)
    base = Path(run.evidence_dir) / run.run_id
    yaml_path = base.with_suffix(".yaml")
    _atomic_write(yaml_path, _dump(data))
    _atomic_write(base.with_suffix(".md"), render_markdown(data))
    return str(yaml_path)


def load_evidence(path: str | Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    if not isinstance(data, dict) or "sparkguard" not in data:
        raise ValueError(f"{path} is not a sparkguard evidence file")
    return data


def _fmt(v: Any) -> str:
    if isinstance(v, dict) and "value" in v:
        return f"{v['value']} (diff {v.get('abs_diff')}, {v.get('pct_diff')}%)"
    return str(v)


def render_markdown(data: dict[str, Any]) -> str:
    """A reviewer's one-page summary of the evidence."""
    sg, rg = data["sparkguard"], data["release_gate_evidence"]
    lines = [
        f"# Backfill evidence: {sg['plan']['name']}",
        "",
        f"- Run: `{sg['run_id']}`; outcome: **{sg['outcome']}**",
        f"- Plan fingerprint: `{sg['plan']['fingerprint']}`",
        f"- Reason: {sg['plan'].get('reason')}",
        f"- Source: `{sg['source']['dataset']}` read at version {sg['source']['version_read']}",
        f"- Window: `{sg['window']['partition_column']}` in "
        f"{', '.join(sg['window']['partitions'])}",
        "- Approvals: " + ", ".join(f"{a['role']} by {a['by']}" for a in sg["approvals_used"]),
        f"- Publish unblocked: {rg['publish_control']['publish_unblocked']}",
    ]
    if sg.get("error"):
        lines.append(f"- Error: {sg['error']}")
    for t in sg["targets"]:
        rb = t["rollback_point"]
        lines += ["", f"## Target `{t['dataset']}` ({t['promotion']})", "",
                  f"- Version before promotion: {rb['version_before_promotion']}; "
                  f"promoted version: {t['promoted_version']}; verified: {t['verified']}"]
        if rb.get("restore_statement"):
            lines.append(f"- Roll back: `{rb['rollback_command'] or rb['restore_statement']}`"
                         f" (SQL: `{rb['restore_statement']}`)")
        w = t.get("full_window")
        if w:
            lines += ["", "| gate | partition | measured | expected | threshold | result |",
                      "|---|---|---|---|---|---|"]
            for g in w["gates"]:
                lines.append(f"| {g['gate']} | {g.get('partition') or 'window'} | "
                             f"{_fmt(g['measured'])} | {g.get('expected')} | {g['threshold']} | "
                             f"{'pass' if g['passed'] else '**FAIL**'} |")
            pv = w.get("change_preview")
            if pv:
                lines += ["", f"Change preview: {pv['inserted']} inserted, {pv['deleted']} "
                          f"deleted, {pv['changed']} changed, {pv['unchanged']} unchanged."]
                cols = {k: v for k, v in pv["changed_by_column"].items() if v}
                if cols:
                    lines.append("Changed values per column: "
                                 + ", ".join(f"{k}={v}" for k, v in sorted(cols.items())) + ".")
    return "\n".join(lines) + "\n"
