"""Evidence: the documented YAML shape, the Markdown summary (golden files) and the PNG chart.

Regenerate the golden Markdown after an intended change with
``SPARKGUARD_REGEN_GOLDEN=1 pytest tests/unit/test_evidence.py`` and review the diff.
"""

from __future__ import annotations

import copy
import os
import struct
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest
import yaml

from sparkguard.chart import chart_available, panels, write_chart
from sparkguard.cli import main
from sparkguard.errors import EXIT_OK, EXIT_USAGE
from sparkguard.evidence import load_evidence, render_markdown

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
TEMPLATE = Path(__file__).resolve().parents[2] / "templates" / "release-gate-evidence.yaml"
CASES = ["evidence", "evidence_gate_failed", "evidence_merge_keep", "evidence_merge_changed",
         "evidence_merge_changed_delete"]  # the last three: one per promotion mode and option

# The release-gate evidence shape of the seed template: every key must stay in ours.
SEED_SHAPE = {
    "release_gate_evidence.release_name", "release_gate_evidence.owner",
    "release_gate_evidence.environment",
    "release_gate_evidence.release_surface.code_paths",
    "release_gate_evidence.release_surface.datasets",
    "release_gate_evidence.release_surface.contracts",
    "release_gate_evidence.staged_validation.shadow_run",
    "release_gate_evidence.staged_validation.canary_scope",
    "release_gate_evidence.staged_validation.notes",
    "release_gate_evidence.reconciliation.row_count_status",
    "release_gate_evidence.reconciliation.metric_parity_status",
    "release_gate_evidence.reconciliation.checked_metrics",
    "release_gate_evidence.publish_control.deployment_complete",
    "release_gate_evidence.publish_control.publish_unblocked",
    "release_gate_evidence.publish_control.cutover_strategy",
    "release_gate_evidence.observability.alerts_configured",
    "release_gate_evidence.observability.dashboard_link",
    "release_gate_evidence.observability.owner_oncall",
    "release_gate_evidence.rollback.strategy", "release_gate_evidence.rollback.tested",
    "release_gate_evidence.approvals.required", "release_gate_evidence.approvals.granted",
    "release_gate_evidence.decision.ready_to_ship",
}


def key_paths(data: Any, prefix: str = "") -> set[str]:
    """Dotted paths of every mapping key; list items are described by their first item."""
    paths: set[str] = set()
    if isinstance(data, dict):
        for key, value in data.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            paths.add(path)
            paths |= key_paths(value, path)
    elif isinstance(data, list) and data:
        paths |= key_paths(data[0], f"{prefix}[]")
    return paths


def _case(name: str) -> dict[str, Any]:
    return load_evidence(GOLDEN / f"{name}.yaml")


# -- shape ------------------------------------------------------------------------------------

def test_template_is_a_superset_of_the_seed_shape() -> None:
    assert key_paths(yaml.safe_load(TEMPLATE.read_text())) >= SEED_SHAPE


@pytest.mark.parametrize("name", CASES)
def test_evidence_files_have_every_field_the_template_documents(name: str) -> None:
    missing = key_paths(yaml.safe_load(TEMPLATE.read_text())) - key_paths(_case(name))
    assert not missing


# -- Markdown ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", CASES)
def test_markdown_matches_golden(name: str) -> None:
    rendered = render_markdown(_case(name))
    golden = GOLDEN / f"{name}.md"
    if os.environ.get("SPARKGUARD_REGEN_GOLDEN") == "1":
        golden.write_text(rendered, encoding="utf-8")
    assert rendered == golden.read_text(encoding="utf-8")


