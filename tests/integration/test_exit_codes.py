"""Every exit code the README documents is the one each command returns.

The README's exit-code table is parsed (command, code); each row has a driver here that runs
the command's real cases for that row and returns what each returned. A documented row with no
driver, or a driver for an undocumented row, fails. The ``run`` and ``rollback`` rows go
through the ``spark-submit`` entry points themselves (``jobs/backfill.py``,
``jobs/rollback.py``), in this process on the shared session; rows that need no Spark run
without it (``make test-fast``).
"""

from __future__ import annotations

import contextlib
import io
import re
import runpy
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from sparkguard.cli import main
from tests.lakes import copy_lake, lock_key_of, set_transform, write_plan
from tests.plan_fixtures import plan_yaml, valid_plan

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
GOLDEN_EVIDENCE = ROOT / "tests" / "golden" / "evidence.yaml"
TARGET = "orders_clean"

Case = tuple[str, int]  # (what was driven, the code it returned)


def documented() -> list[tuple[str, int]]:
    """(command, code) of every row of the README's exit-code table, in order."""
    text = README.read_text(encoding="utf-8")
    section = text.split("\n## Exit codes\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[1].isdigit():
            continue
        name = re.fullmatch(r"`([a-z ]+)`|(any)", cells[0])
        assert name, f"README exit-code table: unreadable command cell {cells[0]!r}"
        rows.append((name.group(1) or name.group(2), int(cells[1])))
    return rows


def job(script: str, *args: str) -> int:
    """``spark-submit jobs/<script> args`` as the driver runs it (in this process)."""
    argv = sys.argv
    sys.argv = [str(ROOT / "jobs" / script), *args]
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as exc:
        return int(exc.code or 0)
    finally:
        sys.argv = argv
    raise AssertionError(f"jobs/{script} returned without an exit code")


def _plan_file(tmp: Path, mutate: Callable[[dict[str, Any]], None] | None = None) -> Path:
    data = valid_plan(tmp)
    if mutate:
        mutate(data["backfill_plan"])
    path = tmp / "plan.yaml"
    path.write_text(plan_yaml(data), encoding="utf-8")
    return path


# -- rows that need no Spark ------------------------------------------------------------------


def any_2(tmp: Path) -> list[Case]:
    return [(" ".join(a), main(a)) for a in (
        ["nope"], ["run"], ["run", "--plan", "p.yaml", "--no-such-flag"], ["status", "--limit", "x"],
        ["plan"], ["rollback", "--run-id"])]


def guard_0(tmp: Path) -> list[Case]:
    plan = _plan_file(tmp)
    write_plan_approvals(plan)
    return [("guard --static-only (approved plan)", main(["guard", str(plan), "--static-only"]))]


def write_plan_approvals(plan: Path) -> None:
    assert main(["approve", str(plan), "--role", "data-platform-owner", "--by", "a@example.com"]) == 0
    assert main(["approve", str(plan), "--role", "downstream-owner", "--by", "b@example.com"]) == 0


def guard_2(tmp: Path) -> list[Case]:
    plan = _plan_file(tmp)  # unapproved
    (tmp / "bad").mkdir()
    bad = _plan_file(tmp / "bad", lambda p: p["affected_window"].update(end_utc="not a date"))
    return [("guard --static-only (unapproved)", main(["guard", str(plan), "--static-only"])),
            ("guard --static-only (malformed)", main(["guard", str(bad), "--static-only"]))]


def approve_0(tmp: Path) -> list[Case]:
    plan = _plan_file(tmp)
    return [("approve", main(["approve", str(plan), "--role", "data-platform-owner",
                              "--by", "a@example.com"]))]


def approve_2(tmp: Path) -> list[Case]:
    bad = tmp / "bad.yaml"
    bad.write_text("backfill_plan: [\n", encoding="utf-8")
    args = ["--role", "data-platform-owner", "--by", "a@example.com"]
    return [("approve (missing file)", main(["approve", str(tmp / "none.yaml"), *args])),
            ("approve (malformed)", main(["approve", str(bad), *args]))]


def report_0(tmp: Path) -> list[Case]:
    return [("report --evidence", main(["report", "--evidence", str(GOLDEN_EVIDENCE)]))]


def report_2(tmp: Path) -> list[Case]:
    other = tmp / "other.yaml"
    other.write_text(yaml.safe_dump({"a": 1}), encoding="utf-8")
    return [("report (no --run-id or --evidence)", main(["report"])),
            ("report (missing evidence)", main(["report", "--evidence", str(tmp / "no.yaml")])),
            ("report (not sparkguard's)", main(["report", "--evidence", str(other)]))]


def status_2_pure(tmp: Path) -> list[Case]:
    return [("status --limit 0", main(["status", "--limit", "0", "--home", str(tmp)]))]


def publish_2(tmp: Path) -> list[Case]:
    return [("publish pause (no TARGET)", main(["publish", "pause", "--home", str(tmp)])),
            ("publish resume (no TARGET)", main(["publish", "resume", "--home", str(tmp)]))]


def plan_schema_0(tmp: Path) -> list[Case]:
    return [("plan schema", main(["plan", "schema"]))]


def faults_0(tmp: Path) -> list[Case]:
    return [("faults", main(["faults"]))]


def plan_init_2(tmp: Path) -> list[Case]:
    exists = tmp / "draft.yaml"
    exists.write_text("keep me\n", encoding="utf-8")
    base = ["plan", "init", "--source", str(tmp / "s"), "--target", str(tmp / "t")]
    return [("plan init (output exists)", main([*base, "--start", "2026-05-12", "--end",
                                                 "2026-05-14", "-o", str(exists)])),
            ("plan init (bad bound)", main([*base, "--start", "May 12", "--end", "2026-05-14"]))]


def run_0_explain(tmp: Path) -> list[Case]:
    return [("run --explain", main(["run", "--plan", str(_plan_file(tmp)), "--explain"]))]


def run_2_unapproved(tmp: Path) -> list[Case]:
    return [("run (unapproved plan)", main(["run", "--plan", str(_plan_file(tmp))])),
            ("run (missing plan)", main(["run", "--plan", str(tmp / "none.yaml")]))]


def rollback_2_pure(tmp: Path) -> list[Case]:
    return [("rollback (no --run-id)", main(["rollback", "--home", str(tmp)])),
            ("rollback --plan missing", main(["rollback", "--run-id", "x", "--plan",
                                              str(tmp / "none.yaml")])),
            ("rollback --abandon (no reason)", _usage(["rollback", "--run-id", "x", "--home",
                                                       str(tmp), "--abandon", ""])),
            ("rollback --abandon --force", _usage(["rollback", "--run-id", "x", "--home",
                                                   str(tmp), "--abandon", "gone", "--force"]))]


def _usage(argv: list[str]) -> int:
    """``main(argv)``, checked to stop at its usage message (not a later refusal)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(argv)
    assert "--abandon needs a reason" in err.getvalue(), err.getvalue()
    return code


def verify_2_pure(tmp: Path) -> list[Case]:
    return [("verify (no mode)", main(["verify", "--home", str(tmp)])),
            ("verify --evidence missing", main(["verify", "--evidence", str(tmp / "none.yaml")])),
            ("verify --run-id (unknown)", main(["verify", "--run-id", "x", "--home", str(tmp)]))]


PURE: dict[tuple[str, int], list[Callable[[Path], list[Case]]]] = {
    ("any", 2): [any_2],
    ("guard", 0): [guard_0],
    ("guard", 2): [guard_2],
    ("approve", 0): [approve_0],
    ("approve", 2): [approve_2],
    ("report", 0): [report_0],
    ("report", 2): [report_2],
    ("status", 2): [status_2_pure],
    ("publish", 2): [publish_2],
    ("plan schema", 0): [plan_schema_0],
    ("faults", 0): [faults_0],
    ("plan init", 2): [plan_init_2],
    ("run", 0): [run_0_explain],
    ("run", 2): [run_2_unapproved],
    ("rollback", 2): [rollback_2_pure],
    ("verify", 2): [verify_2_pure],
}


# -- rows that need Spark: each chain runs once per module --------------------------------------


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("exit-codes")


@pytest.fixture(scope="module")
def run_cases(spark: Any, base_lake: Path, work: Path) -> dict[int, list[Case]]:
    """``jobs/backfill.py`` on four lakes: a good plan, a failing gate, a held lock, a transform
    that returns no DataFrame; plus the read-only commands on the promoted lake."""
    from sparkguard.ledger import Ledger

    out: dict[int, list[Case]] = {}
    tmp = work
    good = copy_lake(base_lake, tmp / "good")
    plan = write_plan(good, lambda p: p["execution"].update(slice_partitions=3))
    out.setdefault(0, []).append(("jobs/backfill.py (good plan)", job("backfill.py", "--plan", str(plan))))
    gate = copy_lake(base_lake, tmp / "gate")
    bad = write_plan(gate, set_transform(  # the demo transform, minus a tenth of the rows
        "SELECT order_id, order_date, customer_id, UPPER(currency) AS currency, status, "
        "quantity, CAST(amount AS DECIMAL(12,2)) AS amount, "
        "CAST(amount * quantity AS DECIMAL(14,2)) AS line_total FROM {source} "
        "WHERE {window} AND order_id % 10 <> 0"))
    out.setdefault(1, []).append(("jobs/backfill.py (row count gate fails)",
                                  job("backfill.py", "--plan", str(bad))))
    locked = copy_lake(base_lake, tmp / "locked")
    plan_l = write_plan(locked)
    Ledger(spark, str(locked / "_sparkguard")).acquire(
        [lock_key_of(spark, locked / "target" / TARGET)], "20261201T090000Z-0ther000", "carol@example.com")
    out.setdefault(2, []).append(("jobs/backfill.py (target locked by another run)",
                                  job("backfill.py", "--plan", str(plan_l))))
    broken = copy_lake(base_lake, tmp / "broken")
    plan_b = write_plan(broken, lambda p: p["targets"][0].update(
        transform={"callable": "tests.integration.test_run_engine:not_a_frame"}))
    out.setdefault(3, []).append(("jobs/backfill.py (transform returns no DataFrame)",
                                  job("backfill.py", "--plan", str(plan_b))))
    return out


@pytest.fixture(scope="module")
def promoted(spark: Any, run_cases: dict[int, list[Case]], work: Path) -> tuple[Path, str]:
    """The good lake after its run: (root, run id)."""
    from sparkguard.ledger import Ledger

    root = work / "good"
    (prog,) = Ledger(spark, str(root / "_sparkguard")).latest_runs()
    assert prog.state == "done"
    return root, prog.run_id


@pytest.fixture(scope="module")
def read_cases(promoted: tuple[Path, str]) -> dict[tuple[str, int], list[Case]]:
    root, run_id = promoted
    home = str(root / "_sparkguard")
    target = str(root / "target" / TARGET)
    draft = root / "draft.yaml"
    return {
        ("status", 0): [("status", main(["status", "--home", home])),
                        ("status --run-id", main(["status", "--run-id", run_id, "--home", home]))],
        ("status", 2): [("status --run-id (unknown)",
                         main(["status", "--run-id", "20260101T000000Z-nope0000", "--home", home]))],
        ("report", 0): [("report --run-id", main(["report", "--run-id", run_id, "--home", home]))],
        ("publish", 0): [("publish status", main(["publish", "status", "--home", home])),
                         ("publish pause", main(["publish", "pause", target, "--home", home,
                                                 "--reason", "exit-code test"])),
                         ("publish resume", main(["publish", "resume", target, "--home", home]))],
        ("plan init", 0): [("plan init", main([
            "plan", "init", "--source", str(root / "source" / "orders"), "--target", target,
            "--start", "2026-05-04", "--end", "2026-05-06", "-o", str(draft)]))],
        ("verify", 0): [("verify --run-id", main(["verify", "--run-id", run_id, "--home", home]))],
        ("verify", 1): [("verify --evidence (owner edited)", main([
            "verify", "--evidence", str(_edited_evidence(root, run_id)), "--home", home]))],
    }


def _edited_evidence(root: Path, run_id: str) -> Path:
    """A copy of the run's evidence with one value changed."""
    text = (root / "evidence" / f"{run_id}.yaml").read_text(encoding="utf-8")
    edited = root / "edited-evidence.yaml"
    edited.write_text(text.replace("owner: ", "owner: x", 1), encoding="utf-8")
    return edited


@pytest.fixture(scope="module")
def rollback_cases(spark: Any, promoted: tuple[Path, str], read_cases: Any
                   ) -> dict[int, list[Case]]:
    """``jobs/rollback.py`` on the promoted lake: a storage failure during RESTORE (3), a
    RESTORE that leaves the table differing (1), another writer's commit (2), ``--abandon`` of
    the stopped rollback (0), then ``--force`` (0), again (0, nothing to do), and ``--abandon``
    of a run rolled back (2)."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    from sparkguard import delta_ops

    root, run_id = promoted
    args = ["--run-id", run_id, "--home", str(root / "_sparkguard")]
    out: dict[int, list[Case]] = {}
    real = delta_ops.restore
    mp = pytest.MonkeyPatch()
    try:
        def storage_down(*_a: Any, **_k: Any) -> None:
            raise OSError("storage unavailable")

        mp.setattr(delta_ops, "restore", storage_down)
        out.setdefault(3, []).append(("jobs/rollback.py (storage fails)", job("rollback.py", *args)))
        mp.setattr(delta_ops, "restore", lambda *_a, **_k: None)  # RESTORE that changes nothing
        out.setdefault(1, []).append(("jobs/rollback.py (table differs after RESTORE)",
                                      job("rollback.py", *args)))
    finally:
        mp.undo()
    assert delta_ops.restore is real
    DeltaTable.forPath(spark, str(root / "target" / TARGET)).update(
        F.col("order_id") == 1_000_001, {"status": F.lit("late-fix")})
    out.setdefault(2, []).append(("jobs/rollback.py (others committed)", job("rollback.py", *args)))
    out[2].append(("jobs/rollback.py (unknown run)", job(
        "rollback.py", "--run-id", "20260101T000000Z-nope0000", "--home", str(root / "_sparkguard"))))
    # the stopped rollback (rolling_back since the storage failure) closed unfinished; a later
    # rollback still may try again
    out.setdefault(0, []).append(("jobs/rollback.py --abandon (rolling_back)",
                                  job("rollback.py", *args, "--abandon", "testing the exit code")))
    out[0].append(("jobs/rollback.py --force", job("rollback.py", *args, "--force")))
    out[0].append(("jobs/rollback.py --force (already rolled back)",
                   job("rollback.py", *args, "--force")))
    out[2].append(("jobs/rollback.py --abandon (run not rolling_back)",
                   job("rollback.py", *args, "--abandon", "not needed")))
    return out


def _spark_cases(request: pytest.FixtureRequest, cmd: str, code: int) -> list[Case] | None:
    if cmd == "run":
        return request.getfixturevalue("run_cases").get(code)
    if cmd == "rollback":
        return request.getfixturevalue("rollback_cases").get(code)
    if (cmd, code) in SPARK_ROWS:
        return request.getfixturevalue("read_cases").get((cmd, code))
    return None


SPARK_ROWS = {("run", 0), ("run", 1), ("run", 2), ("run", 3), ("rollback", 0), ("rollback", 1),
              ("rollback", 2), ("rollback", 3), ("status", 0), ("status", 2), ("report", 0),
              ("publish", 0), ("plan init", 0), ("verify", 0), ("verify", 1)}
ROWS = documented()


def test_the_table_lists_every_command_and_only_the_four_codes() -> None:
    from sparkguard.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a.choices, dict))
    assert isinstance(sub.choices, dict)
    commands = {c for c, _ in ROWS}
    for name, parser in sub.choices.items():
        nested = [a for a in parser._actions if isinstance(a.choices, dict)]
        names = [f"{name} {n}" for n in nested[0].choices] if nested else [name]
        assert set(names) <= commands, f"README exit-code table lacks {set(names) - commands}"
    assert {code for _, code in ROWS} == {0, 1, 2, 3}
    assert len(set(ROWS)) == len(ROWS), "a (command, code) row twice"
    assert set(PURE) | SPARK_ROWS == set(ROWS), "a documented row without a driver, or the reverse"


@pytest.mark.parametrize(("cmd", "code"), [r for r in ROWS if r in PURE],
                         ids=[f"{c}-{n}" for c, n in ROWS if (c, n) in PURE])
def test_documented_code_without_spark(cmd: str, code: int, tmp_path: Path) -> None:
    cases = [case for driver in PURE[(cmd, code)] for case in driver(tmp_path)]
    assert cases
    assert [(what, got) for what, got in cases if got != code] == []


@pytest.mark.spark
@pytest.mark.parametrize(("cmd", "code"), [r for r in ROWS if r in SPARK_ROWS],
                         ids=[f"{c}-{n}" for c, n in ROWS if (c, n) in SPARK_ROWS])
def test_documented_code_on_real_tables(cmd: str, code: int, request: pytest.FixtureRequest) -> None:
    cases = _spark_cases(request, cmd, code)
    assert cases, f"no case drove `{cmd}` to {code}"
    assert [(what, got) for what, got in cases if got != code] == []
