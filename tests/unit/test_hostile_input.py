"""Hostile and extreme input (review of plan validation): each is refused with a message
naming the field and the fix, and the documented exit code, before anything is written.
No test here starts Spark."""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import hashlib
import os
import re
import shlex
import stat
import tracemalloc
import zlib
from pathlib import Path
from typing import Any

import pytest
import yaml

from sparkguard import rollback as rollback_mod
from sparkguard.approve import record_approval
from sparkguard.cli import main
from sparkguard.commands import common as cli_common
from sparkguard.errors import EXIT_USAGE
from sparkguard.layouts import LAYOUTS, layout_plan
from sparkguard.plan import load_plan, window_spec
from sparkguard.plan.approvals import approved_content
from sparkguard.plan.loader import approvals_path
from sparkguard.plan.model import ApprovalRecord
from sparkguard.sql import query_only, query_problem
from tests.plan_fixtures import plan_yaml, valid_plan

DML_AFTER_WITH = [
    "WITH s AS (SELECT * FROM {source} WHERE {window}) DELETE FROM delta.`/lake/t` AS t WHERE true",
    "with s as (select 1 as a) insert into delta.`/lake/t` select * from s",
    "WITH s AS (SELECT 1) INSERT OVERWRITE DIRECTORY '/tmp/x' USING parquet SELECT * FROM s",
    "WITH s AS (SELECT * FROM {source}) MERGE INTO delta.`/lake/other` t USING s ON true "
    "WHEN MATCHED THEN DELETE",
    "WITH s AS (SELECT 1) UPDATE delta.`/lake/t` SET a = 1",
    "WITH s AS (SELECT 1) FROM s INSERT INTO delta.`/lake/t` SELECT *",
    "WITH s (a) AS (SELECT ')'), u AS (SELECT 1 -- )\n) DELETE FROM delta.`/lake/t`",
]
QUERIES = [
    "SELECT * FROM {source} WHERE {window}",
    "WITH a AS (SELECT * FROM {source}), b (x) AS (SELECT id FROM a) SELECT * FROM b",
    "WITH a AS (SELECT 1) FROM a SELECT *",
    "SELECT concat(note, ';'), `a;b` FROM {source} /* ; */ -- trailing",
    "SELECT merge, update, delete, insert FROM {source}",
]


@pytest.fixture
def no_session(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*_a: object, **_k: object) -> None:
        raise AssertionError("a Spark session was requested")
    monkeypatch.setattr(cli_common, "session", fail)


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("sql", DML_AFTER_WITH)
def test_a_command_after_with_is_seen_in_the_text(sql: str) -> None:
    problem = query_problem(sql)
    assert problem is not None and "is a command" in problem


@pytest.mark.parametrize("sql", QUERIES)
def test_queries_pass_the_text_check(sql: str) -> None:
    assert query_problem(sql) is None


def test_query_only_keeps_a_trailing_comment_off_the_parenthesis() -> None:
    assert query_only("SELECT 1 -- note") == "SELECT * FROM (\nSELECT 1 -- note\n) AS `__sg_query`"


