"""What the target's Delta table checks on every written row (CHECK constraints, generated
columns, CHAR/VARCHAR lengths) is a gate on the shadow, before any commit: a violating row
fails reconciliation with its count, instead of Delta refusing the promotion at commit time (a
runtime failure)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from delta.tables import DeltaTable
from pyspark.sql import functions as F

from sparkguard.cli import main
from sparkguard.demo import TRANSFORM_SQL
from sparkguard.errors import EXIT_GATE_FAILED, EXIT_OK
from sparkguard.plan import load_plan
from sparkguard.run import data
from sparkguard.run.evaluator import run_backfill
from sparkguard.run.stages import RunOptions
from sparkguard.sql import TableRef
from tests.lakes import WINDOW, copy_lake, set_transform, write_plan

pytestmark = pytest.mark.spark

# rows the broken transforms below get wrong: in the window, order_id % 50 in (0, 1)
BROKEN = "order_id % 50 IN (0, 1)"


@pytest.fixture(scope="module")
def rules_lake(spark: Any, base_lake: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The base lake with its target rebuilt with a generated column and a CHECK constraint,
    built once; tests copy it."""
    root = copy_lake(base_lake, tmp_path_factory.mktemp("rules") / "lake")
    _with_rules(spark, root)
    return root


def _copy(rules_lake: Path, tmp_path: Path) -> tuple[Path, TableRef]:
    root = copy_lake(rules_lake, tmp_path / "lake")
    return root, TableRef(path=str(root / "target" / "orders_clean"))


def _with_rules(spark: Any, root: Path) -> None:
    """The lake's target rebuilt with a generated column and a CHECK constraint (Delta only
    declares generated columns at creation), holding the same rows."""
    path = root / "target" / "orders_clean"
    held = root / "held"
    spark.read.format("delta").load(str(path)).write.format("delta").save(str(held))
    rows = spark.read.format("delta").load(str(held))
    shutil.rmtree(path)
    ref = TableRef(path=str(path))
    builder = DeltaTable.create(spark).location(str(path)).partitionedBy("order_date")
    for f in rows.schema.fields:
        builder = builder.addColumn(f.name, f.dataType)
    builder.addColumn("order_month", "INT", generatedAlwaysAs="month(order_date)").execute()
    spark.sql(f"ALTER TABLE {ref.sql} ADD CONSTRAINT `positive quantity` CHECK (quantity > 0)")
    rows.write.format("delta").mode("append").save(str(path))


def _loose(select: str | None = None) -> Callable[[dict[str, Any]], None]:
    """A plan change: ``match_target_schema: false``, and with ``select`` the transform
    ``SELECT <select> FROM (<the demo transform>)``."""
    def mutate(plan: dict[str, Any]) -> None:
        plan["targets"][0]["contract"]["match_target_schema"] = False
        if select is not None:
            plan["targets"][0]["transform"] = {"sql": f"SELECT {select} FROM ({TRANSFORM_SQL})"}
    return mutate


def _run(plan: Path, root: Path) -> int:
    return main(["run", "--plan", str(plan), "--home", str(root / "_sg"),
                 "--evidence-dir", str(root / "evidence")])


def _gate_results(root: Path, gate: str) -> list[tuple[list[str], dict[str, Any]]]:
    """Each slice's or the window's result of ``gate`` in the evidence, with the partitions
    that result covered."""
    (evidence,) = (root / "evidence").glob("*.yaml")
    ev = yaml.safe_load(evidence.read_text())["sparkguard"]
    return [([str(p["partition"]) for p in res["partitions"]], g)
            for t in ev["targets"]
            for res in [*t["slices"], *([t["full_window"]] if t.get("full_window") else [])]
            for g in res["gates"] if g["gate"] == gate]


