"""Spark Connect: sparkguard against a real local Spark Connect server with Delta.

One server (``tests/system/connect_server.py``, its own JVM) serves the whole module; the test process
holds only the Connect client. Over that remote session: the end-to-end backfill, ``status``
(through the ``sparkguard`` command in a fresh process with ``SPARK_REMOTE``), a rollback refused
for a foreign commit and then forced, a gate failure with the target unchanged, and a crash at
a failpoint (a separate client process killed after its promote commit) followed by a resume
that promotes once, with the MERGE promotion. Assertions read the real Delta tables through the
same server. The last test keeps the JVM-only handles inside ``sparkguard/compat.py``.

PySpark decides between classic and Connect functions (``F.col``...) by the process-wide
``SPARK_CONNECT_MODE_ENABLED``; the ``remote`` fixture sets it for this module only and puts it
back, so a classic session of other modules in the same pytest run is unaffected.
"""

from __future__ import annotations

import ast
import io
import json
import os
import subprocess
import sys
import tokenize
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from sparkguard import compat, delta_ops
from sparkguard.sql import TableRef
from tests.lakes import (
    TEST_SESSION_CONF,
    WINDOW,
    build_base,
    copy_lake,
    newer_protocol,
    set_transform,
    write_plan,
)
from tests.system.connect_server import ROOT, connect_server

SPARK = pytest.mark.spark
CALLER_TAG = "caller-of-sparkguard"


@pytest.fixture(scope="module")
def connect_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A local Spark Connect server with Delta for this module, stopped afterwards."""
    with connect_server(conf=TEST_SESSION_CONF, log_dir=tmp_path_factory.mktemp("connect")) as url:
        yield url


@pytest.fixture(scope="module")
def remote(connect_url: str) -> Iterator[Any]:
    """A Spark Connect session to that server (no SparkContext, no JVM in this process)."""
    from pyspark.sql.connect.session import SparkSession as RemoteSparkSession

    before = os.environ.get("SPARK_CONNECT_MODE_ENABLED")
    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    session = RemoteSparkSession.builder.remote(connect_url).getOrCreate()
    try:
        yield session
    finally:
        session.stop()
        if before is None:
            os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
        else:
            os.environ["SPARK_CONNECT_MODE_ENABLED"] = before


@pytest.fixture(scope="module")
def rbase(remote: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The small demo lake, generated through the Connect server."""
    return build_base(remote, tmp_path_factory.mktemp("rbase") / "lake")


def _target(root: Path) -> Path:
    return root / "target" / "orders_clean"


def _history(spark: Any, path: Path) -> list[dict[str, Any]]:
    return [r.asDict() for r in delta_ops.history(spark, TableRef(path=str(path)))
            .select("version", "operation", "userMetadata").orderBy("version").collect()]


def _rows(spark: Any, path: Path) -> list[tuple[Any, ...]]:
    """The table's rows, sorted (the test lakes hold 1,200)."""
    df = spark.read.format("delta").load(str(path))
    return [tuple(r) for r in df.orderBy("order_date", "order_id").collect()]


def _expected(spark: Any, root: Path) -> list[tuple[Any, ...]]:
    """The transform applied to the whole source: what the target must hold after a repair."""
    from sparkguard.demo import transform_orders

    src = spark.read.format("delta").load(str(root / "source" / "orders"))
    return [tuple(r) for r in transform_orders(spark, src, []).orderBy("order_date", "order_id")
            .collect()]


