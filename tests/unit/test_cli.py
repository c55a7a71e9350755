"""The ``sparkguard`` command line surface: help, exit codes, flags, explain without Spark, and
``jobs/*.py`` as thin wrappers over the same ``main``. No test here starts Spark."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sparkguard.cli import build_parser, main
from sparkguard.errors import EXIT_OK, EXIT_USAGE
from sparkguard.faults import FAILPOINTS
from tests.lakes import write_plan

ROOT = Path(__file__).resolve().parents[2]
SUBCOMMANDS = [["guard"], ["approve"], ["run"], ["status"], ["report"], ["rollback"],
               ["publish"], ["plan", "schema"], ["plan", "init"], ["faults"]]
# Runs a snippet in a fresh interpreter and reports whether it left Spark untouched.
NO_SPARK_PROBE = """
import sys
from sparkguard.cli import main
rc = main(sys.argv[1:])
from pyspark import SparkContext
from pyspark.sql import SparkSession
print("PROBE", rc, SparkSession.getActiveSession() is None, SparkContext._gateway is None)
"""


def _py(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, check=False)


def _probe(argv: list[str]) -> tuple[int, bool, str]:
    """(exit code, Spark untouched, stdout) of ``main(argv)`` in a fresh process."""
    proc = _py("-c", NO_SPARK_PROBE, *argv)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE ")]
    assert line, proc.stdout + proc.stderr
    _, rc, no_session, no_gateway = line[-1].split()
    return int(rc), no_session == "True" and no_gateway == "True", proc.stdout


def test_top_level_help_lists_subcommands_and_exit_codes(capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    assert main(["--help"]) == EXIT_OK
    out = capsys.readouterr().out
    for cmd in ("guard", "approve", "run", "status", "report", "rollback", "publish", "plan",
                "faults"):
        assert cmd in out
    text = " ".join(out.split())
    assert "exit codes: 0 ok; 1 gate failed" in text
    assert "2 plan/usage/lock error" in text and "3 runtime failure" in text


@pytest.mark.parametrize("cmd", SUBCOMMANDS, ids=" ".join)
def test_every_subcommand_has_help(cmd: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*cmd, "--help"]) == EXIT_OK
    out = capsys.readouterr().out
    assert out.startswith(f"usage: sparkguard {' '.join(cmd)}")


def test_flags_are_consistent_across_subcommands() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a.choices, dict))
    choices = sub.choices
    assert isinstance(choices, dict)

    def flags(name: str) -> set[str]:
        return {o for a in choices[name]._actions for o in a.option_strings}

    for name in ("run", "rollback", "status", "publish"):
        assert "--home" in flags(name), name
    for name in ("run", "report"):
        assert "--evidence-dir" in flags(name), name
    for name in ("rollback", "status", "report"):
        assert "--run-id" in flags(name), name
    assert "--plan" in flags("run")


@pytest.mark.parametrize("argv", [["bogus"], ["run"], ["approve", "p.yaml"],
                                  ["publish", "explode", "t"], []])
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == EXIT_USAGE
    assert "usage: sparkguard" in capsys.readouterr().err


def test_faults_lists_every_failpoint(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["faults"]) == EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[0] for ln in lines] == list(FAILPOINTS)
    for ln, what in zip(lines, FAILPOINTS.values(), strict=True):
        assert ln.endswith(what)


def test_plan_schema_is_json_schema_of_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "schema"]) == EXIT_OK
    schema = json.loads(capsys.readouterr().out)
    assert "backfill_plan" in schema["properties"]
    assert "backfill_plan" in schema["required"]


def test_rollback_without_a_run_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rollback"]) == EXIT_USAGE
    assert "give --run-id or --evidence" in capsys.readouterr().err


def test_approve_records_the_fingerprint_and_unknown_roles_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = write_plan(tmp_path, approve=False)
    assert main(["approve", str(plan), "--role", "data-platform-owner", "--by",
                 "alice@example.com"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "approved: role data-platform-owner by alice@example.com" in out
    approvals = list(tmp_path.glob("*.approvals.yaml"))
    assert len(approvals) == 1
    before = approvals[0].read_text()
    assert main(["approve", str(plan), "--role", "ceo", "--by", "mallory@example.com"]) == \
        EXIT_USAGE
    assert "role 'ceo' is not a required role" in capsys.readouterr().err
    assert approvals[0].read_text() == before


def test_guard_static_only_passes_an_approved_plan(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    plan = write_plan(tmp_path)
    assert main(["guard", str(plan), "--static-only"]) == EXIT_OK
    assert "0 blocking finding(s)" in capsys.readouterr().out


def test_guard_blocks_an_unapproved_plan(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    plan = write_plan(tmp_path, approve=False)
    assert main(["guard", str(plan), "--static-only"]) == EXIT_USAGE
    out = capsys.readouterr().out
    assert "approval" in out.lower()


# -- run --explain: the stage list, without Spark ---------------------------------------------

EXPECTED_STAGES = ["guard", "lock", "pause", "proof", "wave", "reconcile", "promote",
                   "evidence", "resume"]


def _stage_kinds(out: str) -> list[str]:
    return [ln.split()[1] for ln in out.splitlines() if ln[:3].strip().rstrip(".").isdigit()]


def test_run_explain_prints_the_stages_without_starting_spark(tmp_path: Path) -> None:
    plan = write_plan(tmp_path)
    rc, untouched, out = _probe(["run", "--plan", str(plan), "--explain"])
    assert rc == EXIT_OK
    assert untouched, "run --explain started Spark"
    assert _stage_kinds(out) == EXPECTED_STAGES
    assert not (tmp_path / "_sparkguard").exists() and not (tmp_path / "evidence").exists()


def test_dry_run_explain_stops_before_promotion(tmp_path: Path) -> None:
    plan = write_plan(tmp_path)
    rc, untouched, out = _probe(["run", "--plan", str(plan), "--explain", "--dry-run"])
    assert (rc, untouched) == (EXIT_OK, True)
    kinds = _stage_kinds(out)
    assert kinds[-1] == "dry_run_stop" and "promote" not in kinds


def test_run_explain_works_on_an_unapproved_plan_and_writes_nothing(tmp_path: Path) -> None:
    plan = write_plan(tmp_path, approve=False)
    before = sorted(p.name for p in tmp_path.iterdir())
    rc, untouched, out = _probe(["run", "--plan", str(plan), "--explain"])
    assert (rc, untouched) == (EXIT_OK, True)
    assert _stage_kinds(out) == EXPECTED_STAGES
    assert "not runnable yet" in out and "approval" in out.lower()
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_run_explain_works_on_the_bare_template(tmp_path: Path) -> None:
    template = ROOT / "templates" / "backfill-plan.yaml"
    plan = tmp_path / "plan.yaml"
    plan.write_text(template.read_text())
    rc, untouched, out = _probe(["run", "--plan", str(plan), "--explain"])
    assert (rc, untouched) == (EXIT_OK, True), out
    assert _stage_kinds(out)[:2] == ["guard", "lock"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.yaml"]


def test_run_refuses_an_unapproved_plan_before_spark(tmp_path: Path) -> None:
    plan = write_plan(tmp_path, approve=False)
    rc, untouched, _ = _probe(["run", "--plan", str(plan)])
    assert (rc, untouched) == (EXIT_USAGE, True)
    assert not (tmp_path / "_sparkguard").exists()


# -- jobs/*.py are thin wrappers --------------------------------------------------------------

@pytest.mark.parametrize(("script", "command"), [("jobs/backfill.py", "run"),
                                                 ("jobs/rollback.py", "rollback")])
def test_job_scripts_wrap_the_cli(script: str, command: str, tmp_path: Path) -> None:
    proc = _py(str(ROOT / script), "--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: sparkguard {command}")
    assert len((ROOT / script).read_text().splitlines()) <= 20


def test_backfill_job_explain_equals_the_cli(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    plan = write_plan(tmp_path)
    proc = _py(str(ROOT / "jobs/backfill.py"), "--plan", str(plan), "--explain", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert main(["run", "--plan", str(plan), "--explain"]) == EXIT_OK
    assert proc.stdout == capsys.readouterr().out


def test_rollback_job_without_run_id_exits_2(tmp_path: Path) -> None:
    proc = _py(str(ROOT / "jobs/rollback.py"), cwd=tmp_path)
    assert proc.returncode == EXIT_USAGE
    assert "give --run-id or --evidence" in proc.stderr


def test_explain_lists_every_slice_of_the_window(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    plan = write_plan(tmp_path)
    assert main(["run", "--plan", str(plan), "--explain"]) == EXIT_OK
    out = capsys.readouterr().out
    window = yaml.safe_load(plan.read_text())["backfill_plan"]["affected_window"]["partitions"]
    for part in window:
        assert part.split("=", 1)[1] in out