def _counts_broken_rows(spark: Any, root: Path, gate: str) -> None:
    """``gate`` failed, and each of its results counts exactly the source's broken rows of the
    partitions it covered."""
    results = _gate_results(root, gate)
    assert results and not all(g["passed"] for _p, g in results), results
    source = TableRef(path=str(root / "source" / "orders"))
    for parts, g in results:
        n = spark.sql(f"SELECT count(*) FROM {source.sql} WHERE {BROKEN} AND order_date IN "
                      f"({', '.join(f'DATE{p!r}' for p in parts)})").first()[0]
        assert g["measured"] == n and g["passed"] == (n == 0), (parts, g)
        assert f"{n} row(s) of the shadow make" in g["reason"], g["reason"]


def _version(spark: Any, ref: TableRef) -> int:
    return int(DeltaTable.forPath(spark, ref.path).history(1).first()["version"])


def _transform(quantity: str = "quantity",
               order_month: str | None = "month(order_date) AS order_month") -> str:
    """The demo transform with these select items for quantity and the generated column (None:
    left out)."""
    sql = TRANSFORM_SQL.replace("status,\n       quantity,", f"status,\n       {quantity},")
    return sql.replace("AS line_total\n", f"AS line_total,\n       {order_month}\n") \
        if order_month else sql


@pytest.mark.parametrize(("order_month", "promotion"), [
    ("month(order_date) AS order_month", "replace_where"), (None, "merge_changed"),
], ids=["output-replace_where", "omitted-merge_changed"])
def test_rules_the_recomputation_keeps_promote(spark: Any, rules_lake: Path, tmp_path: Path,
                                               promotion: str, order_month: str | None) -> None:
    """A recomputation that keeps the target's rules promotes and verifies; one that leaves the
    generated column out gets it computed as Delta would (the shadow then holds what the
    target will: the schema gate and the verification compare like with like)."""
    root, ref = _copy(rules_lake, tmp_path)
    before = _version(spark, ref)
    plan = write_plan(root, set_transform(_transform(order_month=order_month)),
                      promotion=promotion)
    assert _run(plan, root) == EXIT_OK
    assert _version(spark, ref) > before
    for name in ("check_constraint[positive quantity]", "generated_column[order_month]"):
        results = _gate_results(root, name)
        assert results and all(g["passed"] and g["measured"] == 0 for _p, g in results), results
    wrong = spark.sql(f"SELECT count(*) FROM {ref.sql} WHERE NOT (order_month <=> "
                      "month(order_date))").first()[0]
    assert wrong == 0


@pytest.mark.parametrize(("broken", "gate", "promotion"), [
    ({"quantity": f"CASE WHEN {BROKEN} AND order_id % 2 = 0 THEN 0 WHEN {BROKEN} THEN NULL "
                  "ELSE quantity END AS quantity"}, "check_constraint[positive quantity]",
     "merge_changed"),
    ({"order_month": f"month(order_date) + CASE WHEN {BROKEN} THEN 1 ELSE 0 END AS order_month"},
     "generated_column[order_month]", "replace_where"),
], ids=["check-merge_changed", "generated-replace_where"])
def test_a_row_the_target_would_refuse_fails_its_gate_before_any_commit(
        spark: Any, rules_lake: Path, tmp_path: Path, broken: dict[str, str], gate: str,
        promotion: str) -> None:
    """Zero and null quantities (Delta refuses a row where the CHECK is false or null) or a
    generated column off its expression: each result of the gate counts exactly the broken
    rows of the partitions it checked, and the target keeps the version it had."""
    root, ref = _copy(rules_lake, tmp_path)
    before = _version(spark, ref)
    plan = write_plan(root, set_transform(_transform(**broken)), promotion=promotion)
    assert _run(plan, root) == EXIT_GATE_FAILED
    assert _version(spark, ref) == before
    _counts_broken_rows(spark, root, gate)