def _cli(connect_url: str, *args: str, fault: str | None = None) -> subprocess.CompletedProcess[str]:
    """``sparkguard ARGS`` in a fresh client process, pointed at the server by SPARK_REMOTE."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("SPARK_CONNECT_MODE_ENABLED", "SPARKGUARD_FAULT_AT")}
    env["SPARK_REMOTE"] = connect_url
    if fault:
        env["SPARKGUARD_FAULT_AT"] = fault
    return subprocess.run([sys.executable, "-m", "sparkguard.cli", *args], env=env, cwd=str(ROOT),
                          capture_output=True, text=True, timeout=600)


def _main(*args: str) -> tuple[int, str, str]:
    """``sparkguard ARGS`` in this process (its session: the active Connect session)."""
    from sparkguard.cli import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


@SPARK
def test_connect_session_is_detected_and_labels_jobs_with_tags(remote: Any) -> None:
    assert compat.is_connect(remote)
    remote.addTag(CALLER_TAG)
    try:
        saved = compat.job_labels(remote)
        compat.set_job_label(remote, "sparkguard-run-1", "run 1: promote, with a comma")
        assert remote.getTags() == {CALLER_TAG, "sparkguard-run-1",
                                    "sparkguard: run 1: promote  with a comma"}
        compat.set_job_label(remote, "sparkguard-run-1", "run 1: verify")  # replaces the stage
        assert remote.getTags() == {CALLER_TAG, "sparkguard-run-1", "sparkguard: run 1: verify"}
        compat.restore_job_labels(remote, saved)
        assert remote.getTags() == {CALLER_TAG}
    finally:
        remote.clearTags()
    compat.set_log_level(remote, "ERROR")  # no SparkContext: a no-op, not an error


@pytest.fixture(scope="module")
def promoted(remote: Any, rbase: Path, tmp_path_factory: pytest.TempPathFactory
             ) -> dict[str, Any]:
    """One end-to-end backfill over Connect (replaceWhere promotion, several slices)."""
    from sparkguard.plan import load_plan
    from sparkguard.run.evaluator import run_backfill

    root = copy_lake(rbase, tmp_path_factory.mktemp("promoted") / "lake")
    plan = write_plan(root, lambda p: p["execution"].update(slice_partitions=1))
    target = _target(root)
    before, history_before = _rows(remote, target), _history(remote, target)
    remote.addTag(CALLER_TAG)
    lines: list[str] = []
    try:
        out = run_backfill(remote, load_plan(plan), str(plan), home=str(root / "_sg"),
                           evidence_dir=str(root / "evidence"), out=lines.append)
        tags_after = remote.getTags()
    finally:
        remote.clearTags()
    return {"root": root, "out": out, "before": before, "history_before": history_before,
            "tags_after": tags_after, "lines": lines}


@SPARK
def test_backfill_end_to_end_over_connect(remote: Any, promoted: dict[str, Any]) -> None:
    root, out = promoted["root"], promoted["out"]
    assert out.exit_code == 0, out.message
    target = _target(root)
    rows = _rows(remote, target)
    assert rows == _expected(remote, root)  # the defect repaired, nothing else changed
    assert rows != promoted["before"]
    outside = [r for r in promoted["before"] if r[1] not in WINDOW]
    assert [r for r in rows if r[1] not in WINDOW] == outside
    st = out.targets["orders_clean"]
    v0 = promoted["history_before"][-1]["version"]
    assert (st.rollback_version, st.promoted_version) == (v0, v0 + 1)
    (commit,) = [h for h in _history(remote, target) if h["version"] > v0]
    meta = delta_ops.commit_metadata(commit["userMetadata"])
    assert meta is not None and meta["run_id"] == out.run_id and meta["action"] == "promote"
    assert promoted["tags_after"] == {CALLER_TAG}  # the caller's tags are back, ours gone
    assert out.evidence_path and Path(out.evidence_path).exists()
    assert any("promoted" in ln for ln in promoted["lines"])
    # publish reopened: the control table says so
    from sparkguard.publish import is_paused

    assert not is_paused(remote, str(target), str(root / "_sg"))


@SPARK
def test_status_report_and_publish_commands_over_connect(connect_url: str,
                                                         promoted: dict[str, Any]) -> None:
    root, run_id = promoted["root"], promoted["out"].run_id
    home = str(root / "_sg")
    res = _cli(connect_url, "status", "--home", home, "--run-id", run_id)
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"run {run_id}" in res.stdout and "state done" in res.stdout
    assert "promoted v" in res.stdout and "next:" in res.stdout
    res = _cli(connect_url, "status", "--home", home)
    assert res.returncode == 0 and run_id in res.stdout and "done" in res.stdout
    res = _cli(connect_url, "report", "--run-id", run_id, "--home", home,
               "--evidence-dir", str(root / "evidence"))
    assert res.returncode == 0 and run_id in res.stdout, res.stderr[-2000:]
    res = _cli(connect_url, "publish", "status", "--home", home)
    assert res.returncode == 0 and str(_target(root)) in res.stdout, res.stderr[-2000:]


@SPARK
def test_rollback_refused_for_a_foreign_commit_then_forced(remote: Any,
                                                           promoted: dict[str, Any]) -> None:
    root, run_id = promoted["root"], promoted["out"].run_id
    target, home = _target(root), str(root / "_sg")
    remote.sql(f"UPDATE delta.`{target}` SET status = 'late-fix' WHERE order_id = 1000001")
    n = len(_history(remote, target))
    other = _history(remote, target)[-1]["version"]
    code, _out, err = _main("rollback", "--run-id", run_id, "--home", home)
    assert code == 2
    assert f"v{other} UPDATE" in err and "--force" in err and "nothing restored" in err
    assert len(_history(remote, target)) == n  # nothing restored
    code, _out, err = _main("rollback", "--run-id", run_id, "--home", home, "--force")
    assert code == 0, err
    assert len(_history(remote, target)) == n + 1
    assert _history(remote, target)[-1]["operation"] == "RESTORE"
    assert _rows(remote, target) == promoted["before"]  # the late fix undone with the run
    from sparkguard.ledger import Ledger, run_progress

    assert run_progress(Ledger(remote, home).run_events(run_id)).state == "rolled_back"


@SPARK
def test_gate_failure_over_connect_leaves_the_target_unchanged(remote: Any, rbase: Path,
                                                                tmp_path: Path) -> None:
    from sparkguard.plan import load_plan
    from sparkguard.publish import is_paused
    from sparkguard.run.evaluator import run_backfill

    root = copy_lake(rbase, tmp_path / "lake")
    # a transform that silently loses every seventh order: row-count parity must fail
    from sparkguard.demo import TRANSFORM_SQL

    plan = write_plan(root, set_transform(TRANSFORM_SQL + " AND order_id % 7 <> 0"))
    target = _target(root)
    before, history = _rows(remote, target), _history(remote, target)
    out = run_backfill(remote, load_plan(plan), str(plan), home=str(root / "_sg"),
                       evidence_dir=str(root / "evidence"), out=lambda _m: None)
    assert out.exit_code == 1, out.message
    assert "row_count" in out.message
    assert _history(remote, target) == history and _rows(remote, target) == before
    assert is_paused(remote, str(target), str(root / "_sg"))  # publish stays paused


@SPARK
@pytest.mark.parametrize(("table", "field"), [
    ("source/orders", "backfill_plan.source_of_truth.dataset"),
    ("target/orders_clean", "backfill_plan.targets[0].dataset")], ids=["source", "target"])
def test_a_table_this_delta_cannot_read_is_a_guard_finding_over_connect(
        remote: Any, rbase: Path, tmp_path: Path, table: str, field: str) -> None:
    """Over Connect Delta's refusal comes back as an error condition, from DESCRIBE DETAIL or
    when the read is analysed: the guard and the run block (exit 2) naming the field, with
    Delta's reason, and nothing is written."""
    root = copy_lake(rbase, tmp_path / "lake")
    newer_protocol(remote, root / table, reader=True)
    plan = write_plan(root)
    code, out, _err = _main("guard", str(plan))
    assert code == 2
    (line,) = [ln for ln in out.splitlines() if ln.startswith("[BLOCK] table_unreadable")]
    assert field in line and "futureReaderFeature" in line, line
    code, _out, _err = _main("run", "--plan", str(plan), "--home", str(root / "_sg"))
    assert code == 2 and not (root / "_sg").exists()


