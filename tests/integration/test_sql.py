"""Every SQL string sparkguard emits for a plan, asserted exactly (no Spark), plus one Spark
test proving that a hostile string partition value selects nothing extra on a real table."""

from __future__ import annotations

import datetime as dt

import pytest

from sparkguard.sql import (
    PartitionType,
    TableRef,
    UnsafeSQLError,
    check_expression,
    merge_condition,
    parse_partition_value,
    quote_identifier,
    render_literal,
    restore_statement,
    window_predicate,
)

HOSTILE = "2026-05-01' OR '1'='1"


# -- identifiers --------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "quoted"), [
    ("orders", "`orders`"),
    ("silver.orders_clean", "`silver`.`orders_clean`"),
    ("main.silver.orders", "`main`.`silver`.`orders`"),
    ("_x1", "`_x1`"),
])
def test_quote_identifier_quotes_each_part(name, quoted):
    assert quote_identifier(name) == quoted


@pytest.mark.parametrize("name", [
    "", "a`b", "orders`; DROP TABLE t; --", "a b", "1abc", "a.b.c.d", "a..b", "a;b", "a--b",
    "a/*x*/", "a'b", 'a"b', "a\\b", "ordérs", "a\nb", "a.", ".a", "x" * 129,
])
def test_quote_identifier_rejects_anything_but_plain_names(name):
    with pytest.raises(UnsafeSQLError):
        quote_identifier(name)


def test_table_ref_sql_for_names_and_paths():
    assert TableRef.parse("silver.orders").sql == "`silver`.`orders`"
    assert TableRef.parse("/lake/t").sql == "delta.`/lake/t`"
    assert TableRef.parse("s3://bucket/lake/t").sql == "delta.`s3://bucket/lake/t`"
    assert TableRef.parse("dbfs:/mnt/t").path == "dbfs:/mnt/t"
    # a part in backquotes may hold a hyphen (Unity Catalog's `my-workspace` catalogs)
    assert TableRef.parse("`my-ws`.sales.orders").sql == "`my-ws`.`sales`.`orders`"
    assert TableRef.parse("silver.`orders`").sql == "`silver`.`orders`"
    assert TableRef.parse("`dev-2`.`sales-eu`.`orders-v2`").name == "`dev-2`.`sales-eu`.`orders-v2`"


@pytest.mark.parametrize("dataset", [
    "/lake/t`; DROP TABLE x", "/lake/t'", '/lake/"t', "/lake/t;x", "/lake/t\\x", "/lake/\nx",
    "s3://b/`x`", "silver.orders; DROP TABLE x", "", "   ",
    "silver.orders -- c", "silver.orders/*c*/",
    # backquoted parts: a hyphen is all they add
    "silver.`ord`ers`", "`a;b`.c", "`a b`.c", "`a.b`.c", "`a``b`.c", "silver.`orders`x",
    "``.t", "`a`-b.c", "a-b.c", "`a`.`b`.`c`.`d`", "`a'b`.c", "`" + "x" * 256 + "`.t",
    "`a\nb`.c", "`ördérs`.t", "`a`.b.",
])
def test_table_ref_rejects_quotes_backquotes_semicolons_comments(dataset):
    with pytest.raises(UnsafeSQLError):
        TableRef.parse(dataset)


def test_restore_statement_exact_text():
    assert restore_statement(TableRef.parse("silver.orders"), 12) == \
        "RESTORE TABLE `silver`.`orders` TO VERSION AS OF 12"
    assert restore_statement(TableRef.parse("/lake/t"), 0) == \
        "RESTORE TABLE delta.`/lake/t` TO VERSION AS OF 0"


@pytest.mark.parametrize("version", [-1, True, "3", 1.0, "3; DROP TABLE x"])
def test_restore_statement_refuses_non_integer_versions(version):
    with pytest.raises(UnsafeSQLError):
        restore_statement(TableRef.parse("t"), version)  # type: ignore[arg-type]


def test_merge_condition_exact_text():
    assert merge_condition(["order_id", "line_no"]) == \
        "`t`.`order_id` <=> `s`.`order_id` AND `t`.`line_no` <=> `s`.`line_no`"
    with pytest.raises(UnsafeSQLError):
        merge_condition(["id`) OR (1=1"])
    with pytest.raises(UnsafeSQLError):
        merge_condition([])


# -- typed literals and the window predicate -------------------------------------------------