def test_a_constraint_on_a_column_the_recomputation_lacks_fails_its_gate(
        spark: Any, rules_lake: Path, tmp_path: Path) -> None:
    """The recomputation drops the column a CHECK constraint names: its gate fails saying the
    expression does not resolve (the run does not crash), beside the schema gate."""
    root, ref = _copy(rules_lake, tmp_path)
    before = _version(spark, ref)
    sql = _transform().replace("status,\n       quantity,", "status,")
    assert _run(write_plan(root, set_transform(sql)), root) == EXIT_GATE_FAILED
    assert _version(spark, ref) == before
    (_parts, g), *_ = _gate_results(root, "check_constraint[positive quantity]")
    assert not g["passed"] and "does not resolve on the recomputed rows" in g["reason"], g
    assert any(not s["passed"] for _p, s in _gate_results(root, "schema_matches_target"))


def test_an_omitted_generated_column_is_computed_only_when_truly_omitted(spark: Any) -> None:
    """Output in another case (Delta matches names case-insensitively): kept as output, for
    the gates to judge; an expression over a column the recomputation lacks: left out, for the
    schema gate; otherwise computed with the target's type."""
    import datetime as dt

    from pyspark.sql.types import IntegerType, LongType

    from sparkguard.run.data import _with_generated

    df = spark.createDataFrame([(dt.date(2026, 5, 2), 7)], "order_date date, ORDER_MONTH int")
    generated = [("order_month", "month(order_date)"), ("cents", "CAST(amount * 100 AS BIGINT)")]
    types = {"order_month": IntegerType(), "cents": LongType()}
    kept = _with_generated(df, generated, types)
    assert kept.columns == ["order_date", "ORDER_MONTH"] and kept.first()["ORDER_MONTH"] == 7
    added = _with_generated(df.drop("ORDER_MONTH"), generated, types)
    assert added.columns == ["order_date", "order_month"]
    assert added.schema["order_month"].dataType == IntegerType() and added.first()[1] == 5


@pytest.mark.parametrize(("column", "wrong", "right", "promotion"), [
    ("code VARCHAR(3)", "'ABCD'", "'AB'", "merge_changed"),
    ("code CHAR(2)", "'XYZ'", "'x'", "replace_where"),
], ids=["varchar-merge_changed", "char-replace_where"])
def test_a_value_longer_than_a_char_or_varchar_column_fails_its_gate_before_any_commit(
        spark: Any, base_lake: Path, tmp_path: Path, column: str, wrong: str, right: str,
        promotion: str) -> None:
    """Delta refuses a value longer than a CHAR(n) or VARCHAR(n) column at the promotion's
    commit (once a runtime failure, exit 3, after the whole shadow was built, reported as a
    replaceWhere mismatch). The length is a gate on the shadow: each result counts exactly the
    over-long rows of its partitions (a CHAR's shorter values, padded, pass), and the target
    keeps its version."""
    root = copy_lake(base_lake, tmp_path / "lake")
    ref = TableRef(path=str(root / "target" / "orders_clean"))
    spark.sql(f"ALTER TABLE {ref.sql} ADD COLUMNS ({column})")
    before = _version(spark, ref)
    sql = TRANSFORM_SQL.replace("AS line_total\n", f"AS line_total,\n       "
                                f"IF({BROKEN}, {wrong}, {right}) AS code\n")
    assert _run(write_plan(root, set_transform(sql), promotion=promotion), root) == (
        EXIT_GATE_FAILED)
    assert _version(spark, ref) == before
    _counts_broken_rows(spark, root, f"{column.split()[1].split('(')[0].lower()}_length[code]")
    assert all(g["passed"] for _p, g in _gate_results(root, "schema_matches_target"))


def test_a_varchar_column_the_recomputation_leaves_out_fails_the_column_gate_not_its_length(
        spark: Any, base_lake: Path, tmp_path: Path) -> None:
    """With ``match_target_schema: false``, a VARCHAR column the transform does not output: the
    promotion would null it in the window and the check after the commit would restore the
    target. The column gate fails first, naming it, before any commit; its length gets no gate
    (one that failed as unresolved would point at the wrong cause)."""
    root = copy_lake(base_lake, tmp_path / "lake")
    ref = TableRef(path=str(root / "target" / "orders_clean"))
    spark.sql(f"ALTER TABLE {ref.sql} ADD COLUMNS (code VARCHAR(3))")
    before = _version(spark, ref)
    assert _run(write_plan(root, _loose()), root) == EXIT_GATE_FAILED
    assert _version(spark, ref) == before
    assert not _gate_results(root, "varchar_length[code]")
    ((_parts, g),) = _gate_results(root, "columns_match_target")
    assert not g["passed"] and "'code' missing from the recomputed rows" in g["reason"], g