@SPARK
def test_crash_after_the_merge_commit_then_resume_over_connect(
        remote: Any, connect_url: str, rbase: Path, tmp_path: Path) -> None:
    """A client process dies right after its MERGE promotion commit; the same command again
    finds the commit, promotes nothing twice and finishes. Then VACUUM removes the rollback
    point's files and the rollback check (no file system in this process) sees it."""
    from sparkguard.faults import KILLED_EXIT_CODE
    from sparkguard.ledger import Ledger, run_progress
    from sparkguard.plan import load_plan
    from sparkguard.run.evaluator import run_backfill

    root = copy_lake(rbase, tmp_path / "lake")
    plan = write_plan(root, lambda p: p["execution"].update(slice_partitions=3),
                      promotion="merge")
    target, home = _target(root), str(root / "_sg")
    v0 = _history(remote, target)[-1]["version"]
    res = _cli(connect_url, "run", "--plan", str(plan), "--home", home,
               "--evidence-dir", str(root / "evidence"), fault="after_promote_commit")
    assert res.returncode == KILLED_EXIT_CODE, res.stderr[-3000:]
    (crashed,) = Ledger(remote, home).latest_runs()
    assert run_progress(Ledger(remote, home).run_events(crashed.run_id)) \
        .targets["orders_clean"].promoted_version is None  # the ledger never heard
    (merge,) = [h for h in _history(remote, target) if h["version"] > v0]
    assert merge["operation"] == "MERGE"

    out = run_backfill(remote, load_plan(plan), str(plan), home=home,
                       evidence_dir=str(root / "evidence"), out=lambda _m: None)
    assert out.exit_code == 0 and out.run_id == crashed.run_id, out.message
    assert [h["version"] for h in _history(remote, target) if h["version"] > v0] == [v0 + 1]
    prog = run_progress(Ledger(remote, home).run_events(crashed.run_id))
    assert prog.state == "done" and prog.targets["orders_clean"].verified
    assert prog.targets["orders_clean"].promoted_version == v0 + 1
    assert _rows(remote, target) == _expected(remote, root)

    ref = TableRef(path=str(target))
    assert delta_ops.missing_files_for_version(remote, ref, v0) == []
    key = "spark.databricks.delta.retentionDurationCheck.enabled"
    remote.conf.set(key, "false")  # this test only: let VACUUM remove everything unreferenced
    try:
        remote.sql(f"VACUUM delta.`{target}` RETAIN 0 HOURS")
    finally:
        remote.conf.set(key, "true")
    missing = delta_ops.missing_files_for_version(remote, ref, v0)
    assert missing and all(str(target) in m for m in missing)


