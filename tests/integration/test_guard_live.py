"""Live guard checks on one small real lake (built once for the module; nothing here writes
to it after the fixture)."""

from __future__ import annotations

import copy
import os
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from delta.tables import DeltaTable
from pyspark.errors import ParseException
from pyspark.sql import functions as F

from sparkguard.cli import main
from sparkguard.demo import TRANSFORM_SQL
from sparkguard.guard import Severity, blocking, static_findings
from sparkguard.guard_live import LIVE_RULES, live_findings, retention_days
from sparkguard.plan import load_plan_text
from sparkguard.plan.model import Transform
from sparkguard.run import data as run_data
from tests.lakes import WINDOW, copy_lake, newer_protocol, set_transform, write_plan

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def base(spark, base_lake, tmp_path_factory) -> Path:
    root = copy_lake(base_lake, tmp_path_factory.mktemp("live") / "lake")
    target = spark.read.format("delta").load(str(root / "target" / "orders_clean"))
    target.write.format("delta").save(str(root / "target" / "orders_flat"))  # unpartitioned
    return root


def _plan(base: Path, mutate=None):
    from sparkguard.demo import demo_plan

    data = demo_plan(base, WINDOW)
    if mutate:
        mutate(data["backfill_plan"])
    plan = load_plan_text(yaml.safe_dump(data, sort_keys=False))
    assert not blocking(static_findings(plan, check_approvals=False)), "must pass static checks"
    return plan


def _live(spark, base, mutate=None) -> list[tuple[str, str, str]]:
    return [(f.severity.value, f.code, f.path) for f in live_findings(spark, _plan(base, mutate))]


def _blocks(spark, base, mutate=None) -> set[tuple[str, str]]:
    return {(code, path) for sev, code, path in _live(spark, base, mutate) if sev == "block"}


def test_valid_plan_passes_and_reports_the_blast_radius(spark, base):
    found = live_findings(spark, _plan(base))
    assert not blocking(found)
    assert {f.code for f in found} == {"blast_radius"}
    src, tgt = (f.message for f in found)
    # independent figures: rows via a count, bytes via the files Delta lists for the window
    target_path = str(base / "target" / "orders_clean")
    window = spark.read.format("delta").load(target_path).filter(F.col("order_date").isin(WINDOW))
    files = [f for f in DeltaTable.forPath(spark, target_path).toDF().inputFiles()
             if any(f"order_date={d.isoformat()}/" in f for d in WINDOW)]
    size = sum(os.path.getsize(f.removeprefix("file:")) for f in files)
    assert src == "source: 600 rows in 3 window partition(s)"
    assert tgt == (f"target {target_path!r}: {window.count()} rows in {len(files)} file(s), "
                   f"{size / 1e6:.2f} MB inside the window will be replaced in one commit")
    assert window.count() < 600  # the planted defect dropped rows


def _set(section: str, key: str, value: Any):
    def mutate(p):
        p[section][key] = value
    return mutate


def _target(key: str, value: Any):
    def mutate(p):
        p["targets"][0][key] = value
    return mutate


def _check(i: int, key: str, value: Any):
    def mutate(p):
        p["validation"]["checks"][i][key] = value
    return mutate


def test_blast_radius_of_a_target_with_its_own_metadata_column(spark, base, tmp_path):
    """A user column named ``_metadata`` hides Spark's file metadata column from plain
    references; the blast radius still counts the window's files."""
    path = tmp_path / "with_metadata"
    (spark.read.format("delta").load(str(base / "target" / "orders_clean"))
     .withColumn("_metadata", F.lit("mine")).write.format("delta").partitionBy("order_date")
     .save(str(path)))
    found = [f.message for f in live_findings(spark, _plan(base, _target("dataset", str(path))))
             if f.code == "blast_radius" and "target" in f.message]
    window = spark.read.format("delta").load(str(path)).filter(F.col("order_date").isin(WINDOW))
    files = set(window.inputFiles())
    size = sum(os.path.getsize(f.removeprefix("file:")) for f in files)
    assert found == [f"target {str(path)!r}: {window.count()} rows in {len(files)} file(s), "
                     f"{size / 1e6:.2f} MB inside the window will be replaced in one commit"]


