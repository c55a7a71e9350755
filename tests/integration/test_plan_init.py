"""``sparkguard plan init`` on real Delta tables: the demo lake (key order_id, and the guard
--pre-approval names only the fields to fill), a table whose obvious id has duplicates in the
window (composite key), string and int day partitions, a drafted plan that runs and rolls back
with --plan, and bad input (exit 2, nothing written anywhere)."""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path
from typing import Any

import pytest
from delta.tables import DeltaTable
from pyspark.sql import functions as F

from sparkguard.approve import record_approval
from sparkguard.cli import main
from sparkguard.plan import load_plan

pytestmark = pytest.mark.spark


def _versions(spark: Any, *paths: Path) -> list[int]:
    return [int(DeltaTable.forPath(spark, str(p)).history(1).first()["version"]) for p in paths]


def _files(root: Path) -> set[str]:
    return {str(p) for p in root.rglob("*")}


def _init(source: Any, target: Any, start: str, end: str, out: Path | None, *extra: str) -> int:
    argv = ["plan", "init", "--source", str(source), "--target", str(target), "--start", start,
            "--end", end, *extra]
    return main([*argv, "-o", str(out)] if out else argv)


def test_demo_lake_draft_has_key_order_id_and_pre_approval_names_only_fields_to_fill(
        spark, base_lake, tmp_path, monkeypatch, capsys):
    src, tgt = base_lake / "source" / "orders", base_lake / "target" / "orders_clean"
    before, files = _versions(spark, src, tgt), _files(base_lake)
    monkeypatch.chdir(base_lake.parent)
    out = tmp_path / "draft.yaml"
    rel = base_lake.name
    assert _init(f"{rel}/source/orders", f"{rel}/target/orders_clean", "2026-05-03",
                 "2026-05-06", out, "--owner", "a@example.com", "--reason", "test") == 0
    text = out.read_text()
    plan = load_plan(out)
    (t,) = plan.target_specs()
    assert t.business_keys == ["order_id"] and t.dataset == str(tgt)
    assert plan.source_of_truth.dataset == str(src)
    assert plan.partitioning is not None and plan.partitioning.column == "order_date"
    assert plan.affected_window.partitions == [f"order_date=2026-05-0{d}" for d in (3, 4, 5)]
    assert plan.approvals.required == [] and plan.approvals.granted == []
    assert "#   order_id: exact: " in text and "{fill:line_total} AS line_total" in text
    assert set(t.contract.not_null) >= {"order_id", "amount", "line_total"}
    metrics = {c.metric: c for c in plan.validation.checks if c.metric}
    assert metrics["sum_amount"].threshold_percent == 0.0
    assert metrics["distinct_keys"].source_expr == "order_id"
    capsys.readouterr()
    assert main(["guard", str(out), "--pre-approval"]) == 2
    lines = capsys.readouterr().out.splitlines()
    tagged = [ln for ln in lines if ln.startswith("[")]
    fill = sorted(ln.split(": ")[2] for ln in tagged if ln.startswith("[FILL ]"))
    assert fill == ["backfill_plan.approvals.required",
                    "backfill_plan.safeguards.downstream_notifications",
                    "backfill_plan.targets[0].transform.sql",
                    "backfill_plan.validation.checks[5].source_expr"]
    assert [ln for ln in tagged if ln.startswith(("[BLOCK]", "[WARN ]"))] == []
    assert any("[INFO ] blast_radius" in ln for ln in tagged)  # the live checks ran
    assert "4 field(s) still to fill in, 0 other blocking finding(s)" in lines[-1]
    # plan init and the guard wrote nothing: same table versions, no new file in the lake
    assert _versions(spark, src, tgt) == before and _files(base_lake) == files


