"""Change-aware promotion (``promotion: merge_changed``) on real Delta tables: the change data
feed of the promotion commit holds exactly the change preview's inserts, deletes and updates
(nothing for unchanged rows), deletion vectors are used where enabled, verification and RESTORE
still hold, and the data shapes the demo lacks (nulls, NaN, odd column names) count right."""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame
from pyspark.sql import types as T

from sparkguard import delta_ops
from sparkguard.reconcile.engine import reconcile
from sparkguard.reconcile.spec import ReconcileSpec
from sparkguard.run.data import fingerprints
from sparkguard.sql import PartitionType, TableRef, window_predicate

pytestmark = pytest.mark.spark

D1, D2, OUT = dt.date(2026, 5, 2), dt.date(2026, 5, 3), dt.date(2026, 5, 1)
NAN = float("nan")
SCHEMA = T.StructType([
    T.StructField("k", T.IntegerType()), T.StructField("p", T.DateType()),
    T.StructField("s", T.StringType()), T.StructField("x", T.DoubleType()),
    T.StructField("amount-eur", T.IntegerType()), T.StructField("note$ü", T.StringType()),
])
# target rows (k, p, s, x, amount-eur, note$ü); OUT is outside the window
BEFORE = [
    (1, D1, None, 1.0, 10, "a"),          # unchanged, null -> null
    (2, D1, "it's", NAN, 20, "b"),        # unchanged, NaN -> NaN, a quote
    (3, D1, None, 3.0, 30, "c"),          # null -> value: changed
    (4, D1, "x", 4.0, None, "d"),         # value -> null elsewhere: changed
    (5, D2, "y", NAN, 50, "e"),           # NaN -> number: changed
    (6, D2, "z", 6.0, 60, "f"),           # gone from the recomputation: deleted (or kept)
    (7, D2, "w", -0.0, 70, 'q"uote'),     # -0.0 -> 0.0: equal in Spark, unchanged
    (8, D2, "v", 8.0, 80, "g"),           # odd-named column changes
    (9, OUT, "o", 9.0, 90, "h"),          # outside the window: never touched
]
AFTER = [
    (1, D1, None, 1.0, 10, "a"),
    (2, D1, "it's", NAN, 20, "b"),
    (3, D1, "now", 3.0, 30, "c"),
    (4, D1, "x", 4.0, 41, "d"),
    (5, D2, "y", 5.0, 50, "e"),
    (7, D2, "w", 0.0, 70, 'q"uote'),
    (8, D2, "v", 8.0, 80, "g2"),
    (10, D1, None, NAN, None, None),     # inserted, all nulls
    (11, D2, "new", 11.0, 110, "i"),     # inserted
]
WINDOW = [D1, D2]
SPEC = ReconcileSpec(partition_column="p", partition_type=PartitionType.DATE,
                     business_keys=("k",))


def _table(spark: Any, path: Path, rows: list[tuple[Any, ...]], **props: str) -> TableRef:
    df = spark.createDataFrame(rows, SCHEMA).coalesce(1)
    writer = df.write.format("delta").partitionBy("p")
    for key, value in {"delta.enableChangeDataFeed": "true", **props}.items():
        writer = writer.option(key, value)
    writer.save(str(path))
    return TableRef(path=str(path))


def _window(df: DataFrame) -> DataFrame:
    return df.filter(window_predicate("p", PartitionType.DATE, WINDOW))


def _changes(spark: Any, ref: TableRef, version: int) -> dict[str, list[int]]:
    """Keys per change type in the change data feed of one commit."""
    feed = (spark.read.format("delta").option("readChangeFeed", "true")
            .option("startingVersion", version).option("endingVersion", version).load(ref.path))
    out: dict[str, list[int]] = {}
    for r in feed.select("k", "_change_type").collect():
        out.setdefault(r["_change_type"], []).append(r["k"])
    return {kind: sorted(keys) for kind, keys in out.items()}


def _metrics(spark: Any, ref: TableRef, version: int) -> dict[str, int]:
    commit = delta_ops.history(spark, ref).filter(f"version = {version}").first()
    assert commit is not None
    return {k: int(v) for k, v in commit["operationMetrics"].items() if v.isdigit()}


