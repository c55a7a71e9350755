"""Read-only answers without a JVM: ``status``, ``report``, ``publish status`` and ``is_paused``
read sparkguard's tables with delta-rs; Spark only where delta-rs cannot serve.

The first tests need no Spark: their tables are written by another writer (delta-rs) and the
readers run in subprocesses where ``pyspark`` cannot be imported. The Spark tests write the
tables through sparkguard's own API and compare what both engines read, records and CLI text.
"""

from __future__ import annotations

import io
import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from sparkguard.cli import main
from sparkguard.state_read import DeltaRsReader, FastReadUnavailable, read_state
from tests.plan_fixtures import plan_yaml, valid_plan

ROOT = Path(__file__).resolve().parents[2]
EPOCH_2026 = 1_767_225_600_000_000  # 2026-01-01 00:00:00 UTC in microseconds
# Runs code with pyspark and delta-spark made unimportable, then says whether either got in.
BLOCKED = textwrap.dedent("""
    import sys
    for name in ("pyspark", "delta", "py4j"):
        sys.modules[name] = None  # any import of them raises ImportError
    {body}
    leaked = sorted(m for m in sys.modules if m.split(".")[0] in ("pyspark", "delta", "py4j")
                    and sys.modules[m] is not None)
    print("LEAKED", leaked)
""")


def run_blocked(body: str, *args: str, env: dict[str, str] | None = None
                ) -> subprocess.CompletedProcess[str]:
    code = BLOCKED.format(body=textwrap.indent(textwrap.dedent(body), "").strip())
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, **(env or {})}, timeout=120, check=False)
    assert "LEAKED []" in proc.stdout, proc.stdout + proc.stderr
    return proc


def _write(path: Path, columns: dict[str, tuple[str, list[Any]]]) -> None:
    """Append one commit to a Delta table with delta-rs (the "other writer")."""
    from arro3.core import Array, DataType, Table
    from deltalake import write_deltalake

    types = {"string": DataType.string(), "bool": DataType.bool(), "long": DataType.int64(),
             "double": DataType.float64(), "int": DataType.int32()}
    arrays = {}
    for name, (kind, values) in columns.items():
        if kind == "ts":
            arrays[name] = Array(values, DataType.int64()).cast(DataType.timestamp("us", tz="UTC"))
        else:
            arrays[name] = Array(values, types[kind])
    write_deltalake(str(path), Table.from_pydict(arrays), mode="append")


def _control(home: Path, rows: list[tuple[str, str, bool, int, str | None]]) -> None:
    """Publish control events (target, hold, paused, at micros, reason) in one commit."""
    _write(home / "control" / "publish", {
        "target": ("string", [r[0] for r in rows]), "hold": ("string", [r[1] for r in rows]),
        "paused": ("bool", [r[2] for r in rows]), "at": ("ts", [r[3] for r in rows]),
        "run_id": ("string", [None if r[1] == "manual" else r[1] for r in rows]),
        "actor": ("string", ["ops"] * len(rows)), "reason": ("string", [r[4] for r in rows])})


# -- no Spark ---------------------------------------------------------------------------------


@pytest.fixture
def control_home(tmp_path: Path) -> Path:
    """A control table written by delta-rs: 60,000 events for one target (more than any row
    limit), delivered newest-first; quotes and backslashes in names; nulls."""
    home = tmp_path / "h'ome"
    busy = "s3://lake/orders_clean"
    at = [EPOCH_2026 + i for i in range(60_000)]
    # 55,000 old events clear the hold; the newest 5,000 set it (the very newest too)
    rows = [(busy, "20261201T000000Z-aaaa", i >= 55_000, at[i], None) for i in range(60_000)]
    random.Random(7).shuffle(rows)
    _control(home, rows[:30_000])
    _control(home, rows[30_000:])
    _control(home, [
        ("db.o'rders\\x", "manual", True, EPOCH_2026, "quote's \"reason\""),
        ("db.o'rders\\x", "20261202T000000Z-bbbb", True, EPOCH_2026 + 1, None),
        ("db.o'rders\\x", "20261202T000000Z-bbbb", False, EPOCH_2026 + 2, None),
        ("reopened", "manual", True, EPOCH_2026, None),
        ("reopened", "manual", False, EPOCH_2026 + 5, "done"),
    ])
    return home