# -- no JVM-only handle outside the compatibility module -----------------------------------

JVM_ONLY = frozenset({"sparkContext", "_jvm", "_jsc", "_jdf"})


def jvm_only_references(root: Path) -> list[str]:
    """``file:line name`` for every name or string naming a JVM-only handle in the package
    under ``root``, except in ``compat.py`` (comments and docstring prose do not count)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "compat.py" and path.parent == root:
            continue
        with path.open("rb") as f:
            for tok in tokenize.tokenize(f.readline):
                text: object = tok.string
                if tok.type == tokenize.STRING:
                    try:
                        text = ast.literal_eval(tok.string)
                    except (ValueError, SyntaxError):  # an f-string: its parts are not names
                        continue
                if tok.type in (tokenize.NAME, tokenize.STRING) and text in JVM_ONLY:
                    found.append(f"{path.relative_to(root.parent)}:{tok.start[0]} {text}")
    return found


def test_no_jvm_only_handle_outside_the_compat_module() -> None:
    """Spark Connect sessions have no SparkContext and no JVM gateway: only compat.py may name
    them (whatever modules the package holds, run/ included)."""
    assert jvm_only_references(ROOT / "sparkguard") == []


def test_the_scan_sees_a_jvm_handle(tmp_path: Path) -> None:
    pkg = tmp_path / "sparkguard"
    (pkg / "run").mkdir(parents=True)
    (pkg / "compat.py").write_text("def f(spark):\n    return spark.sparkContext\n")
    (pkg / "run" / "x.py").write_text("# sparkContext in a comment is fine\n"
                                      "def g(spark):\n    return getattr(spark, '_jvm')\n")
    (pkg / "y.py").write_text('"""Docs may say _jsc."""\nh = lambda df: df._jdf\n')
    assert jvm_only_references(pkg) == ["sparkguard/run/x.py:3 _jvm", "sparkguard/y.py:2 _jdf"]


def test_the_connect_server_command_uses_pyspark_s_server_and_the_delta_conf() -> None:
    from tests.system.connect_server import SERVER_CLASS, server_command

    cmd = server_command(15002, {"spark.sql.shuffle.partitions": "2"})
    assert cmd[0].endswith("spark-submit") and SERVER_CLASS in cmd
    assert "spark.connect.grpc.binding.port=15002" in cmd
    assert "spark.connect.grpc.binding.address=127.0.0.1" in cmd
    conf = (ROOT / "conf" / "spark-defaults.conf").read_text()
    assert "io.delta:delta-spark_2.13:4.0.1" in conf and "DeltaSparkSessionExtension" in conf
    assert json.dumps(cmd)  # plain strings only
