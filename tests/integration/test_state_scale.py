"""sparkguard's own state at any size, and the Delta operations that must not leak or guess.

- Past the row limits the old readers had (50,000 publish events, 20,000 ledger rows), the
  newest event still decides: publish status, the lock holder, the run to resume, the slices
  already reconciled.
- The log tables compact themselves (auto compaction) and stay readable by delta-rs.
- MERGE and RESTORE carry their commit metadata in an isolated session: the caller's confs are
  untouched and a write made meanwhile in the caller's session carries none of it.
- Conflicts are recognised by type, ``table_exists`` says "missing" only for a missing table.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from delta.tables import DeltaMergeBuilder, DeltaTable
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sparkguard import delta_ops
from sparkguard.errors import ConcurrentRunError
from sparkguard.ledger import _SCHEMAS, Ledger
from sparkguard.publish import PublishControl, _schema, is_paused
from sparkguard.sql import PartitionType, TableRef, window_predicate

pytestmark = pytest.mark.spark
T0 = dt.datetime(2026, 1, 1)
FP = "a" * 64
TARGET = "/lake/target/orders_clean"


def _bulk(spark: Any, path: str, schema: T.StructType, frame: DataFrame) -> None:
    """Append a generated history in one commit (a stand-in for years of one-row commits)."""
    delta_ops.create_log_table(spark, path, schema)
    frame.select(*[F.col(f.name).cast(f.dataType) for f in schema.fields]).write.format(
        "delta").mode("append").save(path)


def _seconds(n: Any) -> Any:
    return (F.lit(T0) + F.make_interval(secs=n.cast("decimal(18,6)"))).cast("timestamp")


def test_publish_status_newest_event_decides_past_50000_events(spark: Any, lake: Path) -> None:
    home = str(lake / "home")
    ctl = PublishControl(spark, home)
    n = 50_000
    old = spark.range(n).select(
        F.lit(TARGET).alias("target"), F.concat(F.lit("run-"), F.col("id")).alias("hold"),
        (F.col("id") % 2 == 0).alias("paused"), _seconds(F.col("id")).alias("at"),
        F.concat(F.lit("run-"), F.col("id")).alias("run_id"), F.lit("bot").alias("actor"),
        F.lit("history").alias("reason"), F.lit(f"file:{TARGET}").alias("location"))
    # each even run's hold was set, then cleared half a second later
    cleared = spark.range(0, n, 2).select(
        F.lit(TARGET).alias("target"), F.concat(F.lit("run-"), F.col("id")).alias("hold"),
        F.lit(False).alias("paused"), _seconds(F.col("id") + 0.5).alias("at"),
        F.concat(F.lit("run-"), F.col("id")).alias("run_id"), F.lit("bot").alias("actor"),
        F.lit("history").alias("reason"), F.lit(f"file:{TARGET}").alias("location"))
    _bulk(spark, ctl.path, _schema(), old.unionByName(cleared))
    assert not is_paused(spark, TARGET, home)  # 75,000 events, every hold cleared
    ctl.pause([TARGET], run_id="run-now", actor="alice", reason="backfill")  # the newest event
    st = ctl.status(TARGET)
    assert st.paused and [h["hold"] for h in st.holds] == ["run-now"]
    assert st.holds[0]["actor"] == "alice" and st.last_change is not None
    assert st.last_change > T0 + dt.timedelta(seconds=n)
    assert ctl.statuses()[TARGET].paused  # all targets: the same answer
    assert is_paused(spark, f"{TARGET}/", home)  # another spelling of the path: one table
    ctl.finish([TARGET], "run-now")
    assert not is_paused(spark, TARGET, home)


def test_lock_holder_is_the_newest_generation_past_20000_events(spark: Any, lake: Path) -> None:
    home = str(lake / "home")
    led = Ledger(spark, home)
    led.ensure()
    n = 20_001  # generations 1..20001; odd ones acquire, even ones release; 20001 holds it
    hist = spark.range(1, n + 1).select(
        F.lit(TARGET).alias("target"), F.col("id").alias("generation"),
        F.when(F.col("id") % 2 == 1, "acquire").otherwise("release").alias("action"),
        F.concat(F.lit("r"), ((F.col("id") + 1) / 2).cast("long")).alias("run_id"),
        F.lit("bob").alias("owner"), _seconds(F.col("id")).alias("at"),
        F.lit("other-host").alias("host"), F.lit(1).alias("pid"),
        F.concat(F.lit("tok"), F.col("id")).alias("token"))
    _bulk(spark, led._path("locks"), _SCHEMAS["locks"], hist)
    led = Ledger(spark, home)  # (the first one knows it created the table empty)
    holder = led.lock_holder(TARGET)
    assert holder is not None and (holder.generation, holder.run_id) == (n, "r10001")
    with pytest.raises(ConcurrentRunError, match="r10001"):
        Ledger(spark, home).acquire([TARGET], "r-new", "carol")
    assert Ledger(spark, home).lock_holder(TARGET).run_id == "r10001"  # type: ignore[union-attr]


def test_resume_and_done_slices_decided_by_the_newest_events_past_20000_rows(
        spark: Any, lake: Path) -> None:
    home = str(lake / "home")
    led = Ledger(spark, home)
    led.ensure()
    n = 20_000  # 10,000 old runs of this plan, two events each (started, done)
    runs = spark.range(n).select(
        F.concat(F.lit("20250101T000000Z-"), F.lpad((F.col("id") / 2).cast("long").cast(
            "string"), 8, "0")).alias("run_id"), _seconds(F.col("id")).alias("at"),
        F.when(F.col("id") % 2 == 0, "started").otherwise("done").alias("state"),
        F.lit(None).alias("target"), F.lit("p").alias("plan_name"), F.lit(FP).alias(
            "plan_fingerprint"), F.lit("o").alias("owner"), F.lit(7).alias("source_version"),
        F.lit(None).alias("target_version_read"), F.lit(None).alias("target_version_written"),
        F.lit(None).alias("elapsed_s"), F.lit("{}").alias("details"))
    _bulk(spark, led._path("runs"), _SCHEMAS["runs"], runs)
    part = json.dumps(["2026-05-02"])
    slices = spark.range(n).select(
        F.lit("r").alias("run_id"), _seconds(F.col("id")).alias("at"), F.lit(FP).alias(
            "plan_fingerprint"), F.lit("orders_clean").alias("target"), F.lit(1).alias(
            "slice_id"), F.lit(part).alias("partitions"), F.lit("reconciled").alias("state"),
        F.lit(7).alias("source_version"), F.lit(10).alias("rows"), F.lit(None).alias(
            "content_hash"), F.lit(1.0).alias("elapsed_s"), F.lit("[]").alias("gates"))
    _bulk(spark, led._path("slices"), _SCHEMAS["slices"], slices)
    # the newest run crashed (non-terminal), and its newest slice event is a failed gate
    led = Ledger(spark, home)
    led.record_run("20260101T000000Z-newest00", "started", fingerprint=FP, plan_name="p",
                   source_version=7)
    led.record_slice("20260101T000000Z-newest00", FP, "orders_clean", 1, ["2026-05-02"],
                     "gate_failed", 7, rows=10)
    led.record_slice("20260101T000000Z-newest00", FP, "orders_clean", 2, ["2026-05-03"],
                     "reconciled", 7, rows=10)
    hist = led.load(FP)
    resumable = hist.resumable()
    assert resumable is not None and resumable.run_id == "20260101T000000Z-newest00"
    assert set(hist.done_slices("orders_clean", 7)) == {json.dumps(["2026-05-03"])}
    assert len(hist.runs) <= 51  # bounded: the newest runs of the plan, not 10,001
    latest = led.latest_runs(3)
    assert latest[0].run_id == "20260101T000000Z-newest00"


def test_batched_events_land_in_one_commit_per_table(spark: Any, lake: Path) -> None:
    led = Ledger(spark, str(lake / "home"))
    led.ensure()
    with led.batched():
        for i in range(100):
            led.record_run(f"r{i:03d}", "started", fingerprint=FP, plan_name="p",
                           source_version=1)
            led.record_run(f"r{i:03d}", "done", fingerprint=FP, plan_name="p")
            led.record_slice(f"r{i:03d}", FP, "t", 1, ["2026-05-01"], "reconciled", 1, rows=3)
        assert led.load(FP).runs == {}  # nothing written before the block ends
    runs_log = DeltaTable.forPath(spark, led._path("runs")).history().collect()
    assert [h["operation"] for h in runs_log] == ["WRITE", "CREATE TABLE"]
    assert [p.state for p in led.latest_runs(2)] == ["done", "done"]
    assert len(led.load(FP).slices) == 1  # the newest event of the one slice


def test_log_tables_compact_themselves_and_stay_readable_by_delta_rs(
        spark: Any, lake: Path) -> None:
    key = "spark.databricks.delta.autoCompact.minNumFiles"
    old = spark.conf.get(key, None)
    spark.conf.set(key, "4")  # this test only: compact after 4 small files instead of 50
    try:
        led = Ledger(spark, str(lake / "home"))
        for i in range(6):
            led.record_run(f"r{i}", "started", fingerprint=FP, plan_name="p")
    finally:
        spark.conf.set(key, old) if old is not None else spark.conf.unset(key)
    table = DeltaTable.forPath(spark, led._path("runs"))
    ops = [h["operation"] for h in table.history().collect()]
    assert "OPTIMIZE" in ops, ops
    detail = table.detail().first()
    assert detail is not None and detail["numFiles"] < 6
    assert detail["properties"]["delta.autoOptimize.autoCompact"] == "true"
    assert (detail["minReaderVersion"], detail["minWriterVersion"]) == (1, 2)  # no features
    assert [p.run_id for p in led.latest_runs(10)] == [f"r{i}" for i in reversed(range(6))]
    deltalake = pytest.importorskip("deltalake")
    rs = deltalake.DeltaTable(led._path("runs"))
    assert rs.version() == max(h["version"] for h in table.history().collect())
    assert sorted(Path(f).name for f in rs.file_uris()) == sorted(
        Path(f).name for f in spark.read.format("delta").load(led._path("runs")).inputFiles())


# -- MERGE and RESTORE in an isolated session ----------------------------------------------


def _small_table(spark: Any, path: Path) -> TableRef:
    schema = T.StructType([T.StructField("k", T.IntegerType()), T.StructField("d", T.DateType()),
                           T.StructField("v", T.StringType())])
    spark.createDataFrame([(1, dt.date(2026, 5, 1), "old"), (2, dt.date(2026, 5, 2), "o'ld")],
                          schema).write.format("delta").partitionBy("d").save(str(path))
    return TableRef(path=str(path))


def _last_commit(spark: Any, path: Path) -> dict[str, Any]:
    row = DeltaTable.forPath(spark, str(path)).history(1).first()
    assert row is not None
    return row.asDict()


def test_merge_and_restore_leave_the_callers_session_alone(
        spark: Any, lake: Path, monkeypatch: Any) -> None:
    ref = _small_table(spark, lake / "t")
    other = lake / "other"
    spark.range(1).write.format("delta").save(str(other))
    meta_key = "spark.databricks.delta.commitInfo.userMetadata"
    app_key = "spark.databricks.delta.write.txnAppId"
    spark.conf.set(meta_key, "the caller's own metadata")
    real_execute = DeltaMergeBuilder.execute
    during: list[dict[str, Any]] = []

    def execute_with_a_write_meanwhile(self: DeltaMergeBuilder) -> Any:
        # another thread of the caller writes while the MERGE is being set up
        spark.range(1).write.format("delta").mode("append").save(str(other))
        during.append(_last_commit(spark, other))
        return real_execute(self)

    monkeypatch.setattr(DeltaMergeBuilder, "execute", execute_with_a_write_meanwhile)
    try:
        new = spark.createDataFrame([(1, dt.date(2026, 5, 1), "new")], "k int, d date, v string")
        meta = delta_ops.user_metadata("run-1", "fp", "promote", target="t")
        delta_ops.promote_merge(spark, new, ref, ["k"], window_predicate(
            "d", PartitionType.DATE, [dt.date(2026, 5, 1)], "t"), True, meta, ("app-1", 1))
        assert len(during) == 1
        assert during[0]["userMetadata"] == "the caller's own metadata"  # not sparkguard's
        assert during[0]["operation"] == "WRITE"
        merged = _last_commit(spark, lake / "t")
        assert merged["operation"] == "MERGE" and merged["userMetadata"] == meta
        assert spark.conf.get(meta_key) == "the caller's own metadata"
        assert spark.conf.get(app_key, None) is None
        # the caller's write after the MERGE, with its own transaction id, is not skipped
        spark.range(1).write.format("delta").mode("append").option("txnAppId", "app-1").option(
            "txnVersion", 1).save(str(other))
        assert spark.read.format("delta").load(str(other)).count() == 3
        # RESTORE: metadata on its commit, none left on the caller's session
        delta_ops.restore(spark, ref, 0, delta_ops.user_metadata("run-1", "fp", "rollback"))
        restored = _last_commit(spark, lake / "t")
        assert restored["operation"] == "RESTORE"
        assert delta_ops.commit_metadata(restored["userMetadata"])["action"] == "rollback"  # type: ignore[index]
        assert spark.conf.get(meta_key) == "the caller's own metadata"
        assert sorted(map(tuple, spark.read.format("delta").load(str(lake / "t")).collect())) == [
            (1, dt.date(2026, 5, 1), "old"), (2, dt.date(2026, 5, 2), "o'ld")]
    finally:
        spark.conf.unset(meta_key)


def test_merge_in_an_isolated_session_resolves_names_in_the_callers_database(
        spark: Any, lake: Path) -> None:
    spark.sql("CREATE DATABASE IF NOT EXISTS sg_iso")
    spark.sql("USE sg_iso")
    try:
        spark.sql(f"CREATE TABLE t_iso (k INT, v STRING) USING delta LOCATION '{lake / 'n'}'")
        spark.sql("INSERT INTO t_iso VALUES (1, 'a'), (2, NULL)")
        new = spark.createDataFrame([(2, "b"), (3, None)], "k int, v string")
        delta_ops.promote_merge(spark, new, TableRef(name="t_iso"), ["k"], "true", False,
                                delta_ops.user_metadata("r", "fp", "promote"))
        rows = sorted(map(tuple, spark.sql("SELECT * FROM sg_iso.t_iso").collect()),
                      key=lambda r: r[0])
        assert rows == [(1, "a"), (2, "b"), (3, None)]
    finally:
        spark.sql("DROP TABLE IF EXISTS sg_iso.t_iso")
        spark.sql("USE default")


# -- conflicts by type, table_exists -------------------------------------------------------


def test_a_real_conflict_is_recognised_by_its_type_and_text_alone_is_not(
        spark: Any, lake: Path, tmp_path: Path) -> None:
    ref = _small_table(spark, lake / "t")
    started = tmp_path / "write-started"

    @F.udf("boolean")
    def slow_true(_x: Any) -> bool:  # runs in the Python worker, inside the write job
        started.touch()
        time.sleep(0.005)
        return True

    def alter() -> None:
        deadline = time.monotonic() + 60
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        spark.sql(f"ALTER TABLE delta.`{lake / 't'}` SET TBLPROPERTIES ('x.concurrent' = 'yes')")

    df = spark.range(2000).select(F.lit(1).alias("k"), F.lit(dt.date(2026, 5, 1)).alias("d"),
                                  F.lit("new").alias("v")).repartition(1)
    t = threading.Thread(target=alter)
    t.start()
    try:
        with pytest.raises(Exception) as caught:
            delta_ops.promote_replace_where(df.filter(slow_true(F.col("k"))), ref,
                                            "d = DATE'2026-05-01'", "{}", ("app", 1))
    finally:
        t.join()
    assert delta_ops.is_conflict(caught.value), repr(caught.value)
    assert isinstance(caught.value, delta_ops.CONFLICT_TYPES)  # pyspark raises Delta's type
    # words are not a type: an error that only mentions a conflict is not one
    assert not delta_ops.is_conflict(ValueError("ConcurrentAppendException in my transform"))
    assert not delta_ops.is_conflict(RuntimeError("[DELTA_CONCURRENT_APPEND] quoted in a log"))
    with pytest.raises(Exception) as other:
        spark.sql("SELECT raise_error('ConcurrentModificationException DELTA_CONCURRENT_WRITE')"
                  ).collect()
    assert not delta_ops.is_conflict(other.value)


def test_table_exists_is_false_only_for_a_missing_table(spark: Any, lake: Path) -> None:
    assert not delta_ops.table_exists(spark, TableRef(path=str(lake / "nothing")))
    assert not delta_ops.table_exists(spark, TableRef(name="default.sg_no_such_table"))
    spark.sql(f"CREATE TABLE sg_pq (id INT) USING parquet LOCATION '{lake / 'pq'}'")
    broken = lake / "broken"
    try:
        assert not delta_ops.table_exists(spark, TableRef(name="sg_pq"))  # not a Delta table
        spark.sql(f"CREATE TABLE sg_broken (id INT) USING delta LOCATION '{broken}'")
        assert delta_ops.table_exists(spark, TableRef(name="sg_broken"))
        # the table is there but cannot be read (here: its log is unreadable garbage): that
        # is an error to show, not a missing table
        for f in (broken / "_delta_log").iterdir():
            if f.is_file():
                f.write_text("{not json")
        spark.sparkContext._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()
        with pytest.raises(Exception) as caught:
            delta_ops.table_exists(spark, TableRef(name="sg_broken"))
        assert "DELTA_MISSING_DELTA_TABLE" not in str(caught.value)
        with pytest.raises(Exception, match=r"(?i)no filesystem for scheme"):
            delta_ops.table_exists(spark, TableRef(path="sgnosuchfs://bucket/t"))
    finally:
        spark.sql("DROP TABLE IF EXISTS sg_pq")
        spark.sql("DROP TABLE IF EXISTS sg_broken")


def test_confs_set_for_one_statement_are_put_back_when_setting_a_later_one_fails(
        spark: Any) -> None:
    """Over Spark Connect the commit confs are set on the caller's session for the statement:
    when a later one is refused (a static conf here; a serverless session refuses others), the
    ones set before it used to stay, so the caller's next write carried sparkguard's metadata."""
    from sparkguard.delta_ops.sessions import USER_METADATA_CONF, session_confs

    assert spark.conf.get(USER_METADATA_CONF, None) is None
    with pytest.raises(Exception, match=r"(?i)static|modify"), session_confs(spark, {
            USER_METADATA_CONF: '{"sparkguard": {"action": "promote"}}',
            "spark.sql.warehouse.dir": "/elsewhere"}):
        pass
    assert spark.conf.get(USER_METADATA_CONF, None) is None
