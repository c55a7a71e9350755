"""Tables as real lakes name them: a source and a target given by catalog name (the way
Databricks users write plans), and a target whose column names hold a dot, a hyphen or a space
(legal in Delta; a space, here in a nested field, needs column mapping). Each backfill is
promoted, rolled back and verified on real tables."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from pyspark.sql import functions as F

from sparkguard.cli import main
from sparkguard.demo import TRANSFORM_SQL
from sparkguard.errors import EXIT_OK
from sparkguard.ledger import Ledger
from sparkguard.run.data import fingerprints
from tests.lakes import WINDOW, copy_lake, set_transform, write_plan

pytestmark = pytest.mark.spark


def _run(plan: Path, root: Path) -> int:
    return main(["run", "--plan", str(plan), "--home", str(root / "_sg"),
                 "--evidence-dir", str(root / "evidence")])


def _run_id(spark: Any, root: Path) -> str:
    (run,) = Ledger(spark, str(root / "_sg")).latest_runs()
    return run.run_id


def _after_run(spark: Any, root: Path, verb: str) -> int:
    return main([verb, "--run-id", _run_id(spark, root), "--home", str(root / "_sg")])


def _history(spark: Any, table: str) -> list[str]:
    return [r["operation"] for r in spark.sql(f"DESCRIBE HISTORY {table}")
            .orderBy("version").collect()]


def _rows(df: Any) -> list[Any]:
    return sorted(df.collect())


def test_source_and_target_by_catalog_name(spark: Any, base_lake: Path, tmp_path: Path,
                                           capsys: Any) -> None:
    """``dataset: sg_names.orders_src`` and `` `spark_catalog`.`sg_names`.orders_clean ``
    (parts in backquotes, as a Unity Catalog name holding a hyphen is written): the run reads,
    locks, promotes and records the target by its name; rollback and verify find it again by
    name. The transform holds a regex quantifier (``{0,40}``), which is SQL, not a
    placeholder."""
    root = copy_lake(base_lake, tmp_path / "lake")
    schema = f"sg_names_{tmp_path.name.replace('-', '_')}"
    src, tgt = f"{schema}.orders_src", f"{schema}.orders_clean"
    spark.sql(f"CREATE SCHEMA {schema}")
    try:
        spark.sql(f"CREATE TABLE {src} USING DELTA LOCATION '{root / 'source' / 'orders'}'")
        spark.sql(f"CREATE TABLE {tgt} USING DELTA LOCATION '{root / 'target' / 'orders_clean'}'")
        before, v0 = _rows(spark.table(tgt)), len(_history(spark, tgt)) - 1
        # a regex quantifier's braces are SQL, not a placeholder (the guard once blocked them)
        sql = TRANSFORM_SQL.replace("status,", "regexp_replace(status, '^(.{0,40})$', '$1') "
                                    "AS status,")
        spelled = f"`spark_catalog`.`{schema}`.orders_clean"
        plan = write_plan(root, lambda p: (p["source_of_truth"].update(dataset=src),
                                           p["targets"][0].update(dataset=spelled,
                                                                  transform={"sql": sql})))
        assert _run(plan, root) == EXIT_OK
        assert (f"RESTORE TABLE `spark_catalog`.`{schema}`.`orders_clean` TO VERSION AS OF {v0}"
                in capsys.readouterr().out)
        expected = spark.sql(TRANSFORM_SQL.format(
            source=src, window=f"order_date IN ({', '.join(repr(str(d)) for d in WINDOW)})"))
        window = spark.table(tgt).filter(F.col("order_date").isin(*WINDOW))
        assert _rows(window) == _rows(expected.select(*window.columns))
        (led,) = Ledger(spark, str(root / "_sg")).latest_runs()
        assert set(led.targets) == {"orders_clean"}
        assert led.targets["orders_clean"].rollback_version == v0

        assert _after_run(spark, root, "rollback") == EXIT_OK
        assert _rows(spark.table(tgt)) == before
        assert _history(spark, tgt)[-2:] == ["WRITE", "RESTORE"]
        assert _after_run(spark, root, "verify") == EXIT_OK
    finally:
        spark.sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


ODD = {"ship.city": "CONCAT('{p}', CAST(customer_id AS STRING))",
       "order-ref": "CONCAT('r', CAST(order_id AS STRING))",
       "addr": "named_struct('zip code', CAST(amount AS STRING), 'City', 'x')"}


def _odd_sql(prefix: str) -> str:
    extra = ", ".join(f"{e.format(p=prefix)} AS `{c}`" for c, e in ODD.items())
    return TRANSFORM_SQL.replace("AS line_total", f"AS line_total, {extra}")


def test_column_names_with_a_dot_a_hyphen_and_a_nested_space(spark: Any, base_lake: Path,
                                                      tmp_path: Path) -> None:
    """The target gains ``ship.city``, ``order-ref`` and a struct ``addr`` whose field ``zip
    code`` holds a space (column mapping on); the plan recomputes them, ``ship.city``
    differently on every row. The shadow gets column mapping for the nested name (only top-level
    names were looked at once, and Delta refused the shadow's first write), the change preview
    counts the columns by their names, merge_changed promotes and verifies the window against
    the shadow (a dotted name once read as a struct field failed that check after the commit),
    and the rollback restores the old content."""
    root = copy_lake(base_lake, tmp_path / "lake")
    path = root / "target" / "orders_clean"
    held = root / "held"
    df = spark.read.format("delta").load(str(path))
    for c, e in ODD.items():
        df = df.withColumn(c, F.expr(e.format(p="c")))
    (df.write.format("delta").partitionBy("order_date")
     .option("delta.columnMapping.mode", "name").option("delta.minReaderVersion", "2")
     .option("delta.minWriterVersion", "5").save(str(held)))
    shutil.rmtree(path)
    shutil.move(str(held), str(path))
    before = _rows(spark.read.format("delta").load(str(path)))

    plan = write_plan(root, set_transform(_odd_sql("x")), promotion="merge_changed")
    assert _run(plan, root) == EXIT_OK
    after = spark.read.format("delta").load(str(path))
    window = after.filter(F.col("order_date").isin(*WINDOW))
    assert window.count() == 600
    assert window.filter(~F.col("`ship.city`").startswith("x")).count() == 0
    assert (window.filter(F.col("`order-ref`") != F.concat(F.lit("r"), F.col("order_id")))
            .count()) == 0
    assert _rows(after.filter(~F.col("order_date").isin(*WINDOW))) == [
        r for r in before if r["order_date"] not in WINDOW]
    evidence = yaml.safe_load((root / "evidence" / f"{_run_id(spark, root)}.yaml").read_text())
    (target,) = evidence["sparkguard"]["targets"]
    assert target["verified"] is True
    preview = target["full_window"]["change_preview"]
    assert preview["changed"] == 582 and preview["inserted"] == 18
    assert preview["changed_by_column"]["ship.city"] == 582
    assert preview["changed_by_column"]["order-ref"] == 0
    assert preview["changed_by_column"]["addr"] == preview["changed_by_column"]["amount"] > 0

    assert _after_run(spark, root, "rollback") == EXIT_OK
    assert _rows(spark.read.format("delta").load(str(path))) == before
    assert _after_run(spark, root, "verify") == EXIT_OK


def test_fingerprints_of_frames_holding_columns_named_like_sparkguards_own(spark: Any) -> None:
    """A target from before the guard refused the prefix: its rollback still verifies with these
    hashes. Equal frames holding ``__SG_SIDE`` and ``__sg_side_`` hash equal (the side column
    once replaced the user's, so equal content never matched), and a change in either column
    is seen."""
    schema = "id int, __SG_SIDE string, __sg_side_ int"
    a = spark.createDataFrame([(1, "x", 0), (2, "y", 0)], schema)
    same = spark.createDataFrame([(2, "y", 0), (1, "x", 0)], schema)
    ha, hs = fingerprints(a, same)
    assert ha == hs and ha["rows"] == 2
    for other in ([(1, "x", 0), (2, "z", 0)], [(1, "x", 0), (2, "y", 1)]):
        assert fingerprints(a, spark.createDataFrame(other, schema))[1] != ha