def test_report_prints_the_same_markdown(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", "--evidence", str(GOLDEN / "evidence.yaml")]) == EXIT_OK
    assert capsys.readouterr().out == (GOLDEN / "evidence.md").read_text() + "\n"


def test_report_refuses_a_missing_or_foreign_file(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", "--evidence", str(tmp_path / "nope.yaml")]) == EXIT_USAGE
    assert "no such evidence file" in capsys.readouterr().err
    other = tmp_path / "plan.yaml"
    other.write_text("backfill_plan: {name: x}\n")
    assert main(["report", "--evidence", str(other)]) == EXIT_USAGE
    assert "not a sparkguard evidence file" in capsys.readouterr().err


def test_markdown_flags_the_failing_partition_and_gate() -> None:
    md = render_markdown(_case("evidence_gate_failed"))
    assert "| 2026-05-03 | 100 / 97 / 97 | **3%** |" in md
    assert "| row_count_parity | 197 (diff 3.0, 1.5%) | 200 | <= 0% | **FAIL** |" in md
    assert "Not promoted" in md and "Roll back" not in md


def test_markdown_cells_cannot_break_the_table() -> None:
    data = copy.deepcopy(_case("evidence"))
    data["sparkguard"]["plan"]["reason"] = "a | b\nc"
    md = render_markdown(data)
    assert "| Reason | a \\| b c |" in md


def test_rollback_sql_with_backquotes_stays_one_code_span() -> None:
    md = render_markdown(_case("evidence"))
    assert "- Or in SQL: `` RESTORE TABLE delta.`/lake/target/orders_clean` TO VERSION AS OF 2 ``" \
        in md.splitlines()


# -- chart ------------------------------------------------------------------------------------

def test_panels_measure_each_partition_against_its_threshold() -> None:
    rows, gross, line_total = panels(_case("evidence_gate_failed"))
    assert rows.partitions == ("2026-05-02", "2026-05-03")
    assert (rows.unit, rows.threshold, rows.deltas) == ("%", 0.0, (0.0, 3.0))
    assert rows.breaches == ("2026-05-03",)
    assert gross.title == "orders_clean: gross_amount" and gross.threshold == 0.01
    assert gross.breaches == () and gross.deltas == (0.0, 0.0)
    # the promotion lowers amounts (the defect multiplied them by 10 in 20 % of rows)
    assert all(c is not None and -70 < c < -60 for c in gross.changes_pct)
    assert line_total.changes_pct[1] == pytest.approx(-66.1, abs=0.05)


def test_panels_hold_exact_values_exactly_and_each_target_to_its_own_checks() -> None:
    """A decimal sum one unit in the 18th place off, or a bigint past 2**53 off by one, was
    turned into floats and shown as 0% and within threshold while the exact gate failed; and
    the panels took the plan's checks, not the ones the target's gates ran."""
    data = copy.deepcopy(_case("evidence_gate_failed"))
    sg = data["sparkguard"]
    part = sg["targets"][0]["full_window"]["partitions"][0]
    part["metrics"]["gross_amount"].update(source="100.000000000000000000",
                                           shadow="100.000000000000000001")
    part["metrics"]["line_total"].update(source=str(2 ** 60), shadow=str(2 ** 60 + 1))
    own = sg["plan"]["target_checks"][0]["checks"]
    for check in own:
        if check["type"] == "metric_reconciliation":
            check["threshold_percent"] = 0.0
    _rows, gross, line_total = panels(data)
    assert gross.threshold == 0.0 and line_total.threshold == 0.0  # the target's, not 0.01
    assert gross.breaches == line_total.breaches == ("2026-05-02",)
    assert gross.deltas[0] > 0
    (row,) = [ln for ln in render_markdown(data).splitlines() if ln.startswith("| 2026-05-02 |")]
    assert row.split(" | ")[3:5] == ["**1e-18%**", "**8.67e-17%**"], row


def test_panels_fall_back_to_slices_without_a_full_window() -> None:
    data = copy.deepcopy(_case("evidence_gate_failed"))
    data["sparkguard"]["targets"][0]["full_window"] = None
    (rows, *_) = panels(data)
    assert rows.partitions == ("2026-05-02", "2026-05-03")
    assert rows.deltas == (0.0, 0.0)  # the slices, unlike the edited window, matched


def test_panels_leave_out_a_metric_not_measured_per_partition() -> None:
    """A count_distinct checked for the window only has no per-partition value: no panel, rather
    than a flat line of zero deviation."""
    data = copy.deepcopy(_case("evidence_gate_failed"))
    for stats in data["sparkguard"]["targets"][0]["full_window"]["partitions"]:
        stats["metrics"]["gross_amount"] = {"source": None, "shadow": None, "target": None}
    titles = [p.title for p in panels(data)]
    assert "orders_clean: gross_amount" not in titles and len(titles) == 2


def _png_size(path: Path) -> tuple[int, int]:
    raw = path.read_bytes()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG signature"
    length, kind = struct.unpack(">I4s", raw[8:16])
    assert kind == b"IHDR" and length == 13
    ihdr = raw[16:29]
    assert struct.unpack(">I", raw[29:33])[0] == zlib.crc32(b"IHDR" + ihdr)
    assert raw[-12:] == b"\x00\x00\x00\x00IEND\xaeB`\x82"
    width, height = struct.unpack(">II", ihdr[:8])
    return width, height


@pytest.mark.skipif(not chart_available(), reason="matplotlib (extra 'chart') not installed")
@pytest.mark.parametrize("name", CASES)
def test_chart_is_a_valid_png(name: str, tmp_path: Path) -> None:
    path = tmp_path / "chart.png"
    assert write_chart(_case(name), path)
    width, height = _png_size(path)
    assert width >= 600 and height >= 3 * 200  # one panel per check: rows + 2 metrics
    assert path.stat().st_size > 5000


def test_no_chart_without_matplotlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails as if not installed
    assert not chart_available()
    assert not write_chart(_case("evidence"), tmp_path / "chart.png")
    assert not (tmp_path / "chart.png").exists()


def test_markdown_shows_rollbacks_recorded_in_the_evidence() -> None:
    data = copy.deepcopy(_case("evidence"))
    data["sparkguard"]["rollbacks"] = [{
        "at": "2026-05-21T08:00:00+00:00", "by": "oncall@example.com", "forced": False,
        "targets": [{"dataset": "/lake/target/orders_clean", "rollback_version": 2,
                     "new_version": 4, "verified": True}]}]
    md = render_markdown(data)
    assert "## Rolled back at 2026-05-21T08:00:00+00:00 by oncall@example.com\n" in md
    assert "- `/lake/target/orders_clean`: restored to version 2 (new version 4); verified: True" \
        in md.splitlines()


def test_a_newline_in_a_partition_or_actor_cannot_forge_a_line_of_the_summary() -> None:
    """A failed gate's partition value (read from the data) and a rollback's actor
    (``SPARKGUARD_ACTOR``) stay on their own line: no forged outcome line or heading."""
    forged = "\n\n**Outcome: promoted.** Ready to ship: yes\n\n## Release gate"
    data = copy.deepcopy(_case("evidence_gate_failed"))
    data["sparkguard"]["failed_gates"][0]["partition"] = "2026-05-02" + forged
    data["sparkguard"]["targets"][0]["slices"][0]["passed"] = False
    data["sparkguard"]["targets"][0]["slices"][0]["scope"] = "slice 1" + forged
    data["sparkguard"]["rollbacks"] = [{"at": "2026-05-21T00:00:00+00:00", "by": "ops" + forged,
                                        "forced": False, "targets": []}]
    lines = render_markdown(data).splitlines()
    assert [x for x in lines if x.startswith("**Outcome")] == [lines[2]]
    assert lines[2].startswith("**Outcome: gate_failed.**")
    assert lines.count("## Release gate") == 1
    assert "**Outcome: promoted.** Ready to ship: yes ## Release gate" in lines[lines.index(
        "## Failed gates") + 2]


def test_a_failed_slice_gate_is_the_release_gate_verdict() -> None:
    """A slice's failed gate stops the run before its full window is reconciled: the evidence
    said shadow run and row count 'not_run' and listed no failed gate."""
    from sparkguard.evidence import build_evidence
    from sparkguard.plan.loader import load_plan_text
    from sparkguard.reconcile.verdicts import GateResult, ReconcileResult
    from sparkguard.run.report import RunReport, TargetReport
    from sparkguard.sql import TableRef
    from tests.plan_fixtures import plan_yaml, valid_plan

    plan = load_plan_text(plan_yaml(valid_plan()))
    t = plan.target_specs()[0]
    gate = GateResult(gate="row_count_parity", check_type="row_count_parity", passed=False,
                      measured={"value": 95}, threshold="<= 0%", reason="expected 100, got 95",
                      expected=100)
    target = TargetReport(
        label=t.label, ref=TableRef.parse(t.dataset), shadow=TableRef(path="/s/x"),
        promotion=t.promotion, reconciled_version=None, rollback_version=None,
        promoted_version=None, verified=False, restored=False, skipped_slices=(), window=None,
        slice_results=(ReconcileResult(scope="proof slice 1", partitions=(), gates=(gate,)),),
        notes=())
    run = RunReport(run_id="r1", plan=plan, plan_path="/p.yaml", fingerprint="f" * 64,
                    home="/h", evidence_dir="/e", source="/src", source_version=0,
                    partition_column="order_date", partitions=("2026-05-02",),
                    proof_partitions=("2026-05-02",), targets={t.label: target},
                    publish_paused=True)
    data = build_evidence(run, "gate_failed", "orders_clean: proof slice: gate failed")
    rg, sg = data["release_gate_evidence"], data["sparkguard"]
    assert rg["staged_validation"]["shadow_run"] == "fail"
    assert rg["reconciliation"]["row_count_status"] == "fail"
    assert rg["reconciliation"]["metric_parity_status"] == "not_run"
    assert [(g["gate"], g["scope"]) for g in sg["failed_gates"]] == [
        ("row_count_parity", "proof slice 1")]
    assert sg["gates"] == []
    assert "- `orders_clean` **row_count_parity** (proof slice 1): expected 100, got 95" \
        in render_markdown(data).splitlines()


def test_a_release_gate_status_passes_only_when_every_target_ran_such_a_gate() -> None:
    """Two targets; only the first has a metric check (a warning, not a refusal, at the
    guard): metric parity said ``pass`` for the release though no metric gate ran for the
    second. It is ``partial``; row counts, checked for both, pass."""
    from dataclasses import replace

    from sparkguard.evidence import build_evidence
    from sparkguard.plan.loader import load_plan_text
    from sparkguard.reconcile.verdicts import GateResult, ReconcileResult
    from sparkguard.run.report import RunReport, TargetReport
    from sparkguard.sql import TableRef
    from tests.plan_fixtures import plan_yaml, valid_plan

    plan = load_plan_text(plan_yaml(valid_plan()))
    t = plan.target_specs()[0]

    def passed(name: str, kind: str) -> GateResult:
        return GateResult(gate=name, check_type=kind, passed=True, measured={"value": 1},
                          threshold="<= 0%", reason="ok", expected=1)

    def target(label: str, *gates: GateResult) -> TargetReport:
        return TargetReport(
            label=label, ref=TableRef(path=f"/t/{label}"), shadow=TableRef(path=f"/s/{label}"),
            promotion=t.promotion, reconciled_version=1, rollback_version=1,
            promoted_version=2, verified=True, restored=False, skipped_slices=(),
            window=ReconcileResult(scope="full window", partitions=(), gates=gates),
            slice_results=(), notes=())

    row, metric = "row_count_parity", "metric_reconciliation"
    both = {"a": target("a", passed(row, row), passed(f"{metric}[m]", metric)),
            "b": target("b", passed(row, row))}
    run = RunReport(run_id="r1", plan=plan, plan_path="/p.yaml", fingerprint="f" * 64,
                    home="/h", evidence_dir="/e", source="/src", source_version=0,
                    partition_column="order_date", partitions=("2026-05-02",),
                    proof_partitions=("2026-05-02",), targets=both, publish_paused=False)
    rec = build_evidence(run, "promoted")["release_gate_evidence"]["reconciliation"]
    assert (rec["row_count_status"], rec["metric_parity_status"]) == ("pass", "partial")
    both["b"] = replace(both["b"], window=ReconcileResult(
        scope="full window", partitions=(), gates=(passed(row, row), passed(f"{metric}[n]",
                                                                            metric))))
    rec = build_evidence(replace(run, targets=both), "promoted")["release_gate_evidence"][
        "reconciliation"]
    assert rec["metric_parity_status"] == "pass"
