"""A whole run per promotion mode and option on the demo lake, change data feed on: the console,
the evidence (YAML and Markdown) and the change feed of the promotion commit agree, rows no
longer produced are "kept" under ``when_not_matched_by_source: keep``, and RESTORE to the
recorded rollback point brings the old content back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sparkguard import delta_ops
from sparkguard.demo import TRANSFORM_SQL, transform_orders
from sparkguard.errors import EXIT_OK
from sparkguard.evidence import load_evidence, render_markdown
from sparkguard.plan import load_plan
from sparkguard.run.evaluator import run_backfill
from sparkguard.run.report import RunOutcome
from sparkguard.sql import TableRef
from tests.lakes import WINDOW, copy_lake, set_transform, write_plan

pytestmark = pytest.mark.spark
EXTRA = 4  # window rows another writer left in the target, which the recomputation lacks


def _sorted(df: DataFrame) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in df.collect())


def _feed(spark: Any, ref: TableRef, version: int) -> dict[str, int]:
    feed = (spark.read.format("delta").option("readChangeFeed", "true")
            .option("startingVersion", version).option("endingVersion", version).load(ref.path))
    return {r["_change_type"]: r["count"] for r in feed.groupBy("_change_type").count().collect()}


@pytest.mark.parametrize(("promotion", "unmatched"), [
    ("merge_changed", "keep"), ("merge_changed", "delete"), ("merge", "keep"),
    ("replace_where", "delete")])
def test_console_evidence_and_change_feed_agree(spark: Any, base_lake: Path, tmp_path: Path,
                                                promotion: str, unmatched: str) -> None:
    root = copy_lake(base_lake, tmp_path / "lake")
    ref = TableRef(path=str(root / "target" / "orders_clean"))
    spark.sql(f"ALTER TABLE {ref.sql} SET TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    src = spark.read.format("delta").load(str(root / "source" / "orders")).limit(EXTRA)
    extra = (transform_orders(spark, src, []).withColumn("order_date", F.lit(WINDOW[1]))
             .withColumn("order_id", F.col("order_id") + 90_000_000))
    extra.write.format("delta").mode("append").save(ref.path)
    # one order moved to the window's first day in the target: the recomputation puts it back
    first = spark.sql(f"SELECT min(order_id) FROM {ref.sql} WHERE order_date = "
                      f"DATE'{WINDOW[1]}'").first()
    assert first is not None
    spark.sql(f"UPDATE {ref.sql} SET order_date = DATE'{WINDOW[0]}' WHERE order_id = {first[0]}")
    before = _sorted(delta_ops.read_table(spark, ref))

    def mutate(plan: dict[str, Any]) -> None:
        if promotion != "replace_where":
            plan["targets"][0]["merge"] = {"when_not_matched_by_source": unmatched}
    plan = write_plan(root, mutate, promotion=promotion)
    lines: list[str] = []
    out = run_backfill(spark, load_plan(plan), str(plan), home=str(root / "_sg"),
                       evidence_dir=str(root / "evidence"), out=lines.append)
    assert out.exit_code == EXIT_OK, out.message
    st = out.targets["orders_clean"]
    assert st.verified and st.promoted_version is not None and st.rollback_version is not None
    assert st.window is not None and st.window.preview is not None
    pv = st.window.preview
    moved = 0 if promotion == "replace_where" else 1  # a MERGE updates the moved key
    assert pv.moved == moved and pv.deleted == EXTRA + 1
    assert pv.inserted > 1 and pv.changed > 0 and pv.unchanged > 0

    feed = _feed(spark, ref, st.promoted_version)
    assert out.evidence_path is not None
    data = load_evidence(out.evidence_path)
    applied = data["sparkguard"]["targets"][0]["change_applied"]
    md = render_markdown(data)
    console = "\n".join(lines)
    kept = unmatched == "keep"
    gone = EXTRA + 1 - moved  # replace_where deletes the moved key's old row too
    assert applied == {"inserted": pv.inserted - moved, "deleted": 0 if kept else gone,
                       "kept": gone if kept else 0, "updated": pv.changed + moved,
                       "unchanged_reported_as_changed":
                           0 if promotion == "merge_changed" else pv.unchanged}
    if kept:
        assert f"{EXTRA} row(s) no longer produced, kept" in console
        assert f"{EXTRA} no longer produced, kept" in md and f"{EXTRA} deleted" not in md
        assert f"0 deleted, {EXTRA} kept" in md
    else:
        assert f"delete {gone}," in console and f" {gone} deleted" in md
    assert ("1 key(s) moved to another partition" in console) == bool(moved)
    window_rows = pv.deleted + pv.changed + pv.unchanged
    if promotion == "replace_where":  # every old window row out, every new one in
        assert feed == {"delete": window_rows, "insert": pv.inserted + pv.changed + pv.unchanged}
    else:
        updated = applied["updated"] + applied["unchanged_reported_as_changed"]
        expected = {"insert": applied["inserted"], "update_preimage": updated,
                    "update_postimage": updated, "delete": applied["deleted"]}
        assert feed == {k: v for k, v in expected.items() if v}
    if promotion == "merge_changed":  # exactly the preview: no row for an unchanged one
        assert sum(feed.values()) == (applied["inserted"] + applied["deleted"]
                                      + 2 * applied["updated"])

    delta_ops.restore(spark, ref, st.rollback_version)
    assert _sorted(delta_ops.read_table(spark, ref)) == before


@pytest.mark.parametrize("promotion", ["merge", "merge_changed"])
def test_a_key_the_target_holds_in_two_partitions_fails_its_gate_before_any_commit(
        spark: Any, base_lake: Path, tmp_path: Path, promotion: str) -> None:
    """The target window holds an order twice, in two partitions; the recomputation once. A
    MERGE on the business key would match and update both rows into duplicates (keep mode: the
    row the preview said was kept is overwritten too). The ``merge_target_keys`` gate counts
    the key across partitions and fails at reconciliation: nothing is committed."""
    root = copy_lake(base_lake, tmp_path / "lake")
    ref = TableRef(path=str(root / "target" / "orders_clean"))
    one = (delta_ops.read_table(spark, ref).filter(F.col("order_date") == F.lit(WINDOW[0]))
           .orderBy("order_id").limit(1))
    (one.withColumn("order_date", F.lit(WINDOW[1])).withColumn("status", F.lit("OTHER"))
     .write.format("delta").mode("append").save(ref.path))
    appended = delta_ops.current_version(spark, ref)
    plan = write_plan(root, lambda p: p["targets"][0].update(
        merge={"when_not_matched_by_source": "keep"}) if promotion == "merge" else None,
        promotion=promotion)
    gate = _merge_keys_gate_failed(spark, root, plan, appended)
    assert gate["measured"] == {
        "duplicate_keys": 1, "in_one_partition": 0, "across_partitions": 1}, gate
    assert "1 in two or more partitions" in gate["reason"]


def _merge_keys_gate_failed(spark: Any, root: Path, plan: Path, version: int) -> dict[str, Any]:
    """Run ``plan``: it fails, the target stays at ``version`` (no promotion, no restore), and
    the evidence's failed ``merge_target_keys`` gate is returned."""
    ref = TableRef(path=str(root / "target" / "orders_clean"))
    out = run_backfill(spark, load_plan(plan), str(plan), home=str(root / "_sg"),
                       evidence_dir=str(root / "evidence"), out=lambda _m: None)
    assert out.exit_code == 1, out.message
    assert delta_ops.current_version(spark, ref) == version
    assert not out.targets["orders_clean"].restored and out.evidence_path is not None
    gates = load_evidence(out.evidence_path)["sparkguard"]["gates"]
    (gate,) = [g for g in gates if g["gate"] == "merge_target_keys"]
    assert not gate["passed"], gate
    return dict(gate)