def _rows(df: DataFrame) -> list[tuple[Any, ...]]:
    """Rows as comparable tuples (NaN as a marker, since NaN != NaN in Python)."""
    def norm(v: Any) -> Any:
        return "NaN" if isinstance(v, float) and math.isnan(v) else v
    return sorted((tuple(norm(v) for v in r) for r in df.collect()), key=repr)


def _promote(spark: Any, ref: TableRef, shadow: DataFrame, delete: bool,
             changed_only: bool = True) -> int:
    """Promote as a run does (userMetadata and a txn); the new version."""
    delta_ops.promote_merge(spark, shadow, ref, ["k"],
                            window_predicate("p", PartitionType.DATE, WINDOW, alias="t"),
                            delete, '{"sparkguard": {"test": true}}', ("sparkguard-test", 1),
                            changed_only=changed_only)
    return delta_ops.current_version(spark, ref)


@pytest.mark.parametrize("unmatched", ["delete", "keep"])
def test_change_feed_holds_exactly_the_preview(spark: Any, lake: Path, unmatched: str) -> None:
    ref = _table(spark, lake / "t", BEFORE)
    shadow = spark.createDataFrame(AFTER, SCHEMA)
    before_version = delta_ops.current_version(spark, ref)
    preview = reconcile(SPEC, shadow=shadow, target=_window(delta_ops.read_table(spark, ref)),
                        partitions=WINDOW, scope="window").preview
    assert preview is not None
    # the preview's own view of the data shapes: null -> null, NaN -> NaN, -0.0 -> 0.0 unchanged
    assert (preview.inserted, preview.deleted, preview.changed, preview.unchanged) == (2, 1, 4, 3)

    outside = set(delta_ops.read_table(spark, ref).filter("p = DATE'2026-05-01'").inputFiles())
    version = _promote(spark, ref, shadow, delete=unmatched == "delete")
    assert version == before_version + 1  # one commit
    m = _metrics(spark, ref, version)
    # only the two window files holding changes are rewritten, copying their 3 unchanged rows
    # (with keep, the kept row is copied too)
    assert (m["numTargetFilesRemoved"], m["numTargetRowsCopied"]) == \
        (2, 3 if unmatched == "delete" else 4)
    assert set(delta_ops.read_table(spark, ref).filter("p = DATE'2026-05-01'")
               .inputFiles()) == outside
    feed = _changes(spark, ref, version)
    expected = {"insert": [10, 11], "update_preimage": [3, 4, 5, 8],
                "update_postimage": [3, 4, 5, 8]}
    if unmatched == "delete":
        expected["delete"] = [6]
    assert feed == expected
    assert len(feed["insert"]) == preview.inserted
    assert len(feed["update_postimage"]) == preview.changed
    assert len(feed.get("delete", [])) == (preview.deleted if unmatched == "delete" else 0)

    after = delta_ops.read_table(spark, ref)
    kept = [r for r in BEFORE if r[0] == 6] if unmatched == "keep" else []
    assert _rows(_window(after)) == _rows(spark.createDataFrame(AFTER + kept, SCHEMA))
    assert _rows(after.filter("p = DATE'2026-05-01'")) == _rows(
        spark.createDataFrame([BEFORE[-1]], SCHEMA))
    if unmatched == "delete":  # verification after promotion: the window equals the shadow
        window_h, shadow_h = fingerprints(_window(after), shadow)
        assert window_h == shadow_h


def test_plain_merge_reports_every_matched_row(spark: Any, lake: Path) -> None:
    """The baseline the new mode improves on: ``merge`` rewrites unchanged rows as updates."""
    ref = _table(spark, lake / "t", BEFORE)
    version = _promote(spark, ref, spark.createDataFrame(AFTER, SCHEMA), delete=True,
                       changed_only=False)
    assert _changes(spark, ref, version)["update_postimage"] == [1, 2, 3, 4, 5, 7, 8]


