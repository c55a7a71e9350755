"""Static guard rules (no Spark): one test per rule code, the seed's exact findings, output."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from sparkguard.cli import main
from sparkguard.guard import (
    RULES,
    Finding,
    Severity,
    blocking,
    outside_roots,
    render_findings,
    static_findings,
)
from sparkguard.plan import load_plan, load_plan_text
from tests.plan_fixtures import SEED_PLAN, plan_yaml, valid_plan

Mutate = Callable[[dict[str, Any]], None]


def _findings(mutate: Mutate | None = None, approvals: bool = False) -> list[Finding]:
    data = valid_plan()
    if mutate:
        mutate(data["backfill_plan"])
    return static_findings(load_plan_text(plan_yaml(data)), check_approvals=approvals)


def _codes(mutate: Mutate | None = None) -> set[str]:
    return {f.code for f in _findings(mutate) if f.severity is not Severity.INFO}


def test_the_valid_plan_has_no_findings_but_claims():
    found = _findings()
    assert {f.code for f in found} == {"claim_untrusted"}
    assert all(f.severity is Severity.INFO for f in found)


def test_seed_template_findings_are_exactly_what_it_lacks():
    plan = load_plan(SEED_PLAN)
    found = static_findings(plan)
    assert sorted((f.severity.value, f.code, f.path) for f in found) == [
        ("block", "approvals_missing", "backfill_plan.approvals.granted"),
        ("block", "approvals_missing", "backfill_plan.approvals.granted"),
        ("block", "metric_undefined", "backfill_plan.validation.checks[1].source_expr"),
        ("block", "partitioning_missing", "backfill_plan.partitioning"),
        ("block", "target_incomplete", "backfill_plan.targets[0]"),
        ("block", "target_incomplete", "backfill_plan.targets[1]"),
        ("info", "claim_untrusted", "backfill_plan.safeguards.publish_paused"),
    ]
    partitioning = next(f for f in found if f.code == "partitioning_missing")
    assert "the partitions suggest column 'event_date'" in partitioning.message


def test_seed_template_guard_exit_2_lists_every_finding(capsys):
    assert main(["guard", str(SEED_PLAN), "--static-only"]) == 2
    out = capsys.readouterr().out.splitlines()
    blocks = [line for line in out if line.startswith("[BLOCK]")]
    assert len(blocks) == 6
    assert any(line.startswith("[INFO ] claim_untrusted") for line in out)
    assert out[-1].endswith("6 blocking finding(s), 1 other(s)")


def _set(path: str, value: Any) -> Mutate:
    def mutate(p: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = p
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        if value is _DELETE:
            del node[int(last) if last.isdigit() else last]
        else:
            node[int(last) if last.isdigit() else last] = value
    return mutate


_DELETE = object()


def _both(*ms: Mutate) -> Mutate:
    def mutate(p: dict[str, Any]) -> None:
        for m in ms:
            m(p)
    return mutate


TWO_TARGETS = _set("targets", [
    {"name": "a", "dataset": "/lake/a", "business_keys": ["order_id"],
     "transform": {"sql": "SELECT * FROM {source}"}},
    {"name": "b", "dataset": "/lake/b", "business_keys": ["order_id"],
     "transform": {"sql": "SELECT * FROM {shadow:a}"}, "depends_on": ["a"]},
])

# rule code -> mutations of the valid plan that must raise it (and nothing else blocking)
CASES: list[tuple[str, Mutate, set[str]]] = [
    ("template_incomplete", _set("owner", _DELETE), {"template_incomplete"}),
    ("template_incomplete", _set("reason", ""), {"template_incomplete"}),
    ("template_incomplete", _set("source_of_truth.system", None), {"template_incomplete"}),
    ("template_incomplete", _set("execution.write_strategy", " "), {"template_incomplete"}),
    ("template_incomplete", _set("targets", []), {"template_incomplete"}),
    ("partitioning_missing", _set("partitioning", _DELETE), {"partitioning_missing"}),
    ("window_unbounded", _set("affected_window.end_utc", _DELETE), {"window_unbounded"}),
    ("window_unbounded", _both(_set("affected_window.start_utc", None),
                               _set("affected_window.end_utc", None)), {"window_unbounded"}),
    ("window_inverted", _both(_set("affected_window.start_utc", "2026-05-06T00:00:00Z"),
                              _set("affected_window.end_utc", "2026-05-03T00:00:00Z")),
     {"window_inverted"}),
    ("window_inverted", _both(_set("affected_window.end_utc", "2026-05-03T00:00:00Z"),
                              _set("affected_window.partitions", _DELETE)),
     {"window_inverted"}),
    ("window_too_large", _set("affected_window.max_partitions", 2), {"window_too_large"}),
    ("window_too_large", _both(_set("affected_window.start_utc", "1900-01-01T00:00:00Z"),
                               _set("affected_window.end_utc", "2100-01-01T00:00:00Z")),
     {"window_too_large"}),
    ("window_empty", _both(_set("partitioning.type", "string"),
                           _set("affected_window.partitions", [])), {"window_empty"}),
    ("window_not_aligned", _set("affected_window.end_utc", "2026-05-05T18:00:00Z"),
     {"window_not_aligned"}),
    ("partitions_inconsistent", _set("affected_window.end_utc", "2026-05-05T00:00:00Z"),
     {"partitions_inconsistent"}),
    ("partitions_inconsistent", _set("affected_window.partitions.2", "order_date=2026-05-07"),
     {"partitions_inconsistent"}),
    # integer partitions written yyyymmdd are dates: the list must agree with the range
    ("partitions_inconsistent", _both(_set("partitioning.type", "int"), _set(
        "affected_window.partitions", [20260503, 20260504, 20260531])),
     {"partitions_inconsistent"}),
    ("partition_value_invalid", _set("affected_window.partitions.0",
                                     "order_date=2026-05-01' OR '1'='1"),
     {"partition_value_invalid"}),
    ("partition_value_invalid", _both(_set("partitioning.type", "int"),
                                      _set("affected_window.partitions", ["1; DROP TABLE t"])),
     {"partition_value_invalid"}),
    ("partition_column_mismatch", _set("affected_window.partitions.0", "event_date=2026-05-03"),
     {"partition_column_mismatch"}),
    ("partitions_duplicated", _set("affected_window.partitions.2", "2026-05-03"),
     {"partitions_duplicated", "partitions_inconsistent"}),
    ("publish_not_paused", _set("safeguards.publish_paused", False), {"publish_not_paused"}),
    ("publish_not_paused", _set("safeguards.publish_paused", _DELETE), {"publish_not_paused"}),
    ("no_notifications", _set("safeguards.downstream_notifications", []), {"no_notifications"}),
    ("rollback_missing", _set("safeguards.rollback_strategy", ""), {"rollback_missing"}),
    ("not_idempotent", _set("execution.idempotent", False), {"not_idempotent"}),
    ("no_proof_slice", _set("execution.proof_slice", False), {"no_proof_slice"}),
    ("thresholds_undefined", _set("validation.checks", []), {"thresholds_undefined"}),
    ("thresholds_undefined", _set("validation.checks.0.threshold_percent", _DELETE),
     {"thresholds_undefined"}),
    ("gate_missing", _set("validation.checks", [
        {"type": "duplicate_check"},
        {"type": "metric_reconciliation", "metric": "m", "source_expr": "amount",
         "shadow_expr": "amount", "threshold_percent": 0}]), {"gate_missing"}),
    ("gate_missing", _set("validation.checks.1.type", "row_count_parity"),
     {"gate_missing", "check_duplicated", "check_field_ignored", "thresholds_undefined"}),
    # a target's reference query is held to the transform's placeholder rules
    ("transform_placeholder", _set("targets.0.validation", {
        "reference": {"sql": "SELECT * FROM {shadow:nope} WHERE {window}"}}),
     {"transform_placeholder"}),
    # a target's own checks are held to the same rules as the plan's
    ("gate_missing", _set("targets.0.validation", {"checks": [
        {"type": "row_count_parity", "threshold_percent": 0}]}),
     {"gate_missing", "metric_gate_missing"}),
    ("metric_gate_missing", _set("validation.checks", [
        {"type": "row_count_parity", "threshold_percent": 0}, {"type": "duplicate_check"}]),
     {"metric_gate_missing"}),
    ("metric_undefined", _set("validation.checks.2.shadow_expr", _DELETE), {"metric_undefined"}),
    ("metric_undefined", _set("validation.checks.2.metric", _DELETE), {"metric_undefined"}),
    ("check_duplicated", _set("validation.checks.3.metric", "gross_amount"), {"check_duplicated"}),
    ("check_field_ignored", _set("validation.checks.0.key_columns", ["order_id"]),
     {"check_field_ignored"}),
    ("check_field_ignored", _set("validation.checks.0.table_wide", True),
     {"check_field_ignored"}),
    ("keys_mismatch", _set("validation.checks.1.key_columns", ["order_id", "customer_id"]),
     {"keys_mismatch"}),
    ("contract_column_unknown", _set("targets.0.contract", {
        "not_null": ["Order_ID", "amount"],
        "columns": [{"name": "order_id", "type": "bigint"}, {"name": "amount", "type": "double"}]}),
     {"contract_column_unknown"}),
    ("target_incomplete", _set("targets.0", "silver.orders_clean"), {"target_incomplete"}),
    ("target_duplicated", lambda p: p["targets"].append(copy.deepcopy(p["targets"][0])),
     {"target_duplicated"}),
    ("source_is_target", _set("source_of_truth.dataset", "/lake/target/orders_clean"),
     {"source_is_target"}),
    ("source_is_target", _set("source_of_truth.dataset", "/lake/target/../target/orders_clean"),
     {"source_is_target"}),
    # the same table spelt another way, under another name
    ("target_duplicated", lambda p: p["targets"].append(
        {**copy.deepcopy(p["targets"][0]), "name": "again",
         "dataset": "/lake//target/orders_clean/"}), {"target_duplicated"}),
    ("target_duplicated", lambda p: p["targets"].append(
        {**copy.deepcopy(p["targets"][0]), "name": "again",
         "dataset": "file:///lake/target/orders_clean"}), {"target_duplicated"}),
    # a catalog name with its parts in backquotes is the same name
    ("target_duplicated", _both(_set("targets.0.dataset", "silver.orders_clean"), lambda p: p[
        "targets"].append({**copy.deepcopy(p["targets"][0]), "name": "again",
                           "dataset": "`spark_catalog`.`silver`.Orders_Clean"})),
     {"target_duplicated"}),
    # one storage through another connector: s3a:// and s3n:// are s3://, wasbs:// on the blob
    # endpoint and abfs:// are abfss:// on the dfs endpoint
    ("source_is_target", _both(_set("source_of_truth.dataset", "s3a://lake/orders"),
                               _set("targets.0.dataset", "S3://lake/orders/")),
     {"source_is_target"}),
    ("target_duplicated", _both(_set("targets.0.dataset", "s3://lake/clean"), lambda p: p[
        "targets"].append({**copy.deepcopy(p["targets"][0]), "name": "again",
                           "dataset": "s3n://lake/clean"})), {"target_duplicated"}),
    ("no_shadow", _both(_set("targets.0.dataset", "abfss://c@acct.dfs.core.windows.net/clean"),
                        _set("execution.shadow_location",
                             "wasbs://c@acct.blob.core.windows.net/clean/_shadow")),
     {"no_shadow"}),
    # a target's folder inside the source's (a VACUUM of one deletes the other's files)
    ("source_is_target", _set("source_of_truth.dataset", "/lake/target"), {"source_is_target"}),
    ("no_shadow", _set("execution.shadow_location", "/lake/target/orders_clean"), {"no_shadow"}),
    ("no_shadow", _set("execution.shadow_location", "/lake/target/orders_clean/_shadow"),
     {"no_shadow"}),
    ("no_shadow", _set("execution.shadow_location", "/lake"), {"no_shadow"}),
    ("no_shadow", _set("execution.shadow_location", "/lake/source/orders/x"), {"no_shadow"}),
    ("relative_path", _set("targets.0.dataset", "./target/orders_clean"), {"relative_path"}),
    ("target_dependencies", _both(TWO_TARGETS, _set("targets.0.depends_on", ["b"])),
     {"target_dependencies"}),
    ("target_dependencies", _both(TWO_TARGETS, _set("targets.1.depends_on", ["zzz"])),
     {"target_dependencies", "transform_placeholder"}),
    ("transform_placeholder", _set("targets.0.transform.sql", "SELECT * FROM silver.orders"),
     {"transform_placeholder"}),
    ("transform_placeholder", _set("targets.0.transform.sql",
                                   "SELECT * FROM {source} WHERE {windw}"),
     {"transform_placeholder"}),
    ("transform_placeholder", _both(TWO_TARGETS, _set("targets.1.depends_on", [])),
     {"transform_placeholder"}),
    ("transform_placeholder", _both(TWO_TARGETS, _set("targets.1.transform.sql",
                                                      "SELECT * FROM {source} JOIN {shadow:b}")),
     {"transform_placeholder"}),
    ("transform_unfilled", _set("targets.0.transform.sql",
                                "SELECT order_id, {fill:amount} AS amount FROM {source}"),
     {"transform_unfilled"}),
    ("window_not_exact", _both(
        _set("partitioning", _DELETE), _set("affected_window.partitions", _DELETE),
        _set("window_column", {"name": "order_date", "type": "date_hour", "hour_column": "hr"}),
        _set("affected_window.start_utc", "2026-05-03T05:30:00Z")), {"window_not_exact"}),
    # the seed's write_strategy: merge, promoted by the default replace_where
    ("seed_text_contradicts", _both(_set("execution.write_strategy", "merge"),
                                    _set("targets.0.promotion", _DELETE)),
     {"seed_text_contradicts"}),
    ("seed_text_contradicts", _set("execution.mode", "merge"), {"seed_text_contradicts"}),
    ("seed_text_contradicts", _set("targets.0.promotion", "merge"), {"seed_text_contradicts"}),
    ("seed_text_contradicts", _both(_set("execution.mode", "overwrite"),
                                    _set("targets.0.promotion", "merge"),
                                    _set("execution.write_strategy", "MERGE on order_id")),
     {"seed_text_contradicts"}),
]


@pytest.mark.parametrize(("code", "mutate", "expected"), CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_rule(code, mutate, expected):
    assert code in expected
    assert _codes(mutate) == expected


def test_every_static_rule_has_a_case():
    covered = {c[0] for c in CASES} | {"claim_untrusted", "approvals_undefined",
                                       "approvals_missing", "approval_stale",
                                       "owner_self_approval", "path_outside_roots"}
    assert covered == set(RULES)


def test_severity_of_each_finding_is_the_rule_severity():
    for _, mutate, _ in CASES:
        for f in _findings(mutate):
            assert f.severity is RULES[f.code][0], f


def test_self_declared_claims_are_info_only_and_prove_nothing():
    def claims(p):
        p["status"] = {"state": "approved"}
        p["execution"]["dry_run_completed"] = True
    found = _findings(claims, approvals=True)
    info = {f.path for f in found if f.code == "claim_untrusted"}
    assert info == {"backfill_plan.status.state", "backfill_plan.execution.dry_run_completed",
                    "backfill_plan.safeguards.publish_paused"}
    assert all(f.severity is Severity.INFO for f in found if f.code == "claim_untrusted")
    # claiming approval does not approve: the approval findings are still blocking
    assert {f.code for f in blocking(found)} == {"approvals_missing"}


@pytest.mark.parametrize("sql", [
    "SELECT *, regexp_extract(note, '[0-9]{4}-[0-9]{2}', 0) AS d FROM {source} WHERE {window}",
    'SELECT *, get_json_object(\'{"a": {"b": 1}}\', "$.a") AS j FROM {source} WHERE {window}',
    "SELECT `odd{name}` FROM {source} -- {not a placeholder}\nWHERE {window} /* {x} */",
])
def test_braces_in_literals_names_and_comments_are_not_placeholders(sql):
    """A regex quantifier, a JSON literal, a backquoted name or a comment holding braces is SQL:
    the guard does not take it for an unknown placeholder (it blocked such transforms)."""
    assert _codes(_set("targets.0.transform.sql", sql)) == set()


def test_placeholders_are_found_outside_quotes_only():
    from sparkguard.sql import placeholders

    assert placeholders("SELECT '{a}', \"{b}\", `{c}`, {d} FROM {shadow:x} -- {e}") == [
        "d", "shadow:x"]
    assert placeholders("SELECT 'it''s {a}' FROM {source}") == ["source"]


def test_approvals_undefined():
    found = _findings(_set("approvals.required", []), approvals=True)
    assert {f.code for f in blocking(found)} == {"approvals_undefined"}


def test_approval_rules_are_skipped_before_approval():
    assert not blocking(_findings(approvals=False))
    assert {f.code for f in blocking(_findings(approvals=True))} == {"approvals_missing"}


@pytest.mark.parametrize(("path", "roots", "outside"), [
    ("/lake/t", ["/lake"], False),
    ("/lake", ["/lake"], False),
    ("/lakehouse/t", ["/lake"], True),
    ("/lake/../etc/t", ["/lake"], True),
    ("/etc/t", ["/lake", "/data"], True),
    ("/data/x", ["/lake", "/data"], False),
    ("s3://bucket/lake/t", ["s3://bucket/lake"], False),
    ("s3://bucket/lake/../other", ["s3://bucket/lake"], True),
    ("s3://other/lake/t", ["s3://bucket/lake"], True),
    ("s3://bucket/lake/t", ["/lake"], True),
    ("file:///lake/t", ["/lake"], False),
    ("dbfs:/mnt/x", ["dbfs:/mnt"], False),
    ("/anything", [], False),
])
def test_outside_roots(path, roots, outside):
    assert outside_roots(path, roots) is outside


def test_path_outside_roots(monkeypatch):
    monkeypatch.setenv("SPARKGUARD_ALLOWED_ROOTS", "/lake/source:/lake/target")
    assert _codes() == set()
    found = _findings(_set("execution.shadow_location", "/tmp/shadow"))
    assert [(f.code, f.path) for f in blocking(found)] == [
        ("path_outside_roots", "backfill_plan.execution.shadow_location")]
    monkeypatch.setenv("SPARKGUARD_ALLOWED_ROOTS", "/data")
    paths = {f.path for f in _findings() if f.code == "path_outside_roots"}
    assert paths == {"backfill_plan.source_of_truth.dataset", "backfill_plan.targets[0].dataset"}


def test_table_names_are_not_subject_to_roots(monkeypatch):
    monkeypatch.setenv("SPARKGUARD_ALLOWED_ROOTS", "/data")
    found = _findings(_both(_set("source_of_truth.dataset", "bronze.orders"),
                            _set("targets.0.dataset", "silver.orders_clean")))
    assert not [f for f in found if f.code == "path_outside_roots"]


def test_render_lists_blocking_first_with_severity_code_path_and_fix():
    found = _findings(_both(_set("safeguards.downstream_notifications", []),
                            _set("validation.checks.0.key_columns", ["order_id"])))
    lines = render_findings(found, "plan.yaml").splitlines()
    assert lines[0] == (
        "[BLOCK] no_notifications: plan.yaml: backfill_plan.safeguards.downstream_notifications: "
        "no downstream owner will be told that publish is paused; fix: list the downstream owners")
    assert lines[1].startswith("[WARN ] check_field_ignored: plan.yaml: "
                               "backfill_plan.validation.checks[0].key_columns: ")
    assert all(line.startswith("[INFO ]") for line in lines[2:])


def test_guard_exit_codes(tmp_path, capsys):
    path = tmp_path / "plan.yaml"
    data = valid_plan()
    path.write_text(plan_yaml(data))
    assert main(["guard", str(path), "--static-only", "--pre-approval"]) == 0
    assert main(["guard", str(path), "--static-only"]) == 2
    data["backfill_plan"]["validation"]["checks"][0]["key_columns"] = ["order_id"]  # a WARN
    path.write_text(plan_yaml(data))
    assert main(["guard", str(path), "--static-only", "--pre-approval"]) == 0
    assert "[WARN ] check_field_ignored" in capsys.readouterr().out


def test_a_table_name_is_the_same_table_in_any_case_and_with_the_default_catalog() -> None:
    from sparkguard.guard_paths import _identity, _same_dataset

    assert _same_dataset("spark_catalog.Silver.Orders", "silver.orders")
    assert _identity("silver.orders") == _identity("SILVER.ORDERS")
    assert not _same_dataset("silver.orders", "silver.orders_v2")
    assert not _same_dataset("/lake/t", "/lake/t2")


def test_integer_partitions_are_checked_against_the_range_only_when_they_are_dates():
    """``yyyymmdd`` integers are compared with [start_utc, end_utc) as dates (one that is no
    calendar day is in no range), and the finding writes them as the plan does; other integers
    (an hour id) cannot be, and are not."""
    as_int = _set("partitioning.type", "int")
    same = _both(as_int, _set("affected_window.partitions", [20260503, 20260504, 20260505]))
    assert _codes(same) == set()
    off = _both(as_int, _set("affected_window.partitions", [20260503, 20260531]))
    (found,) = [f for f in _findings(off) if f.code == "partitions_inconsistent"]
    assert "outside the range ['20260531']" in found.message, found.message
    assert "missing from the list ['20260504', '20260505']" in found.message, found.message
    assert _codes(_both(as_int, _set("affected_window.partitions", [1, 2, 3]))) == set()
    bad = _both(as_int, _set("affected_window.partitions", [20260503, 20260504, 20260505,
                                                           20261399]))
    (found,) = [f for f in _findings(bad) if f.code == "partitions_inconsistent"]
    assert "outside the range ['20261399']" in found.message, found.message