@pytest.fixture(scope="module")
def events(spark, tmp_path_factory) -> Path:
    """Source and target ``events`` partitioned by a string day: ``id`` repeats (two lines per
    id), (id, line_no) is the key; a nullable note; timestamps at the window's edges; a double
    measure and a double with NaN; columns named with a dot and a hyphen; a struct whose fields
    have capitals in their names and whose ``ZipCode`` is an int in the target and a bigint in
    the source; a struct ``geo`` whose fields come in another order in the source."""
    root = tmp_path_factory.mktemp("events")
    days = ["2026-05-11", "2026-05-12", "2026-05-13", "2026-05-14"]
    rows = []
    for d in days:
        day = dt.date.fromisoformat(d)
        for i in range(40):
            edge = dt.datetime(day.year, day.month, day.day) + (
                dt.timedelta(microseconds=86_400_000_000 - 1) if i % 2 else dt.timedelta(0))
            rows.append((d, i // 2, i % 2, (i // 2) % 7, None if i % 5 == 0 else f"n'{i}`;",
                         edge, i * 0.1, float("nan") if i == 3 else 1.5,
                         None if i % 3 == 0 else f"city{i % 4}", f"{d}/{i}",
                         (10_000 + i, f"C{i % 3}"), (48.0 + i / 100, 2.0 + i / 100)))
    schema = ("day string, id bigint, line_no int, customer_id int, note string, "
              "ts timestamp, amount double, score double, `geo.city` string, `line-ref` string, "
              "addr struct<ZipCode: {zip}, City: string>, geo struct<lat: double, lon: double>")
    for side, zip_type in (("source", "bigint"), ("target", "int")):
        df = spark.createDataFrame(rows, schema.format(zip=zip_type))
        if side == "source":  # the same values, the fields in another order
            df = df.withColumn("geo", F.struct(F.col("geo.lon").alias("lon"),
                                               F.col("geo.lat").alias("lat")))
        df.write.format("delta").partitionBy("day").save(str(root / side))
    return root


def test_obvious_id_with_duplicates_gives_a_composite_key_then_the_draft_runs_and_rolls_back(
        spark, events, tmp_path, capsys):
    lake = tmp_path / "lake"
    for side in ("source", "target"):
        shutil.copytree(events / side, lake / side)
    out = lake / "draft.yaml"
    assert _init(lake / "source", lake / "target", "2026-05-12", "2026-05-14", out,
                 "--owner", "data@example.com", "--reason", "recompute", "--name", "ev") == 0
    text = out.read_text()
    plan = load_plan(out)
    (t,) = plan.target_specs()
    assert t.business_keys == ["id", "line_no"]
    assert "#   id: not a key: 40 duplicate row(s) in 80 rows" in text
    assert "#   (id, line_no): exact: 80 rows, no nulls, 80 distinct keys per partition" in text
    assert plan.partitioning is not None and plan.partitioning.type.value == "string"
    assert plan.affected_window.partitions == ["day=2026-05-12", "day=2026-05-13"]
    assert "note" not in t.contract.not_null and "ts" in t.contract.not_null
    metrics = {c.metric: c for c in plan.validation.checks if c.metric}
    assert metrics["sum_amount"].threshold_percent == 0.0001  # float tolerance
    assert metrics["sum_score"].nan.value == "exclude" and "score holds NaN" in text
    assert metrics["distinct_keys"].source_expr == "struct(id, line_no)"
    # the source has every target column; geo's fields come in another order there, and a
    # CAST would match them by position: a hole to fill
    assert "{fill:geo} AS geo" in text and text.count("{fill:") == 1
    assert "source's struct fields differ in name or order" in text
    # columns named with a dot or a hyphen: recomputed backquoted, named by no plain-name field
    assert t.transform.sql is not None and "`geo.city`, `line-ref`" in t.transform.sql
    # a nested type cast with its field names backquoted and their case kept
    assert "CAST(addr AS STRUCT<`ZipCode`: INT, `City`: STRING>) AS addr" in t.transform.sql
    assert "geo.city" not in t.contract.not_null and "line-ref" not in t.contract.not_null
    assert {c.name for c in t.contract.columns} == {
        "day", "id", "line_no", "customer_id", "note", "ts", "amount", "score", "addr", "geo"}
    assert "match_target_schema compares them): geo.city, line-ref" in text
    # fill in the two fields only a person knows, approve, run, roll back by --plan
    text = text.replace("downstream_notifications: []", "downstream_notifications: [bi]")
    text = text.replace("required: []", "required: [data-owner]")
    text = text.replace("{fill:geo}", "named_struct('lat', geo.lat, 'lon', geo.lon)")
    out.write_text(text)
    record_approval(out, "data-owner", "reviewer@example.com")
    tgt = lake / "target"
    (v0,) = _versions(spark, tgt)
    def content() -> list[Any]:  # without score, whose NaN never equals itself
        rows = spark.read.format("delta").load(str(tgt)).drop("score").collect()
        return sorted(map(tuple, rows), key=str)

    expected = content()
    assert main(["run", "--plan", str(out)]) == 0
    (v1,) = _versions(spark, tgt)
    assert v1 > v0 and (lake / "_sparkguard").is_dir()  # the home derived from the plan
    assert content() == expected  # an identity recompute: lat is still lat, ZipCode an int
    run_id = next(ln for ln in capsys.readouterr().out.splitlines()
                  if "(run " in ln).split("(run ")[1].split(",")[0]
    assert main(["rollback", "--plan", str(out), "--run-id", run_id]) == 0
    hist = DeltaTable.forPath(spark, str(tgt)).history(1).first()
    assert hist["operation"] == "RESTORE" and int(hist["operationParameters"]["version"]) == v0
    assert content() == expected and len(expected) == 160
    assert {r[0] for r in spark.read.format("delta").load(str(tgt)).select("`line-ref`")
            .collect()} >= {"2026-05-12/7"}
    assert main(["rollback", "--plan", str(lake / "nope.yaml"), "--run-id", run_id]) == 2