@pytest.mark.parametrize(("value", "ptype", "sql"), [
    ("2026-05-01", PartitionType.DATE, "DATE'2026-05-01'"),
    (dt.date(2026, 5, 1), PartitionType.DATE, "DATE'2026-05-01'"),
    (dt.datetime(2026, 5, 1, 13, 0), PartitionType.DATE, "DATE'2026-05-01'"),
    (42, PartitionType.INT, "42"),
    ("-7", PartitionType.INT, "-7"),
    ("EU", PartitionType.STRING, "'EU'"),
    ("2026-05-01", PartitionType.STRING, "'2026-05-01'"),
    ("a b/c:d=e+f@g,h.i_j-k", PartitionType.STRING, "'a b/c:d=e+f@g,h.i_j-k'"),
    ("", PartitionType.STRING, "''"),
    (HOSTILE, PartitionType.STRING,
     "CAST(X'323032362D30352D303127204F52202731273D2731' AS STRING)"),
    ("x\\' OR 1=1 --", PartitionType.STRING,
     "CAST(X'785C27204F5220313D31202D2D' AS STRING)"),
    ("a;b", PartitionType.STRING, "CAST(X'613B62' AS STRING)"),
    ("`x`", PartitionType.STRING, "CAST(X'607860' AS STRING)"),
    ("café", PartitionType.STRING, "CAST(X'636166C3A9' AS STRING)"),
])
def test_render_literal_exact_text(value, ptype, sql):
    assert render_literal(value, ptype) == sql


@pytest.mark.parametrize(("value", "ptype"), [
    (HOSTILE, PartitionType.DATE),
    ("2026-02-30", PartitionType.DATE),
    ("2026-5-1", PartitionType.DATE),
    ("\u0662\u0660\u0662\u0666-\u0660\u0665-\u0660\u0661", PartitionType.DATE),  # Arabic-Indic digits
    ("1; DROP TABLE t", PartitionType.INT),
    ("1 OR 1=1", PartitionType.INT),
    (True, PartitionType.INT),
    (2**63, PartitionType.INT),
    ("99999999999999999999", PartitionType.INT),
    (1.5, PartitionType.INT),
    ("a\nb", PartitionType.STRING),
    ("a\x00b", PartitionType.STRING),
    (None, PartitionType.STRING),
    (1.5, PartitionType.STRING),
])
def test_partition_values_that_are_not_literals_of_the_type_are_rejected(value, ptype):
    with pytest.raises(UnsafeSQLError):
        render_literal(value, ptype)


def test_window_predicate_exact_text_sorted_and_deduplicated():
    days = ["2026-05-03", dt.date(2026, 5, 1), "2026-05-03", dt.date(2026, 5, 2)]
    assert window_predicate("order_date", PartitionType.DATE, days) == \
        "`order_date` IN (DATE'2026-05-01', DATE'2026-05-02', DATE'2026-05-03')"
    assert window_predicate("order_date", PartitionType.DATE, days[:1], alias="t") == \
        "`t`.`order_date` IN (DATE'2026-05-03')"
    assert window_predicate("bucket", PartitionType.INT, [10, "9", 9]) == "`bucket` IN (9, 10)"
    assert window_predicate("region", PartitionType.STRING, ["EU", HOSTILE]) == \
        "`region` IN (" + render_literal(HOSTILE, PartitionType.STRING) + ", 'EU')"


def test_window_predicate_refuses_hostile_columns_and_empty_windows():
    with pytest.raises(UnsafeSQLError):
        window_predicate("d` IN (1) OR 1=1 OR `d", PartitionType.DATE, ["2026-05-01"])
    with pytest.raises(UnsafeSQLError):
        window_predicate("d", PartitionType.DATE, ["2026-05-01"], alias="t`")
    with pytest.raises(UnsafeSQLError):
        window_predicate("d", PartitionType.DATE, [])


def test_parse_partition_value_types():
    assert parse_partition_value("2026-05-01", PartitionType.DATE) == dt.date(2026, 5, 1)
    assert parse_partition_value("12", PartitionType.INT) == 12
    assert parse_partition_value(dt.date(2026, 5, 1), PartitionType.STRING) == "2026-05-01"
    assert parse_partition_value(5, PartitionType.STRING) == "5"


# -- expressions -----------------------------------------------------------------------------

@pytest.mark.parametrize("expr", [
    "amount", "amount * quantity", "CASE WHEN status = 'paid' THEN amount END",
    "EXTRACT(YEAR FROM order_date)", "coalesce(amount, 0)",
])
def test_check_expression_accepts_plain_expressions(expr):
    assert check_expression(f"  {expr} ") == expr


@pytest.mark.parametrize("expr", [
    "amount; DROP TABLE t", "amount -- c", "amount /* c */", "`amount", "",
    "(SELECT max(x) FROM other)", "amount */", "  ",
])
def test_check_expression_rejects_statements_comments_subqueries(expr):
    with pytest.raises(UnsafeSQLError):
        check_expression(expr)


# -- on a real table -------------------------------------------------------------------------

def test_hostile_string_partition_value_selects_nothing_extra(spark, lake):
    """The rendered predicate, used as a filter and as replaceWhere, touches only its rows."""
    from delta.tables import DeltaTable

    path = str(lake / "regions")
    rows = [("EU", 1), ("US", 2), ("2026-05-01", 3), (HOSTILE, 4), ("x\\' OR 1=1 --", 5)]
    spark.createDataFrame(rows, "region string, n int").write.format("delta") \
        .partitionBy("region").save(path)
    df = spark.read.format("delta").load(path)

    only_hostile = window_predicate("region", PartitionType.STRING, [HOSTILE])
    assert sorted(r["n"] for r in df.filter(only_hostile).collect()) == [4]
    assert df.filter(window_predicate("region", PartitionType.STRING,
                                      ["x\\' OR 1=1 --"])).count() == 1
    assert df.filter(window_predicate("region", PartitionType.STRING, ["1'='1"])).count() == 0

    # the same predicate as replaceWhere replaces exactly that partition, in one commit
    spark.createDataFrame([(HOSTILE, 40)], "region string, n int").write.format("delta") \
        .mode("overwrite").option("replaceWhere", only_hostile).save(path)
    after = sorted((r["region"], r["n"]) for r in spark.read.format("delta").load(path).collect())
    assert after == sorted([("EU", 1), ("US", 2), ("2026-05-01", 3), (HOSTILE, 40),
                            ("x\\' OR 1=1 --", 5)])
    assert DeltaTable.forPath(spark, path).history(1).first()["operation"] == "WRITE"