def test_source_missing(spark, base):
    assert _blocks(spark, base, _set("source_of_truth", "dataset", str(base / "nope"))) == {
        ("source_missing", "backfill_plan.source_of_truth.dataset")}


def test_source_missing_as_a_catalog_name(spark, base):
    assert ("source_missing", "backfill_plan.source_of_truth.dataset") in _blocks(
        spark, base, _set("source_of_truth", "dataset", "no_such_db.no_such_table"))


def test_the_source_named_as_a_target_through_the_catalog_is_refused(spark, base):
    """The static guard sees two spellings; the live check sees one table: the target by its
    catalog name, the source by its path (and the other way round)."""
    path = str(base / "target" / "orders_clean")
    alias = "sg_live_src_alias"
    spark.sql(f"CREATE TABLE IF NOT EXISTS {alias} USING DELTA LOCATION '{path}'")
    try:
        for source, target in ((path, alias), (alias, path)):
            def swap(p, source=source, target=target):
                p["source_of_truth"].update(dataset=source)
                p["targets"][0].update(dataset=target)
            found = [f for f in live_findings(spark, _plan(base, swap))
                     if f.code == "source_is_target_table"]
            assert [(f.severity.value, f.path) for f in found] == [
                ("block", "backfill_plan.targets[0].dataset")]
            assert f"is the source of truth's table ({source!r}, at file:{path})" in (
                found[0].message)
        assert not [f for f in live_findings(spark, _plan(base))
                    if f.code == "source_is_target_table"]
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {alias}")


def test_a_view_or_another_format_is_named_as_such_with_its_fix(spark, base, tmp_path):
    """A view (catalog or temporary) as the source, a Parquet table as the target: the finding
    says what the dataset is and how to fix that, not only that it is not Delta."""
    spark.sql("CREATE SCHEMA IF NOT EXISTS sg_live_kinds")
    spark.sql(f"CREATE TABLE sg_live_kinds.src USING DELTA LOCATION "
              f"'{base / 'source' / 'orders'}'")
    spark.sql("CREATE OR REPLACE VIEW sg_live_kinds.src_view AS SELECT * FROM sg_live_kinds.src")
    spark.sql("CREATE OR REPLACE TEMP VIEW sg_live_temp AS SELECT * FROM sg_live_kinds.src")
    spark.range(3).write.format("parquet").saveAsTable("sg_live_kinds.flat")
    gone = tmp_path / "gone"
    spark.range(3).write.format("delta").save(str(gone))
    spark.sql(f"CREATE TABLE sg_live_kinds.gone USING DELTA LOCATION '{gone}'")
    shutil.rmtree(gone / "_delta_log")
    try:
        for view in ("sg_live_kinds.src_view", "sg_live_temp"):
            (f,) = [f for f in live_findings(spark, _plan(base, _set(
                "source_of_truth", "dataset", view))) if f.code == "source_missing"]
            assert f.message == (f"source {view!r} is a view, not a Delta table: a run reads "
                                 "its source at one pinned Delta version and promotes into one "
                                 "Delta table"), f.message
            assert f.fix.startswith("name the Delta table the view reads")
        (f,) = [f for f in live_findings(spark, _plan(base, _target(
            "dataset", "sg_live_kinds.flat"))) if f.code == "target_missing"]
        assert f.message == "target 'sg_live_kinds.flat' is a parquet table, not Delta"
        assert "CONVERT TO DELTA" in f.fix
        (f,) = [f for f in live_findings(spark, _plan(base, _target(
            "dataset", "sg_live_kinds.nope"))) if f.code == "target_missing"]
        assert f.message == "target 'sg_live_kinds.nope' is not in the catalog"
        assert f.fix == "create it before backfilling, or check the name or path"
        (f,) = [f for f in live_findings(spark, _plan(base, _target(
            "dataset", "sg_live_kinds.gone"))) if f.code == "target_missing"]
        assert f.message == ("target 'sg_live_kinds.gone' is registered as a Delta table but "
                             "its transaction log (_delta_log) cannot be found"), f.message
    finally:
        spark.sql("DROP VIEW IF EXISTS sg_live_temp")
        spark.sql("DROP SCHEMA IF EXISTS sg_live_kinds CASCADE")


