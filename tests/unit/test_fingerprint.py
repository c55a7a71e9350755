"""The plan fingerprint (no Spark): what changes it and what does not."""

from __future__ import annotations

import datetime as dt
import hashlib

import pytest
import yaml

from sparkguard.plan import fingerprint, load_plan_text
from sparkguard.plan.fingerprint import canonical_content
from sparkguard.plan.model import ApprovalRecord
from tests.plan_fixtures import plan_yaml, valid_plan


def _fp(mutate=None) -> str:
    data = valid_plan()
    if mutate:
        mutate(data["backfill_plan"])
    return fingerprint(load_plan_text(plan_yaml(data)))


BASE = _fp()


def test_fingerprint_is_sha256_of_canonical_content():
    plan = load_plan_text(plan_yaml(valid_plan()))
    assert fingerprint(plan) == hashlib.sha256(canonical_content(plan).encode()).hexdigest()
    assert len(BASE) == 64


def test_formatting_comments_and_key_order_do_not_change_it():
    data = valid_plan()
    text = "# a comment\n" + yaml.safe_dump(data, indent=4, width=50, default_flow_style=True)
    reordered = {"backfill_plan": dict(reversed(list(data["backfill_plan"].items())))}
    assert fingerprint(load_plan_text(text)) == BASE
    assert fingerprint(load_plan_text(plan_yaml(reordered))) == BASE


def test_writing_a_default_explicitly_does_not_change_it():
    def mutate(p):
        p["targets"][0]["merge"] = {"when_not_matched_by_source": "delete"}
        p["safeguards"]["rollback_horizon_days"] = 7
    assert _fp(mutate) == BASE


@pytest.mark.parametrize("mutate", [
    lambda p: p.update(status={"state": "approved"}),
    lambda p: p.update(status={"state": "draft"}),
    lambda p: p["execution"].update(dry_run_completed=True),
    lambda p: p["execution"].pop("dry_run_completed"),
    lambda p: p["approvals"].update(granted=[{
        "role": "data-platform-owner", "by": "x", "at": "2026-05-01T00:00:00Z",
        "fingerprint": "0" * 64}]),
], ids=["status-approved", "status-draft", "dry-run-claim", "dry-run-claim-removed",
        "granted-approvals"])
def test_claims_status_and_granted_approvals_are_excluded(mutate):
    assert _fp(mutate) == BASE


@pytest.mark.parametrize("mutate", [
    lambda p: p["validation"]["checks"][0].update(threshold_percent=5.0),
    lambda p: p["affected_window"].update(end_utc="2026-05-07T00:00:00Z"),
    lambda p: p["affected_window"]["partitions"].pop(),
    lambda p: p["targets"][0]["transform"].update(sql="SELECT * FROM {source}"),
    lambda p: p["targets"][0].update(promotion="merge"),
    lambda p: p["targets"][0].update(business_keys=["order_id", "customer_id"]),
    lambda p: p.update(owner="someone-else@example.com"),
    lambda p: p["safeguards"].update(publish_paused=False),
    lambda p: p["safeguards"]["downstream_notifications"].append("new-team"),
    lambda p: p["approvals"]["required"].pop(),
    lambda p: p["approvals"]["required"].append("security"),
    lambda p: p["approvals"].update(owner_may_self_approve=True),
    lambda p: p["execution"].update(shadow_location="/elsewhere/shadow"),
    lambda p: p["source_of_truth"].update(dataset="/lake/other"),
], ids=["threshold", "window-end", "partition-list", "transform", "promotion", "keys", "owner",
        "publish-paused", "notifications", "role-removed", "role-added", "self-approval-policy",
        "shadow", "source"])
def test_any_change_of_meaning_changes_it(mutate):
    assert _fp(mutate) != BASE


def test_required_roles_are_content_so_removing_a_role_invalidates_approvals():
    """If roles were excluded, deleting a reviewer from `required` would keep old approvals
    valid and let a plan run with fewer sign-offs than were asked for."""
    plan = load_plan_text(plan_yaml(valid_plan()))
    content = canonical_content(plan)
    assert '"required":["data-platform-owner","downstream-owner"]' in content
    assert '"granted"' not in content and '"status"' not in content
    assert '"dry_run_completed"' not in content


def test_granted_records_do_not_feed_back_into_the_fingerprint():
    plan = load_plan_text(plan_yaml(valid_plan()))
    rec = ApprovalRecord(role="data-platform-owner", by="a", fingerprint=fingerprint(plan),
                         at=dt.datetime(2026, 5, 1, tzinfo=dt.UTC))
    approved = plan.model_copy(update={"approvals": plan.approvals.model_copy(
        update={"granted": [rec]})})
    assert fingerprint(approved) == fingerprint(plan)


# The fingerprint of ``valid_plan()`` before any field was added to the model after plans were
# approved: a new field at its default must leave every existing plan's fingerprint (and so its
# approvals) as it was. Update only for a change to ``valid_plan()`` itself.
PINNED = "d1d81788e68bd223981fbf2342220c799cd4d3d3aa4c4231ad9b10bf81626ef4"


def test_fields_added_later_keep_existing_fingerprints():
    assert BASE == PINNED
    assert '"nan"' not in canonical_content(load_plan_text(plan_yaml(valid_plan())))


def _set_nan(rule: str):
    def mutate(p):
        for c in p["validation"]["checks"]:
            if c["type"] == "metric_reconciliation":
                c["nan"] = rule
    return mutate


def test_nan_rule_at_default_is_not_content_but_a_change_is():
    assert _fp(_set_nan("fail")) == BASE
    assert _fp(_set_nan("exclude")) != BASE


def test_target_checks_are_content_and_replace_the_plan_checks():
    from sparkguard.reconcile.spec import spec_for_target

    def own(p):
        p["targets"][0]["validation"] = {"checks": [
            {"type": "row_count_parity", "threshold_absolute": 5},
            {"type": "duplicate_check"}]}
    assert _fp(own) != BASE
    data = valid_plan()
    own(data["backfill_plan"])
    plan = load_plan_text(plan_yaml(data))
    spec = spec_for_target(plan, plan.target_specs()[0])
    assert spec.metrics == () and spec.row_count is not None and spec.row_count.absolute == 5
    base = load_plan_text(plan_yaml(valid_plan()))
    assert spec_for_target(base, base.target_specs()[0]).metrics  # the plan's checks


def test_slice_partitions_auto_keeps_the_fingerprint_of_plans_without_it():
    """``auto`` replaced ``1`` as the default of an existing field (not a new field): a plan
    that omits it, or says ``auto``, keeps the fingerprint it had."""
    def omit(p):
        p.get("execution", {}).pop("slice_partitions", None)

    assert _fp(omit) == PINNED
    assert _fp(lambda p: (omit(p), p["execution"].update(slice_partitions="auto"))) == PINNED


def test_an_explicit_slice_size_still_changes_it():
    assert _fp(lambda p: p["execution"].update(slice_partitions=4)) != \
        _fp(lambda p: p["execution"].update(slice_partitions="auto"))