def test_int_day_partitions_and_a_window_in_another_time_zone(spark, tmp_path):
    rows = [(20260500 + d, f"sku{i}", i * 3) for d in (11, 12, 13) for i in range(10)]
    df = spark.createDataFrame(rows, "day_key int, sku string, units bigint")
    for side in ("src", "tgt"):
        df.write.format("delta").partitionBy("day_key").save(str(tmp_path / side))
    out = tmp_path / "d.yaml"
    assert _init(tmp_path / "src", tmp_path / "tgt", "2026-05-12T02:00:00+02:00",
                 "2026-05-13", out) == 0
    plan = load_plan(out)
    assert plan.partitioning is not None and plan.partitioning.type.value == "int"
    assert plan.affected_window.partitions == ["day_key=20260512"]
    assert plan.target_specs()[0].business_keys == ["sku"]
    assert plan.owner is None and plan.reason is None  # left to fill


@pytest.fixture(scope="module")
def odd(spark, tmp_path_factory) -> Path:
    """Tables plan init must refuse: every row twice, unpartitioned with a timestamp,
    clustered, partitioned by a column whose name holds a dot, a struct field named with a tab
    (column mapping), a column named with sparkguard's working-column prefix."""
    root = tmp_path_factory.mktemp("odd")
    base = spark.range(20).select(F.lit(dt.date(2026, 5, 12)).alias("d"), F.col("id"),
                                  (F.col("id") % 3).alias("g"),
                                  F.lit(dt.datetime(2026, 5, 12, 1)).alias("ts"))
    base.write.format("delta").partitionBy("d").save(str(root / "src"))
    base.unionAll(base).write.format("delta").partitionBy("d").save(str(root / "dups"))
    base.write.format("delta").save(str(root / "flat"))
    spark.sql(f"CREATE TABLE delta.`{root / 'clustered'}` (d DATE, id BIGINT, ts TIMESTAMP) "
              "USING delta CLUSTER BY (ts)")
    base.withColumnRenamed("d", "event.day").write.format("delta").partitionBy(
        "event.day").save(str(root / "dotted"))
    (base.withColumn("s", F.struct(F.col("id").alias("a\tb"))).write.format("delta")
     .partitionBy("d").option("delta.columnMapping.mode", "name")
     .option("delta.minReaderVersion", "2").option("delta.minWriterVersion", "5")
     .save(str(root / "tabbed")))
    base.withColumn("__SG_N", F.lit(1)).write.format("delta").partitionBy("d").save(
        str(root / "reserved"))
    return root


