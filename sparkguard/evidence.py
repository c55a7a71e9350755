"""Evidence for audit: a YAML file (a superset of the seed's release-gate-evidence shape, see
``templates/release-gate-evidence.yaml``), a Markdown summary and a PNG chart beside it."""

from __future__ import annotations

import datetime as dt
import math
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from sparkguard.errors import EXIT_USAGE, SparkguardError
from sparkguard.plan.model import BackfillPlan, Promotion, TargetSpec
from sparkguard.plan.window_spec import range_window
from sparkguard.sql import restore_statement

if TYPE_CHECKING:
    from sparkguard.plan.model import BackfillPlan
    from sparkguard.run.report import RunReport

__all__ = ["EvidenceError", "build_evidence", "load_evidence", "render_markdown", "write_evidence"]

_ENTRY_POINT = "jobs/backfill.py"


def change_applied(preview: dict[str, Any] | None, promotion: Promotion,
                   deletes_unmatched: bool) -> dict[str, Any] | None:
    """What the promotion commit does to the window's rows, from the change preview: rows
    inserted, deleted, kept (no longer produced, ``merge.when_not_matched_by_source: keep``),
    updated, and unchanged rows rewritten as if changed, which a change data feed reports as
    changes: every one under ``replace_where`` and ``merge``, none under ``merge_changed``."""
    if not preview:
        return None
    gone = int(preview["deleted"])
    return {"inserted": int(preview["inserted"]),
            "deleted": gone if deletes_unmatched else 0,
            "kept": 0 if deletes_unmatched else gone,
            "updated": int(preview["changed"]),
            "unchanged_reported_as_changed": (0 if promotion is Promotion.MERGE_CHANGED
                                    else int(preview["unchanged"]))}


def _target_checks(plan: BackfillPlan, t: TargetSpec) -> dict[str, Any]:
    """The checks one target is gated by and what they compare its shadow with."""
    ref = t.validation.reference if t.validation else None
    return {"target": t.label,
            "own_checks": bool(t.validation and t.validation.checks),
            "reference": ref.model_dump(mode="json", exclude_none=True) if ref else None,
            "checks": [c.model_dump(mode="json", exclude_none=True)
                       for c in plan.checks_for(t)]}


def build_evidence(run: RunReport, outcome: str, error: str | None = None) -> dict[str, Any]:
    """Evidence dict from the typed report of a run in progress or finished."""
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
            "promotion": st.promotion.value,
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
            "change_applied": change_applied(
                window.get("change_preview") if window else None, st.promotion,
                st.deletes_unmatched),
        })
    failed = [g for g in all_gates if not g["passed"]]
    row_gates = [g for g in all_gates if g["check_type"] == "row_count_parity"]
    metric_gates = [g for g in all_gates if g["check_type"] == "metric_reconciliation"]
    granted = [a.model_dump(mode="json") for a in plan.approvals.granted
               if a.fingerprint == run.fingerprint]
    promoted = outcome == "promoted"
    code_paths = [_ENTRY_POINT, run.plan_path]
    code_paths += [t.transform.callable for t in plan.target_specs() if t.transform.callable]
    contracts = [_contract_text(t) for t in plan.targets]

    def status(gates: list[dict[str, Any]]) -> str:
        if not gates:
            return "not_run"
        return "pass" if all(g["passed"] for g in gates) else "fail"

    return {
        "release_gate_evidence": {
            "release_name": plan.name,
            "owner": plan.owner,
            "environment": os.environ.get("SPARKGUARD_ENVIRONMENT", "local"),
            "release_surface": {"code_paths": code_paths,
                                "datasets": [t["dataset"] for t in targets],
                                "contracts": contracts},
            "staged_validation": {
                "shadow_run": "pass" if all_gates and not failed else
                ("fail" if failed else "not_run"),
                "canary_scope": "proof slice: " + ", ".join(run.proof_partitions)
                if run.proof_partitions else None,
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
            "observability": {
                "alerts_configured": bool(plan.safeguards.downstream_notifications),
                "dashboard_link": os.environ.get("SPARKGUARD_DASHBOARD_URL"),
                "owner_oncall": plan.owner,
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
            "written_at": dt.datetime.now(dt.UTC).isoformat(),
            "plan": {"name": plan.name, "path": run.plan_path, "fingerprint": run.fingerprint,
                     "reason": plan.reason,
                     "checks": [c.model_dump(mode="json", exclude_none=True)
                                for c in plan.validation.checks],
                     "target_checks": [_target_checks(plan, t) for t in plan.target_specs()]},
            "chart": None,
            "approvals_used": granted,
            "source": {"dataset": run.source, "version_read": run.source_version},
            "window": {"partition_column": run.partition_column,
                       "partitions": list(run.partitions), **_range_of(plan)},
            "publish": {"paused_by_this_run": run.publish_paused},
            "gates": all_gates,
            "failed_gates": failed,
            "targets": targets,
        },
    }


def _contract_text(target: Any) -> str:
    parts = []
    if target.contract.match_target_schema:
        parts.append("schema equals the target's")
    if target.contract.not_null:
        parts.append("not null: " + ", ".join(target.contract.not_null))
    if target.contract.columns:
        parts.append(f"{len(target.contract.columns)} column contract(s)")
    return f"{target.label}: " + ("; ".join(parts) or "none")


def _dump(data: dict[str, Any]) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True,
                          width=100)


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)