def test_a_key_the_target_holds_twice_in_a_partition_fails_its_gate_before_any_commit(
        spark: Any, base_lake: Path, tmp_path: Path) -> None:
    """The target's window holds an order twice in its own partition (an earlier run appended
    it twice), the recomputation once. A MERGE would update both copies and keep the duplicate:
    the ``merge_target_keys`` gate fails at reconciliation and nothing is committed; the same
    lake promoted with replace_where repairs it."""
    root = copy_lake(base_lake, tmp_path / "lake")
    ref = TableRef(path=str(root / "target" / "orders_clean"))
    (delta_ops.read_table(spark, ref).filter(F.col("order_date") == F.lit(WINDOW[1]))
     .orderBy("order_id").limit(1).write.format("delta").mode("append").save(ref.path))
    appended = delta_ops.current_version(spark, ref)
    gate = _merge_keys_gate_failed(spark, root, write_plan(root, promotion="merge_changed"),
                                   appended)
    assert gate["measured"] == {
        "duplicate_keys": 1, "in_one_partition": 1, "across_partitions": 0}, gate
    assert "replace_where" in gate["reason"]
    fixed = write_plan(root, name="plan-replace.yaml")
    out = run_backfill(spark, load_plan(fixed), str(fixed), home=str(root / "_sg"),
                       evidence_dir=str(root / "evidence"), out=lambda _m: None)
    assert out.exit_code == EXIT_OK, out.message
    window = delta_ops.read_table(spark, ref).filter(F.col("order_date") == F.lit(WINDOW[1]))
    assert window.groupBy("order_id").count().filter(F.col("count") > 1).count() == 0


