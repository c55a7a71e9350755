"""Evidence for audit: a YAML file (a superset of the seed's release-gate-evidence shape, see
``templates/release-gate-evidence.yaml``), a Markdown summary and a PNG chart beside it.

This module builds, writes and loads the evidence dict; ``evidence_md`` renders the Markdown.
"""

from __future__ import annotations

import datetime as dt
import os
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from sparkguard.doc_io import atomic_write, dump_yaml
from sparkguard.errors import EXIT_USAGE, SparkguardError
from sparkguard.evidence_md import render_markdown
from sparkguard.plan.model import BackfillPlan, Promotion, TargetSpec
from sparkguard.plan.window_spec import range_window
from sparkguard.sql import restore_statement

if TYPE_CHECKING:
    from sparkguard.plan.model import BackfillPlan
    from sparkguard.run.report import RunReport

__all__ = ["EvidenceError", "build_evidence", "evidence_home", "load_evidence", "render_markdown",
           "write_evidence"]

_ENTRY_POINT = "jobs/backfill.py"


def change_applied(preview: dict[str, Any] | None, promotion: Promotion,
                   deletes_unmatched: bool) -> dict[str, Any] | None:
    """What the promotion commit does to the window's rows, from the change preview: rows
    inserted, deleted, kept (no longer produced, ``merge.when_not_matched_by_source: keep``),
    updated, and unchanged rows rewritten as if changed, which a change data feed reports as
    changes: every one under ``replace_where`` and ``merge``, none under ``merge_changed``. A
    key moved to another partition of the window (``moved``, MERGE modes) is one update."""
    if not preview:
        return None
    moved = int(preview.get("moved") or 0)
    gone = int(preview["deleted"]) - moved
    return {"inserted": int(preview["inserted"]) - moved,
            "deleted": gone if deletes_unmatched else 0,
            "kept": 0 if deletes_unmatched else gone,
            "updated": int(preview["changed"]) + moved,
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
    slice_failed: list[dict[str, Any]] = []  # a slice's failed gates stop a run before its window
    for label, st in run.targets.items():
        window = st.window.to_dict() if st.window else None
        if st.window:
            all_gates += [{"target": label, **g.to_dict()} for g in st.window.gates]
        else:
            slice_failed += [{"target": label, "scope": r.scope, **g.to_dict()}
                             for r in st.slice_results for g in r.gates if not g.passed]
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
                                     f"--home {shlex.quote(str(run.home))}")
                if st.promoted_version is not None
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
    failed = [g for g in all_gates if not g["passed"]] + slice_failed
    row_gates = [g for g in all_gates if g["check_type"] == "row_count_parity"]
    metric_gates = [g for g in all_gates if g["check_type"] == "metric_reconciliation"]
    granted = [a.model_dump(mode="json") for a in plan.approvals.granted
               if a.fingerprint == run.fingerprint]
    promoted = outcome == "promoted"
    code_paths = [_ENTRY_POINT, run.plan_path]
    code_paths += [t.transform.callable for t in plan.target_specs() if t.transform.callable]
    contracts = [_contract_text(t) for t in plan.targets]

    def status(gates: list[dict[str, Any]], kind: str) -> str:
        """fail, pass (a gate of ``kind`` passed for every target), partial (for some
        targets only: others have no such check) or not_run."""
        if any(g["check_type"] == kind for g in failed):
            return "fail"
        if not gates:
            return "not_run"
        return "pass" if {g["target"] for g in gates} >= set(run.targets) else "partial"

    return {
        "release_gate_evidence": {
            "release_name": plan.name,
            "owner": plan.owner,
            "environment": os.environ.get("SPARKGUARD_ENVIRONMENT", "local"),
            "release_surface": {"code_paths": code_paths,
                                "datasets": [t["dataset"] for t in targets],
                                "contracts": contracts},
            "staged_validation": {
                "shadow_run": "fail" if failed else ("pass" if all_gates else "not_run"),
                "canary_scope": "proof slice: " + ", ".join(run.proof_partitions)
                if run.proof_partitions else None,
                "notes": error or f"outcome: {outcome}",
            },
            "reconciliation": {
                "row_count_status": status(row_gates, "row_count_parity"),
                "metric_parity_status": status(metric_gates, "metric_reconciliation"),
                "checked_metrics": sorted({g["gate"] for g in [*metric_gates, *failed]
                                           if g["check_type"] == "metric_reconciliation"}),
            },
            "publish_control": {
                "deployment_complete": promoted,
                # a promoted run's error: publish could not be reopened (a re-run does it)
                # an operator's manual pause stays when the run reopens its own hold
                "publish_unblocked": ((promoted and error is None and not run.held_by_others)
                                      or outcome == "dry_run_passed"),
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
            "publish": {"paused_by_this_run": run.publish_paused, **(
                {"still_paused_by_others": {t: list(h) for t, h in run.held_by_others.items()}}
                if run.held_by_others else {})},
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
    atomic_write(yaml_path, dump_yaml(data))
    atomic_write(base.with_suffix(".md"), render_markdown(data))
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
    except (OSError, UnicodeDecodeError) as exc:
        raise EvidenceError(f"{path}: cannot be read as an evidence file ({exc}); give the "
                            "<run id>.yaml the run wrote") from None
    except yaml.YAMLError as exc:
        raise EvidenceError(f"{path}: not YAML ({exc})") from None
    if not isinstance(data, dict) or "sparkguard" not in data or \
            "release_gate_evidence" not in data:
        raise EvidenceError(f"{path}: not a sparkguard evidence file (no 'sparkguard' and "
                            "'release_gate_evidence' sections)")
    sg = data["sparkguard"]
    if not isinstance(sg, dict) or not isinstance(sg.get("run_id"), str) or not sg["run_id"]:
        raise EvidenceError(f"{path}: sparkguard.run_id is missing or not a string: not an "
                            "evidence file sparkguard wrote")
    if not isinstance(sg.get("targets", []), list) or not all(
            isinstance(t, dict) and isinstance(t.get("rollback_point", {}), dict)
            for t in sg.get("targets", [])):
        raise EvidenceError(f"{path}: sparkguard.targets is not a list of targets with a "
                            "rollback_point mapping: not an evidence file sparkguard wrote")
    return data


def evidence_home(data: dict[str, Any]) -> str | None:
    """The ledger home a loaded evidence file records (``audit.ledger_home``, else the
    ``--home`` of its rollback command), or None."""
    audit = data.get("audit")
    if isinstance(audit, dict) and isinstance(audit.get("ledger_home"), str):
        return str(audit["ledger_home"])
    for t in data["sparkguard"].get("targets", []):
        cmd = (t.get("rollback_point") or {}).get("rollback_command")
        try:
            words = shlex.split(cmd) if isinstance(cmd, str) else []
        except ValueError:
            continue
        if "--home" in words[:-1]:
            return words[words.index("--home") + 1]
    return None


def _range_of(plan: BackfillPlan) -> dict[str, Any]:
    """A ``window_column`` window's exact bounds and bucket grain (nothing for partitions)."""
    rw = range_window(plan)
    if rw is None:
        return {}
    w = plan.affected_window
    assert w.start_utc is not None and w.end_utc is not None
    return {"range": [w.start_utc.isoformat().replace("+00:00", "Z"),
                      w.end_utc.isoformat().replace("+00:00", "Z")], "bucket": rw.grain}