def test_target_missing(spark, base):
    assert _blocks(spark, base, _target("dataset", str(base / "target" / "nope"))) == {
        ("target_missing", "backfill_plan.targets[0].dataset")}


def test_a_catalog_name_and_a_path_of_one_table_are_refused_as_two_targets(spark, base):
    # the static guard compares the spellings (paths normalised, names case-folded); a name
    # and a path of one table only the live check can see
    path = str(base / "target" / "orders_clean")
    alias = "sg_live_alias_orders"
    spark.sql(f"CREATE TABLE IF NOT EXISTS {alias} USING DELTA LOCATION '{path}'")

    def mutate(p):
        again = copy.deepcopy(p["targets"][0])
        again["name"] = "orders_again"
        again["dataset"] = alias
        p["targets"].append(again)
    try:
        found = [f for f in live_findings(spark, _plan(base, mutate))
                 if f.code == "targets_same_table"]
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {alias}")
    assert [(f.severity.value, f.path) for f in found] == [
        ("block", "backfill_plan.targets[1].dataset")]
    assert f"targets[0] ({path!r})" in found[0].message


def test_partition_column_missing(spark, base):
    def mutate(p):
        p["partitioning"]["column"] = "event_date"
        p["affected_window"].pop("partitions")
    assert _blocks(spark, base, mutate) == {
        ("partition_column_missing", "backfill_plan.partitioning.column"),
        ("partition_column_missing", "backfill_plan.targets[0].dataset")}


def test_partition_type_mismatch(spark, base):
    blocks = _blocks(spark, base, _set("partitioning", "type", "string"))
    assert ("partition_type_mismatch", "backfill_plan.partitioning.column") in blocks
    assert ("partition_type_mismatch", "backfill_plan.targets[0].dataset") in blocks


def test_business_key_and_duplicate_key_missing_from_target(spark, base):
    def mutate(p):
        p["targets"][0]["business_keys"] = ["order_id", "nope"]
        p["validation"]["checks"][1]["key_columns"] = ["order_id", "nope"]
        p["targets"][0]["contract"]["not_null"] = ["order_id", "Amount"]  # another case
        p["targets"][0]["contract"]["columns"] = [  # the second in another case
            {"name": "order_id", "type": "bigint"}, {"name": "LINE_TOTAL", "type": "decimal(14,2)"}]
    assert _blocks(spark, base, mutate) == {
        ("column_missing", "backfill_plan.targets[0].business_keys[1]"),
        ("column_missing", "backfill_plan.validation.checks[1].key_columns"),
        ("column_missing", "backfill_plan.targets[0].contract.not_null[1]"),
        ("column_missing", "backfill_plan.targets[0].contract.columns[1].name")}


def test_window_partitions_missing_from_source(spark, base):
    def mutate(p):
        p["affected_window"] = {"start_utc": "2026-05-05T00:00:00Z",
                                "end_utc": "2026-05-09T00:00:00Z"}
    found = live_findings(spark, _plan(base, mutate))
    miss = [f for f in found if f.code == "window_not_in_source"]
    assert len(miss) == 1 and miss[0].severity is Severity.BLOCK
    assert "2 of 4 partition(s) have no rows in the source: ['2026-05-07', '2026-05-08']" \
        in miss[0].message


def test_transform_that_does_not_analyse(spark, base):
    assert _blocks(spark, base, _target("transform", {
        "sql": "SELECT order_id, no_such_column FROM {source}"})) == {
        ("transform_invalid", "backfill_plan.targets[0].transform.sql")}
    assert not [t for t in spark.catalog.listTables() if t.name.startswith("__sg_guard_")]


def test_transform_callable_that_cannot_be_imported(spark, base):
    assert _blocks(spark, base, _target("transform", {"callable": "no.such.module:fn"})) == {
        ("transform_invalid", "backfill_plan.targets[0].transform.callable")}
    assert not _blocks(spark, base, _target("transform", {
        "callable": "sparkguard.demo:transform_orders"}))


def test_metric_expression_that_does_not_resolve(spark, base):
    def mutate(p):
        p["validation"]["checks"][2]["source_expr"] = "no_such_col * 2"
        p["validation"]["checks"][3]["shadow_expr"] = "gross_margin"  # not a target column
    assert _blocks(spark, base, mutate) == {
        ("metric_expr_invalid", "backfill_plan.validation.checks[2].source_expr"),
        ("metric_expr_invalid", "backfill_plan.validation.checks[3].shadow_expr")}


