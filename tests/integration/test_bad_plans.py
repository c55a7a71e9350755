"""Issue 6.4 / issue 3.8: malformed and hostile plans are refused with exit 2, a line naming the
YAML path, and nothing written anywhere.

Every case runs ``sparkguard run`` through ``cli.main``. Static cases must be refused before a
Spark session is requested (the session factory is replaced by one that fails the test), and
the whole temporary tree is compared byte for byte before and after. The few cases that only
the live guard can catch share one small real lake built once for the module, whose files and
table versions are compared before and after.
"""

from __future__ import annotations

import copy
import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

import sparkguard.cli as cli
from sparkguard.commands import common as cli_common
from sparkguard.demo import demo_plan
from sparkguard.plan import fingerprint, load_plan
from sparkguard.plan.loader import approvals_path
from tests.lakes import WINDOW

Mutate = Callable[[dict[str, Any]], None]
ROOT_TOKEN = "@ROOT@"


@dataclass(frozen=True)
class Case:
    """One bad plan: how to make it, and the line expected on stderr (path + fragment)."""

    id: str
    path: str
    fragment: str
    mutate: Mutate | None = None
    text: str | bytes | None = None  # raw file content instead of a mutated valid plan
    env: dict[str, str] = field(default_factory=dict)
    approve: bool = True  # record valid approvals for the plan as written (when it loads)


def _set(dotted: str, value: Any) -> Mutate:
    def mutate(p: dict[str, Any]) -> None:
        *parents, last = dotted.split(".")
        node: Any = p
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        key: Any = int(last) if last.isdigit() else last
        if value is _DELETE:
            del node[key]
        else:
            node[key] = value.replace(ROOT_TOKEN, p["_root"]) if isinstance(value, str) else value
    return mutate


_DELETE = object()


def _all(*ms: Mutate) -> Mutate:
    def mutate(p: dict[str, Any]) -> None:
        for m in ms:
            m(p)
    return mutate


def _two_targets(p: dict[str, Any]) -> None:
    first = copy.deepcopy(p["targets"][0])
    second = copy.deepcopy(first)
    second.update(name="daily", dataset=p["_root"] + "/target/daily",
                  transform={"sql": "SELECT * FROM {shadow:orders_clean}"},
                  depends_on=["orders_clean"])
    p["targets"] = [first, second]


B = "backfill_plan"
CHECKS = f"{B}.validation.checks"
T0 = f"{B}.targets[0]"
HOSTILE_VALUE = "2026-05-03' OR '1'='1"