def _promoted_with(spark: Any, root: Path, promotion: str, columns: str
                   ) -> tuple[RunOutcome, dict[str, int]]:
    """A run of the demo plan whose transform also outputs ``columns`` (SQL select items),
    promoted and verified; (its outcome, the preview's changed keys per column)."""
    sql = TRANSFORM_SQL.replace("AS line_total\n", f"AS line_total,\n       {columns}\n")
    plan = write_plan(root, set_transform(sql), promotion=promotion)
    out = run_backfill(spark, load_plan(plan), str(plan), home=str(root / "_sg"),
                       evidence_dir=str(root / "evidence"), out=lambda _m: None)
    assert out.exit_code == EXIT_OK, out.message
    st = out.targets["orders_clean"]
    assert st.verified and st.window is not None and st.window.preview is not None
    return out, st.window.preview.changed_by_column


@pytest.mark.parametrize("promotion", ["merge_changed", "replace_where"])
def test_a_variant_column_is_reconciled_promoted_and_verified(
        spark: Any, base_lake: Path, tmp_path: Path, promotion: str) -> None:
    """A target with a VARIANT column (semi-structured attributes, a quote in a value): the
    recomputation changes it on some rows; the preview counts them, the promotion writes them
    (merge_changed: only those), and the evidence holds the sampled values as JSON text."""
    root = copy_lake(base_lake, tmp_path / "lake")
    ref = TableRef(path=str(root / "target" / "orders_clean"))
    spark.sql(f"ALTER TABLE {ref.sql} SET TBLPROPERTIES ('delta.feature.variantType' = "
              "'supported')")
    spark.sql(f"ALTER TABLE {ref.sql} ADD COLUMNS (attrs VARIANT)")
    spark.sql(f"UPDATE {ref.sql} SET attrs = parse_json(to_json(named_struct("
              "'status', status, 'note', 'it\\'s')))")
    out, by_column = _promoted_with(spark, root, promotion, (
        "parse_json(to_json(named_struct('status', status, 'note', "
        "CASE WHEN order_id % 2 = 0 THEN 'it\\'s' ELSE 'changed' END))) AS attrs"))
    assert by_column["attrs"] > 0
    assert out.evidence_path is not None
    text = Path(out.evidence_path).read_text(encoding="utf-8")
    assert '\\"note\\":\\"changed\\"' in text or '"note":"changed"' in text, text[:2000]
    odd = spark.sql(f"SELECT count(*) FROM {ref.sql} WHERE order_id % 2 = 1 AND "
                    f"order_date BETWEEN DATE'{WINDOW[0]}' AND DATE'{WINDOW[-1]}' AND "
                    "variant_get(attrs, '$.note', 'string') = 'changed'").first()
    assert odd is not None and odd[0] > 0


