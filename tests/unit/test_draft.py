"""plan init's decisions and rendering (no Spark): key candidate order, layouts the plan
format cannot express, day formats, hostile arguments, identity transform, measures, and a
rendered draft that loads as a plan."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
import yaml

from sparkguard.draft.decide import (
    Column,
    KeyCandidate,
    KeyEvidence,
    Layout,
    day_format,
    identity_transform,
    key_candidates,
    measures,
    parse_bound,
    resolve_table,
    window_column,
    window_days,
    write_new_file,
)
from sparkguard.draft.inputs import read_sql_file
from sparkguard.draft.render import Draft, render_draft
from sparkguard.errors import PlanError
from sparkguard.guard import pre_approval_findings, to_fill
from sparkguard.plan import load_plan_text
from sparkguard.sql import PartitionType

COLS = [Column("order_date", "date"), Column("id", "bigint"), Column("customer_id", "int"),
        Column("order_id", "bigint"), Column("status", "string"), Column("price", "double"),
        Column("amount", "decimal(12,2)"), Column("qty", "int"), Column("flag", "boolean")]


def test_key_candidates_try_declared_then_own_id_then_id_then_id_like_then_others():
    cols = [*COLS, Column("ref", "string", comment="business key of the order line")]
    names = [c.columns for c in key_candidates(cols, "orders_clean", "order_date")]
    assert names[:4] == [("ref",), ("order_id",), ("id",), ("customer_id",)]
    flat = {n for c in names for n in c}
    assert {"price", "amount", "flag", "order_date"}.isdisjoint(flat)  # inexact types, window col
    assert ("status",) in names and ("qty",) in names


def test_a_key_comment_makes_a_column_the_first_candidate():
    cols = [Column("d", "date"), Column("x_id", "bigint"),
            Column("seq", "bigint", comment="unique order number")]
    assert key_candidates(cols, "t", "d")[0].columns == ("seq",)


def test_composites_pair_the_best_ranked_columns_first():
    comps = [c.columns for c in key_candidates(COLS, "orders_clean", "order_date", True)]
    assert comps[0] == ("order_id", "id")
    assert all(1 < len(c) <= 3 for c in comps)


def test_key_evidence_explains_why_a_candidate_fails():
    cand = KeyCandidate(("id",), "a primary-key-like name")
    bad = KeyEvidence(cand, rows=100, null_rows=2, distinct=95)
    assert not bad.exact and bad.duplicates == 3
    assert bad.describe() == ("id: not a key: 3 duplicate row(s) and 2 row(s) with a null key "
                              "in 100 rows (a primary-key-like name)")
    good = KeyEvidence(KeyCandidate(("a", "b"), "x"), 10, 0, 10)
    assert good.exact and good.describe().startswith("(a, b): exact: 10 rows, no nulls")


@pytest.mark.parametrize(("layout", "words"), [
    (Layout((), ("region", "ts"), ("ts",), ()), ["clustered", "clustering columns ['region', "
                                                  "'ts']", "timestamp columns ['ts']"]),
    (Layout((), (), ("event_ts",), ()), ["unpartitioned", "timestamp columns ['event_ts']"]),
    (Layout(("d", "region"), (), (), ("d",)), ["partition columns ['d', 'region']"]),
    (Layout(("ts",), (), ("ts",), ()), ["partition column 'ts' is timestamp"]),
])
def test_layouts_the_plan_format_cannot_express_are_refused_naming_them(layout, words):
    cols = [Column("d", "date"), Column("region", "string"), Column("ts", "timestamp"),
            Column("event_ts", "timestamp")]
    with pytest.raises(PlanError) as err:
        window_column(layout, cols)
    text = str(err.value)
    assert text.startswith("plan init: --target: the target is ")
    for w in words:
        assert w in text


@pytest.mark.parametrize(("col", "ptype"), [("d", PartitionType.DATE), ("s", PartitionType.STRING),
                                            ("i", PartitionType.INT)])
def test_one_date_string_or_int_partition_column_bounds_the_window(col, ptype):
    cols = [Column("d", "date"), Column("s", "string"), Column("i", "bigint")]
    assert window_column(Layout((col,), (), (), ()), cols) == (col, ptype)


def test_day_formats_of_string_and_int_partitions():
    assert day_format(PartitionType.STRING, ["2026-05-12", "2026-05-13"]) == "%Y-%m-%d"
    assert day_format(PartitionType.STRING, ["20260512"]) == "%Y%m%d"
    assert day_format(PartitionType.INT, [20260512, 20260513]) == "%Y%m%d"
    assert day_format(PartitionType.STRING, ["eu", "us"]) is None
    assert day_format(PartitionType.INT, [1, 2]) is None
    assert day_format(PartitionType.STRING, ["2026-5-1"]) is None  # not zero-padded


def test_window_is_whole_days_end_exclusive():
    s, e = parse_bound("--start", "2026-05-12"), parse_bound("--end", "2026-05-14T00:00:00Z")
    assert window_days(s, e) == [dt.date(2026, 5, 12), dt.date(2026, 5, 13)]
    with pytest.raises(PlanError, match="--start: 2026-05-12T10:00:00Z is inside a day"):
        window_days(parse_bound("--start", "2026-05-12T10:00"), e)
    with pytest.raises(PlanError, match="--end: 2026-05-12 is not after --start"):
        window_days(s, s)
    with pytest.raises(PlanError, match="--start: is not an ISO-8601"):
        parse_bound("--start", "12/05/2026")
    # another time zone: 2026-05-12T02:00+02:00 is midnight UTC
    assert parse_bound("--start", "2026-05-12T02:00:00+02:00") == s


@pytest.mark.parametrize("value", ["orders`; DROP TABLE x", "db.orders;", "a'b", "x.y.z.w",
                                   "/lake/or`ders", "./lake/o;rders", "s3://b/o'x", ""])
def test_hostile_table_arguments_are_refused(value):
    with pytest.raises(PlanError) as err:
        resolve_table("--target", value)
    assert str(err.value).startswith("plan init: --target: ")


def test_relative_paths_become_absolute_and_names_stay_names(tmp_path):
    assert resolve_table("--source", "lake/orders", tmp_path) == str(tmp_path / "lake" / "orders")
    assert resolve_table("--source", "main.sales.orders") == "main.sales.orders"
    assert resolve_table("--source", "s3://bucket/orders") == "s3://bucket/orders"


def test_identity_transform_casts_and_leaves_holes_for_missing_columns():
    target = [Column("k", "bigint"), Column("d", "date"), Column("amount", "decimal(12,2)"),
              Column("total", "double")]
    source = [Column("k", "int"), Column("d", "date"), Column("amount", "decimal(12,2)"),
              Column("extra", "string")]
    t = identity_transform(target, source)
    assert t.sql == ("SELECT CAST(k AS BIGINT) AS k, d, amount, {fill:total} AS total\n"
                     "FROM {source}\nWHERE {window}\n")
    assert t.unfilled == ["total"] and t.casts == ["k: int -> bigint"]


def test_identity_transform_backquotes_names_with_a_dot_a_hyphen_or_a_space():
    target = [Column("k", "bigint"), Column("geo.city", "string"), Column("unit price", "int"),
              Column("line-ref", "string")]
    source = [Column("k", "bigint"), Column("geo.city", "string"), Column("unit price", "bigint")]
    t = identity_transform(target, source)
    assert t.sql == ("SELECT k, `geo.city`, CAST(`unit price` AS INT) AS `unit price`,\n"
                     "       {fill:line-ref} AS `line-ref`\nFROM {source}\nWHERE {window}\n")
    assert t.unfilled == ["line-ref"]


def test_identity_transform_leaves_a_hole_for_a_struct_whose_fields_moved():
    target = [Column("k", "bigint"), Column("geo", "struct<lat:double,lon:double>")]
    source = [Column("k", "bigint"), Column("geo", "struct<lon:double,lat:double>")]
    t = identity_transform(target, source, reordered={"geo"})
    assert t.sql.startswith("SELECT k, {fill:geo} AS geo\n") and t.unfilled == ["geo"]
    assert t.casts == []


def test_measures_skip_keys_ids_and_window_and_mark_nan_columns():
    ms = measures(COLS, [c for c in COLS if c.name != "qty"], ["order_id"], "order_date",
                  "orders", nan_columns=["price"])
    assert [(m.column, m.exact, m.source_expr, m.has_nan) for m in ms] == [
        ("price", False, "price", True), ("amount", True, "amount", False),
        ("qty", True, None, False)]
    assert ms[1].threshold_percent == 0.0 and ms[0].threshold_percent == 0.0001


def _draft(**kw: object) -> Draft:
    base = dict(
        name="backfill-x", owner=None, reason="fix it", source="/lake/src", target="/lake/tgt",
        label="tgt", start=dt.datetime(2026, 5, 12, tzinfo=dt.UTC),
        end=dt.datetime(2026, 5, 14, tzinfo=dt.UTC), window_column="day",
        window_type=PartitionType.STRING, day_format="%Y-%m-%d",
        partitions=["2026-05-12", "2026-05-13"], layout=Layout(("day",), (), ("ts",), ()),
        source_layout=Layout(("day",), (), ("ts",), ()),
        source_rows={"2026-05-12": 5, "2026-05-13": 5}, target_rows={"2026-05-12": 5},
        target_columns=[Column("day", "string"), Column("id", "bigint"),
                        Column("ts", "timestamp"), Column("v", "double")],
        keys=("id", "ts"), evidence=[KeyEvidence(KeyCandidate(("id",), "w"), 10, 0, 8),
                                     KeyEvidence(KeyCandidate(("id", "ts"), "w"), 10, 0, 10)],
        untried=[], not_null=["day", "id"],
        measures=measures([Column("v", "double")], [], [], "day", "tgt"),
        transform_sql="SELECT day, id, ts, {fill:v} AS v\nFROM {source}\nWHERE {window}\n",
        transform_notes=["Identity recompute."])
    base.update(kw)
    return Draft(**base)  # type: ignore[arg-type]


def test_a_rendered_draft_loads_and_leaves_only_the_fields_to_fill():
    text = render_draft(_draft())
    plan = load_plan_text(text, "draft.yaml")
    assert plan.target_specs()[0].business_keys == ["id", "ts"]
    assert plan.partitioning is not None and plan.partitioning.type is PartitionType.STRING
    assert plan.affected_window.partitions == ["day=2026-05-12", "day=2026-05-13"]
    assert plan.approvals.required == [] and plan.status.state == "draft"
    assert "#   id: not a key: 2 duplicate row(s) in 10 rows" in text
    assert "The target has no rows in 1 window partition(s): 2026-05-13" in text
    checks = plan.validation.checks
    assert checks[2].aggregation.value == "count_distinct" and checks[2].source_expr == "struct(id, ts)"
    assert checks[3].threshold_percent == 0.0001 and checks[3].source_expr is None
    fill = sorted(f.path for f in to_fill(pre_approval_findings(plan)))
    assert fill == ["backfill_plan.approvals.required", "backfill_plan.owner",
                    "backfill_plan.safeguards.downstream_notifications",
                    "backfill_plan.targets[0].transform.sql",
                    "backfill_plan.validation.checks[3].source_expr"]
    assert [f for f in pre_approval_findings(plan) if f.severity.value != "info"
            and not f.unfilled] == []


def test_user_text_with_quotes_and_newlines_stays_a_value():
    text = render_draft(_draft(owner="o'neil@example.com", reason="line 1\n# not a comment: 'x'"))
    plan = load_plan_text(text)
    assert plan.owner == "o'neil@example.com" and plan.reason == "line 1\n# not a comment: 'x'"


def test_given_sql_with_odd_whitespace_round_trips():
    sql = "  SELECT *\tFROM {source}  \nWHERE {window}"
    plan = load_plan_text(render_draft(_draft(transform_sql=sql, transform_given=True)))
    assert plan.target_specs()[0].transform.sql == sql.strip()


def test_the_output_file_is_never_overwritten(tmp_path: Path):
    out = tmp_path / "d.yaml"
    write_new_file(str(out), "a: 1\n")
    with pytest.raises(PlanError, match="already exists"):
        write_new_file(str(out), "b: 2\n")
    assert out.read_text() == "a: 1\n"
    with pytest.raises(PlanError, match="does not exist"):
        write_new_file(str(tmp_path / "nope" / "d.yaml"), "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.yaml"]


@pytest.mark.parametrize("odd", ["\x0b", "\x0c", "\x1c", "\x85", "\u2028"])
def test_given_sql_with_a_character_python_splits_lines_at_is_quoted_and_refused(odd, tmp_path):
    """str.splitlines splits at these too: written into a literal block, each came back as a
    newline (another SQL than the file given). The draft now quotes it, and a plan refuses it
    as text a reviewer cannot see: --transform-sql says so first, naming the option."""
    sql = f"SELECT regexp_replace(note, '{odd}', ' ') AS note\nFROM {{source}}"
    text = render_draft(_draft(transform_sql=sql, transform_given=True))
    assert yaml.safe_load(text)["backfill_plan"]["targets"][0]["transform"]["sql"] == sql
    given = tmp_path / "t.sql"
    given.write_text(sql, encoding="utf-8")
    with pytest.raises(PlanError, match=r"--transform-sql.*control character"):
        read_sql_file(str(given))