# -- Delta SQL for sessions without the DeltaTable API (Spark Connect) ------------------------

def test_describe_history_and_detail_exact_text():
    from sparkguard.sql import describe_detail_statement, describe_history_statement

    assert describe_history_statement(TableRef.parse("/lake/t"), 1) == \
        "DESCRIBE HISTORY delta.`/lake/t` LIMIT 1"
    assert describe_history_statement(TableRef.parse("main.sales.orders")) == \
        "DESCRIBE HISTORY `main`.`sales`.`orders`"
    assert describe_detail_statement(TableRef.parse("s3://b/t")) == "DESCRIBE DETAIL delta.`s3://b/t`"
    for bad in (0, -1, True, "5", 1.5):
        with pytest.raises(UnsafeSQLError, match="history limit"):
            describe_history_statement(TableRef.parse("t"), bad)  # type: ignore[arg-type]


def test_merge_statement_exact_text_bounded_by_the_window():
    from sparkguard.sql import PartitionType, merge_statement

    window = window_predicate("order_date", PartitionType.DATE, ["2026-05-02"], alias="t")
    sql = merge_statement(TableRef.parse("/lake/t"), "sparkguard_merge_1", ["order_id"],
                          ["order_id", "amount", "odd `name"], window, delete_unmatched=True)
    assert sql == (
        "MERGE INTO delta.`/lake/t` AS `t`\n"
        "USING `sparkguard_merge_1` AS `s`\n"
        "ON (`t`.`order_id` <=> `s`.`order_id`) AND `t`.`order_date` IN (DATE'2026-05-02')\n"
        "WHEN MATCHED THEN UPDATE SET `t`.`order_id` = `s`.`order_id`, "
        "`t`.`amount` = `s`.`amount`, `t`.`odd ``name` = `s`.`odd ``name`\n"
        "WHEN NOT MATCHED THEN INSERT (`order_id`, `amount`, `odd ``name`) "
        "VALUES (`s`.`order_id`, `s`.`amount`, `s`.`odd ``name`)\n"
        "WHEN NOT MATCHED BY SOURCE AND `t`.`order_date` IN (DATE'2026-05-02') THEN DELETE")
    kept = merge_statement(TableRef.parse("t"), "v", ["k"], ["k"], window, delete_unmatched=False)
    assert "NOT MATCHED BY SOURCE" not in kept


def test_merge_statement_refuses_hostile_view_keys_and_columns():
    from sparkguard.sql import PartitionType, merge_statement

    window = window_predicate("d", PartitionType.INT, [1], alias="t")
    ref = TableRef.parse("t")
    for view, keys, cols in (("v; DROP TABLE x", ["k"], ["k"]), ("v", ["k`"], ["k"]),
                             ("v", [], ["k"]), ("v", ["k"], []), ("v", ["k"], ["a\nb"])):
        with pytest.raises(UnsafeSQLError):
            merge_statement(ref, view, keys, cols, window, delete_unmatched=True)


LOCATIONS = [
    "s3a://lake/orders/", "S3N://Lake/Orders", "s3://lake/orders", "gs://b/t//",
    "wasbs://c@acct.blob.core.windows.net/t/", "WASB://c@acct.BLOB.core.windows.net/a.blob.core.x",
    "abfs://c@acct.dfs.core.windows.net/t", "abfss://c@acct.dfs.core.windows.net/t",
    "file:/lake/t/", "file:///lake/t", "/lake/t", "dbfs:/mnt/t", "://x", "s3a+x://b/t", "",
    "hdfs://nn:8020/a/b/", "wasbs://c@a.blob.core.b.blob.core.net/t.blob.core.x/",
    "s3a://b/t/\n", "wasbx://c@a.blob.core.x/t", "s3a://b/t://u/",
]


def test_the_sql_spelling_of_a_location_is_the_python_one(spark):
    """``status_sql`` canonicalises locations in SQL; it gives what the folds in Python give."""
    from pyspark.sql import functions as F

    from sparkguard.sql import canonical_location, canonical_location_sql

    rows = spark.createDataFrame([(loc,) for loc in LOCATIONS], "location STRING").select(
        "location", F.expr(canonical_location_sql("location")).alias("canon")).collect()
    assert {r["location"]: r["canon"] for r in rows} == {
        loc: canonical_location(loc) for loc in LOCATIONS}