def test_is_paused_needs_no_pyspark_and_the_newest_event_decides(control_home: Path) -> None:
    proc = run_blocked("""
        from sparkguard.publish import is_paused
        home = sys.argv[1]
        for target in ("s3://lake/orders_clean", "db.o'rders\\\\x", "reopened", "never-seen"):
            print("PAUSED", repr(target), is_paused(home, target))
    """, str(control_home))
    got = [line.split(" ", 1)[1] for line in proc.stdout.splitlines() if line.startswith("PAUSED")]
    assert got == ["'s3://lake/orders_clean' True", "\"db.o'rders\\\\x\" True",
                   "'reopened' False", "'never-seen' False"], proc.stdout + proc.stderr


def test_is_paused_on_a_home_never_written_is_open_and_on_no_directory_raises(
        tmp_path: Path) -> None:
    """A home directory holding nothing yet is open. No directory at all is no answer: a path
    without a scheme is the cluster's file system to Spark (``/mnt/...`` on Databricks), which
    this machine does not see; it used to answer "open"."""
    from sparkguard.publish import is_paused

    assert is_paused(str(tmp_path), "t") is False
    assert is_paused(tmp_path, "t") is False  # a Path works too
    with pytest.raises(FastReadUnavailable, match="no directory"):
        is_paused(str(tmp_path / "mnt" / "lake" / "_sparkguard"), "t")
    with pytest.raises(TypeError, match="home once"):
        is_paused(str(tmp_path), "t", str(tmp_path))


def test_a_catalog_name_spelled_another_way_reads_the_hold_set_under_the_plan_name(
        tmp_path: Path) -> None:
    """The plan paused ``main.sales.orders``; a downstream job asks with another case,
    backquotes, or without the catalog: delta-rs cannot resolve names, and used to answer
    "open" for each. Names that may be the same table count as one; others stay apart."""
    from sparkguard.publish import is_paused

    home = tmp_path / "_sg"
    _control(home, [("main.sales.orders", "20261202T000000Z-cccc", True, EPOCH_2026, None),
                    ("main.sales.returns", "manual", False, EPOCH_2026, None)])
    for asked in ("main.sales.orders", "MAIN.Sales.ORDERS", "`main`.`sales`.`orders`",
                  "sales.orders", "orders"):
        assert is_paused(home, asked), asked
    for asked in ("main.sales.returns", "main.hr.orders", "other.sales.orders", "orders_x"):
        assert not is_paused(home, asked), asked
    (st,) = DeltaRsReader(str(home)).publish_statuses(["sales.orders"]).values()
    assert st.target == "sales.orders" and [h["target"] for h in st.holds] == [
        "main.sales.orders"]


def test_publish_status_lists_holds_sorted_by_target(control_home: Path) -> None:
    statuses = DeltaRsReader(str(control_home)).publish_statuses()
    assert sorted(statuses) == ["db.o'rders\\x", "reopened", "s3://lake/orders_clean"]
    quoted = statuses["db.o'rders\\x"]
    assert quoted.paused and [h["hold"] for h in quoted.holds] == ["manual"]
    assert quoted.holds[0]["reason"] == "quote's \"reason\""
    assert not statuses["reopened"].paused and statuses["reopened"].holds == ()
    busy = statuses["s3://lake/orders_clean"]
    assert busy.paused and len(busy.holds) == 1
    assert busy.last_change == busy.holds[0]["at"]