def test_nothing_changed_writes_no_row(spark: Any, lake: Path) -> None:
    ref = _table(spark, lake / "t", BEFORE)
    same = spark.createDataFrame([r for r in BEFORE if r[1] != OUT], SCHEMA)
    before = delta_ops.current_version(spark, ref)
    version = _promote(spark, ref, same, delete=True)
    # a MERGE of no rows still commits (with the run's metadata), so a resumed run finds it
    assert version == before + 1
    assert _changes(spark, ref, version) == {}
    commit = delta_ops.history(spark, ref).filter(f"version = {version}").first()
    assert commit is not None and commit["userMetadata"] == '{"sparkguard": {"test": true}}'
    m = _metrics(spark, ref, version)
    assert m.get("numFiles", 0) == m.get("numOutputRows", 0) == m.get("numTargetRowsCopied", 0) == 0
    assert m.get("numTargetFilesAdded", 0) == m.get("numTargetFilesRemoved", 0) == 0


def test_only_keys_no_other_column(spark: Any, lake: Path) -> None:
    """A table of keys and partition only: nothing can change, rows are inserted or deleted."""
    schema = T.StructType([T.StructField("k", T.IntegerType()), T.StructField("p", T.DateType())])
    path = str(lake / "keys")
    (spark.createDataFrame([(1, D1), (2, D1)], schema).write.format("delta")
     .option("delta.enableChangeDataFeed", "true").save(path))
    ref = TableRef(path=path)
    version = _promote(spark, ref, spark.createDataFrame([(1, D1), (3, D1)], schema), delete=True)
    # the partition column is compared like any non-key column: key 1 stays in D1, unchanged
    assert _changes(spark, ref, version) == {"insert": [3], "delete": [2]}


def test_backquotes_and_dots_in_column_names(spark: Any, lake: Path) -> None:
    """The MERGE itself takes any column name Delta allows (a backquote, a dot); the
    reconciliation engine reads columns by plain name, so such names stop a run earlier. (No
    change data feed here: Delta 4.0's CDF writer fails on a backquote in a column name.)"""
    schema = T.StructType([T.StructField("k", T.IntegerType()), T.StructField("p", T.DateType()),
                           T.StructField("we`ird.name", T.StringType())])
    path = str(lake / "odd")
    (spark.createDataFrame([(1, D1, "a"), (2, D1, "b"), (3, D1, None)], schema).write
     .format("delta").save(path))
    ref = TableRef(path=path)
    new = spark.createDataFrame([(1, D1, "a"), (2, D1, "B"), (3, D1, None)], schema)
    version = _promote(spark, ref, new, delete=True)
    m = _metrics(spark, ref, version)
    assert (m["numTargetRowsUpdated"], m["numTargetRowsInserted"], m["numTargetRowsDeleted"]) \
        == (1, 0, 0)
    assert _rows(delta_ops.read_table(spark, ref)) == _rows(new)


def test_deletion_vectors_verify_and_restore(spark: Any, lake: Path) -> None:
    rows = [(k, D1 if k % 2 else D2, f"s{k}", float(k), k, "n") for k in range(1, 2001)]
    ref = _table(spark, lake / "dv", rows, **{"delta.enableDeletionVectors": "true"})
    rollback = delta_ops.current_version(spark, ref)
    old = _rows(delta_ops.read_table(spark, ref))
    changed = {r[0]: (r[0], r[1], r[2] + "!", r[3], r[4], r[5]) for r in rows if r[0] % 100 == 0}
    new = [changed.get(r[0], r) for r in rows if r[0] != 7] + [(5000, D1, "new", 0.0, 0, "n")]
    shadow = spark.createDataFrame(new, SCHEMA)
    version = _promote(spark, ref, shadow, delete=True)

    m = _metrics(spark, ref, version)
    assert m["numTargetRowsUpdated"] == 20 and m["numTargetRowsDeleted"] == 1
    assert m["numTargetRowsInserted"] == 1
    assert m["numTargetDeletionVectorsAdded"] >= 1  # rows marked deleted, files kept
    assert m["numTargetFilesRemoved"] == 0  # no data file rewritten
    feed = _changes(spark, ref, version)
    assert len(feed["update_postimage"]) == 20 and feed["delete"] == [7]
    assert feed["insert"] == [5000]

    window_h, shadow_h = fingerprints(_window(delta_ops.read_table(spark, ref)), shadow)
    assert window_h == shadow_h  # the run's verification holds
    delta_ops.restore(spark, ref, rollback)
    assert _rows(delta_ops.read_table(spark, ref)) == old


