"""Plan models and loader (no Spark): seed compatibility, normalisation, error lines."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path

import pytest
import yaml

from sparkguard.errors import PlanError
from sparkguard.plan import load_plan, load_plan_text
from sparkguard.plan.loader import yaml_path
from sparkguard.plan.model import BackfillPlan, ExecutionMode, Promotion, TargetSpec
from sparkguard.sql import PartitionType, UnsafeSQLError
from tests.plan_fixtures import SEED_PLAN, plan_yaml, valid_plan

UTC = dt.UTC


def _problems(text: str, source: str = "p.yaml") -> list[str]:
    with pytest.raises(PlanError) as info:
        load_plan_text(text, source)
    return str(info.value).splitlines()


def _mutated(mutate) -> str:
    data = valid_plan()
    mutate(data["backfill_plan"])
    return plan_yaml(data)


# -- seed compatibility ------------------------------------------------------------------------

def test_seed_template_loads_unchanged_as_a_draft():
    plan = load_plan(SEED_PLAN)
    assert plan.name == "replay_publish_partition_2026_05"
    assert plan.status.state == "draft"
    assert plan.affected_window.start_utc == dt.datetime(2026, 5, 1, tzinfo=UTC)
    assert plan.affected_window.end_utc == dt.datetime(2026, 5, 3, tzinfo=UTC)
    assert plan.affected_window.partitions == ["event_date=2026-05-01", "event_date=2026-05-02"]
    assert plan.partition_prefixes() == ["event_date", "event_date"]
    assert plan.targets == ["silver.orders_clean", "publish.daily_order_metrics"]
    assert plan.target_specs() == []
    assert plan.execution.mode is ExecutionMode.REPLAY
    assert plan.execution.write_strategy == "merge"
    assert plan.validation.checks[2].key_columns == ["order_id", "event_date"]
    assert plan.approvals.required == ["data-platform-owner", "downstream-owner"]
    assert plan.partitioning is None


def test_blank_template_fields_load_as_unset():
    text = ("backfill_plan:\n  name: ''\n  owner: ' '\n  reason:\n  affected_window:\n"
            "    start_utc: ''\n    end_utc: ''\n  source_of_truth: {system: '', dataset: ''}\n"
            "  targets: []\n  execution: {mode: '', write_strategy: ''}\n"
            "  safeguards: {rollback_strategy: ''}\n")
    plan = load_plan_text(text)
    assert (plan.name, plan.owner, plan.reason) == (None, None, None)
    assert plan.affected_window.start_utc is None and plan.source_of_truth.dataset is None
    assert plan.execution.mode is None and plan.safeguards.rollback_strategy is None


def test_valid_plan_loads_with_typed_fields():
    plan = load_plan_text(plan_yaml(valid_plan()))
    assert isinstance(plan, BackfillPlan)
    assert plan.partitioning is not None and plan.partitioning.type is PartitionType.DATE
    spec = plan.targets[0]
    assert isinstance(spec, TargetSpec) and spec.label == "orders_clean"
    assert spec.promotion is Promotion.REPLACE_WHERE
    assert plan.partition_values() == [dt.date(2026, 5, 3), dt.date(2026, 5, 4),
                                       dt.date(2026, 5, 5)]


@pytest.mark.parametrize(("raw", "expected"), [
    ("'2026-05-01T00:00:00Z'", dt.datetime(2026, 5, 1, tzinfo=UTC)),
    ("2026-05-01T00:00:00Z", dt.datetime(2026, 5, 1, tzinfo=UTC)),  # YAML timestamp
    ("2026-05-01", dt.datetime(2026, 5, 1, tzinfo=UTC)),  # YAML date
    ("'2026-05-01T02:00:00+02:00'", dt.datetime(2026, 5, 1, tzinfo=UTC)),
    ("'2026-05-01 00:00:00'", dt.datetime(2026, 5, 1, tzinfo=UTC)),  # naive means UTC
])
def test_window_bounds_normalise_to_aware_utc(raw, expected):
    text = f"backfill_plan:\n  affected_window:\n    start_utc: {raw}\n"
    assert load_plan_text(text).affected_window.start_utc == expected


@pytest.mark.parametrize("raw", [
    "'2026-05-01T05:00:00.0000009Z'",  # quoted: Python used to drop the 7th digit
    "2026-05-01T05:00:00.0000009Z",  # a YAML timestamp: PyYAML used to drop it
    "'2026-05-01T05:00:00.9999999+02:00'",
])
def test_window_bound_finer_than_a_microsecond_is_refused_not_truncated(raw):
    """Spark timestamps hold microseconds: a bound between two of them was silently cut down
    to the earlier one, moving the window (a start so cut takes in a row before it, an end
    so cut leaves out a row before it)."""
    text = f"backfill_plan:\n  affected_window:\n    start_utc: {raw}\n"
    lines = _problems(text)
    assert any("microsecond" in ln for ln in lines), lines


@pytest.mark.parametrize(("raw", "micros"), [
    ("'2026-05-01T05:00:00.1234560Z'", 123456),  # zeros past the microsecond are exact
    ("2026-05-01T05:00:00.000001000Z", 1),
    ("'2026-05-01T05:00:00.5Z'", 500000),
])
def test_window_bound_to_the_microsecond_is_kept(raw, micros):
    text = f"backfill_plan:\n  affected_window:\n    start_utc: {raw}\n"
    assert load_plan_text(text).affected_window.start_utc.microsecond == micros


def test_equivalent_spellings_of_the_window_share_a_fingerprint():
    from sparkguard.plan.fingerprint import fingerprint

    a = load_plan_text("backfill_plan:\n  affected_window: {start_utc: 2026-05-01}\n")
    b = load_plan_text("backfill_plan:\n  affected_window: {start_utc: '2026-05-01T00:00:00Z'}\n")
    assert fingerprint(a) == fingerprint(b)


def test_partition_prefix_only_for_plain_column_names():
    plan = load_plan_text("backfill_plan:\n  partitioning: {column: region, type: string}\n"
                          "  affected_window:\n    partitions: ['region=EU', \"x' OR '1'='1\"]\n")
    assert plan.partition_values() == ["EU", "x' OR '1'='1"]
    assert plan.partition_prefixes() == ["region"]


def _listed(ptype: str, items: str) -> BackfillPlan:
    return load_plan_text(f"backfill_plan:\n  partitioning: {{column: p, type: {ptype}}}\n"
                          f"  affected_window:\n    partitions: [{items}]\n")


def test_unquoted_numbers_in_the_partition_list_keep_their_spelling():
    """YAML 1.1 reads 010 as octal 8, 0x1F as 31, 1_000 as 1000 and 1:30 as 90: the window
    would name other partitions. Only decimal integers are numbers; the rest stay as written."""
    assert _listed("int", "009, 010, 011, 12, -3").partition_values() == [9, 10, 11, 12, -3]
    assert _listed("string", "06, 07, 010, 1_000, 0x1F, 1:30, 7").partition_values() == [
        "06", "07", "010", "1_000", "0x1F", "1:30", "7"]
    with pytest.raises(UnsafeSQLError, match="not a 64-bit integer"):
        _listed("int", "0x1F").partition_values()
    plan = load_plan_text("backfill_plan:\n  affected_window: {max_partitions: 040}\n")
    assert plan.affected_window.max_partitions == 40  # a number field reads it as written


def test_a_string_partition_keeps_its_spaces_and_a_prefixed_one_with_spaces_is_refused():
    assert _listed("string", "'US ', ' EU', 'region=US'").partition_values() == [
        "US ", " EU", "US"]
    for item in ("'region=US '", "'region= EU'"):
        with pytest.raises(UnsafeSQLError, match="starts or ends with a space"):
            _listed("string", item).partition_values()
    assert _listed("int", "'p= 7 ', ' 8'").partition_values() == [7, 8]
    assert _listed("date", "'p= 2026-05-01'").partition_values() == [dt.date(2026, 5, 1)]
    problems = _problems("backfill_plan:\n  partitioning: {column: p, type: string}\n"
                         "  affected_window:\n    partitions: [NO, SE]\n")
    assert any("partitions[0]" in ln and "quote it ('NO')" in ln for ln in problems), problems


def test_window_partitions_from_range_end_exclusive_and_partial_day():
    plan = load_plan_text("backfill_plan:\n  affected_window: {start_utc: 2026-05-01, "
                          "end_utc: '2026-05-03T06:00:00Z'}\n")
    assert plan.window_partitions_from_range() == [dt.date(2026, 5, 1), dt.date(2026, 5, 2),
                                                   dt.date(2026, 5, 3)]
    assert plan.range_days() == 3


def test_enormous_range_is_not_materialised():
    plan = load_plan_text("backfill_plan:\n  affected_window: {start_utc: 1900-01-01, "
                          "end_utc: 9998-12-31}\n")  # the widest bounds accepted
    assert plan.range_days() == 2958098
    assert plan.window_partitions_from_range() == []


# -- error lines -----------------------------------------------------------------------------

def test_every_problem_is_reported_one_line_each_with_path_value_and_fix():
    def mutate(p):
        p["affected_window"]["end_utc"] = "tomorrow"
        p["validation"]["checks"][0]["threshold_percent"] = 250
        p["targets"][0]["business_keys"] = ["order_id`; DROP TABLE x"]
        p["execution"]["mode"] = "upsert"
        p["ownr"] = "x"

    lines = _problems(_mutated(mutate))
    assert lines == [
        "p.yaml: backfill_plan.affected_window.end_utc: is not an ISO-8601 UTC timestamp "
        "(got 'tomorrow'); write it like 2026-05-01T00:00:00Z (or a date, 2026-05-01)",
        "p.yaml: backfill_plan.targets[0].business_keys[0]: 'order_id`; DROP TABLE x' is not a "
        "plain name (letters, digits, underscore; not starting with a digit) "
        "(got 'order_id`; DROP TABLE x'); use letters, digits and '_' only (tables: up to "
        "catalog.schema.table)",
        "p.yaml: backfill_plan.execution.mode: Input should be 'replay', 'merge' or 'overwrite' "
        "(got 'upsert'); use one of the listed values",
        "p.yaml: backfill_plan.validation.checks[0].threshold_percent: Input should be less than "
        "or equal to 100 (got 250); use a value in the allowed range",
        "p.yaml: backfill_plan.ownr: is not a known field (got 'x'); did you mean 'owner'? "
        "otherwise remove it",
    ]


@pytest.mark.parametrize(("target", "path", "message"), [
    ("5", "backfill_plan.targets[0]", "must be a dataset name or a target mapping"),
    ("'silver.x`y'", "backfill_plan.targets[0]", "is not a plain name"),
    ("{dataset: /lake/t, transform: {sql: 'SELECT 1 FROM {source}'}}",
     "backfill_plan.targets[0].business_keys", "is required"),
    ("{dataset: /lake/t, business_keys: [id], transform: {sql: 'SELECT 1'}, promotion: upsert}",
     "backfill_plan.targets[0].promotion", "Input should be 'replace_where', 'merge' or 'merge_changed'"),
    ("{dataset: /lake/t, business_keys: [id], transform: {sql: 'SELECT 1', callable: 'a:b'}}",
     "backfill_plan.targets[0].transform", "exactly one of transform.sql or transform.callable"),
    ("{dataset: /lake/t, business_keys: [id], transform: {sql: 'SELECT 1'}, name: '../x'}",
     "backfill_plan.targets[0].name", "is not a plain name"),
])
def test_union_targets_report_clean_yaml_paths(target, path, message):
    lines = _problems(f"backfill_plan:\n  targets:\n    - {target}\n")
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"p.yaml: {path}: ")
    assert message in lines[0]
    assert "target-spec" not in lines[0] and "dataset-name" not in lines[0]


@pytest.mark.parametrize(("loc", "path"), [
    (("backfill_plan", "targets", 0, "target-spec", "transform", "sql"),
     "backfill_plan.targets[0].transform.sql"),
    (("backfill_plan", "targets", 1, "dataset-name"), "backfill_plan.targets[1]"),
    (("backfill_plan", "affected_window", "partitions", 2, "function-before[x]", "str"),
     "backfill_plan.affected_window.partitions[2]"),
])
def test_yaml_path_drops_pydantic_internals(loc, path):
    assert yaml_path(loc) == path


def test_yaml_path_keeps_a_user_key_named_like_an_internal_part():
    lines = _problems("backfill_plan:\n  str: 1\n")
    assert lines[0].startswith("p.yaml: backfill_plan.str: is not a known field")


@pytest.mark.parametrize(("text", "fragment"), [
    ("backfill_plan:\n  name: a\n  name: b\n", "duplicate key 'name'"),
    ("- a\n- b\n", "no top-level 'backfill_plan:' mapping (got list)"),
    ("just text\n", "no top-level 'backfill_plan:' mapping (got str)"),
    ("", "no top-level 'backfill_plan:' mapping (got NoneType)"),
    ("plan:\n  name: x\n", "no top-level 'backfill_plan:' mapping (got keys ['plan'])"),
    ("backfill_plan: [1, 2\n", "not valid YAML at line 2"),
    # a backquoted catalog name left unquoted: the fix says to quote it
    ("backfill_plan:\n  source_of_truth:\n    dataset: `my-ws`.sales.orders\n",
     "put a value starting with a backquote in quotes"),
    ("backfill_plan: &a {name: x}\nother: *a\n", "anchors and aliases"),
    ("backfill_plan:\n  affected_window: {start_utc: 2026-13-45}\n", "a value cannot be read"),
    ("backfill_plan:\n  on: true\n", "key True is not a string"),
    ("backfill_plan:\n  ? [a, b]\n  : 1\n", "a mapping key is a list or mapping"),
    ("backfill_plan: !!python/object:os.system {}\n", "not valid YAML"),
    ("backfill_plan:\n  name: x\n---\nbackfill_plan: {}\n", "not valid YAML"),
    ("backfill_plan: 5\n", "backfill_plan: must be a mapping (got 5)"),
    ("backfill_plan:\n  name: ok\nextra: 1\n", "p.yaml: extra: is not a known field"),
])
def test_malformed_yaml_is_one_clear_problem(text, fragment):
    lines = _problems(text)
    assert any(fragment in line for line in lines), lines
    assert all(line.startswith("p.yaml: ") for line in lines)


def test_load_plan_refuses_missing_binary_and_huge_files(tmp_path: Path):
    with pytest.raises(PlanError, match="plan file not found"):
        load_plan(tmp_path / "nope.yaml")
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"backfill_plan:\n  name: \xff\xfe\n")
    with pytest.raises(PlanError, match="not UTF-8"):
        load_plan(binary)
    huge = tmp_path / "huge.yaml"
    huge.write_text("backfill_plan:\n  reason: '" + "x" * 1_100_000 + "'\n")
    with pytest.raises(PlanError, match="larger than 1 MB"):
        load_plan(huge)


def test_models_are_frozen():
    plan = load_plan_text(plan_yaml(valid_plan()))
    with pytest.raises(Exception, match="frozen"):
        plan.name = "other"  # type: ignore[misc]


def test_valid_plan_round_trips_through_yaml():
    data = valid_plan()
    plan = load_plan_text(plan_yaml(data))
    again = load_plan_text(yaml.safe_dump({"backfill_plan": plan.model_dump(mode="json")}))
    assert again == plan


# -- template and schema -----------------------------------------------------------------------

TEMPLATE = Path(__file__).resolve().parents[2] / "templates" / "backfill-plan.yaml"
SCHEMA = Path(__file__).resolve().parents[2] / "templates" / "backfill-plan.schema.json"


def test_template_is_a_complete_plan_that_passes_static_checks_except_approvals(monkeypatch):
    from sparkguard.guard import Severity, static_findings

    monkeypatch.delenv("SPARKGUARD_ALLOWED_ROOTS", raising=False)
    plan = load_plan(TEMPLATE)
    found = static_findings(plan)
    assert {f.code for f in found if f.severity is not Severity.INFO} == {"approvals_missing"}
    assert not [f for f in static_findings(plan, check_approvals=False)
                if f.severity is not Severity.INFO]


def test_template_documents_every_field():
    """Every model field appears in the template, and every key written there is explained by
    the comment right above it or named in a comment (the check list documents its keys)."""
    from sparkguard.plan.model import field_names

    lines = TEMPLATE.read_text().splitlines()
    comments = " ".join(line.split("#", 1)[1] for line in lines if "#" in line)
    text = "\n".join(lines)
    for name in field_names() - {"backfill_plan"}:
        assert re.search(rf"\b{name}\b", text), f"{name} missing from the template"
    previous = ""
    for line in lines:
        key = re.match(r"^\s*(?:- )?([a-z_]+):", line)
        if key and key.group(1) != "backfill_plan":
            explained = previous.lstrip().startswith("#") or \
                re.search(rf"\b{key.group(1)}\b", comments)
            assert explained, f"template key {key.group(1)!r} has no comment"
        if line.strip():
            previous = line


def test_committed_schema_matches_the_models(capsys):
    """Regenerate with: python -m sparkguard.cli plan schema > templates/backfill-plan.schema.json"""
    from sparkguard.cli import main

    assert main(["plan", "schema"]) == 0
    printed = capsys.readouterr().out
    assert json.loads(printed)["$id"].endswith("backfill-plan.schema.json")
    assert SCHEMA.read_text() == printed, "templates/backfill-plan.schema.json is stale"


def test_schema_validates_the_template_shape():
    schema = json.loads(SCHEMA.read_text())
    plan_def = schema["$defs"]["BackfillPlan"]
    assert plan_def["additionalProperties"] is False
    assert set(plan_def["properties"]) == set(BackfillPlan.model_fields)
    data = yaml.safe_load(TEMPLATE.read_text())
    assert set(data["backfill_plan"]) <= set(plan_def["properties"])


@pytest.mark.parametrize(("dataset", "label"), [
    ("silver.orders", "silver_orders"),
    ("`silver`.`orders`", "silver_orders"),
    ("`my-workspace`.sales.orders", "my_workspace_sales_orders"),
    ("/lake/target/orders_clean/", "orders_clean"),
])
def test_a_targets_label_comes_from_its_name_without_backquotes(dataset: str, label: str) -> None:
    """A target without ``name`` is labelled after its dataset (shadow folder, ledger,
    placeholders): one table spelt with or without backquotes gets one label."""
    data = valid_plan()
    data["backfill_plan"]["targets"][0]["dataset"] = dataset
    data["backfill_plan"]["targets"][0].pop("name", None)
    assert load_plan_text(plan_yaml(data)).targets[0].label == label
