"""Publish control: holds in a table outside the target, one-call check and view for
downstream jobs, the CLI, and a real run pausing, notifying and reopening."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from delta.tables import DeltaTable

from sparkguard.cli import main
from sparkguard.ledger import Ledger
from sparkguard.notify import FileNotifier
from sparkguard.plan import load_plan
from sparkguard.publish import PublishControl, is_paused, register_view, status_sql
from sparkguard.run.evaluator import run_backfill
from tests.lakes import copy_lake, count_descriptions, set_transform, write_plan

pytestmark = pytest.mark.spark
T1, T2 = "/lake/target/a", "main.sales.b"



def test_holds_run_release_keeps_manual_pause_operator_resume_clears_all(
        spark: Any, lake: Path) -> None:
    home = str(lake / "home")
    ctl = PublishControl(spark, home)
    assert not is_paused(spark, T1, home)  # never paused: open, and no table needed
    ctl.pause([T1, T2], run_id="run-1", actor="alice", reason="backfill")
    assert is_paused(spark, T1, home) and is_paused(spark, T2, home)
    ctl.pause([T1], actor="oncall", reason="incident")  # manual hold on top
    ctl.release([T1, T2], "run-1")  # the run finishes: only its own hold goes
    st = ctl.status(T1)
    assert st.paused and [h["hold"] for h in st.holds] == ["manual"]
    assert "PAUSED" in st.describe() and "incident" in st.describe()
    assert not is_paused(spark, T2, home)
    ctl.pause([T1], run_id="run-2")
    cleared = ctl.resume([T1], actor="oncall", reason="incident over")
    assert sorted(cleared) == [f"{T1}: manual", f"{T1}: run-2"]
    assert not is_paused(spark, T1, home)


def test_finishing_run_clears_holds_left_by_dead_or_failed_runs_not_manual_ones(
        spark: Any, lake: Path) -> None:
    home = str(lake / "home")
    ctl = PublishControl(spark, home)
    ctl.pause([T1, T2], run_id="failed-run")  # a run that stopped on a gate, hold left
    ctl.pause([T2], actor="oncall")
    ctl.pause([T1, T2], run_id="run-3")
    after = ctl.finish([T1, T2], "run-3")
    assert not after[T1].paused and after[T2].paused
    assert [h["hold"] for h in after[T2].holds] == ["manual"]
    assert {t: s.paused for t, s in ctl.statuses([T1, T2]).items()} == {T1: False, T2: True}


def test_view_and_sql_for_downstream_jobs(spark: Any, lake: Path) -> None:
    home = str(lake / "home")
    name = register_view(spark, home, "sg_pub_empty")
    assert spark.sql(f"SELECT * FROM {name}").count() == 0  # nothing ever paused
    ctl = PublishControl(spark, home)
    ctl.pause([T1, T2], run_id="run-1")
    ctl.release([T2], "run-1")
    name = register_view(spark, home, "sg_pub")
    rows = {r["target"]: r for r in spark.sql(f"SELECT * FROM {name}").collect()}
    assert rows[T1]["paused"] is True and rows[T1]["holds"] == ["run-1"]
    assert rows[T2]["paused"] is False and rows[T2]["holds"] == []
    (row,) = spark.sql(f"SELECT paused FROM ({status_sql(home)}) WHERE target = '{T1}'").collect()
    assert row["paused"] is True
    with pytest.raises(ValueError):
        register_view(spark, home, "bad name; DROP")


def test_one_table_named_two_ways_has_one_publish_state(
        spark: Any, tmp_path: Path, capsys: Any) -> None:
    """A hold set under a catalog name pauses the table's path too (and the other way), for
    Spark, delta-rs and the view; a run finishing under one name clears what dead runs left
    under the other; an operator's resume under either name reopens both; chains verify."""
    table = tmp_path / "orders"
    spark.range(3).write.format("delta").save(str(table))
    name, path, home = "sg_pub_orders", str(table), str(tmp_path / "_sg")
    spark.sql(f"CREATE TABLE {name} USING DELTA LOCATION '{path}'")
    try:
        ctl = PublishControl(spark, home)
        ctl.pause([name], run_id="dead-run", actor="alice", reason="backfill by name")
        for spelled in (name, path, f"{path}/", f"file://{path}"):
            assert is_paused(spark, spelled, home), spelled
        for spelled in (name, path, f"{path}/", f"file://{path}"):  # delta-rs: no catalog
            assert is_paused(home, spelled), spelled
        assert not is_paused(home, str(tmp_path / "other")) and not is_paused(home, "other")
        st = ctl.status(path)
        assert [(h["target"], h["hold"]) for h in st.holds] == [(name, "dead-run")]
        assert f"as {name}" in st.describe()

        ctl.pause([path], actor="oncall", reason="incident")  # manual, under the path
        ctl.pause([path], run_id="run-2")
        after = ctl.finish([path], "run-2")  # clears dead-run's hold set under the name
        assert [(h["target"], h["hold"]) for h in after[path].holds] == [(path, "manual")]
        assert [(h["target"], h["hold"]) for h in ctl.status(name).holds] == [(path, "manual")]
        view = register_view(spark, home, "sg_pub_two_names")
        rows = {r["target"]: r for r in spark.sql(f"SELECT * FROM {view}").collect()}
        assert {t: (r["paused"], r["holds"]) for t, r in rows.items()} == {
            name: (True, ["manual"]), path: (True, ["manual"])}
        assert rows[name]["last_change"] == rows[path]["last_change"]

        assert ctl.resume([name], actor="oncall") == [f"{path}: manual"]
        for spelled in (name, path):
            assert not is_paused(spark, spelled, home) and not is_paused(home, spelled)
        rows = {r["target"]: r["paused"] for r in spark.sql(f"SELECT * FROM {view}").collect()}
        assert rows == {name: False, path: False}
        assert {t: s.paused for t, s in ctl.statuses().items()} == {name: False, path: False}
        capsys.readouterr()
        assert main(["verify", "--all", "--home", home]) == 0, capsys.readouterr().out
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {name}")