@pytest.mark.parametrize(("aggregation", "source_expr", "shadow_expr", "refused"), [
    ("sum", "sum(amount)", "amount", "source_expr"),  # an aggregate: the gate sums it again
    ("sum", "amount", "sum(amount) over ()", "shadow_expr"),  # a window: every row the total
    ("max", "amount + rand()", "amount", "source_expr"),  # a different value on every read
    ("max", "amount", "map('a', amount)", "shadow_expr"),  # max cannot order a map
    ("sum", "amount", "array(amount)", "shadow_expr"),  # sum takes numbers only
    ("count_distinct", "count(order_id)", "order_id", "source_expr"),
])
def test_metric_expression_that_is_not_a_per_row_value_of_its_aggregation(
        spark, base, aggregation, source_expr, shadow_expr, refused):
    def mutate(p):
        p["validation"]["checks"][2].update(aggregation=aggregation, source_expr=source_expr,
                                            shadow_expr=shadow_expr)
    found = [f for f in live_findings(spark, _plan(base, mutate)) if f.severity is Severity.BLOCK]
    assert [(f.code, f.path) for f in found] == [
        ("metric_expr_invalid", f"backfill_plan.validation.checks[2].{refused}")]
    assert f"cannot be aggregated with {aggregation}" in found[0].message
    assert "without aggregate or window functions" in found[0].fix


@pytest.mark.parametrize(("aggregation", "expr"), [
    ("sum", "cast(amount AS decimal(20, 2)) * quantity"), ("min", "order_date"),
    ("max", "order_id"), ("count_distinct", "concat(order_id, '|', status)"),
    ("sum", "cast(order_date AS timestamp)"),
])
def test_per_row_metric_expressions_of_every_aggregation_pass(spark, base, aggregation, expr):
    def mutate(p):  # exact: a percent of a date is refused (the next test)
        p["validation"]["checks"][2].update(aggregation=aggregation, source_expr=expr,
                                            shadow_expr=expr, threshold_percent=0.0)
    assert not _blocks(spark, base, mutate)


@pytest.mark.parametrize(("aggregation", "expr", "refused"), [
    ("max", "order_date", True), ("min", "cast(order_date AS timestamp)", True),
    ("max", "cast(order_date AS timestamp_ntz)", True), ("max", "amount", False),
    ("count_distinct", "order_date", False),
])
def test_a_percent_threshold_on_a_date_or_timestamp_metric_is_refused(
        spark, base, aggregation, expr, refused):
    """max(order_date) compares in days since 1970: threshold_percent 0.01 let a shadow whose
    newest date was two days off pass. Refused, once per check; exact or absolute pass."""
    def mutate(p):
        p["validation"]["checks"][2].update(aggregation=aggregation, source_expr=expr,
                                            shadow_expr=expr, threshold_percent=0.01)
    found = [f for f in live_findings(spark, _plan(base, mutate)) if f.severity is Severity.BLOCK]
    if not refused:
        assert not found
        return
    assert [(f.code, f.path) for f in found] == [
        ("metric_percent_of_instant", "backfill_plan.validation.checks[2].threshold_percent")]
    assert "move by about 2" in found[0].message and "threshold_absolute" in found[0].fix

    def absolute(p):  # an absolute threshold beside the percent: both must hold
        mutate(p)
        p["validation"]["checks"][2]["threshold_absolute"] = 0
    assert not _blocks(spark, base, absolute)

    def drift(p):  # the drift threshold compares the same days or seconds
        absolute(p)
        p["validation"]["checks"][2]["drift_threshold_percent"] = 0.01
    assert _blocks(spark, base, drift) == {
        ("metric_percent_of_instant",
         "backfill_plan.validation.checks[2].drift_threshold_percent")}