@pytest.mark.parametrize(("promotion", "column", "cast", "expected", "gate"), [
    # replace_where writes the columns as they are: Delta refused the commit (exit 3)
    ("replace_where", "line_total", "DECIMAL(12,2)", EXIT_GATE_FAILED, "columns_match_target"),
    # ... but writes a narrower integer into the wider column as it is
    ("replace_where", "quantity", "SMALLINT", EXIT_OK, "columns_match_target"),
    # a MERGE casts each value: float into decimal(14,2) changes it, the check after the
    # commit restored the target (exit 1 after a MERGE and a RESTORE)
    ("merge_changed", "line_total", "FLOAT", EXIT_GATE_FAILED, "cast_to_target[line_total]"),
    # text holding the very number: the MERGE's cast keeps every value
    ("merge", "line_total", "STRING", EXIT_OK, "cast_to_target[line_total]"),
    ("merge_changed", "line_total", "STRING", EXIT_OK, "cast_to_target[line_total]"),
], ids=["replace-where-narrower-decimal", "replace-where-smallint", "merge-changed-float",
        "merge-text", "merge-changed-text"])
def test_a_type_other_than_the_targets_is_gated_by_what_the_promotion_writes(
        spark: Any, base_lake: Path, tmp_path: Path, promotion: str, column: str, cast: str,
        expected: int, gate: str) -> None:
    """``match_target_schema: false`` and a column recomputed as another type than the
    target's (``line_total DECIMAL(14,2)``, ``quantity INT``): a failing case stops at its gate
    before any commit, where it used to fail at the commit or after it; a type the promotion
    writes unchanged promotes."""
    root = copy_lake(base_lake, tmp_path / "lake")
    ref = TableRef(path=str(root / "target" / "orders_clean"))
    before = _version(spark, ref)
    mutate = _loose(f"* EXCEPT ({column}), CAST({column} AS {cast}) AS {column}")
    assert _run(write_plan(root, mutate, promotion=promotion), root) == expected
    results = _gate_results(root, gate)
    assert results, gate
    if expected == EXIT_OK:
        assert all(g["passed"] for _p, g in results)
        assert _version(spark, ref) == before + 1
        window = spark.read.format("delta").load(ref.path).where(
            F.col("order_date").isin(*WINDOW))
        assert window.count() == 600
        assert window.schema["line_total"].dataType.simpleString() == "decimal(14,2)"
        assert window.schema["quantity"].dataType.simpleString() == "int"
        assert window.where("line_total <> round(quantity * amount, 2)").count() == 0
        return
    assert _version(spark, ref) == before  # no commit, no RESTORE
    failed = [g for _p, g in results if not g["passed"]]
    assert failed and all(g["measured"] > 0 for g in failed), failed
    if promotion == "replace_where":
        assert "type decimal(12,2) != target decimal(14,2)" in failed[0]["reason"]


@pytest.mark.parametrize(("promotion", "field", "expected"), [
    # the MERGE's cast would change values
    ("merge_changed", "CAST(line_total AS FLOAT)", EXIT_GATE_FAILED),
    ("merge", "CAST(line_total AS FLOAT)", EXIT_GATE_FAILED),
    ("merge", "CAST(line_total AS STRING)", EXIT_OK),  # text holding the very number: kept
    # the change set compares the field as the MERGE writes it (it failed on the types, exit 3)
    ("merge_changed", "CAST(line_total AS STRING)", EXIT_OK),
], ids=["merge-changed-float-field", "merge-float-field", "merge-text-field",
        "merge-changed-text-field"])