def test_one_storage_through_two_connectors_has_one_publish_state(
        spark: Any, tmp_path: Path) -> None:
    """A pause set under ``s3a://`` holds a downstream job asking under ``s3://`` (or
    ``s3n://``, another case, a trailing slash), through Spark and delta-rs; the same for ADLS
    through ``wasbs://``'s blob endpoint and ``abfss://``. Another table stays open."""
    home = str(tmp_path / "_sg")
    ctl = PublishControl(spark, home)
    ctl.pause(["s3a://lake/orders", "wasbs://c@acct.blob.core.windows.net/sales"],
              run_id="run-1", actor="alice", reason="backfill")
    for spelled in ("s3://lake/orders", "s3n://lake/orders/", "S3A://lake/orders",
                    "abfss://c@acct.dfs.core.windows.net/sales",
                    "abfs://c@acct.dfs.core.windows.net/sales/"):
        assert is_paused(spark, spelled, home), spelled
        assert is_paused(home, spelled), spelled
    for other in ("s3://lake/orders_v2", "s3://other/orders",
                  "abfss://c@other.dfs.core.windows.net/sales"):
        assert not is_paused(spark, other, home) and not is_paused(home, other), other
    after = ctl.finish(["s3://lake/orders"], "run-1")  # the run's hold, under another scheme
    assert not after["s3://lake/orders"].paused and not is_paused(home, "s3a://lake/orders")
    assert is_paused(home, "wasbs://c@acct.blob.core.windows.net/sales")
    # a hold an earlier version recorded with the location as given (s3a://, not s3://)
    ctl._append([("main.sales.orders", "run-0", True, PublishControl._now(), "run-0", "bob",
                  "gate failed", "s3a://lake/orders")])
    for spelled in ("s3://lake/orders", "s3a://lake/orders", "main.sales.orders"):
        assert is_paused(spark, spelled, home) and is_paused(home, spelled), spelled
    view = register_view(spark, home, "sg_pub_connectors")  # the SQL downstream jobs use
    rows = {r["target"]: r for r in spark.sql(f"SELECT * FROM {view}").collect()}
    assert rows["s3a://lake/orders"]["holds"] == ["run-0"], rows
    assert rows["wasbs://c@acct.blob.core.windows.net/sales"]["holds"] == ["run-1"], rows


def test_cli_publish_status_pause_resume(spark: Any, lake: Path, capsys: Any) -> None:
    home = str(lake / "home")
    assert main(["publish", "pause", T1, "--reason", "reload", "--home", home]) == 0
    assert is_paused(spark, T1, home)
    assert "PAUSED" in capsys.readouterr().out
    assert main(["publish", "status", "--home", home]) == 0
    assert main(["publish", "resume", T1, "--home", home]) == 0
    assert not is_paused(spark, T1, home)
    assert main(["publish", "pause", "--home", home]) == 2  # pause needs a target


class _Probe:
    """A notifier that asks the control table, at each event, whether publish is paused."""

    def __init__(self, spark: Any, home: str, target: str) -> None:
        self.spark, self.home, self.target = spark, home, target
        self.seen: list[tuple[str, bool]] = []

    def send(self, event: str, recipients: Any, payload: dict[str, Any]) -> None:
        self.seen.append((event, is_paused(self.spark, self.target, self.home)))