def test_a_targets_own_checks_are_checked_against_both_sides(spark, base):
    def mutate(p):
        checks = copy.deepcopy(p["validation"]["checks"])
        checks[2]["source_expr"] = "no_such_col * 2"
        checks[3]["shadow_expr"] = "gross_margin"
        p["targets"][0]["validation"] = {"checks": checks}
    assert _blocks(spark, base, mutate) == {
        ("metric_expr_invalid", "backfill_plan.targets[0].validation.checks[2].source_expr"),
        ("metric_expr_invalid", "backfill_plan.targets[0].validation.checks[3].shadow_expr")}


def test_retention_does_not_cover_the_rollback_horizon(spark, base):
    found = live_findings(spark, _plan(base, _set("safeguards", "rollback_horizon_days", 10)))
    short = [f for f in found if f.code == "retention_too_short"]
    assert [f.path for f in short] == ["backfill_plan.targets[0].dataset"]
    assert "delta.deletedFileRetentionDuration = 7 days" in short[0].message
    assert "logRetentionDuration" not in short[0].message
    assert not [f for f in live_findings(spark, _plan(base)) if f.code == "retention_too_short"]


def test_an_append_only_target_blocks_before_anything_is_written(spark, base, tmp_path):
    """Delta refuses a replaceWhere or MERGE on an append-only table at commit, on every re-run:
    the live guard blocks it (exit 2) instead."""
    path = tmp_path / "orders_append_only"
    (spark.read.format("delta").load(str(base / "target" / "orders_clean")).write
     .format("delta").partitionBy("order_date").option("delta.appendOnly", "true")
     .save(str(path)))

    def mutate(p):
        p["targets"][0]["dataset"] = str(path)
    found = [f for f in live_findings(spark, _plan(base, mutate)) if f.code == "target_append_only"]
    assert [(f.severity, f.path) for f in found] == [
        (Severity.BLOCK, "backfill_plan.targets[0].dataset")]
    assert "'delta.appendOnly' = 'false'" in found[0].fix
    assert not [f for f in live_findings(spark, _plan(base)) if f.code == "target_append_only"]


def test_a_promotion_leaving_deletion_vectors_in_a_variant_target_is_warned(
        spark, base, tmp_path):
    """Spark 4.0 cannot read a VARIANT column from a file with a deletion vector when it reads
    rows without whole-stage code generation (this test session has it off; a wide table
    passes ``spark.sql.codegen.maxFields``): the guard warns for merge and merge_changed, and
    for replace_where where the table is not partitioned by the window's column (it deletes
    rows from files it keeps); not for replace_where over partitions, nor without deletion
    vectors, nor when code generation or Parquet's row reader reads the table."""
    src = spark.read.format("delta").load(str(base / "target" / "orders_clean")).withColumn(
        "attrs", F.parse_json(F.lit('{"a": 1}')))
    path, flat = tmp_path / "orders_variant", tmp_path / "orders_variant_flat"
    src.write.format("delta").partitionBy("order_date").option(
        "delta.enableDeletionVectors", "true").save(str(path))
    src.write.format("delta").option("delta.enableDeletionVectors", "true").save(str(flat))

    def codes(promotion, dataset=str(path)):
        def mutate(p):
            p["targets"][0].update(dataset=dataset, promotion=promotion)
            p["execution"]["write_strategy"] = f"{promotion} over the window, one commit"
        return [f for f in live_findings(spark, _plan(base, mutate))
                if f.code == "variant_deletion_vectors"]
    found = codes("merge_changed")
    assert [(f.severity, f.path) for f in found] == [
        (Severity.WARN, "backfill_plan.targets[0].promotion")]
    assert "spark.sql.codegen.wholeStage = false" in found[0].message
    assert "replace_where" in found[0].fix and "enableDeletionVectors" in found[0].fix
    assert len(codes("merge")) == 1
    assert codes("replace_where") == []
    (unpartitioned,) = codes("replace_where", str(flat))
    assert "over order_date, which the table is not partitioned by" in unpartitioned.message
    assert "set promotion: replace_where" not in unpartitioned.fix
    fields = len(src.columns)  # flat columns: one field each
    try:
        spark.conf.set("spark.sql.parquet.enableVectorizedReader", "false")
        assert codes("merge") == []  # Parquet's own row reader reads such files (measured)
        spark.conf.unset("spark.sql.parquet.enableVectorizedReader")
        spark.conf.set("spark.sql.codegen.wholeStage", "true")
        assert codes("merge") == []  # a narrow table is read with code generation
        spark.conf.set("spark.sql.codegen.maxFields", str(fields + 9))
        (wide,) = codes("merge")
        assert (f"its {fields} fields and Delta's own columns pass spark.sql.codegen.maxFields "
                f"({fields + 9})") in wide.message
        assert f"--conf spark.sql.codegen.maxFields={fields + 20}" in wide.fix
    finally:
        spark.conf.set("spark.sql.codegen.wholeStage", "false")
        spark.conf.unset("spark.sql.codegen.maxFields")
        spark.conf.unset("spark.sql.parquet.enableVectorizedReader")
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES "
              "('delta.enableDeletionVectors' = 'false')")
    assert codes("merge_changed") == []
    assert codes("merge", str(base / "target" / "orders_clean")) == []