def test_a_struct_field_of_another_type_is_gated_before_the_merge(
        spark: Any, base_lake: Path, tmp_path: Path, promotion: str, field: str,
        expected: int) -> None:
    """``match_target_schema: false`` and a struct column whose field is recomputed as another
    type than the target's (``info.total DECIMAL(14,2)``): the MERGE casts the field, so a value
    that cast would change stops the run at ``cast_to_target[info]`` before any commit (it used
    to be found only after the commit, which the run then restored); one it keeps promotes,
    and under ``merge_changed`` rewrites only the rows whose values change (the change set
    failed on the two struct types before, exit 3)."""
    root = copy_lake(base_lake, tmp_path / "lake")
    ref = TableRef(path=str(root / "target" / "orders_clean"))
    spark.sql(f"ALTER TABLE {ref.sql} ADD COLUMNS (info STRUCT<total: DECIMAL(14,2), "
              "note: STRING>)")
    spark.sql(f"UPDATE {ref.sql} SET info = named_struct('total', line_total, 'note', 'it''s')")
    before = _version(spark, ref)
    mutate = _loose(f"*, named_struct('total', {field}, 'note', 'it''s') AS info")
    assert _run(write_plan(root, mutate, promotion=promotion), root) == expected
    results = _gate_results(root, "cast_to_target[info]")
    assert results
    if expected == EXIT_OK:
        assert all(g["passed"] for _p, g in results)
        assert _version(spark, ref) == before + 1
        window = spark.read.format("delta").load(ref.path).where(
            F.col("order_date").isin(*WINDOW))
        assert window.where("info.total IS NULL OR info.total <> line_total").count() == 0
        if promotion == "merge_changed":  # a row whose fields cast to its values is unchanged
            old = spark.read.format("delta").option("versionAsOf", before).load(ref.path)
            differ = " OR ".join(f"NOT (o.{c} <=> n.{c})" for c in old.columns)
            changed = old.alias("o").join(window.alias("n"), "order_id").where(differ).count()
            commit = DeltaTable.forPath(spark, ref.path).history(1).first()
            assert commit is not None
            assert 0 < changed < 600
            assert int(commit["operationMetrics"]["numTargetRowsUpdated"]) == changed
        return
    assert _version(spark, ref) == before  # no commit, no RESTORE
    failed = [g for _p, g in results if not g["passed"]]
    assert failed and all(g["measured"] > 0 for g in failed), failed


@pytest.mark.parametrize("promotion", ["merge_changed", "replace_where"])
def test_output_columns_named_in_another_case_are_compared_as_the_target_columns_they_fill(
        spark: Any, base_lake: Path, tmp_path: Path, promotion: str) -> None:
    """``match_target_schema: false`` and a recomputation naming columns in another case than
    the target (``LINE_TOTAL`` for ``line_total``, ``CODE`` for a ``CHAR(3)`` ``code``), which
    Delta's writes fill whatever the case. The run promotes and verifies: the check after the
    commit compares the same columns (it used to restore the target, exit 1), the CHAR value is
    padded as the target holds it, and the change preview counts ``line_total`` (it was left
    out as a column of the shadow only)."""
    root = copy_lake(base_lake, tmp_path / "lake")
    ref = TableRef(path=str(root / "target" / "orders_clean"))
    spark.sql(f"ALTER TABLE {ref.sql} ADD COLUMNS (code CHAR(3))")
    before = _version(spark, ref)
    mutate = _loose("* EXCEPT (line_total), line_total AS LINE_TOTAL, 'x' AS CODE")
    assert _run(write_plan(root, mutate, promotion=promotion), root) == EXIT_OK
    assert _version(spark, ref) == before + 1
    window = spark.read.format("delta").load(ref.path).where(F.col("order_date").isin(*WINDOW))
    assert window.count() == 600
    assert [r[0] for r in window.select("code").distinct().collect()] == ["x  "]
    assert window.where("line_total <> CAST(amount * quantity AS DECIMAL(14,2))").count() == 0
    (evidence,) = (root / "evidence").glob("*.yaml")
    (target,) = yaml.safe_load(evidence.read_text())["sparkguard"]["targets"]
    by_column = target["full_window"]["change_preview"]["changed_by_column"]
    assert by_column["line_total"] == by_column["amount"] > 0, by_column