def _props(spark: Any, path: Path) -> dict[str, str]:
    row = DeltaTable.forPath(spark, str(path)).detail().first()
    return dict(row["properties"]) if row else {}


def _one_slice_claiming_a_dry_run(plan: dict[str, Any]) -> None:
    plan["execution"].update(slice_partitions=3, dry_run_completed=True)


def test_run_pauses_before_writing_notifies_and_reopens_only_after_verification(
        spark: Any, base_lake: Path, tmp_path: Path, monkeypatch: Any) -> None:
    root = copy_lake(base_lake, tmp_path / "lake")
    described = count_descriptions(monkeypatch)
    plan_path = write_plan(root, _one_slice_claiming_a_dry_run)
    home = str(root / "_sg")
    target = root / "target" / "orders_clean"
    props_before = _props(spark, target)
    probe = _Probe(spark, home, f"file://{target}/")  # the plan names it {target}
    events = tmp_path / "events.jsonl"
    lines: list[str] = []
    out = run_backfill(spark, load_plan(plan_path), str(plan_path), home=home,
                       evidence_dir=str(root / "evidence"),
                       notifiers=[probe, FileNotifier(str(events))], out=lines.append)
    assert out.exit_code == 0
    assert probe.seen == [("publish_paused", True), ("promoted", True),
                          ("publish_resumed", False)]
    # the target's location is read once, for its lock; pause and finish record that one
    assert described[str(target)] == 1
    sent = [json.loads(x) for x in events.read_text().splitlines()]
    assert {tuple(x["recipients"]) for x in sent} == {("finance-bi", "ops-analytics")}
    assert sent[1]["version"] == out.targets["orders_clean"].promoted_version
    # the pause never touched the target's own properties
    assert _props(spark, target) == props_before
    # the plan claims dry_run_completed, the ledger has no dry run of it: reported, ignored
    started = Ledger(spark, home).run_events(out.run_id)[0]
    assert started["details"]["dry_run_claim"] == {"claimed": True, "recorded_run_id": None,
                                                   "recorded_at": None}
    assert any("not backed by the ledger" in ln for ln in lines)


def test_gate_failure_keeps_publish_paused_and_notifies(
        spark: Any, base_lake: Path, tmp_path: Path) -> None:
    root = copy_lake(base_lake, tmp_path / "lake")
    bad = ("SELECT order_id, order_date, customer_id, UPPER(currency) AS currency, status, "
           "quantity, CAST(amount * 2 AS DECIMAL(12,2)) AS amount, "
           "CAST(amount * quantity AS DECIMAL(14,2)) AS line_total FROM {source} WHERE {window}")
    plan_path = write_plan(root, lambda p: (set_transform(bad)(p),
                                            p["execution"].update(slice_partitions=3)))
    home = str(root / "_sg")
    target = str(root / "target" / "orders_clean")
    probe = _Probe(spark, home, target)
    out = run_backfill(spark, load_plan(plan_path), str(plan_path), home=home,
                       evidence_dir=str(root / "evidence"), notifiers=[probe],
                       out=lambda _m: None)
    assert out.exit_code == 1
    assert probe.seen == [("publish_paused", True), ("gate_failed", True)]
    assert is_paused(spark, target, home) and is_paused(home, f"{target}/")


def test_an_operators_manual_pause_outlives_the_run_and_the_evidence_says_so(
        spark: Any, base_lake: Path, tmp_path: Path) -> None:
    """On-call paused the target by hand (an incident) before the backfill; the run releases
    only its own hold. Its evidence used to say publish_unblocked: true; now it says false,
    naming the hold that stays, in the YAML and the Markdown."""
    import yaml

    root = copy_lake(base_lake, tmp_path / "lake")
    plan_path = write_plan(root, _one_slice_claiming_a_dry_run)
    home = str(root / "_sg")
    target = str(load_plan(plan_path).target_specs()[0].dataset)
    PublishControl(spark, home).pause([target], actor="oncall", reason="incident 42")
    out = run_backfill(spark, load_plan(plan_path), str(plan_path), home=home,
                       evidence_dir=str(root / "evidence"), out=lambda _m: None)
    assert out.exit_code == 0 and out.evidence_path is not None
    assert is_paused(home, target)
    data = yaml.safe_load(Path(out.evidence_path).read_text(encoding="utf-8"))
    assert data["release_gate_evidence"]["publish_control"]["publish_unblocked"] is False
    (held,) = data["sparkguard"]["publish"]["still_paused_by_others"][target]
    assert "manual by oncall" in held and "incident 42" in held
    assert out.run_id not in held  # its own hold, released at once, is not listed
    md = Path(out.evidence_path).with_suffix(".md").read_text(encoding="utf-8")
    assert "stays paused after this run" in md and "publish unblocked: no" in md