def write_evidence(run: RunReport, outcome: str, error: str | None = None,
                   audit: dict[str, Any] | None = None) -> str:
    """Write ``<evidence_dir>/<run_id>.yaml``, ``.md`` and (with matplotlib) ``.png``; return the
    YAML path. ``audit`` (chain heads and commits, see :func:`attach_audit_section`) adds the
    audit section, its content hash and, with ``SPARKGUARD_AUDIT_KEY`` set, its seal."""
    from sparkguard.chart import write_chart

    data = build_evidence(run, outcome, error)
    base = Path(run.evidence_dir) / run.run_id
    png, tmp = base.with_suffix(".png"), base.with_name(f".{run.run_id}.png.tmp")
    try:  # the chart is an aid: never let it cost the evidence itself
        if write_chart(data, tmp):
            os.replace(tmp, png)
            data["sparkguard"]["chart"] = png.name
    except Exception as exc:
        data["sparkguard"]["chart_error"] = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        tmp.unlink(missing_ok=True)
    if audit is not None:
        attach_audit_section(data, audit)
    yaml_path = base.with_suffix(".yaml")
    _atomic_write(yaml_path, _dump(data))
    _atomic_write(base.with_suffix(".md"), render_markdown(data))
    return str(yaml_path)


def attach_audit_section(data: dict[str, Any], facts: dict[str, Any]) -> None:
    """Add the ``audit`` section (last, after everything it hashes) to evidence in place."""
    from sparkguard.audit_trail import attach_audit, audit_key

    attach_audit(data, home=facts["home"], chains=facts["chains"], commits=facts["commits"],
                 key=audit_key(), commits_error=facts.get("commits_error"))


class EvidenceError(SparkguardError):
    """Raised when an evidence file is missing or is not one sparkguard wrote."""

    exit_code = EXIT_USAGE