@pytest.mark.parametrize("where", ["transform", "reference"])
@pytest.mark.parametrize("cmd", [["guard", "--pre-approval"], ["run", "--plan"], ["approve"]])
def test_plans_with_a_command_after_with_are_refused_before_spark(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], no_session: None, cmd: list[str],
        where: str) -> None:
    data = valid_plan()
    target = data["backfill_plan"]["targets"][0]
    if where == "transform":
        target["transform"]["sql"] = DML_AFTER_WITH[0]
        field = "backfill_plan.targets[0].transform.sql"
    else:
        target["validation"] = {"reference": {"sql": DML_AFTER_WITH[3]}}
        field = "backfill_plan.targets[0].validation.reference.sql"
    path = tmp_path / "plan.yaml"
    path.write_text(plan_yaml(data), encoding="utf-8")
    before = _tree(tmp_path)
    argv = [cmd[0], *cmd[1:], str(path)] if cmd[0] != "approve" else \
        ["approve", str(path), "--role", "data-platform-owner", "--by", "a@example.com"]
    assert main(argv) == EXIT_USAGE
    out = "".join(capsys.readouterr())
    line = next(ln for ln in out.splitlines() if field in ln)
    assert "is a command (" in line and "write one SELECT" in line
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "-inf", "1e400", "soon"])
def test_stale_lock_timeout_must_be_finite_and_positive(
        value: str, capsys: pytest.CaptureFixture[str], no_session: None) -> None:
    assert main(["run", "--plan", "missing.yaml", "--takeover-stale-lock",
                 f"--stale-lock-timeout={value}"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "--stale-lock-timeout" in err and "finite number of seconds above 0" in err


def _window_plan(tmp_path: Path, **window: Any) -> Path:
    """The timestamp layout's plan with ``affected_window``/``window_column`` changes."""
    data = layout_plan(LAYOUTS["timestamp_partial_day"], Path("/lake"))
    bp = data["backfill_plan"]
    for key, value in window.items():
        section, field = key.split("__")
        bp[section][field] = value
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def _date_plan(tmp_path: Path, **window: str) -> Path:
    data = valid_plan()
    data["backfill_plan"]["affected_window"].update(window)
    data["backfill_plan"]["affected_window"].pop("partitions", None)
    path = tmp_path / "plan.yaml"
    path.write_text(plan_yaml(data), encoding="utf-8")
    return path


@pytest.mark.parametrize(("field", "value", "layout"), [
    ("start_utc", "0001-01-01T00:00:00+01:00", "date"),
    ("start_utc", "0001-01-01T00:00:00+01:00", "timestamp"),
    ("end_utc", "9999-12-31T05:00:00Z", "date"),
    ("end_utc", "9999-12-31T05:00:00Z", "timestamp"),
    ("end_utc", "9999-12-31T23:00:00-05:00", "date"),
    ("start_utc", "1899-12-31", "date"),
])
@pytest.mark.parametrize("cmd", [["guard", "--static-only"], ["run", "--explain", "--plan"],
                                 ["approve"]])
def test_extreme_window_bounds_are_a_named_plan_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], no_session: None, field: str,
        value: str, layout: str, cmd: list[str]) -> None:
    path = (_date_plan(tmp_path, **{field: value}) if layout == "date"
            else _window_plan(tmp_path, **{f"affected_window__{field}": value}))
    before = _tree(tmp_path)
    argv = [*cmd, str(path)] if cmd[0] != "approve" else \
        ["approve", str(path), "--role", "data-platform-owner", "--by", "a@example.com"]
    assert main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"backfill_plan.affected_window.{field}: is outside the years 1900 to 9998" in err
    assert "Traceback" not in err and _tree(tmp_path) == before


@pytest.mark.parametrize(("flag", "value"), [("--start", "0001-01-01T00:00:00+05:00"),
                                             ("--end", "9999-12-31T23:00:00-05:00")])
def test_plan_init_refuses_extreme_bounds_before_spark(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], no_session: None, flag: str,
        value: str) -> None:
    bounds = {"--start": "2026-05-01", "--end": "2026-05-03", flag: value}
    argv = ["plan", "init", "--source", "/lake/s", "--target", "/lake/t",
            "--start", bounds["--start"], "--end", bounds["--end"], "-o", str(tmp_path / "d.yaml")]
    assert main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"{flag}: is outside the years 1900 to 9998" in err and "Traceback" not in err
    assert not (tmp_path / "d.yaml").exists()


def test_a_window_too_large_is_refused_before_its_buckets_are_built(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], no_session: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[object] = []

    def bucket(*args: object) -> object:
        built.append(args)
        if len(built) > 3660:
            raise AssertionError("buckets built beyond max_partitions")
        return real(*args)
    real = window_spec.Bucket
    monkeypatch.setattr(window_spec, "Bucket", bucket)
    path = _window_plan(tmp_path, affected_window__start_utc="1990-01-01T00:00:00Z",
                        affected_window__end_utc="2020-01-01T00:00:30Z",
                        window_column__bucket="hour")
    assert main(["guard", "--static-only", str(path)]) == EXIT_USAGE
    out = capsys.readouterr().out
    hours = (dt.datetime(2020, 1, 1) - dt.datetime(1990, 1, 1)) // dt.timedelta(hours=1) + 1
    assert f"{hours} buckets exceed the plan's max_partitions" in out
    assert not built
    plan = load_plan(path)
    with pytest.raises(ValueError, match=f"{hours} buckets exceed max_partitions"):
        window_spec.range_window(plan)
    assert not built