def test_a_target_column_named_like_sparkguards_own_is_refused_before_anything_is_written(
        spark, base_lake, tmp_path, capsys):
    """A target column ``__SG_Side`` (the prefix in any case) would be read in place of the
    reconciliation's own side column: once, such a run promoted, failed its own check after
    the commit and restored the target (exit 3). The guard refuses it (exit 2), nothing
    written; a source column with the prefix is never part of sparkguard's frames."""
    root = copy_lake(base_lake, tmp_path / "lake")
    target = str(root / "target" / "orders_clean")
    (spark.read.format("delta").load(target).withColumn("__SG_Side", F.lit(1)).write
     .format("delta").mode("overwrite").option("overwriteSchema", "true")
     .partitionBy("order_date").save(target))
    source = str(root / "source" / "orders")
    (spark.read.format("delta").load(source).withColumn("__sg_side", F.lit(1)).write
     .format("delta").mode("overwrite").option("overwriteSchema", "true")
     .partitionBy("order_date").save(source))
    before = _state(spark, target)
    found = [f for f in live_findings(spark, _plan(root)) if f.severity is Severity.BLOCK]
    assert [(f.code, f.path) for f in found] == [
        ("target_reserved_column", "backfill_plan.targets[0].dataset")]
    assert "['__SG_Side']" in found[0].message and "RENAME COLUMN" in found[0].fix
    plan = write_plan(root, mutate=set_transform(TRANSFORM_SQL.replace(
        "AS line_total", "AS line_total, 2 AS __SG_Side")))
    assert main(["run", "--plan", str(plan), "--home", str(root / "_sg")]) == 2
    err = capsys.readouterr().err
    assert "backfill_plan.targets[0].dataset" in err and "__SG_Side" in err
    assert _state(spark, target) == before
    assert not (root / "_sg").exists() and not (root / "_sparkguard").exists()


def test_a_target_this_delta_cannot_write_blocks_before_anything_is_written(spark, base, tmp_path):
    """A table another writer (a newer Delta, another runtime) gave a writer feature this
    client's Delta does not know: Delta reads it, but refuses every write at commit, so the
    promotion would fail after the whole shadow was built, on every re-run. The live guard
    blocks it with Delta's own reason instead."""
    path = tmp_path / "orders_newer_writer"
    (spark.read.format("delta").load(str(base / "target" / "orders_clean")).write
     .format("delta").partitionBy("order_date").save(str(path)))
    version = newer_protocol(spark, path, reader=False)
    assert spark.read.format("delta").load(str(path)).count() > 0  # readable
    with pytest.raises(Exception, match="futureWriterFeature"):  # the premise: no write lands
        spark.read.format("delta").load(str(path)).limit(1).write.format("delta") \
            .mode("append").save(str(path))

    def mutate(p):
        p["targets"][0]["dataset"] = str(path)
    found = [f for f in live_findings(spark, _plan(base, mutate)) if f.code == "target_not_writable"]
    assert [(f.severity, f.path) for f in found] == [
        (Severity.BLOCK, "backfill_plan.targets[0].dataset")]
    assert "futureWriterFeature" in found[0].message, found[0].message
    assert not [f for f in live_findings(spark, _plan(base)) if f.code == "target_not_writable"]
    root = copy_lake(base, tmp_path / "lake")
    plan = write_plan(root, mutate)
    assert main(["run", "--plan", str(plan), "--home", str(root / "_sg")]) == 2
    assert not (root / "_sg").exists()  # refused before the ledger, a shadow or a pause
    assert spark.sql(f"DESCRIBE HISTORY delta.`{path}`").first()["version"] == version


