"""Hostile and extreme input (review of plan validation): each is refused with a message
naming the field and the fix, and the documented exit code, before anything is written.
No test here starts Spark."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkguard.cli import main
from sparkguard.commands import common as cli_common
from sparkguard.errors import EXIT_USAGE
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