@pytest.mark.parametrize("window", [
    {"window_column__hour_column": "hr"},
    {"window_column__slice": "5h", "window_column__bucket": "day"},
    {"affected_window__partitions": ["2026-03-10"]},
    {"affected_window__end_utc": None},
], ids=["hour-column-on-timestamp", "slice-not-whole-buckets", "partitions-listed", "no-end"])
def test_explain_prints_a_window_column_plan_with_a_static_window_problem(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], no_session: None,
        window: dict[str, Any]) -> None:
    path = _window_plan(tmp_path, **window)
    before = _tree(tmp_path)
    assert main(["run", "--explain", "--plan", str(path)]) == 0
    out, err = capsys.readouterr()
    assert " 1. guard " in out and "Traceback" not in err
    assert any(ln.startswith("not runnable yet:") and ("window" in ln or "partitions" in ln)
               for ln in out.splitlines())
    assert _tree(tmp_path) == before


@pytest.mark.parametrize(("field", "value"), [
    ("source_of_truth.dataset", "s3://[bucket/src"),
    ("targets[0].dataset", "abfss://c@[acct/t"),
])
@pytest.mark.parametrize("cmd", [["guard"], ["run", "--plan"]])
def test_a_dataset_uri_urlsplit_rejects_is_a_named_field_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], no_session: None, field: str,
        value: str, cmd: list[str]) -> None:
    data = valid_plan()
    bp = data["backfill_plan"]
    if field.startswith("targets"):
        bp["targets"][0]["dataset"] = value
    else:
        bp["source_of_truth"]["dataset"] = value
    path = tmp_path / "plan.yaml"
    path.write_text(plan_yaml(data), encoding="utf-8")
    assert main([*cmd, str(path)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"backfill_plan.{field}: " in err and "is not a valid URI" in err
    assert "Traceback" not in err


def _evidence(tmp_path: Path, sg: Any, **top: Any) -> Path:
    path = tmp_path / "ev.yaml"
    path.write_text(yaml.safe_dump({"release_gate_evidence": {}, "sparkguard": sg, **top}),
                    encoding="utf-8")
    return path


@pytest.mark.parametrize("cmd", [["rollback", "--evidence"], ["report", "--evidence"],
                                 ["verify", "--evidence"]])
@pytest.mark.parametrize("make", [
    lambda d: d,  # a directory
    lambda d: (d / "latin1.yaml").write_bytes(b"sparkguard: caf\xe9\n") and d / "latin1.yaml",
    lambda d: _evidence(d, {}),
    lambda d: _evidence(d, None),
    lambda d: _evidence(d, {"run_id": "r1", "targets": [{"rollback_point": None}]}),
    lambda d: _evidence(d, {"run_id": "r1", "targets": "none"}),
], ids=["directory", "not-utf8", "empty", "null", "rollback-point-null", "targets-not-list"])
def test_malformed_evidence_is_refused_by_name(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], no_session: None, cmd: list[str],
        make: Any) -> None:
    path = make(tmp_path)
    assert main([*cmd, str(path)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert str(path) in err and "Traceback" not in err
    assert any(w in err for w in ("cannot be read", "sparkguard.run_id", "sparkguard.targets"))


def test_report_names_the_key_an_evidence_file_lacks(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], no_session: None) -> None:
    path = _evidence(tmp_path, {"run_id": "r1"})
    assert main(["report", "--evidence", str(path)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "the key 'plan' is missing" in err and "Traceback" not in err


@pytest.mark.parametrize("recorded", ["audit", "command"])
def test_rollback_takes_the_home_the_evidence_records_even_with_a_space(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recorded: str) -> None:
    home = "/data/my lake/_sparkguard"
    seen: dict[str, Any] = {}

    def rollback_run(spark: object, h: str, run_id: str, force: bool = False,
                     takeover: object = None) -> list[Any]:
        seen.update(home=h, run_id=run_id)
        return []
    monkeypatch.setattr(rollback_mod, "rollback_run", rollback_run)
    monkeypatch.setattr(cli_common, "session", lambda *a, **k: object())
    cmd = f"spark-submit jobs/rollback.py --run-id r1 --home {shlex.quote(home)}"
    sg = {"run_id": "r1", "targets": [{"rollback_point": {"rollback_command": cmd}}]}
    path = _evidence(tmp_path, sg, **({"audit": {"ledger_home": home}}
                                      if recorded == "audit" else {}))
    assert main(["rollback", "--evidence", str(path)]) == 0
    assert seen == {"home": home, "run_id": "r1"}


def _sidecar(tmp_path: Path, *records: dict[str, Any]) -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text(plan_yaml(valid_plan()), encoding="utf-8")
    approvals_path(path).write_text(yaml.safe_dump({"approvals": list(records)}),
                                    encoding="utf-8")
    return path


def _record(at: str, content: bytes | None = None, **extra: Any) -> dict[str, Any]:
    rec = {"role": "data-platform-owner", "by": "a@example.com", "at": at,
           "fingerprint": "0" * 64, **extra}
    if content is not None:
        rec["content"] = base64.b64encode(zlib.compress(content, 9)).decode("ascii")
        rec["fingerprint"] = hashlib.sha256(content).hexdigest()
    return rec


@pytest.mark.parametrize("records", [
    [_record("2026-05-01T10:00:00"), _record("2026-05-02T10:00:00+02:00")],
    [_record("2026-05-01T10:00:00Z", b"not json")],
], ids=["naive-and-aware-at", "content-not-json"])
def test_stale_approval_records_that_used_to_crash_are_reported(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], records: list[dict[str, Any]]
        ) -> None:
    path = _sidecar(tmp_path, *records)
    assert main(["guard", "--static-only", str(path)]) == EXIT_USAGE
    out, err = capsys.readouterr()
    assert "approval_stale" in out and "role 'data-platform-owner' approved an earlier" in out
    assert "Traceback" not in err


def test_recorded_content_is_not_inflated_past_a_plans_size() -> None:
    bomb = b"{" + b" " * 64_000_000 + b"}"
    record = ApprovalRecord.model_validate(_record("2026-05-01T10:00:00Z", bomb))
    tracemalloc.start()
    try:
        assert approved_content(record) is None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16_000_000


@pytest.mark.parametrize("cmd", [["status"], ["publish", "status"], ["verify", "--all"],
                                 ["rollback", "--run-id", "r1"]])
def test_a_home_sql_cannot_hold_is_refused_before_anything_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], no_session: None,
        cmd: list[str]) -> None:
    bad = str(tmp_path / "team`x")
    assert main([*cmd, "--home", bad]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "--home: the home" in err and "backquote" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("env", "plan_dir", "source"), [
    ({"SPARKGUARD_HOME": "/data/team`x"}, None, "$SPARKGUARD_HOME"),
    ({}, "team`x", "the default home"),
])
def test_every_source_of_the_home_is_checked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str],
        plan_dir: str | None, source: str) -> None:
    monkeypatch.delenv("SPARKGUARD_HOME", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    plan = str(tmp_path / plan_dir / "plan.yaml") if plan_dir else None
    with pytest.raises(cli_common.HomeError, match=re.escape(source)):
        cli_common.home(argparse.Namespace(home=None, plan=plan))


def test_a_relative_home_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli_common.home(argparse.Namespace(home="relhome/", plan=None)) == \
        str(tmp_path / "relhome")


@pytest.mark.parametrize("dataset", ["/", "/lake/2026"])
def test_a_target_whose_derived_label_is_not_a_plain_name_needs_a_name(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], no_session: None,
        dataset: str) -> None:
    data = valid_plan()
    data["backfill_plan"]["targets"][0]["dataset"] = dataset
    data["backfill_plan"]["targets"][0].pop("name", None)
    path = tmp_path / "plan.yaml"
    path.write_text(plan_yaml(data), encoding="utf-8")
    assert main(["guard", "--static-only", str(path)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "backfill_plan.targets[0]: the target's label derived from dataset" in err
    assert "give the target a name:" in err


def test_the_approvals_sidecar_is_readable_as_a_plain_new_file(tmp_path: Path) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(plan_yaml(valid_plan()), encoding="utf-8")
    old = os.umask(0o022)
    try:
        record_approval(path, "data-platform-owner", "alice@example.com")
    finally:
        os.umask(old)
    assert stat.S_IMODE(approvals_path(path).stat().st_mode) == 0o644


def test_a_constrained_number_is_reported_at_its_yaml_path(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = valid_plan()
    data["backfill_plan"]["execution"]["slice_partitions"] = 0
    path = tmp_path / "plan.yaml"
    path.write_text(plan_yaml(data), encoding="utf-8")
    assert main(["guard", "--static-only", str(path)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "backfill_plan.execution.slice_partitions: " in err and "slice_partitions.constrained" not in err


def test_a_transform_with_neither_sql_nor_callable_is_told_to_add_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = valid_plan()
    data["backfill_plan"]["targets"][0]["transform"] = {}
    path = tmp_path / "plan.yaml"
    path.write_text(plan_yaml(data), encoding="utf-8")
    assert main(["guard", "--static-only", str(path)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "add sql (a SELECT) or callable" in err and "not both" not in err


@pytest.mark.parametrize("char", ["\u202e", "\u0085", "\u2028", "\u200b"])
@pytest.mark.parametrize("field", ["owner", "reason", "dataset"])
def test_invisible_and_separator_characters_are_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], char: str, field: str) -> None:
    data = valid_plan()
    bp = data["backfill_plan"]
    if field == "dataset":
        bp["targets"][0]["dataset"] += char + "x"
        path_shown = "backfill_plan.targets[0].dataset"
    else:
        bp[field] = f"a{char}b@example.com"
        path_shown = f"backfill_plan.{field}"
    path = tmp_path / "plan.yaml"
    path.write_text(plan_yaml(data), encoding="utf-8")
    assert main(["guard", "--static-only", str(path)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert any(path_shown in ln and "control character" in ln for ln in err.splitlines())


@pytest.mark.parametrize(("edit", "path_shown", "said"), [
    (lambda t: t.replace("UPPER(currency)", "UPPER(currency) || '\u202e'"),
     "backfill_plan.targets[0].transform.sql", "control character"),
    (lambda t: t.replace("- order_id\n", "- !!binary b3JkZXJfaWQ=\n", 1),
     "backfill_plan.targets[0].business_keys[0]", "binary data (!!binary)"),
    (lambda t: t.replace("- order_id\n", "- !!set {order_id}\n", 1),
     "backfill_plan.targets[0].business_keys[0]", "a YAML set"),
    (lambda t: t.replace("  owner:", "  \"own\\u200ber\": x\n  owner:", 1),
     "backfill_plan.own\u200ber", "key contains a control character"),
], ids=["bidi-in-transform-sql", "binary-key", "set-key", "zero-width-in-a-key"])
def test_what_a_reviewer_cannot_read_is_refused_in_any_field(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: Any, path_shown: str,
        said: str) -> None:
    """A transform a reviewer approves must be the one that runs: text that prints otherwise
    than it reads (a bidi override in the SQL) and values behind a YAML tag (``!!binary``
    base64 decoded to a key) are refused in every field, not only owner, reason and dataset."""
    text = plan_yaml(valid_plan())
    changed = edit(text)
    assert changed != text
    path = tmp_path / "plan.yaml"
    path.write_text(changed, encoding="utf-8")
    assert main(["guard", "--static-only", str(path)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert any(path_shown in ln and said in ln for ln in err.splitlines()), err


def test_an_approvals_file_with_a_bidi_override_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(plan_yaml(valid_plan()), encoding="utf-8")
    approvals_path(path).write_text(
        "approvals:\n- role: data-platform-owner\n  by: \"alice\\u202e@example.com\"\n"
        "  at: '2026-05-01T00:00:00Z'\n  plan_sha256: abc\n", encoding="utf-8")
    assert main(["guard", "--static-only", str(path)]) == EXIT_USAGE
    assert "control character" in capsys.readouterr().err


def test_approve_by_refuses_a_bidi_override(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(plan_yaml(valid_plan()), encoding="utf-8")
    assert main(["approve", str(path), "--role", "data-platform-owner",
                 "--by", "alice\u202e@example.com"]) == EXIT_USAGE
    assert "--by" in capsys.readouterr().err and not approvals_path(path).exists()


@pytest.mark.parametrize(("expr", "refused"), [
    ("`order amount` * 2", None),
    ("`fx.rate` * `we``ird`", None),
    ("concat('`', status)", None),  # a backquote inside a string literal is not a name
    ("sum(`line_total)", "unterminated backquote"),
    ("`a``", "unterminated backquote"),
    ("`x` -- y", "a comment"),
    ("(TABLE secrets.cards)", "subquery"),
    ("amount IN (VALUES 1, 2)", "subquery"),
    ("EXISTS ( table t)", "subquery"),
    ("`table` + `values`", None),  # names, not query heads
    # with spark.sql.parser.escapedStringLiterals=true a backslash ends no string: '\' is one,
    # and the TABLE between the two is a subquery
    ("'\\' || (TABLE secrets.cards) || '\\'", "subquery"),
    ("concat('\\'', (status))", None),
])
def test_metric_expressions_take_backquoted_names(expr: str, refused: str | None) -> None:
    """A column with a space, a dot or a backquote in its name can be named in a metric; an
    unterminated backquote, and a subquery without SELECT, are plan errors."""
    from sparkguard.sql import UnsafeSQLError, check_expression

    if refused is None:
        assert check_expression(expr) == expr
        return
    with pytest.raises(UnsafeSQLError, match=refused):
        check_expression(expr)


def test_the_column_a_metric_expression_is() -> None:
    """A metric reuses a compared column's sum only when its expression is exactly that column."""
    from sparkguard.sql import column_named

    assert column_named(" amount ") == "amount"
    assert column_named("`c```") == "c`" and column_named("`a.b`") == "a.b"
    assert column_named("amount * 2") is None and column_named("`a` + `b`") is None


@pytest.mark.parametrize("where", ["a-file", "under-a-file"])
def test_an_evidence_dir_that_cannot_be_written_is_refused_before_spark_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        where: str) -> None:
    """Found only at the Evidence stage, after the promotion, it made every attempt promote and
    undo (exit 3); refused up front, nothing is created."""
    path = tmp_path / "plan.yaml"
    path.write_text(plan_yaml(valid_plan()), encoding="utf-8")
    record_approval(path, "data-platform-owner", "alice@example.com")
    record_approval(path, "downstream-owner", "bob@example.com")
    blocker = tmp_path / "taken"
    blocker.write_text("x")
    target = blocker if where == "a-file" else blocker / "evidence"

    def no_spark() -> None:
        raise AssertionError("a session was started")

    monkeypatch.setattr(cli_common, "session", no_spark)
    before = sorted(tmp_path.rglob("*"))
    assert main(["run", "--plan", str(path), "--evidence-dir", str(target)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "--evidence-dir:" in err and "a folder you can write" in err
    assert sorted(tmp_path.rglob("*")) == before


@pytest.mark.parametrize("value", ["relative/dir", "sales.orders"])
def test_a_shadow_location_that_is_not_a_path_is_told_to_give_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str) -> None:
    """It was parsed as a table name and told to use letters, digits and '_'."""
    data = valid_plan()
    data["backfill_plan"]["execution"]["shadow_location"] = value
    path = tmp_path / "plan.yaml"
    path.write_text(plan_yaml(data), encoding="utf-8")
    assert main(["guard", "--static-only", str(path)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "backfill_plan.execution.shadow_location" in err
    assert "give an absolute path or a URI" in err and "letters, digits" not in err