def _ledger_rows(home: Path) -> None:
    """A ledger written by delta-rs: a finished run, a run that failed at a gate, with a NaN
    elapsed time, an error with quotes, and a slice."""
    runs = [
        ("20261203T000000Z-0001", 0, "started", {"dry_run": False}, 1.0),
        ("20261203T000000Z-0001", 1, "paused", {}, 2.0),
        ("20261203T000000Z-0001", 2, "done",
         {"evidence_path": str(ROOT / "tests" / "golden" / "evidence.yaml")}, 3.5),
        ("20261203T000000Z-0002", 10, "started", {"dry_run": True}, float("nan")),
        ("20261203T000000Z-0002", 11, "gate_failed", {"error": "it's \"bad\""}, None),
    ]
    _write(home / "ledger" / "runs", {
        "run_id": ("string", [r[0] for r in runs]), "at": ("ts", [EPOCH_2026 + r[1] for r in runs]),
        "state": ("string", [r[2] for r in runs]), "target": ("string", [None] * len(runs)),
        "plan_name": ("string", ["p"] * len(runs)), "plan_fingerprint": ("string", ["f" * 64] * 5),
        "owner": ("string", [None] * len(runs)), "source_version": ("long", [3, None, None, 4, 4]),
        "target_version_read": ("long", [None] * 5), "target_version_written": ("long", [None] * 5),
        "elapsed_s": ("double", [r[4] for r in runs]),
        "details": ("string", [json.dumps(r[3]) for r in runs])})
    _write(home / "ledger" / "slices", {
        "run_id": ("string", ["20261203T000000Z-0002"]), "at": ("ts", [EPOCH_2026 + 10]),
        "plan_fingerprint": ("string", ["f" * 64]), "target": ("string", ["t"]),
        "slice_id": ("int", [1]), "partitions": ("string", ['["2026-05-01"]']),
        "state": ("string", ["gate_failed"]), "source_version": ("long", [4]),
        "rows": ("long", [None]), "content_hash": ("string", [None]), "elapsed_s": ("double", [None]),
        "gates": ("string", ['[{"gate": "row_count_parity", "passed": false}]'])})


def test_fast_commands_and_static_guard_import_no_pyspark(tmp_path: Path) -> None:
    home = tmp_path / "_sg"
    _ledger_rows(home)
    plan = tmp_path / "plan.yaml"
    plan.write_text(plan_yaml(valid_plan(tmp_path)))
    proc = run_blocked("""
        from sparkguard.cli import main
        home, plan = sys.argv[1], sys.argv[2]
        for argv in (["status", "--home", home], ["status", "--home", home, "--run-id",
                     "20261203T000000Z-0002"], ["status", "--home", home, "--run-id", "nope"],
                     ["publish", "status", "--home", home], ["guard", plan, "--static-only",
                     "--pre-approval"], ["report", "--home", home, "--run-id",
                     "20261203T000000Z-0001"]):
            print("EXIT", argv[0], main(argv), flush=True)
    """, str(home), str(plan), env={"TZ": "UTC"})
    out = proc.stdout
    assert [ln for ln in out.splitlines() if ln.startswith("EXIT")] == [
        "EXIT status 0", "EXIT status 0", "EXIT status 2", "EXIT publish 0", "EXIT guard 0",
        "EXIT report 0"], \
        out + proc.stderr
    lines = out.splitlines()
    assert lines[0].startswith("20261203T000000Z-0002  gate_failed") and "dry-run" in lines[0]
    assert lines[1].startswith("20261203T000000Z-0001  done")
    assert "started=2026-01-01 00:00:00" in lines[1]
    assert "failed: row_count_parity" in out and "it's \"bad\"" in out
    assert "run nope is not in the ledger" in proc.stderr
    assert "no target was ever paused" in out and "# Backfill evidence" in out
    assert "reading with Spark" not in proc.stderr