def load_evidence(path: str | Path) -> dict[str, Any]:
    """Read an evidence YAML written by :func:`write_evidence`."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except FileNotFoundError:
        raise EvidenceError(f"{path}: no such evidence file; give the <run id>.yaml the run wrote "
                            "(its path is printed at the end of the run)") from None
    except yaml.YAMLError as exc:
        raise EvidenceError(f"{path}: not YAML ({exc})") from None
    if not isinstance(data, dict) or "sparkguard" not in data or \
            "release_gate_evidence" not in data:
        raise EvidenceError(f"{path}: not a sparkguard evidence file (no 'sparkguard' and "
                            "'release_gate_evidence' sections)")
    return data


# -- Markdown ---------------------------------------------------------------------------------

_MAX_PARTITION_ROWS = 100


def _cell(value: Any) -> str:
    """A value as a Markdown table cell (pipes escaped, one line)."""
    return " ".join(str(value).split()).replace("|", "\\|")


def _code(text: Any) -> str:
    """Inline code that survives backquotes inside (``RESTORE TABLE delta.`/p` ...``)."""
    text = str(text)
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def _yes(flag: Any) -> str:
    return "yes" if flag else "no"


def _measured(value: Any) -> str:
    if isinstance(value, dict) and "nan_or_infinite_rows" in value:
        rows = ", ".join(f"{k} {v}" for k, v in value["nan_or_infinite_rows"].items())
        return f"{value['value']} (NaN or infinite input rows: {rows})"
    if isinstance(value, dict) and "value" in value:
        pct = value.get("pct_diff")
        return f"{value['value']} (diff {value.get('abs_diff')}, {pct}%)"
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items())
    return str(value)


def _pct(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "n/a"
    if math.isinf(value):
        return "inf"
    if value == 0:
        return "0%"
    return f"{value:+.3g}%" if signed else f"{value:.3g}%"


def _window_text(column: str, partitions: list[str], window: dict[str, Any] | None = None
                 ) -> str:
    shown = partitions if len(partitions) <= 8 else [*partitions[:3], "...", *partitions[-2:]]
    if window and window.get("range"):
        lo, hi = window["range"]
        return (f"`{column}` in [{lo}, {hi}) ({len(partitions)} {window['bucket']} bucket(s): "
                f"{', '.join(shown)})")
    return f"`{column}` in {', '.join(shown)} ({len(partitions)} partition(s))"


def _range_of(plan: BackfillPlan) -> dict[str, Any]:
    """A ``window_column`` window's exact bounds and bucket grain (nothing for partitions)."""
    rw = range_window(plan)
    if rw is None:
        return {}
    w = plan.affected_window
    assert w.start_utc is not None and w.end_utc is not None
    return {"range": [w.start_utc.isoformat().replace("+00:00", "Z"),
                      w.end_utc.isoformat().replace("+00:00", "Z")], "bucket": rw.grain}


def _summary(data: dict[str, Any]) -> list[str]:
    sg, rg = data["sparkguard"], data["release_gate_evidence"]
    approvals = "; ".join(f"{a['role']} by {a['by']} at {a['at']}" for a in sg["approvals_used"])
    rows = [
        ("Run", f"`{sg['run_id']}`"),
        ("Plan", f"`{sg['plan']['path']}` (fingerprint `{sg['plan']['fingerprint'][:16]}`)"),
        ("Reason", sg["plan"].get("reason")),
        ("Owner", rg["owner"]),
        ("Environment", rg["environment"]),
        ("Source of truth", f"`{sg['source']['dataset']}` read at version "
                            f"{sg['source']['version_read']}"),
        ("Window", _window_text(sg["window"]["partition_column"], sg["window"]["partitions"],
                                sg["window"])),
        ("Approvals", approvals or "none"),
        ("Written at", sg["written_at"]),
    ]
    return ["| | |", "|---|---|", *(f"| {k} | {_cell(v)} |" for k, v in rows)]


def _release_gate(rg: dict[str, Any]) -> list[str]:
    rec, sv = rg["reconciliation"], rg["staged_validation"]
    rows = [
        ("Shadow run", sv["shadow_run"]),
        ("Proof (canary) scope", sv.get("canary_scope")),
        ("Row count parity", rec["row_count_status"]),
        ("Metric parity", f"{rec['metric_parity_status']} "
                          f"({', '.join(rec['checked_metrics']) or 'no metric'})"),
        ("Approvals required / granted", f"{', '.join(rg['approvals']['required'])} / "
                                         f"{', '.join(rg['approvals']['granted']) or 'none'}"),
        ("Cutover", rg["publish_control"]["cutover_strategy"]),
        ("Rollback strategy", rg["rollback"]["strategy"]),
    ]
    return ["## Release gate", "", "| check | status |", "|---|---|",
            *(f"| {k} | {_cell(v)} |" for k, v in rows)]