@pytest.mark.parametrize(("case", "words"), [
    ("missing", ["--target: ", "is not a Delta table"]),
    ("empty_window", ["--start: the source has no rows in the window"]),
    ("no_key", ["no exact business key in the window", "id: not a key: 20 duplicate row(s)",
                "(id, g): not a key"]),
    ("unpartitioned", ["the target is unpartitioned", "timestamp columns ['ts']"]),
    ("clustered", ["the target is clustered", "clustering columns ['ts']"]),
    ("view_source", ["--source: 'sg_init_view' is a view, not a Delta table",
                     "name the Delta table the view reads"]),
    ("nested_control", ["--target: column or field name(s) ['a\\tb'] hold a control"]),
    ("dotted_window", ["--target: the window column 'event.day' is not a plain name"]),
    ("reserved", ["--target: column(s) ['__SG_N'] start with '__sg_'", "RENAME COLUMN"]),
    ("hostile_path", ["--target: path", "contains a quote, backquote"]),
    ("hostile_name", ["--source: ", "is not a plain name"]),
    ("source_is_target", ["--source: the source is the target"]),
    ("exists", ["-o: ", "already exists; plan init never overwrites a plan"]),
])
def test_bad_input_exits_2_with_a_clear_message_and_writes_nothing(
        spark, odd, tmp_path, capsys, case, words):
    src, tgt, start, end = odd / "src", odd / "dups", "2026-05-12", "2026-05-13"
    if case == "missing":
        tgt = odd / "nope"
    elif case == "empty_window":
        start, end = "2030-01-01", "2030-01-03"
    elif case in ("unpartitioned", "clustered", "dotted_window", "nested_control", "reserved"):
        tgt = odd / {"unpartitioned": "flat", "clustered": "clustered",
                     "nested_control": "tabbed", "reserved": "reserved"}.get(case, "dotted")
    elif case == "hostile_path":
        tgt = Path(f"{odd}/dups`; DROP TABLE x")
    elif case == "no_key":
        pass
    elif case == "source_is_target":  # the same table spelt another way
        src = f"file://{tgt}/"  # type: ignore[assignment]
    out = tmp_path / "draft.yaml"
    if case == "exists":
        out.write_text("mine\n")
    files = _files(odd)
    tables = [odd / t for t in ("src", "dups", "flat", "clustered", "dotted", "tabbed",
                                "reserved")]
    versions = _versions(spark, *tables)
    argv_src: Any = "orders; DROP TABLE x" if case == "hostile_name" else src
    if case == "view_source":
        spark.sql(f"CREATE OR REPLACE TEMP VIEW sg_init_view AS SELECT * FROM delta.`{src}`")
        argv_src = "sg_init_view"
    try:
        assert _init(argv_src, tgt, start, end, out) == 2
    finally:
        spark.sql("DROP VIEW IF EXISTS sg_init_view")
    err = capsys.readouterr().err
    for w in words:
        assert w in err, err
    assert "nothing was written" in err
    assert _files(odd) == files
    assert _versions(spark, *tables) == versions
    assert (out.read_text() == "mine\n") if case == "exists" else not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name != "draft.yaml"]


def test_a_snapshot_target_with_an_identity_column_and_a_digit_name_drafts_a_plan_that_runs(
        spark, tmp_path):
    """A daily snapshot (``customer_id`` once per day, so unique per partition only) whose
    target generates ``sk`` and lives in a folder named ``2024_snap``; ``ratio`` is infinite in
    one source row only. The draft promotes by MERGE, which matches on the key alone: the key
    must hold across the window, so it is (customer_id, day), not customer_id (which fails
    ``merge_target_keys`` on every run); the label is made a plain name instead of a traceback
    (exit 3); ``ratio`` gets ``nan: exclude`` from the source's infinity."""
    days = ["2026-05-11", "2026-05-12", "2026-05-13"]
    rows = [(d, c, c * 1.5, c * 2) for d in days for c in range(20)]
    src, tgt = tmp_path / "src", tmp_path / "2024_snap"
    spark.createDataFrame(
        [(d, c, float("inf") if (d, c) == ("2026-05-12", 3) else r, n) for d, c, r, n in rows],
        "day string, customer_id int, ratio double, visits int",
    ).write.format("delta").partitionBy("day").save(str(src))
    from delta.tables import IdentityGenerator

    (DeltaTable.create(spark).location(str(tgt)).partitionedBy("day")
     .addColumn("sk", "BIGINT", generatedAlwaysAs=IdentityGenerator(1, 1))
     .addColumn("day", "STRING").addColumn("customer_id", "INT").addColumn("ratio", "DOUBLE")
     .addColumn("visits", "INT").execute())
    spark.createDataFrame(rows, "day string, customer_id int, ratio double, visits int") \
        .write.format("delta").mode("append").save(str(tgt))
    out = tmp_path / "draft.yaml"
    assert _init(src, tgt, "2026-05-11", "2026-05-13", out, "--owner", "data@example.com",
                 "--reason", "recompute") == 0
    text = out.read_text()
    plan = load_plan(out)
    (t,) = plan.target_specs()
    assert t.name == "t_2024_snap" and t.promotion.value == "merge_changed"
    assert t.business_keys == ["customer_id", "day"]
    assert "customer_id: not a key: 20 duplicate row(s) in 40 rows" in text
    assert "keys across the window" in text and "no duplicate across the window" in text
    metrics = {c.metric: c for c in plan.validation.checks if c.metric}
    assert metrics["sum_ratio"].nan.value == "exclude"
    assert metrics["sum_visits"].nan.value != "exclude"