def test_variant_and_map_columns_compare_as_json(spark: Any, lake: Path) -> None:
    """VARIANT columns, which ``<=>`` cannot compare, compare as their JSON text like maps: a
    variant whose object keys merely come in another order is the same value, and only the rows
    whose variant or map changed are updated."""
    path = str(lake / "variant")
    spark.sql(f"CREATE TABLE delta.`{path}` (k INT, p DATE, v VARIANT, a ARRAY<VARIANT>, "
              "m MAP<STRING, INT>) USING delta PARTITIONED BY (p) "
              "TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    rows = ("(1, DATE'2026-05-02', parse_json('{{\"a\": 1, \"b\": [1, 2]}}'), "
            "array(parse_json('1')), map('x', 1)), "
            "(2, DATE'2026-05-02', parse_json('{{\"a\": {b}}}'), array(parse_json('\"s\"')), "
            "map('x', 2)), "
            "(3, DATE'2026-05-03', parse_json('null'), NULL, map('y', {m})), "
            "(4, DATE'2026-05-03', NULL, array(parse_json('{{\"q\": \"it\\'s\"}}')), NULL)")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES " + rows.format(b=2, m=3))
    ref = TableRef(path=path)
    new = spark.sql("SELECT * FROM VALUES " + rows.format(b=20, m=30).replace(
        "'{\"a\": 1, \"b\": [1, 2]}'", "'{\"b\": [1, 2], \"a\": 1}'") + " AS s(k, p, v, a, m)")
    version = _promote(spark, ref, new, delete=True)
    assert _changes(spark, ref, version) == {"update_preimage": [2, 3],
                                             "update_postimage": [2, 3]}
    got = spark.sql(f"SELECT k, to_json(v) v, to_json(a) a, m['y'] y FROM delta.`{path}` "
                    "ORDER BY k").collect()
    assert [(r["k"], r["v"], r["a"], r["y"]) for r in got] == [
        (1, '{"a":1,"b":[1,2]}', "[1]", None), (2, '{"a":20}', '["s"]', None),
        (3, "null", None, 30), (4, None, '[{"q":"it\'s"}]', None)]


def test_a_nested_variant_null_is_not_a_sql_null(spark: Any, lake: Path) -> None:
    """A variant holding JSON ``null`` replacing a SQL null inside an array or a map is a
    change (a JSON rendering of the whole value writes both ``null``): the change set updates
    it, so the promotion verifies, instead of skipping it and failing verification forever."""
    path = str(lake / "vnull")
    spark.sql(f"CREATE TABLE delta.`{path}` (k INT, p DATE, a ARRAY<VARIANT>, "
              "m MAP<STRING, VARIANT>) USING delta PARTITIONED BY (p) "
              "TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    row = "({k}, DATE'2026-05-02', array({a}), map('x', {m}))"
    null, jnull = "CAST(NULL AS VARIANT)", "parse_json('null')"
    spark.sql(f"INSERT INTO delta.`{path}` VALUES " + ", ".join(
        row.format(k=k, a=null, m=null) for k in (1, 2, 3)))
    new = spark.sql("SELECT * FROM VALUES " + ", ".join(
        [row.format(k=1, a=jnull, m=null), row.format(k=2, a=null, m=jnull),
         row.format(k=3, a=null, m=null)]) + " AS s(k, p, a, m)")
    ref = TableRef(path=path)
    version = _promote(spark, ref, new, delete=True)
    assert _changes(spark, ref, version) == {"update_preimage": [1, 2],
                                             "update_postimage": [1, 2]}
    got = spark.sql(f"SELECT k, a[0] IS NULL, m['x'] IS NULL FROM delta.`{path}` ORDER BY k")
    assert [tuple(r) for r in got.collect()] == [(1, False, True), (2, True, False),
                                                 (3, True, True)]


def test_map_timestamps_and_collated_text_compare_exactly(spark: Any, lake: Path) -> None:
    """A change of microseconds in a map's timestamp (JSON's default format stops at
    milliseconds) and a change of case in ``UTF8_LCASE`` text, at the top or in a struct (the
    collation compares case-blind), are changes: each such row is updated, the unchanged one is
    not. Collated Delta tables exist on Databricks; this open-source Delta makes them only with
    its type check off, as here."""
    path = str(lake / "exact")
    spark.conf.set("spark.databricks.delta.schema.typeCheck.enabled", "false")
    try:
        spark.sql(f"CREATE TABLE delta.`{path}` (k INT, p DATE, m MAP<STRING, TIMESTAMP>, "
                  "n MAP<STRING, TIMESTAMP_NTZ>, c STRING COLLATE UTF8_LCASE, "
                  "st STRUCT<a: STRING COLLATE UTF8_LCASE>) USING delta PARTITIONED BY (p) "
                  "TBLPROPERTIES (delta.enableChangeDataFeed = true)")
        row = ("({k}, DATE'2026-05-02', map('t', TIMESTAMP'2026-05-02 10:00:00.{m}+00:00'), "
               "map('t', TIMESTAMP_NTZ'2026-05-02 23:59:59.{n}'), '{c}', named_struct('a', '{a}'))")
        base = {"m": "123000", "n": "999000", "c": "abc", "a": "x"}
        old = [row.format(k=k, **base) for k in range(1, 6)]
        spark.sql(f"INSERT INTO delta.`{path}` VALUES {', '.join(old)}")
        fixes = [{}, {"m": "123456"}, {"n": "999999"}, {"c": "ABC"}, {"a": "X"}]
        new = spark.sql("SELECT * FROM VALUES " + ", ".join(
            row.format(k=k, **{**base, **fix}) for k, fix in enumerate(fixes, 1))
            + " AS s(k, p, m, n, c, st)")
        ref = TableRef(path=path)
        version = _promote(spark, ref, new, delete=True)
        assert _changes(spark, ref, version) == {"update_preimage": [2, 3, 4, 5],
                                                 "update_postimage": [2, 3, 4, 5]}
        got = spark.sql(f"SELECT k, date_format(m['t'], 'SSSSSS') m, "
                        f"date_format(n['t'], 'SSSSSS') n, collate(c, 'UTF8_BINARY') c, "
                        f"collate(st.a, 'UTF8_BINARY') a FROM delta.`{path}` ORDER BY k").collect()
        assert [tuple(r) for r in got] == [
            (1, "123000", "999000", "abc", "x"), (2, "123456", "999000", "abc", "x"),
            (3, "123000", "999999", "abc", "x"), (4, "123000", "999000", "ABC", "x"),
            (5, "123000", "999000", "abc", "X")]
    finally:
        spark.conf.unset("spark.databricks.delta.schema.typeCheck.enabled")


def test_the_change_set_casts_only_what_the_merge_casts_and_the_gates_cover(spark: Any) -> None:
    """The change set compares a column of another type cast to the target's (a wider number,
    a struct whose field is text), but not a map (compared as JSON), a struct whose fields
    would pair otherwise than by name, or text that differs only in collation: cast to
    ``UTF8_LCASE``, 'ABC' would compare equal to 'abc' and the change would be skipped
    (collated Delta tables exist on Databricks; this open-source Delta refuses them)."""
    from sparkguard.delta_ops.changes import _as_written

    target = spark.sql(
        "SELECT 1L AS n, named_struct('a', CAST(1 AS DECIMAL(10,2)), 'b', 'x') AS st, "
        "map('k', 1L) AS m, named_struct('b', 'x', 'a', 1L) AS swapped, "
        "collate('abc', 'UTF8_LCASE') AS s")
    df = spark.sql(
        "SELECT 1 AS n, named_struct('a', '1.00', 'b', 'x') AS st, map('k', 1) AS m, "
        "named_struct('a', 1L, 'b', 'x') AS swapped, 'ABC' AS s")
    out = _as_written(df, target).schema
    assert out["n"].dataType == T.LongType()
    assert out["st"].dataType.simpleString() == "struct<a:decimal(10,2),b:string>"
    assert out["m"].dataType == df.schema["m"].dataType
    assert out["swapped"].dataType == df.schema["swapped"].dataType
    assert out["s"].dataType == T.StringType()  # binary: a change of case stays a change