CASES: list[Case] = [
    # -- missing fields ------------------------------------------------------------------------
    Case("missing-owner", f"{B}.owner", "template_incomplete", _set("owner", _DELETE)),
    Case("missing-reason", f"{B}.reason", "template_incomplete", _set("reason", "")),
    Case("missing-name", f"{B}.name", "template_incomplete", _set("name", _DELETE)),
    Case("missing-source", f"{B}.source_of_truth.dataset", "template_incomplete",
         _set("source_of_truth.dataset", _DELETE)),
    Case("missing-targets", f"{B}.targets", "template_incomplete", _set("targets", [])),
    Case("missing-partitioning", f"{B}.partitioning", "partitioning_missing",
         _set("partitioning", _DELETE)),
    Case("missing-mode", f"{B}.execution.mode", "template_incomplete",
         _set("execution.mode", _DELETE)),
    Case("missing-write-strategy", f"{B}.execution.write_strategy", "template_incomplete",
         _set("execution.write_strategy", "")),
    Case("missing-rollback", f"{B}.safeguards.rollback_strategy", "rollback_missing",
         _set("safeguards.rollback_strategy", _DELETE)),
    Case("missing-publish-paused", f"{B}.safeguards.publish_paused", "publish_not_paused",
         _set("safeguards.publish_paused", _DELETE)),
    Case("publish-not-paused", f"{B}.safeguards.publish_paused", "publish_not_paused",
         _set("safeguards.publish_paused", False)),
    Case("missing-notifications", f"{B}.safeguards.downstream_notifications",
         "no_notifications", _set("safeguards.downstream_notifications", [])),
    Case("not-idempotent", f"{B}.execution.idempotent", "not_idempotent",
         _set("execution.idempotent", False)),
    Case("no-proof-slice", f"{B}.execution.proof_slice", "no_proof_slice",
         _set("execution.proof_slice", False)),
    Case("missing-checks", f"{B}.validation.checks", "thresholds_undefined",
         _set("validation.checks", [])),
    Case("missing-threshold", f"{CHECKS}[0].threshold_percent", "thresholds_undefined",
         _set("validation.checks.0.threshold_percent", _DELETE)),
    Case("missing-duplicate-check", f"{B}.validation.checks", "no duplicate_check check",
         _set("validation.checks.1", {"type": "row_count_parity", "threshold_percent": 1})),
    Case("missing-metric-expr", f"{CHECKS}[2].shadow_expr", "metric_undefined",
         _set("validation.checks.2.shadow_expr", _DELETE)),
    Case("missing-business-keys", f"{T0}.business_keys", "is required",
         _set("targets.0.business_keys", _DELETE)),
    Case("empty-business-keys", f"{T0}.business_keys", "at least 1 item",
         _set("targets.0.business_keys", [])),
    Case("missing-transform", f"{T0}.transform", "is required",
         _set("targets.0.transform", _DELETE)),
    Case("seed-bare-target", f"{T0}", "target_incomplete", _set("targets.0", "silver.orders")),
    Case("missing-roles", f"{B}.approvals.required", "approvals_undefined",
         _set("approvals.required", [])),
    Case("unapproved", f"{B}.approvals.granted", "has not approved this plan", approve=False),
    # -- mistyped fields -----------------------------------------------------------------------
    Case("start-not-a-time", f"{B}.affected_window.start_utc", "not an ISO-8601 UTC timestamp",
         _set("affected_window.start_utc", "yesterday")),
    Case("end-an-integer", f"{B}.affected_window.end_utc", "is not a timestamp",
         _set("affected_window.end_utc", 1746230400)),
    Case("idempotent-a-sentence", f"{B}.execution.idempotent", "valid boolean",
         _set("execution.idempotent", "yes please")),
    Case("slices-a-word", f"{B}.execution.slice_partitions", "valid integer",
         _set("execution.slice_partitions", "three")),
    Case("concurrency-zero", f"{B}.execution.max_concurrent_slices", "greater than or equal",
         _set("execution.max_concurrent_slices", 0)),
    Case("concurrency-huge", f"{B}.execution.max_concurrent_slices", "less than or equal",
         _set("execution.max_concurrent_slices", 10_000)),
    Case("threshold-a-word", f"{CHECKS}[0].threshold_percent", "valid number",
         _set("validation.checks.0.threshold_percent", "ten")),
    Case("partitions-a-string", f"{B}.affected_window.partitions", "must be a list",
         _set("affected_window.partitions", "order_date=2026-05-03")),
    Case("partition-a-float", f"{B}.affected_window.partitions[1]", "type float",
         _set("affected_window.partitions.1", 2026.5)),
    Case("targets-a-mapping", f"{B}.targets", "must be a list",
         _set("targets", {"dataset": "/x"})),
    Case("target-an-integer", f"{T0}", "must be a dataset name or a target mapping",
         _set("targets.0", 42)),
    Case("checks-a-mapping", f"{B}.validation.checks", "must be a list",
         _set("validation.checks", {"type": "row_count_parity"})),
    Case("keys-a-string", f"{T0}.business_keys", "must be a list",
         _set("targets.0.business_keys", "order_id")),
    Case("execution-a-list", f"{B}.execution", "must be a mapping", _set("execution", [])),
    Case("roles-a-string", f"{B}.approvals.required", "must be a list",
         _set("approvals.required", "owner")),
    Case("status-unknown", f"{B}.status.state", "Input should be 'draft'",
         _set("status.state", "shipped")),
    Case("mode-unknown", f"{B}.execution.mode", "'replay', 'merge' or 'overwrite'",
         _set("execution.mode", "upsert")),
    Case("promotion-unknown", f"{T0}.promotion", "'replace_where', 'merge' or 'merge_changed'",
         _set("targets.0.promotion", "swap")),
    Case("aggregation-unknown", f"{CHECKS}[2].aggregation", "Input should be 'sum'",
         _set("validation.checks.2.aggregation", "median")),
    Case("partition-type-unknown", f"{B}.partitioning.type", "'date', 'string' or 'int'",
         _set("partitioning.type", "timestamp")),
    Case("merge-option-unknown", f"{T0}.merge.when_not_matched_by_source", "'delete' or 'keep'",
         _set("targets.0.merge", {"when_not_matched_by_source": "update"})),
    Case("unknown-key", f"{B}.ownr", "did you mean 'owner'", _set("ownr", "x")),
    Case("misplaced-key", f"{B}.execution.publish_paused", "check its indentation",
         _set("execution.publish_paused", True)),
    # -- windows -------------------------------------------------------------------------------
    Case("window-unbounded", f"{B}.affected_window.end_utc", "window_unbounded",
         _set("affected_window.end_utc", _DELETE)),
    Case("window-inverted", f"{B}.affected_window.end_utc", "window_inverted",
         _all(_set("affected_window.start_utc", "2026-05-06T00:00:00Z"),
              _set("affected_window.partitions", _DELETE))),
    Case("window-zero-length", f"{B}.affected_window.end_utc", "window_inverted",
         _all(_set("affected_window.end_utc", "2026-05-03T00:00:00Z"),
              _set("affected_window.partitions", _DELETE))),
    Case("window-enormous", f"{B}.affected_window", "73049 partitions exceed",
         _all(_set("affected_window.start_utc", "1900-01-01T00:00:00Z"),
              _set("affected_window.end_utc", "2100-01-01T00:00:00Z"))),
    Case("window-year-1-to-9999", f"{B}.affected_window.start_utc", "outside the years 1900",
         _all(_set("affected_window.start_utc", "0001-01-01T00:00:00Z"),
              _set("affected_window.end_utc", "9999-12-31T00:00:00Z"),
              _set("affected_window.partitions", _DELETE))),
    Case("window-over-max", f"{B}.affected_window", "window_too_large",
         _set("affected_window.max_partitions", 2)),
    Case("max-partitions-absurd", f"{B}.affected_window.max_partitions", "less than or equal",
         _set("affected_window.max_partitions", 100_000)),
    Case("window-end-inclusive-mistake", f"{B}.affected_window.partitions",
         "partitions_inconsistent", _set("affected_window.end_utc", "2026-05-05T00:00:00Z")),
    Case("partition-outside-range", f"{B}.affected_window.partitions", "outside the range",
         _set("affected_window.partitions.2", "order_date=2026-06-01")),
    Case("window-empty-string-partitions", f"{B}.affected_window.partitions", "window_empty",
         _all(_set("partitioning.type", "string"), _set("affected_window.partitions", []))),
    Case("partition-not-a-date", f"{B}.affected_window.partitions", "not a calendar date",
         _set("affected_window.partitions.0", "order_date=2026-02-30")),
    Case("partition-prefixed-value-with-space", f"{B}.affected_window.partitions",
         "starts or ends with a space", _all(_set("partitioning.type", "string"),
                                             _set("affected_window.partitions",
                                                  ["order_date=US "]))),
    Case("partition-yaml-boolean", f"{B}.affected_window.partitions[0]", "quote it ('NO')",
         _all(_set("partitioning.type", "string"), _set("affected_window.partitions",
                                                        [False]))),
    Case("partition-other-column", f"{B}.affected_window.partitions",
         "partition_column_mismatch", _set("affected_window.partitions.0",
                                           "event_date=2026-05-03")),
    # -- thresholds and checks -----------------------------------------------------------------
    Case("threshold-over-100", f"{CHECKS}[0].threshold_percent", "less than or equal to 100",
         _set("validation.checks.0.threshold_percent", 150)),
    Case("threshold-negative", f"{CHECKS}[2].threshold_percent", "greater than or equal to 0",
         _set("validation.checks.2.threshold_percent", -1)),
    Case("threshold-absolute-negative", f"{CHECKS}[3].threshold_absolute", "greater than",
         _set("validation.checks.3.threshold_absolute", -5)),
    Case("threshold-nan", f"{CHECKS}[0].threshold_percent", "finite number",
         _set("validation.checks.0.threshold_percent", float("nan"))),
    Case("threshold-true", f"{CHECKS}[0].threshold_percent", "is true/false, not a number",
         _set("validation.checks.0.threshold_percent", True)),  # pydantic alone reads 1
    Case("max-partitions-true", f"{B}.affected_window.max_partitions",
         "is true/false, not a number", _set("affected_window.max_partitions", True)),
    Case("slice-partitions-true", f"{B}.execution.slice_partitions",
         "is true/false, not a number", _set("execution.slice_partitions", True)),
    Case("rollback-horizon-false", f"{B}.safeguards.rollback_horizon_days",
         "is true/false, not a number", _set("safeguards.rollback_horizon_days", False)),
    Case("check-type-unknown", f"{CHECKS}[0].type", "'row_count_parity', 'metric_reconciliation'",
         _set("validation.checks.0.type", "row_count")),
    Case("check-type-missing", f"{CHECKS}[0].type", "is required",
         _set("validation.checks.0.type", _DELETE)),
    Case("check-duplicated", f"{B}.validation.checks", "row_count_parity is declared twice",
         _set("validation.checks.2", {"type": "row_count_parity", "threshold_percent": 5})),
    # -- quotes, backquotes, semicolons and SQL in names and values ----------------------------
    Case("source-name-semicolon", f"{B}.source_of_truth.dataset", "not a plain name",
         _set("source_of_truth.dataset", "bronze.orders; DROP TABLE silver.orders")),
    Case("target-name-backquote", f"{T0}.dataset", "not a plain name",
         _set("targets.0.dataset", "silver.orders` WHERE 1=1; --")),
    Case("target-path-quote", f"{T0}.dataset", "contains a quote",
         _set("targets.0.dataset", "@ROOT@/target/x'; DROP TABLE t; --")),
    Case("bare-target-backquote", f"{T0}", "not a plain name",
         _set("targets.0", "silver.`orders; DROP TABLE t`")),
    Case("target-label-injection", f"{T0}.name", "is not a plain name",
         _set("targets.0.name", "x`; DROP TABLE t; --")),
    Case("target-label-traversal", f"{T0}.name", "is not a plain name",
         _set("targets.0.name", "../../etc")),
    Case("partition-column-backquote", f"{B}.partitioning.column", "not a plain name",
         _set("partitioning.column", "order_date`; DROP TABLE t; --")),
    Case("partition-column-or", f"{B}.partitioning.column", "not a plain name",
         _set("partitioning.column", "order_date) OR (1=1")),
    Case("business-key-semicolon", f"{T0}.business_keys[0]", "not a plain name",
         _set("targets.0.business_keys.0", "order_id; DELETE FROM t")),
    Case("key-column-comment", f"{CHECKS}[1].key_columns[0]", "not a plain name",
         _set("validation.checks.1.key_columns.0", "order_id -- x")),
    Case("not-null-backquote", f"{T0}.contract.not_null[0]", "not a plain name",
         _set("targets.0.contract.not_null.0", "x`y")),
    Case("contract-type-sql", f"{T0}.contract.columns[0].type", "should match pattern",
         _set("targets.0.contract.columns", [{"name": "amount",
                                              "type": "int); DROP TABLE t; --"}])),
    Case("metric-name-sql", f"{CHECKS}[2].metric", "not a plain name",
         _set("validation.checks.2.metric", "m; DROP TABLE t")),
    Case("source-expr-semicolon", f"{CHECKS}[2].source_expr", "contains ';'",
         _set("validation.checks.2.source_expr", "amount); DROP TABLE t; --")),
    Case("shadow-expr-comment", f"{CHECKS}[2].shadow_expr", "a comment",
         _set("validation.checks.2.shadow_expr", "amount /* x */")),
    Case("source-expr-subquery", f"{CHECKS}[3].source_expr", "subquery",
         _set("validation.checks.3.source_expr", "(SELECT max(amount) FROM secrets.cards)")),
    Case("shadow-expr-backquote", f"{CHECKS}[3].shadow_expr", "unterminated backquote",
         _set("validation.checks.3.shadow_expr", "sum(`line_total)")),
    Case("date-partition-injection", f"{B}.affected_window.partitions", "partition_value_invalid",
         _set("affected_window.partitions.0", "order_date=" + HOSTILE_VALUE)),
    Case("int-partition-injection", f"{B}.affected_window.partitions", "64-bit integer",
         _all(_set("partitioning.type", "int"),
              _set("affected_window.partitions", ["1 OR 1=1"]))),
    Case("partition-control-char", f"{B}.affected_window.partitions[0]", "control character",
         _set("affected_window.partitions.0", "order_date=2026-05-03\x00")),
    Case("transform-two-statements", f"{T0}.transform.sql", "one query",
         _set("targets.0.transform.sql", "SELECT * FROM {source}; DROP TABLE t")),
    Case("transform-not-a-query", f"{T0}.transform.sql", "must be a query",
         _set("targets.0.transform.sql", "DELETE FROM silver.orders")),
    Case("transform-bypasses-source", f"{T0}.transform.sql", "transform_placeholder",
         _set("targets.0.transform.sql", "SELECT * FROM prod.orders")),
    Case("callable-shell", f"{T0}.transform.callable", "module:function",
         _set("targets.0.transform", {"callable": "os:system; rm -rf /"})),
    Case("shadow-a-table-name", f"{B}.execution.shadow_location", "is a table name",
         _set("execution.shadow_location", "db.shadow")),
    Case("shadow-semicolon", f"{B}.execution.shadow_location", "semicolon",
         _set("execution.shadow_location", "@ROOT@/sha;dow")),
    Case("shadow-is-target", f"{B}.execution.shadow_location", "no_shadow",
         _set("execution.shadow_location", "@ROOT@/target/orders_clean")),
    Case("source-is-target", f"{B}.source_of_truth.dataset", "source_is_target",
         _set("source_of_truth.dataset", "@ROOT@/target/orders_clean")),
    Case("role-shell", f"{B}.approvals.required[0]", "not a plain role name",
         _set("approvals.required.0", "owner; rm -rf /")),
    Case("plan-name-traversal", f"{B}.name", "must not contain '..'",
         _set("name", "a..b")),
    Case("dependency-cycle", f"{B}.targets", "cycle",
         _all(_two_targets, _set("targets.0.depends_on", ["daily"]))),
    Case("shadow-placeholder-unknown", f"{B}.targets[1].transform.sql", "names no other target",
         _all(_two_targets, _set("targets.1.transform.sql", "SELECT * FROM {shadow:nope}"))),
    # -- paths outside the allowed roots -------------------------------------------------------
    Case("target-outside-roots", f"{T0}.dataset", "path_outside_roots",
         _set("targets.0.dataset", "/etc/orders_clean"), env={"ROOTS": "@ROOT@"}),
    Case("source-outside-roots", f"{B}.source_of_truth.dataset", "path_outside_roots",
         _set("source_of_truth.dataset", "/var/lib/orders"), env={"ROOTS": "@ROOT@"}),
    Case("shadow-outside-roots", f"{B}.execution.shadow_location", "path_outside_roots",
         _set("execution.shadow_location", "/tmp/elsewhere/shadow"), env={"ROOTS": "@ROOT@"}),
    Case("traversal-outside-roots", f"{T0}.dataset", "path_outside_roots",
         _set("targets.0.dataset", "@ROOT@/target/../../../etc/x"), env={"ROOTS": "@ROOT@"}),
    Case("bucket-outside-roots", f"{T0}.dataset", "path_outside_roots",
         _set("targets.0.dataset", "s3://other-bucket/orders"),
         env={"ROOTS": "@ROOT@,s3://lake-bucket/data"}),
    # -- YAML documents that are not plans -----------------------------------------------------
    Case("duplicate-keys", B, "duplicate key 'owner'",
         text="backfill_plan:\n  owner: a@example.com\n  owner: b@example.com\n"),
    Case("yaml-list", B, "no top-level 'backfill_plan:' mapping (got list)",
         text="- backfill_plan\n- x\n"),
    Case("yaml-scalar", B, "no top-level 'backfill_plan:' mapping (got str)", text="hello\n"),
    Case("yaml-empty", B, "no top-level 'backfill_plan:' mapping", text=""),
    Case("plan-not-a-mapping", B, "must be a mapping", text="backfill_plan: [1, 2]\n"),
    Case("yaml-syntax", B, "not valid YAML at line", text="backfill_plan:\n  name: [x\n"),
    Case("yaml-tabs", B, "not valid YAML", text="backfill_plan:\n\tname: x\n"),
    Case("yaml-alias-bomb", B, "anchors and aliases",
         text="a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
              "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nbackfill_plan: {name: *c}\n"),
    Case("yaml-bad-timestamp", B, "a value cannot be read",
         text="backfill_plan:\n  affected_window:\n    start_utc: 2026-13-45\n"),
    Case("yaml-boolean-key", f"{B}.True", "key True is not a string",
         text="backfill_plan:\n  on: true\n"),
    Case("yaml-python-tag", B, "not valid YAML",
         text="backfill_plan: !!python/object/apply:os.system ['touch /tmp/pwned']\n"),
    Case("yaml-two-documents", B, "not valid YAML",
         text="backfill_plan: {name: a}\n---\nbackfill_plan: {name: b}\n"),
    Case("yaml-deep-nesting", B, "nested deeper than 32 levels",
         text="backfill_plan: " + "[" * 5000 + "]" * 5000 + "\n"),
    Case("not-utf8", B, "not UTF-8", text=b"backfill_plan:\n  name: \xff\xfe\n"),
    Case("huge-file", B, "larger than 1 MB",
         text="backfill_plan:\n  reason: '" + "x" * 1_200_000 + "'\n"),
]


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file and folder under root with size and mtime: any write shows up."""
    return {str(p.relative_to(root)): (p.stat().st_size if p.is_file() else -1,
                                      p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*"))}


def _write_case(case: Case, folder: Path, lake: Path) -> Path:
    plan_path = folder / "plan.yaml"
    if case.text is not None:
        data = case.text if isinstance(case.text, bytes) else case.text.encode("utf-8")
        plan_path.write_bytes(data)
        return plan_path
    data_plan = demo_plan(lake, WINDOW)
    body = data_plan["backfill_plan"]
    if case.mutate:
        body["_root"] = str(lake)
        case.mutate(body)
        body.pop("_root")
    plan_path.write_text(yaml.safe_dump(data_plan, sort_keys=False), encoding="utf-8")
    if case.approve:
        _approve_as_written(plan_path)
    return plan_path


def _approve_as_written(plan_path: Path) -> None:
    """Valid approvals for the plan as it is (so the refusal is about the defect itself)."""
    try:
        plan = load_plan(plan_path)
    except Exception:
        return  # does not even load: approvals are irrelevant
    fp = fingerprint(plan)
    records = [{"role": role, "by": f"reviewer{i}@example.com", "fingerprint": fp,
                "at": dt.datetime(2026, 5, 20, tzinfo=dt.UTC).isoformat()}
               for i, role in enumerate(plan.approvals.required)]
    approvals_path(plan_path).write_text(yaml.safe_dump({"approvals": records}))


def _run(plan: Path, folder: Path) -> int:
    return cli.main(["run", "--plan", str(plan), "--home", str(folder / "home"),
                     "--evidence-dir", str(folder / "evidence")])


def test_the_corpus_is_large_and_unique():
    assert len(CASES) >= 60
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.reliability("hostile_plan")
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_static_bad_plan_refused_before_spark_with_nothing_written(case, tmp_path, monkeypatch,
                                                                   capsys):
    def no_spark() -> None:
        raise AssertionError("the CLI asked for a Spark session for a plan it should refuse")

    monkeypatch.setattr(cli_common, "session", no_spark)
    lake = tmp_path / "lake"
    (lake / "target" / "orders_clean").mkdir(parents=True)  # stand-ins: must stay untouched
    (lake / "source" / "orders").mkdir(parents=True)
    roots = case.env.get("ROOTS")
    if roots:
        monkeypatch.setenv("SPARKGUARD_ALLOWED_ROOTS", roots.replace(ROOT_TOKEN, str(lake)))
    else:
        monkeypatch.delenv("SPARKGUARD_ALLOWED_ROOTS", raising=False)
    plan = _write_case(case, tmp_path, lake)
    before = _tree(tmp_path)

    code = _run(plan, tmp_path)

    err = capsys.readouterr().err
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.startswith(f"{plan}: ")]
    assert any(line.startswith(f"{plan}: {case.path}") and case.fragment in line
               for line in lines), f"no line for {case.path} / {case.fragment!r} in:\n{err}"
    assert err.rstrip().endswith("nothing was written")
    assert _tree(tmp_path) == before
    assert not (tmp_path / "home").exists() and not (tmp_path / "evidence").exists()
    # --explain shows the stages of any plan that loads and says why it cannot run yet; a
    # window it cannot even write is a plan error (exit 2), never a crash (exit 3)
    code = cli.main(["run", "--plan", str(plan), "--explain"])
    out = capsys.readouterr()
    assert code in (0, 2), out.err
    assert ("not runnable yet" in out.out) if code == 0 else (f"{plan}: {case.path}" in out.err)
    assert _tree(tmp_path) == before


def test_missing_plan_file(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cli_common, "session", lambda: pytest.fail("Spark requested"))
    assert _run(tmp_path / "absent.yaml", tmp_path) == 2
    assert "absent.yaml: backfill_plan: plan file not found" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_guard_reports_the_same_refusals(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cli_common, "session", lambda: pytest.fail("Spark requested"))
    lake = tmp_path / "lake"
    lake.mkdir()
    for case in [c for c in CASES if c.id in ("window-inverted", "target-name-backquote")]:
        plan = _write_case(case, tmp_path, lake)
        assert cli.main(["guard", str(plan)]) == 2
        captured = capsys.readouterr()
        assert case.path in captured.out + captured.err


# -- cases only the live guard can catch: one shared small lake ---------------------------------

@pytest.fixture(scope="module")
def live_lake(base_lake, tmp_path_factory) -> Path:
    from tests.lakes import copy_lake

    return copy_lake(base_lake, tmp_path_factory.mktemp("bad-live") / "lake")


LIVE_CASES: list[Case] = [
    Case("live-source-missing", f"{B}.source_of_truth.dataset", "source_missing",
         _set("source_of_truth.dataset", "@ROOT@/source/nope")),
    Case("live-target-missing", f"{T0}.dataset", "target_missing",
         _set("targets.0.dataset", "@ROOT@/target/nope")),
    Case("live-business-key-missing", f"{T0}.business_keys[0]", "column_missing",
         _set("targets.0.business_keys", ["no_such_key"])),
    Case("live-window-not-in-source", f"{B}.affected_window.partitions", "window_not_in_source",
         _all(_set("affected_window.start_utc", "2027-01-01T00:00:00Z"),
              _set("affected_window.end_utc", "2027-01-03T00:00:00Z"),
              _set("affected_window.partitions", _DELETE))),
    Case("live-transform-bad-column", f"{T0}.transform.sql", "transform_invalid",
         _set("targets.0.transform.sql", "SELECT order_id, no_such_col FROM {source}")),
    Case("live-retention-short", f"{T0}.dataset", "retention_too_short",
         _set("safeguards.rollback_horizon_days", 45)),
]


@pytest.mark.reliability("hostile_plan")
@pytest.mark.parametrize("case", LIVE_CASES, ids=[c.id for c in LIVE_CASES])
def test_live_bad_plan_refused_with_nothing_written(case, spark, live_lake, tmp_path, capsys,
                                                    monkeypatch):
    from delta.tables import DeltaTable

    monkeypatch.delenv("SPARKGUARD_ALLOWED_ROOTS", raising=False)
    target = str(live_lake / "target" / "orders_clean")
    version = DeltaTable.forPath(spark, target).history(1).first()["version"]
    lake_before = _tree(live_lake)
    plan = _write_case(case, tmp_path, live_lake)
    before = _tree(tmp_path)

    code = _run(plan, tmp_path)

    err = capsys.readouterr().err
    assert code == 2, err
    assert any(line.startswith(f"{plan}: {case.path}") and case.fragment in line
               for line in err.splitlines()), err
    assert _tree(tmp_path) == before
    assert _tree(live_lake) == lake_before
    assert DeltaTable.forPath(spark, target).history(1).first()["version"] == version