def _partition_table(data: dict[str, Any], target: dict[str, Any]) -> list[str]:
    from sparkguard.chart import panels

    mine = panels({"sparkguard": {**data["sparkguard"], "targets": [target]}})
    if not mine:
        return []
    rows_panel, metric_panels = mine[0], mine[1:]
    metrics = [p.title.split(": ", 1)[1] for p in metric_panels]
    head = ["partition", "rows source / shadow / target", "rows vs source",
            *(f"{m} vs source" for m in metrics),
            *(f"{m}: target -> after promotion" for m in metrics)]
    stats = {str(s["partition"]): s for s in _stats_of(target)}
    lines = ["", "Per partition: the gate's measure (shadow vs source of truth) and how each "
             "metric moves when the promotion replaces the current target (the drift).", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, part in enumerate(rows_panel.partitions[:_MAX_PARTITION_ROWS]):
        s = stats[part]
        cells = [part, f"{s.get('rows_source')} / {s.get('rows_shadow')} / {s.get('rows_target')}",
                 _flagged(rows_panel, i),
                 *(_flagged(p, i) for p in metric_panels),
                 *(_move(s, m, p.changes_pct[i]) for m, p in zip(metrics, metric_panels,
                                                                  strict=True))]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    if len(rows_panel.partitions) > _MAX_PARTITION_ROWS:
        lines.append(f"\n{len(rows_panel.partitions) - _MAX_PARTITION_ROWS} more partition(s) "
                     "in the YAML.")
    return lines


def _move(stats: dict[str, Any], metric: str, pct: float | None) -> str:
    """A metric's drift in one partition: ``before -> after (+x%)``."""
    values = (stats.get("metrics") or {}).get(metric) or {}
    return f"{values.get('target')} -> {values.get('shadow')} ({_pct(pct, signed=True)})"


def _stats_of(target: dict[str, Any]) -> list[dict[str, Any]]:
    window = target.get("full_window")
    if window and window.get("partitions"):
        return list(window["partitions"])
    return [s for sl in target.get("slices") or [] for s in sl.get("partitions") or []]


def _flagged(panel: Any, i: int) -> str:
    delta = panel.deltas[i]
    text = _pct(delta) if panel.unit == "%" else f"{delta:g}"
    return f"**{text}**" if panel.partitions[i] in panel.breaches else text


def _applied_text(promotion: str, a: dict[str, Any], done: bool) -> str:
    """One sentence: what the promotion commit does, as its change data feed reports it."""
    kept = (f", {a['kept']} kept (no longer produced; merge.when_not_matched_by_source: keep)"
            if a["kept"] else "")
    same = (f"; {a['unchanged_reported_as_changed']} unchanged row(s) rewritten as well and "
            "reported as changes by a change data feed" if a["unchanged_reported_as_changed"]
            else "; unchanged rows neither updated nor reported as changes")
    head = f"Promotion ({promotion})" + ("" if done else ", had it happened")
    return (f"{head}: {a['inserted']} inserted, {a['deleted']} deleted"
            f"{kept}, {a['updated']} updated{same}.")


def _target(data: dict[str, Any], t: dict[str, Any]) -> list[str]:
    rb = t["rollback_point"]
    lines = ["", f"## Target {_code(t['dataset'])} ({t['promotion']})", ""]
    if t["promoted_version"] is not None:
        lines.append(f"- Promoted at version {t['promoted_version']}; verified: "
                     f"{_yes(t['verified'])}; restored after a failure: "
                     f"{_yes(t['restored_after_failure'])}")
    else:
        lines.append("- Not promoted: the target was left as it was")
    tc = next((x for x in data["sparkguard"]["plan"].get("target_checks") or []
               if x["target"] == t["name"]), None)
    if tc is not None:
        ref = tc["reference"]
        against = ("the source of truth" if not ref else
                   f"its reference {_code(' '.join(str(ref.get('sql') or ref.get('callable')).split()))}")
        which = "its own" if tc["own_checks"] else "the plan's"
        names = ", ".join(c.get("metric") or c["type"] for c in tc["checks"])
        lines.append(f"- Checks: {which} ({_cell(names)}), against {against}")
    if rb.get("version_before_promotion") is not None:
        lines.append(f"- Rollback point: version {rb['version_before_promotion']}")
    if rb.get("rollback_command"):
        lines.append(f"- Roll back: {_code(rb['rollback_command'])}")
    if rb.get("restore_statement"):
        lines.append(f"- Or in SQL: {_code(rb['restore_statement'])}")
    slices = t.get("slices") or []
    skipped = t.get("skipped_slices_already_reconciled") or []
    lines.append(f"- Slices reconciled in this run: {len(slices)}"
                 + (f"; skipped as already reconciled: {skipped}" if skipped else ""))
    failed_slices = [s["scope"] for s in slices if not s["passed"]]
    if failed_slices:
        lines.append(f"- Slices that failed their gates: {', '.join(failed_slices)}")
    w = t.get("full_window")
    if w:
        lines += ["", "| gate | measured | expected | threshold | result |", "|---|---|---|---|---|"]
        for g in w["gates"]:
            where = f" [{g['partition']}]" if g.get("partition") else ""
            lines.append(f"| {_cell(g['gate'] + where)} | {_cell(_measured(g['measured']))} | "
                         f"{_cell(g.get('expected'))} | {_cell(g['threshold'])} | "
                         f"{'pass' if g['passed'] else '**FAIL**'} |")
        pv = w.get("change_preview")
        applied = t.get("change_applied")
        if pv:
            gone = (f"{pv['deleted']} deleted" if not applied or not applied["kept"] else
                    f"{pv['deleted']} no longer produced, kept")
            lines += ["", f"Change preview: {pv['inserted']} inserted, {gone}, "
                          f"{pv['changed']} changed, {pv['unchanged']} unchanged."]
            cols = {k: v for k, v in pv["changed_by_column"].items() if v}
            if cols:
                lines.append("Changed values per column: "
                             + ", ".join(f"{k}={v}" for k, v in sorted(cols.items())) + ".")
        if applied:
            lines.append(_applied_text(t["promotion"], applied,
                                       t["promoted_version"] is not None))
    lines += _partition_table(data, t)
    return lines


def render_markdown(data: dict[str, Any]) -> str:
    """A reviewer's one-page summary of the evidence."""
    sg, rg = data["sparkguard"], data["release_gate_evidence"]
    lines = [f"# Backfill evidence: {sg['plan']['name']}", "",
             f"**Outcome: {sg['outcome']}.** Ready to ship: "
             f"{_yes(rg['decision']['ready_to_ship'])}; publish unblocked: "
             f"{_yes(rg['publish_control']['publish_unblocked'])}.", ""]
    if sg.get("error"):
        lines += [f"> {_cell(sg['error'])}", ""]
    lines += _summary(data)
    if sg.get("failed_gates"):
        lines += ["", "## Failed gates", ""]
        lines += [f"- `{g['target']}` **{g['gate']}**"
                  + (f" [{g['partition']}]" if g.get("partition") else "")
                  + f": {' '.join(str(g['reason']).split())}" for g in sg["failed_gates"]]
    for t in sg["targets"]:
        lines += _target(data, t)
    for rb in sg.get("rollbacks") or []:
        lines += ["", f"## Rolled back at {rb['at']} by {rb['by']}"
                      f"{' (forced)' if rb.get('forced') else ''}", ""]
        lines += [f"- {_code(r['dataset'])}: restored to version {r['rollback_version']} (new "
                  f"version {r['new_version']}); verified: {r['verified']}"
                  for r in rb.get("targets") or []]
    if sg.get("chart"):
        lines += ["", "## Per-partition deltas against thresholds", "",
                  f"![per-partition row-count and metric deltas]({sg['chart']})"]
    lines += ["", *_release_gate(rg)]
    return "\n".join(lines) + "\n"