@pytest.mark.parametrize(("table", "field", "by_name"), [
    ("source/orders", "backfill_plan.source_of_truth.dataset", False),
    ("target/orders_clean", "backfill_plan.targets[0].dataset", False),
    ("source/orders", "backfill_plan.source_of_truth.dataset", True),
], ids=["source", "target", "source-by-name"])
def test_a_table_this_delta_cannot_read_is_a_finding_not_a_crash(spark, base, tmp_path, capsys,
                                                                table, field, by_name):
    """A source or target a newer Delta gave a reader feature, named by path or in the catalog:
    the guard and the run used to crash (exit 3, a Java stack trace); now the live guard blocks
    with Delta's reason, naming the field (exit 2), and nothing is written."""
    root = copy_lake(base, tmp_path / "lake")
    name = "sg_unreadable_source"
    if by_name:
        spark.sql(f"CREATE TABLE {name} USING DELTA LOCATION '{root / table}'")
    newer_protocol(spark, root / table, reader=True)

    def named(p: dict[str, Any]) -> None:
        p["source_of_truth"]["dataset"] = name

    try:
        _unreadable_refused(root, write_plan(root, named if by_name else None), table, field,
                            name if by_name else str(root / "source" / "orders"), tmp_path,
                            capsys)
    finally:
        if by_name:
            spark.sql(f"DROP TABLE IF EXISTS {name}")


def _unreadable_refused(root, plan, table, field, source, tmp_path, capsys):
    """The guard, the run and plan init refuse the unreadable table, naming its field."""
    capsys.readouterr()
    assert main(["guard", str(plan)]) == 2
    out = capsys.readouterr().out
    (line,) = [ln for ln in out.splitlines() if ln.startswith("[BLOCK] table_unreadable")]
    assert field in line and "futureReaderFeature" in line and "Delta version" in line, line
    assert main(["run", "--plan", str(plan), "--home", str(root / "_sg")]) == 2
    assert not (root / "_sg").exists()
    draft = tmp_path / "draft.yaml"
    capsys.readouterr()
    assert main(["plan", "init", "--source", source, "--target",
                 str(root / "target" / "orders_clean"), "--start", str(WINDOW[0]), "--end",
                 str(WINDOW[-1]), "-o", str(draft)]) == 2
    err = capsys.readouterr().err
    flag = "--source" if table.startswith("source") else "--target"
    assert f"{flag}: this client's Delta cannot read" in err and "futureReaderFeature" in err, err
    assert not draft.exists()


def test_target_not_partitioned_is_a_warning(spark, base):
    def mutate(p):
        p["targets"][0]["dataset"] = str(base / "target" / "orders_flat")
    found = live_findings(spark, _plan(base, mutate))
    assert [(f.severity, f.code) for f in found if f.code == "target_not_partitioned"] == [
        (Severity.WARN, "target_not_partitioned")]
    assert not blocking(found)


@pytest.mark.parametrize(("value", "days"), [
    (None, 30.0), ("interval 7 days", 7.0), ("interval 1 week", 7.0), ("168 hours", 7.0),
    ("INTERVAL 36 HOURS", 1.5), ("interval 30 minutes", 30 / 1440), ("forever", None),
    ("interval 1 day 12 hours", 1.5), ("interval 7 days; DROP", None), ("", 30.0),
    ("interval 2 months", None),
])
def test_retention_days(value, days):
    got = retention_days(value, 30.0)
    assert got == days if days is None else got == pytest.approx(days)


def test_live_rules_have_tests():
    # retention_unreadable: the None results of test_retention_days (Delta itself refuses most
    # odd values when the property is set, so a live table cannot easily hold one)
    tested = {"source_missing", "target_missing", "partition_column_missing",
              "partition_type_mismatch", "column_missing", "target_not_partitioned",
              "targets_same_table", "source_is_target_table", "target_reserved_column",
              "window_not_in_source", "transform_invalid", "metric_expr_invalid",
              "metric_percent_of_instant", "retention_too_short", "blast_radius", "retention_unreadable",
              "target_append_only", "target_not_writable", "table_unreadable",
              "variant_deletion_vectors",
              "identity_replace_where", "identity_column_named",  # test_identity_columns.py
              "window_rewrites_most",  # this one in test_windows_guard.py, the next in
              "window_zone_dependent"}  # test_windows_e2e.py
    assert tested == set(LIVE_RULES)