def test_a_shadow_an_earlier_version_wrote_in_the_recomputations_case_is_read_as_the_targets(
        spark: Any, base_lake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dry run by a version that kept the recomputation's names wrote a shadow with
    ``LINE_TOTAL``; the real run reuses its slices (nothing rewrites them) and reads them under
    the target's names, so it promotes and verifies."""
    root = copy_lake(base_lake, tmp_path / "lake")
    ref = TableRef(path=str(root / "target" / "orders_clean"))
    before = _version(spark, ref)
    plan = write_plan(root, _loose("* EXCEPT (line_total), line_total AS LINE_TOTAL"),
                      promotion="merge")
    home, evidence = str(root / "_sg"), str(root / "evidence")
    with monkeypatch.context() as m:
        m.setattr(data, "_target_spelling", lambda _ctx, _st, df: df)
        dry = run_backfill(spark, load_plan(plan), str(plan), home=home, evidence_dir=evidence,
                           out=lambda _m: None, options=RunOptions(dry_run=True))
    assert dry.exit_code == EXIT_OK
    shadow = dry.targets["orders_clean"].shadow
    assert "LINE_TOTAL" in spark.read.format("delta").load(shadow.path).columns
    out = run_backfill(spark, load_plan(plan), str(plan), home=home, evidence_dir=evidence,
                       out=lambda _m: None)
    assert out.exit_code == EXIT_OK, out.message
    assert out.targets["orders_clean"].skipped_slices == (1, 2, 3)
    assert _version(spark, ref) == before + 1
    window = spark.read.format("delta").load(ref.path).where(F.col("order_date").isin(*WINDOW))
    assert window.where("line_total <> CAST(amount * quantity AS DECIMAL(14,2))").count() == 0


@pytest.mark.parametrize("promotion", ["replace_where", "merge_changed"])
def test_a_null_in_a_nested_not_null_field_fails_its_gate_before_any_commit(
        spark: Any, base_lake: Path, tmp_path: Path, promotion: str) -> None:
    """The target's ``addr`` struct declares ``city`` NOT NULL; the recomputation leaves it
    null on the broken rows. Delta refused that at the commit (exit 3, after the whole shadow
    was built, and again on every re-run); the field is a gate on the shadow: each result
    counts exactly the broken rows, and the target keeps its version."""
    from pyspark.sql import types as T

    root = copy_lake(base_lake, tmp_path / "lake")
    ref = TableRef(path=str(root / "target" / "orders_clean"))
    held = root / "held"  # Delta declares a nested NOT NULL only at creation
    spark.read.format("delta").load(ref.path).write.format("delta").save(str(held))
    rows = spark.read.format("delta").load(str(held))
    shutil.rmtree(ref.path)
    builder = DeltaTable.create(spark).location(ref.path).partitionedBy("order_date")
    for f in rows.schema.fields:
        builder = builder.addColumn(f.name, f.dataType)
    builder.addColumn("addr", T.StructType([T.StructField("city", T.StringType(), False),
                                            T.StructField("zip", T.StringType())])).execute()
    rows.withColumn("addr", F.expr("named_struct('city', 'Oslo', 'zip', CAST(NULL AS STRING))")) \
        .write.format("delta").mode("append").save(ref.path)
    before = _version(spark, ref)
    sql = TRANSFORM_SQL.replace("AS line_total\n", "AS line_total,\n       named_struct('city', "
                                f"IF({BROKEN}, CAST(NULL AS STRING), 'Oslo'), 'zip', "
                                "CAST(NULL AS STRING)) AS addr\n")
    assert _run(write_plan(root, set_transform(sql), promotion=promotion), root) == (
        EXIT_GATE_FAILED)
    assert _version(spark, ref) == before
    _counts_broken_rows(spark, root, "nested_not_null[addr.city]")
