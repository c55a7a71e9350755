"""Approvals bound to the plan fingerprint (no Spark): CLI `approve`, invalidation, policy."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
import yaml

from sparkguard.approve import record_approval
from sparkguard.cli import main
from sparkguard.errors import PlanError
from sparkguard.guard import blocking, static_findings
from sparkguard.plan import fingerprint, load_plan
from sparkguard.plan.approvals import approval_issues, valid_approvals
from sparkguard.plan.loader import approvals_path
from tests.plan_fixtures import SEED_PLAN, plan_yaml, valid_plan

OWNER = "data-platform@example.com"


@pytest.fixture
def plan_path(tmp_path: Path) -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text(plan_yaml(valid_plan()), encoding="utf-8")
    return path


def _codes(path: Path) -> list[str]:
    return [code for code, _ in approval_issues(load_plan(path))]


def _approve(path: Path, role: str, by: str) -> int:
    return main(["approve", str(path), "--role", role, "--by", by])


def test_cli_approve_records_role_approver_time_and_fingerprint(plan_path, capsys):
    assert _approve(plan_path, "data-platform-owner", "alice@example.com") == 0
    side = yaml.safe_load(approvals_path(plan_path).read_text())["approvals"]
    assert len(side) == 1
    rec = side[0]
    assert rec["role"] == "data-platform-owner" and rec["by"] == "alice@example.com"
    assert rec["fingerprint"] == fingerprint(load_plan(plan_path))
    at = dt.datetime.fromisoformat(rec["at"].replace("Z", "+00:00"))
    assert abs((dt.datetime.now(dt.UTC) - at).total_seconds()) < 60
    assert rec["fingerprint"] in capsys.readouterr().out
    # the plan file itself is untouched: approvals live beside it
    assert "granted" not in plan_path.read_text()


def test_every_required_role_must_approve_this_fingerprint(plan_path):
    assert _codes(plan_path) == ["approvals_missing", "approvals_missing"]
    assert _approve(plan_path, "data-platform-owner", "alice@example.com") == 0
    assert _codes(plan_path) == ["approvals_missing"]
    assert _approve(plan_path, "downstream-owner", "bob@example.com") == 0
    assert _codes(plan_path) == []
    assert {a.role for a in valid_approvals(load_plan(plan_path))} == {
        "data-platform-owner", "downstream-owner"}
    assert not blocking(static_findings(load_plan(plan_path)))


def test_any_edit_invalidates_earlier_approvals(plan_path, capsys):
    record_approval(plan_path, "data-platform-owner", "alice@example.com")
    record_approval(plan_path, "downstream-owner", "bob@example.com")
    assert _codes(plan_path) == []
    plan_path.write_text(plan_path.read_text().replace("threshold_percent: 0.01",
                                                       "threshold_percent: 5.0"))
    assert _codes(plan_path) == ["approval_stale", "approval_stale"]
    assert valid_approvals(load_plan(plan_path)) == []
    assert main(["guard", str(plan_path), "--static-only"]) == 2
    out = capsys.readouterr().out
    assert "approval_stale" in out and "approved an earlier version of this plan" in out


def test_removing_a_required_role_invalidates_approvals(plan_path):
    record_approval(plan_path, "data-platform-owner", "alice@example.com")
    record_approval(plan_path, "downstream-owner", "bob@example.com")
    plan_path.write_text(plan_path.read_text().replace("    - downstream-owner\n", ""))
    assert load_plan(plan_path).approvals.required == ["data-platform-owner"]
    assert _codes(plan_path) == ["approval_stale"]


def test_status_and_dry_run_claims_do_not_invalidate(plan_path):
    record_approval(plan_path, "data-platform-owner", "alice@example.com")
    record_approval(plan_path, "downstream-owner", "bob@example.com")
    text = plan_path.read_text().replace("state: review", "state: approved") \
        .replace("dry_run_completed: false", "dry_run_completed: true")
    plan_path.write_text(text)
    assert _codes(plan_path) == []


def test_owner_cannot_be_the_only_approver(plan_path):
    record_approval(plan_path, "data-platform-owner", OWNER)
    record_approval(plan_path, "downstream-owner", " Data-Platform@Example.com ")
    assert _codes(plan_path) == ["owner_self_approval"]
    record_approval(plan_path, "downstream-owner", "bob@example.com")
    assert _codes(plan_path) == []


def test_owner_may_self_approve_when_the_plan_says_so(tmp_path):
    data = valid_plan()
    data["backfill_plan"]["approvals"]["owner_may_self_approve"] = True
    path = tmp_path / "plan.yaml"
    path.write_text(plan_yaml(data))
    record_approval(path, "data-platform-owner", OWNER)
    record_approval(path, "downstream-owner", OWNER)
    assert _codes(path) == []


def test_role_not_required_is_refused_and_nothing_written(plan_path, capsys):
    assert _approve(plan_path, "security", "eve@example.com") == 2
    err = capsys.readouterr().err
    assert "backfill_plan.approvals.required: role 'security' is not a required role" in err
    assert "use one of ['data-platform-owner', 'downstream-owner']" in err
    assert not approvals_path(plan_path).exists()


@pytest.mark.parametrize("by", ["", "   ", "eve\nroot", "x" * 201])
def test_odd_approver_names_are_refused(plan_path, by, capsys):
    assert _approve(plan_path, "data-platform-owner", by) == 2
    assert "--by" in capsys.readouterr().err
    assert not approvals_path(plan_path).exists()


def test_an_incomplete_plan_cannot_be_approved(tmp_path, capsys):
    path = tmp_path / "seed.yaml"
    path.write_text(SEED_PLAN.read_text())
    assert _approve(path, "data-platform-owner", "alice@example.com") == 2
    err = capsys.readouterr().err
    assert "partitioning_missing" in err and "not complete enough to approve" in err
    assert not approvals_path(path).exists()


def test_approving_an_unloadable_plan_is_refused(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("backfill_plan:\n  name: [\n")
    assert _approve(path, "x", "alice") == 2
    assert "not valid YAML" in capsys.readouterr().err


def test_approvals_for_another_fingerprint_or_role_do_not_count(plan_path):
    approvals_path(plan_path).write_text(yaml.safe_dump({"approvals": [
        {"role": "data-platform-owner", "by": "alice", "at": "2026-05-01T00:00:00Z",
         "fingerprint": "0" * 64},
        {"role": "security", "by": "eve", "at": "2026-05-01T00:00:00Z",
         "fingerprint": fingerprint(load_plan(plan_path))},
    ]}))
    plan = load_plan(plan_path)
    assert valid_approvals(plan) == []
    assert _codes(plan_path) == ["approval_stale", "approvals_missing"]


@pytest.mark.parametrize("content", [
    "approvals: 5\n",
    "approvals:\n  - {role: r, by: a, at: '2026-05-01T00:00:00Z', fingerprint: abc}\n",
    "approvals:\n  - {role: r, by: a}\n",
    "other: []\n",
    "approvals: [\n",
])
def test_malformed_approvals_file_is_a_clear_error(plan_path, content):
    approvals_path(plan_path).write_text(content)
    with pytest.raises(PlanError) as info:
        load_plan(plan_path)
    assert str(approvals_path(plan_path)) in str(info.value)


def test_concurrent_approvals_are_all_kept(plan_path):
    """Two approvers at once: the sidecar read-modify-write is serialised by a file lock."""
    from concurrent.futures import ThreadPoolExecutor

    roles = ["data-platform-owner", "downstream-owner"] * 4
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda i: record_approval(plan_path, roles[i], f"user{i}"), range(8)))
    side = yaml.safe_load(approvals_path(plan_path).read_text())["approvals"]
    assert sorted(r["by"] for r in side) == sorted(f"user{i}" for i in range(8))