def test_timestamps_read_as_pyspark_collects_them_in_any_time_zone(tmp_path: Path) -> None:
    """PySpark's collect() gives naive datetimes in the process's local zone; so does the
    delta-rs reader (here a zone with a half-hour offset)."""
    home = tmp_path / "_sg"
    _ledger_rows(home)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import sys
        from sparkguard.state_read import DeltaRsReader
        e = DeltaRsReader(sys.argv[1]).run_events("20261203T000000Z-0001")[0]
        print(e["at"].isoformat(), e["at"].tzinfo)
    """), str(home)], capture_output=True, text=True, cwd=ROOT, check=True,
        env={**os.environ, "TZ": "Asia/Kolkata"})
    assert proc.stdout.split() == ["2026-01-01T05:30:00", "None"]


def test_a_reader_feature_delta_rs_lacks_falls_back_to_spark_in_one_line(tmp_path: Path) -> None:
    log = tmp_path / "_sg" / "control" / "publish" / "_delta_log"
    log.mkdir(parents=True)
    schema = {"type": "struct", "fields": [{"name": "target", "type": "string", "nullable": True,
                                            "metadata": {}}]}
    (log / "00000000000000000000.json").write_text("\n".join(json.dumps(a) for a in (
        {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7,
                      "readerFeatures": ["sparkguardFutureFeature"],
                      "writerFeatures": ["sparkguardFutureFeature"]}},
        {"metaData": {"id": "x", "format": {"provider": "parquet", "options": {}},
                      "schemaString": json.dumps(schema), "partitionColumns": [],
                      "configuration": {}, "createdTime": 0}})) + "\n")
    with pytest.raises(FastReadUnavailable, match="delta-rs cannot"):
        DeltaRsReader(str(tmp_path / "_sg")).publish_statuses()
    err, used = io.StringIO(), []

    class NoSpark:  # the session factory: its call is what we look for
        pass

    def spark() -> Any:
        used.append(True)
        return NoSpark()

    engine = read_state(str(tmp_path / "_sg"), lambda r: r.engine if r.engine == "spark"
                        else r.publish_statuses(), spark=spark, err=err)
    assert engine == "spark" and used == [True]
    assert len(err.getvalue().splitlines()) == 1
    assert "sparkguardFutureFeature" in err.getvalue() and "reading with Spark" in err.getvalue()


@pytest.mark.parametrize("home", ["dbfs:/mnt/lake/_sg", "hdfs://nn/lake/_sg"])
def test_schemes_delta_rs_does_not_open_go_to_spark(home: str) -> None:
    err, used = io.StringIO(), []
    got = read_state(home, lambda r: r.engine, spark=lambda: used.append(1) or object(), err=err)
    assert got == "spark" and used == [1]
    assert f"delta-rs does not open {home.split(':')[0]}: URIs" in err.getvalue()
    with pytest.raises(FastReadUnavailable):
        read_state(home, lambda r: r.engine, spark=lambda: object(), engine="delta-rs")


def test_forcing_delta_rs_on_an_unreadable_home_is_a_runtime_error(capsys: Any,
                                                                  monkeypatch: Any) -> None:
    monkeypatch.setenv("SPARKGUARD_READER", "delta-rs")
    assert main(["status", "--home", "dbfs:/mnt/_sg"]) == 3
    assert "delta-rs does not open dbfs: URIs" in capsys.readouterr().err
    monkeypatch.setenv("SPARKGUARD_READER", "jvm")
    assert main(["publish", "status", "--home", "/x"]) == 3
    assert "SPARKGUARD_READER='jvm' is not a reader" in capsys.readouterr().err


def test_status_refuses_a_limit_below_one(capsys: Any, tmp_path: Path) -> None:
    assert main(["status", "--home", str(tmp_path), "--limit", "0"]) == 2
    assert "--limit must be at least 1" in capsys.readouterr().err


# -- written by Spark, read by both -----------------------------------------------------------

T1, T2 = "s3://lake/orders_clean", "main.sales.o'rders"
GOLDEN_EVIDENCE = ROOT / "tests" / "golden" / "evidence.yaml"


def _checkpoint_interval(path: Path) -> int:
    from deltalake import DeltaTable

    return int(DeltaTable(str(path)).metadata().configuration.get("delta.checkpointInterval",
                                                                  "10"))


@pytest.fixture(scope="module")
def spark_home(spark: Any, tmp_path_factory: Any) -> Path:
    """Tables written through sparkguard's own API (Ledger, PublishControl), with more commits
    to the runs table than its checkpoint interval, so the log holds a checkpoint."""
    from sparkguard.ledger import Ledger, new_run_id
    from sparkguard.publish import PublishControl

    home = tmp_path_factory.mktemp("fast") / "_sg"
    ledger, ctl = Ledger(spark, str(home)), PublishControl(spark, str(home))
    fp = "e" * 64
    runs = [new_run_id() + f"{i:02d}" for i in range(14)]
    ledger.record_run(runs[0], "started", fingerprint=fp, plan_name="p", owner="ann",
                      source_version=7, dry_run=False, plan_path="p.yaml")
    interval = _checkpoint_interval(home / "ledger" / "runs")
    ledger.acquire([T1, T2], runs[0], "ann")
    ctl.pause([T1, T2], run_id=runs[0], actor="ann", reason="backfill 'p'")
    ledger.record_slice(runs[0], fp, "orders_clean", 1, ["2026-05-01"], "reconciled", 7,
                        rows=7000, content_hash="h", elapsed_s=1.25,
                        gates=[{"gate": "row_count_parity", "passed": True}])
    ledger.record_slice(runs[0], fp, "orders_clean", 2, ["2026-05-02", "2026-05-03"],
                        "gate_failed", 7, rows=None, elapsed_s=float("nan"),
                        gates=[{"gate": "duplicate_check", "passed": False}])
    story = [("paused", {}), ("proof_passed", {"label": "orders_clean"}),
             ("reconciled", {"label": "orders_clean"}), ("promoting", {"label": "orders_clean"}),
             ("promoted", {"label": "orders_clean"}), ("verified", {"label": "orders_clean"}),
             ("published", {"evidence_path": str(GOLDEN_EVIDENCE)}), ("done", {})]
    for state, details in story:
        ledger.record_run(runs[0], state, fingerprint=fp, plan_name="p", target=T1,
                          version_read=2, version_written=3 if state != "reconciled" else None,
                          elapsed_s=0.5, **details)
    ledger.release([T1, T2], runs[0])
    ctl.finish([T1, T2], runs[0], actor="ann", reason="done")
    ctl.pause([T2], actor="bob", reason="manual \"hold\"")
    endings = ["gate_failed", "failed", "dry_run_passed", "done", "rolled_back", "abandoned"]
    i = 1
    log = home / "ledger" / "runs" / "_delta_log"
    while i < len(runs) or len(list(log.glob("*.json"))) <= interval + 5:
        run = runs[i % len(runs)] if i < len(runs) else new_run_id() + f"x{i}"
        ledger.record_run(run, "started", fingerprint=fp, plan_name=f"plan-{i}", owner="ćelo",
                          source_version=i, dry_run=i % 3 == 0)
        ledger.record_run(run, endings[i % len(endings)], fingerprint=fp, plan_name=f"plan-{i}",
                          elapsed_s=float(i), error=f"it's \"{i}\"" if i % 2 else None)
        i += 1
    assert list((home / "ledger" / "runs" / "_delta_log").glob("*.checkpoint*.parquet"))
    return home


def _answers(reader: Any) -> str:
    """Every read both engines offer, as text (repr keeps NaN comparable)."""
    runs = reader.latest_runs(1000)
    out = [repr(reader.latest_runs(3)), repr(runs)]
    for prog in runs[:3] + runs[-3:]:  # the oldest carries slices; latest_runs read every event
        out += [repr(reader.run_events(prog.run_id)), repr(reader.slice_events(prog.run_id))]
    out += [repr(sorted(d.items())) for d in (
        reader.lock_holders([T1, T2, "never"]), reader.publish_statuses(),
        reader.publish_statuses([T1, T2, "never"]))]  # key order is no answer
    return "\n".join(out)


def test_spark_written_tables_read_the_same_with_delta_rs(spark: Any, spark_home: Path) -> None:
    import time

    from delta.tables import DeltaTable

    from sparkguard.state_read import SparkReader

    fast, slow = DeltaRsReader(str(spark_home)), SparkReader(spark, str(spark_home))
    before = _answers(fast)
    assert before == _answers(slow)
    assert len(fast.latest_runs(1000)) > 14 and fast.lock_holders([T1])[T1].action == "release"
    statuses = fast.publish_statuses()
    assert not statuses[T1].paused and statuses[T2].paused
    assert [h["hold"] for h in statuses[T2].holds] == ["manual"]
    # another zone: both convert timestamps as PySpark's collect() does
    old = os.environ.get("TZ")
    os.environ["TZ"] = "Asia/Kolkata"
    time.tzset()
    try:
        assert _answers(fast) == _answers(slow) != before
    finally:
        os.environ.pop("TZ") if old is None else os.environ.update(TZ=old)
        time.tzset()
    # compacted (OPTIMIZE): same answers from both engines
    for rel in ("ledger/runs", "ledger/slices", "ledger/locks", "control/publish"):
        DeltaTable.forPath(spark, str(spark_home / rel)).optimize().executeCompaction()
    assert _answers(DeltaRsReader(str(spark_home))) == _answers(slow) == before


def _cli(argv: list[str], engine: str, capsys: Any, monkeypatch: Any) -> tuple[int, str, str]:
    monkeypatch.setenv("SPARKGUARD_READER", engine)
    capsys.readouterr()
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_text_and_exit_codes_are_the_same_from_both_engines(
        spark: Any, spark_home: Path, capsys: Any, monkeypatch: Any) -> None:
    from sparkguard.state_read import DeltaRsReader

    home = str(spark_home)
    first = DeltaRsReader(home).latest_runs(1000)[-1].run_id
    commands = [["status"], ["status", "--limit", "3"], ["status", "--run-id", first],
                ["status", "--run-id", "nope"], ["publish", "status"], ["publish", "status", T2],
                ["publish", "status", "never"], ["report", "--run-id", first]]
    for cmd in commands:
        argv = [*cmd, "--home", home]
        fast = _cli(argv, "delta-rs", capsys, monkeypatch)
        assert fast == _cli(argv, "spark", capsys, monkeypatch), argv
        assert fast[0] == (2 if "nope" in cmd else 0)
    code, out, _ = _cli(["report", "--run-id", first, "--home", home], "auto", capsys, monkeypatch)
    assert code == 0 and out.startswith("# Backfill evidence")


def test_is_paused_with_pyspark_blocked_reads_the_spark_written_table(
        spark: Any, spark_home: Path) -> None:
    from sparkguard.publish import PublishControl

    proc = run_blocked("""
        from sparkguard.publish import is_paused
        for target in sys.argv[2:]:
            print("PAUSED", is_paused(sys.argv[1], target))
    """, str(spark_home), T1, T2, "never")
    got = [ln.split()[1] == "True" for ln in proc.stdout.splitlines() if ln.startswith("PAUSED")]
    ctl = PublishControl(spark, str(spark_home))
    assert got == [ctl.is_paused(T1), ctl.is_paused(T2), ctl.is_paused("never")] == [
        False, True, False]


@pytest.mark.slow
def test_spark_submit_starts_without_the_ivy_banner(spark: Any, tmp_path: Path) -> None:
    """With the jars resolved once (``make warm``'s conf dir), a ``spark-submit`` run's stderr
    carries sparkguard's own lines, not Ivy's resolution report."""
    from sparkguard.session import write_submit_conf

    conf = write_submit_conf(spark, ROOT / "conf", tmp_path / "spark-conf")
    env = {**os.environ, "SPARK_CONF_DIR": str(conf), "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable}
    env.pop("SPARKGUARD_FAULT_AT", None)
    submit = Path(sys.executable).parent / "spark-submit"
    proc = subprocess.run([str(submit), str(ROOT / "jobs" / "backfill.py"), "--plan",
                           str(tmp_path / "missing.yaml")], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=300, check=False)
    # spark-submit hands the Python driver's stderr to its stdout; its own stderr is the JVM's
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "missing.yaml: backfill_plan: plan file not found" in proc.stdout
    ivy = [ln for ln in proc.stderr.splitlines() if any(s in ln for s in (
        ":: loading settings", "Ivy Default Cache", ":: resolving dependencies", "confs: [",
        ":: resolution report", "modules in use", ":: retrieving", "artifacts copied",
        "added as a dependency", "Setting default log level"))]
    assert ivy == [], proc.stderr[-3000:]


@pytest.mark.parametrize("zone", ["UTC", "Asia/Kolkata"])
def test_status_reads_spark_written_statistics_newest_first_and_exactly(
        spark: Any, tmp_path: Path, served: list[bool], zone: str) -> None:
    """Through the ledger's own API (one commit per event, statistics on ``run_id`` and
    ``at``), an old run resumed last of all sits in the newest files; the newest-first read
    must look further back to rank it by its first event, as Spark does. The session's zone
    is the one Delta writes the statistics in."""
    from sparkguard import delta_reader, newest_runs
    from sparkguard.ledger import Ledger, new_run_id
    from sparkguard.state_read import SparkReader

    home = str(tmp_path / "_sg")
    ledger, fp = Ledger(spark, home), "a" * 64
    before = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", zone)
    try:
        old = new_run_id()
        ledger.record_run(old, "started", fingerprint=fp, plan_name="old", owner="ann")
        for i in range(16):
            run = new_run_id() + f"-{i:02d}"
            ledger.record_run(run, "started", fingerprint=fp, plan_name=f"p{i}", owner="bob")
            ledger.record_run(run, "done" if i % 2 else "failed", fingerprint=fp,
                              plan_name=f"p{i}")
        ledger.record_run(old, "resumed", fingerprint=fp, plan_name="old")
        ledger.record_run(old, "done", fingerprint=fp, plan_name="old")
    finally:
        spark.conf.set("spark.sql.session.timeZone", before)
    stats = newest_runs.file_stats(
        delta_reader._add_actions(DeltaRsReader(home)._table("runs")))
    assert stats is not None and len(stats) > 32  # one file per event, statistics in each
    fast, slow = DeltaRsReader(home), SparkReader(spark, home)
    for limit in (1, 2, 3, 16, 17):
        got = fast.latest_runs(limit)
        assert repr(got) == repr(slow.latest_runs(limit)), limit
        assert (old in {p.run_id for p in got}) == (limit == 17), limit
    assert served[0], "one run: the newest files and the resumed run's first event served it"
    assert fast.latest_runs(17)[-1].state == "done"


def test_history_of_a_table_delta_rs_cannot_see_is_no_answer_not_a_missing_table(
        tmp_path: Path) -> None:
    """``verify`` reads targets' histories with delta-rs: a URI scheme delta-rs does not open
    (``wasbs://``) or a path with no directory on this machine (the cluster's file system) used
    to come back as "no table", which verify reports as tampering; now Spark answers."""
    home = tmp_path / "_sg"
    _control(home, [("t", "manual", True, EPOCH_2026, None)])
    reader = DeltaRsReader(str(home))
    for dataset in ("wasbs://c@acct.blob.core.windows.net/orders", "/mnt/lake/orders"):
        with pytest.raises(FastReadUnavailable):
            reader.history(dataset)
    (tmp_path / "gone").mkdir()  # the table's directory is here, its log is not: no table
    assert reader.history(str(tmp_path / "gone")) is None
    assert reader.history(str(home / "ledger" / "runs")) is None  # never written
    assert [c["version"] for c in reader.history(str(home / "control" / "publish")) or []] == [0]