def test_cli_guard_runs_live_checks_and_exits_2_on_a_live_block(spark, base, tmp_path, capsys):
    good = write_plan(base, approve=False, name="live-ok.yaml")
    try:
        assert main(["guard", str(good), "--pre-approval"]) == 0
        out = capsys.readouterr().out
        assert "[INFO ] blast_radius" in out and "0 blocking finding(s)" in out
        bad = write_plan(base, mutate=lambda p: p["targets"][0].update(
            dataset=str(base / "target" / "nope")), approve=False, name="live-bad.yaml")
        assert main(["guard", str(bad), "--pre-approval"]) == 2
        out = capsys.readouterr().out
        assert "[BLOCK] target_missing" in out and "backfill_plan.targets[0].dataset" in out
    finally:
        for name in ("live-ok.yaml", "live-bad.yaml"):
            (base / name).unlink(missing_ok=True)


def test_live_checks_write_nothing(spark, base):
    target = str(base / "target" / "orders_clean")
    before = DeltaTable.forPath(spark, target).history().count()
    live_findings(spark, _plan(base))
    assert DeltaTable.forPath(spark, target).history().count() == before
    assert not (base / "_sg").exists() and not (base / "_sparkguard").exists()


def _delete_after_with(target: str) -> str:
    return ("WITH s AS (SELECT * FROM {source} WHERE {window}) "
            f"DELETE FROM delta.`{target}` AS t WHERE true")


def _state(spark, table: str) -> tuple[int, int]:
    return (DeltaTable.forPath(spark, table).history().count(),
            spark.read.format("delta").load(table).count())


def test_a_command_after_with_is_never_run_by_the_live_guard_or_the_run(spark, base_lake,
                                                                        tmp_path):
    """Review finding 1: even a plan the static validator missed cannot make Spark run a
    command; the live guard and the run's transform both parse the SQL as a subquery."""
    root = copy_lake(base_lake, tmp_path / "lake")
    target = str(root / "target" / "orders_clean")
    before = _state(spark, target)
    plan = _plan(root)
    spec = plan.target_specs()[0]
    hostile = spec.model_copy(update={"transform": Transform.model_construct(
        sql=_delete_after_with(target), callable=None)})  # bypasses the static validator
    plan = plan.model_copy(update={"targets": [hostile, *plan.targets[1:]]})
    found = [f for f in live_findings(spark, plan) if f.code == "transform_invalid"]
    assert [f.path for f in found] == ["backfill_plan.targets[0].transform.sql"]
    assert "never run" in found[0].message and found[0].severity is Severity.BLOCK
    assert _state(spark, target) == before

    ctx = SimpleNamespace(spark=spark, window=SimpleNamespace(pred=lambda parts: "true"))
    state = SimpleNamespace(run_id="r1", targets={}, source_df=spark.read.format("delta").load(
        str(root / "source" / "orders")))
    with pytest.raises(ParseException):
        run_data.transform(ctx, state, SimpleNamespace(spec=hostile), WINDOW, "t")  # type: ignore[arg-type]
    spark.catalog.dropTempView("__sg_src_r1_t")
    assert _state(spark, target) == before


def test_cli_guard_and_run_refuse_a_command_after_with(spark, base_lake, tmp_path, capsys):
    root = copy_lake(base_lake, tmp_path / "lake")
    target = str(root / "target" / "orders_clean")
    before = _state(spark, target)
    plan = write_plan(root, mutate=lambda p: p["targets"][0]["transform"].update(
        sql=_delete_after_with(target)), approve=False, name="dml.yaml")
    for argv in (["guard", str(plan), "--pre-approval"], ["run", "--plan", str(plan)]):
        assert main(argv) == 2
        out = "".join(capsys.readouterr())
        assert "backfill_plan.targets[0].transform.sql" in out
        assert "is a command (DELETE), not a query" in out and "write one SELECT" in out
    assert _state(spark, target) == before
    assert not (root / "_sparkguard").exists()
