"""Review before approval (no Spark): stale approvals name the changed fields, guard
--pre-approval names the fields still to fill, seed-shaped plans are said to be drafts, seed
text that contradicts the promotion is flagged, and the plan layer never imports the guard."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sparkguard.approve import record_approval
from sparkguard.cli import main
from sparkguard.guard import pre_approval_findings, static_findings, to_fill
from sparkguard.plan import fingerprint, load_plan
from sparkguard.plan.approvals import approval_issues, approved_content
from sparkguard.plan.loader import approvals_path
from tests.plan_fixtures import SEED_PLAN, plan_yaml, valid_plan

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def approved(tmp_path: Path) -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text(plan_yaml(valid_plan()), encoding="utf-8")
    record_approval(path, "data-platform-owner", "alice@example.com")
    record_approval(path, "downstream-owner", "bob@example.com")
    return path


def _stale_messages(path: Path) -> list[str]:
    return [p.message for code, p in approval_issues(load_plan(path)) if code == "approval_stale"]


def test_an_approval_records_the_content_it_approved(approved):
    plan = load_plan(approved)
    for rec in plan.approvals.granted:
        content = approved_content(rec)
        assert content is not None and content["name"] == plan.name


def test_a_voided_approval_says_which_fields_changed_from_what_to_what(approved, capsys):
    data = yaml.safe_load(approved.read_text())
    data["backfill_plan"]["validation"]["checks"][2]["threshold_percent"] = 0.5
    data["backfill_plan"]["safeguards"]["downstream_notifications"].append("new-team")
    approved.write_text(yaml.safe_dump(data, sort_keys=False))
    (msg, msg2) = _stale_messages(approved)
    assert msg.startswith("role 'data-platform-owner' approved an earlier version")
    assert msg2.split("; ", 1)[1] == msg.split("; ", 1)[1]
    assert "validation.checks[2].threshold_percent: 0.01 -> 0.5" in msg
    assert 'safeguards.downstream_notifications[2]: (absent) -> "new-team"' in msg
    assert msg.count(" -> ") == 2  # nothing else is reported as changed
    assert main(["guard", str(approved), "--static-only"]) == 2
    out = capsys.readouterr().out
    assert "[BLOCK] approval_stale" in out and "threshold_percent: 0.01 -> 0.5" in out


def test_old_approvals_without_content_still_load_and_still_void(approved):
    side = approvals_path(approved)
    records = yaml.safe_load(side.read_text())["approvals"]
    for r in records:
        del r["content"]
    side.write_text(yaml.safe_dump({"approvals": records}))
    assert not [c for c, _ in approval_issues(load_plan(approved))]  # still valid as they are
    data = yaml.safe_load(approved.read_text())
    data["backfill_plan"]["reason"] = "another reason"
    approved.write_text(yaml.safe_dump(data, sort_keys=False))
    (msg, _) = _stale_messages(approved)
    assert "the changed fields cannot be listed" in msg


def test_recorded_content_that_does_not_match_its_fingerprint_is_ignored(approved):
    side = approvals_path(approved)
    records = yaml.safe_load(side.read_text())["approvals"]
    other = approved.with_name("other.yaml")
    data = valid_plan()
    data["backfill_plan"]["reason"] = "forged"
    other.write_text(plan_yaml(data))
    record_approval(other, "data-platform-owner", "mallory@example.com")
    forged = yaml.safe_load(approvals_path(other).read_text())["approvals"][0]["content"]
    records[0]["content"] = forged
    side.write_text(yaml.safe_dump({"approvals": records}))
    assert approved_content(load_plan(approved).approvals.granted[0]) is None


def _draft_like(path: Path) -> Path:
    data = valid_plan()
    p = data["backfill_plan"]
    p["owner"] = None
    p["status"]["state"] = "draft"
    p["safeguards"]["downstream_notifications"] = []
    p["approvals"]["required"] = []
    p["validation"]["checks"][3]["source_expr"] = None
    p["targets"][0]["transform"]["sql"] = (
        "SELECT order_id, order_date, customer_id, currency, status, quantity, amount, "
        "{fill:line_total} AS line_total FROM {source} WHERE {window}")
    path.write_text(plan_yaml(data))
    return path


def test_pre_approval_names_each_field_still_to_fill_and_nothing_else(tmp_path, capsys):
    path = _draft_like(tmp_path / "draft.yaml")
    fill = to_fill(pre_approval_findings(load_plan(path)))
    assert sorted(f.path for f in fill) == [
        "backfill_plan.approvals.required", "backfill_plan.owner",
        "backfill_plan.safeguards.downstream_notifications",
        "backfill_plan.targets[0].transform.sql",
        "backfill_plan.validation.checks[3].source_expr"]
    assert main(["guard", str(path), "--static-only", "--pre-approval"]) == 2
    out = capsys.readouterr().out.splitlines()
    assert [ln.split("]")[0] for ln in out if ln.startswith("[")] == ["[FILL "] * 5 + \
        ["[INFO "]  # the publish_paused claim
    assert any("{fill:line_total}" in ln and "line_total" in ln for ln in out)
    assert out[-2].startswith("still to fill in (5): backfill_plan.")
    assert "5 field(s) still to fill in, 0 other blocking finding(s)" in out[-1]
    # without --pre-approval the same fields block as before
    assert main(["guard", str(path), "--static-only"]) == 2
    assert "[FILL" not in capsys.readouterr().out


def test_pre_approval_still_blocks_a_real_problem_beside_the_fields_to_fill(tmp_path, capsys):
    path = _draft_like(tmp_path / "draft.yaml")
    data = yaml.safe_load(path.read_text())
    data["backfill_plan"]["safeguards"]["publish_paused"] = False
    path.write_text(yaml.safe_dump(data))
    assert main(["guard", str(path), "--static-only", "--pre-approval"]) == 2
    out = capsys.readouterr().out
    assert "[BLOCK] publish_not_paused" in out and "1 other blocking finding(s)" in out


def test_a_seed_shaped_plan_is_said_to_load_as_a_draft(capsys):
    assert main(["guard", str(SEED_PLAN), "--static-only"]) == 2
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"{SEED_PLAN}: loaded as a draft in the seed template's shape")
    assert "partitioning" in first and "2 target(s) as bare names" in first


def test_a_complete_plan_is_not_called_a_draft(approved, capsys):
    assert main(["guard", str(approved), "--static-only"]) == 0
    assert "as a draft" not in capsys.readouterr().out


def test_seed_write_strategy_merge_without_promotion_is_flagged(tmp_path):
    data = valid_plan()
    p = data["backfill_plan"]
    p["execution"]["write_strategy"] = "merge"  # the seed's value
    del p["targets"][0]["promotion"]
    path = tmp_path / "p.yaml"
    path.write_text(plan_yaml(data))
    (f,) = [f for f in static_findings(load_plan(path)) if f.code == "seed_text_contradicts"]
    assert f.path == "backfill_plan.execution.write_strategy"
    assert "promoted by replace_where (the default when promotion is not set)" in f.message
    p["targets"][0]["promotion"] = "merge"  # now the words and the run agree
    path.write_text(plan_yaml(data))
    assert not [f for f in static_findings(load_plan(path)) if f.code == "seed_text_contradicts"]


@pytest.mark.parametrize("module", ["sparkguard.plan.approvals", "sparkguard.guard",
                                    "sparkguard.approve", "sparkguard.plan"])
def test_each_module_imports_first_in_a_fresh_interpreter(module):
    proc = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_the_plan_layer_imports_nothing_above_it():
    allowed = ("sparkguard.plan", "sparkguard.errors", "sparkguard.sql")
    for path in sorted((ROOT / "sparkguard" / "plan").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for name in names:
                if name.startswith("sparkguard"):
                    assert name.startswith(allowed), f"{path.name} imports {name}"


def test_fingerprint_is_unchanged_by_recorded_content(approved):
    path = approved.with_name("same.yaml")
    path.write_text(plan_yaml(valid_plan()))
    assert fingerprint(load_plan(path)) == fingerprint(load_plan(approved))