@pytest.mark.parametrize("promotion", ["merge_changed", "replace_where"])
def test_struct_array_binary_and_char_columns_are_promoted_and_sampled(
        spark: Any, base_lake: Path, tmp_path: Path, promotion: str) -> None:
    """Columns of types the demo lacks: a struct holding binary, an array of structs, binary, and
    CHAR(3) (Delta pads it; the recomputation gives shorter strings). Some rows change in each;
    the run promotes and verifies, and the evidence holds the sampled values as plain data."""
    root = copy_lake(base_lake, tmp_path / "lake")
    ref = TableRef(path=str(root / "target" / "orders_clean"))
    spark.sql(f"ALTER TABLE {ref.sql} ADD COLUMNS (info STRUCT<a: STRING, b: BINARY>, "
              "tags ARRAY<STRUCT<k: STRING, v: INT>>, raw BINARY, code CHAR(3))")
    spark.sql(f"UPDATE {ref.sql} SET info = named_struct('a', status, 'b', X'00FF'), "
              "tags = array(named_struct('k', currency, 'v', quantity)), raw = X'0A0B', "
              "code = 'ab'")
    even = "order_id % 2 = 0"
    extra = (f"named_struct('a', status, 'b', IF({even}, X'00FF', X'01')) AS info, "
             f"array(named_struct('k', UPPER(currency), 'v', IF({even}, quantity, -1))) AS tags, "
             f"IF({even}, X'0A0B', X'0C') AS raw, IF({even}, 'ab', 'x') AS code")
    out, by_column = _promoted_with(spark, root, promotion, extra)
    assert by_column["code"] == by_column["raw"] == by_column["info"] == by_column["tags"] > 0, \
        by_column
    assert out.evidence_path is not None
    data = load_evidence(out.evidence_path)
    sample = data["sparkguard"]["targets"][0]["full_window"]["change_preview"]["sample"]
    changed = next(e for e in sample if e["kind"] == "change" and "raw" in e["changed_columns"])
    assert changed["before"]["raw"] == "Cgs=" and changed["after"]["raw"] == "DA=="  # base64
    assert changed["after"]["info"]["b"] == "AQ==" and changed["after"]["tags"][0]["v"] == -1
    assert changed["before"]["code"] == "ab " and changed["after"]["code"] == "x  "
    codes = {r[0] for r in spark.sql(f"SELECT DISTINCT code FROM {ref.sql} WHERE order_date "
                                     f"BETWEEN DATE'{WINDOW[0]}' AND DATE'{WINDOW[-1]}'").collect()}
    assert codes == {"ab ", "x  "}


@pytest.mark.parametrize("promotion", ["merge_changed", "replace_where"])
def test_a_column_mapping_target_with_a_space_in_a_column_name(
        spark: Any, base_lake: Path, tmp_path: Path, promotion: str) -> None:
    """A target with column mapping (``name``) whose column was renamed to ``line total``: the
    shadow gets column mapping too, and the run promotes and verifies."""
    root = copy_lake(base_lake, tmp_path / "lake")
    ref = TableRef(path=str(root / "target" / "orders_clean"))
    spark.sql(f"ALTER TABLE {ref.sql} SET TBLPROPERTIES ('delta.columnMapping.mode' = 'name', "
              "'delta.minReaderVersion' = '2', 'delta.minWriterVersion' = '5')")
    spark.sql(f"ALTER TABLE {ref.sql} RENAME COLUMN line_total TO `line total`")
    sql = TRANSFORM_SQL.replace("AS line_total", "AS `line total`")

    def mutate(plan: dict[str, Any]) -> None:  # a metric expression cannot name that column
        set_transform(sql)(plan)  # (plans refuse backquotes in expressions)
        plan["validation"]["checks"] = [c for c in plan["validation"]["checks"]
                                        if c.get("shadow_expr") != "line_total"]
    plan = write_plan(root, mutate, promotion=promotion)
    out = run_backfill(spark, load_plan(plan), str(plan), home=str(root / "_sg"),
                       evidence_dir=str(root / "evidence"), out=lambda _m: None)
    assert out.exit_code == EXIT_OK, out.message
    assert out.targets["orders_clean"].verified
    src = spark.read.format("delta").load(str(root / "source" / "orders"))
    expected = transform_orders(spark, src, []).withColumnRenamed("line_total", "line total")
    assert _sorted(delta_ops.read_table(spark, ref)) == _sorted(expected)
