"""Pure verdict arithmetic: deviations, thresholds, metric partials, gates and schema contract."""

from __future__ import annotations

import datetime as dt
import math
import os
import time
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest

from sparkguard.plan.loader import load_plan_text
from sparkguard.plan.model import Aggregation, ColumnContract, Contract, NanRule
from sparkguard.reconcile.gates import build_gates, combine_metric, metric_value, utc_instant
from sparkguard.reconcile.spec import (
    ColumnInfo,
    MetricSpec,
    ReconcileSpec,
    ThresholdSpec,
    schema_contract_gates,
    spec_for_target,
)
from sparkguard.reconcile.verdicts import (
    EXACT,
    ChangePreview,
    ReconcileResult,
    deviation,
    judge,
    within,
)
from sparkguard.sql import PartitionType
from tests.plan_fixtures import plan_yaml, valid_plan

INF = math.inf


@pytest.mark.parametrize(("expected", "measured", "out"), [
    (None, None, (0.0, 0.0)),
    (None, 5, (INF, INF)),
    (5, None, (INF, INF)),
    (0, 0, (0.0, 0.0)),
    (0, 5, (5.0, INF)),
    (100, 90, (10.0, 10.0)),
    (-200, -150, (50.0, 25.0)),
    (math.nan, math.nan, (INF, INF)),   # a NaN total never passes, not even against NaN
    (math.nan, 1.0, (INF, INF)),
    (INF, INF, (INF, INF)),             # nor an infinite one
    (-INF, 1.0, (INF, INF)),
])
def test_deviation(expected: Any, measured: Any, out: tuple[float, float]) -> None:
    assert deviation(expected, measured) == out


@pytest.mark.parametrize(("absolute", "percent", "tp", "ta", "ok"), [
    (0.0, 0.0, None, None, True),       # no threshold: exact only
    (1e-9, 1e-9, None, None, False),
    (5.0, 1.0, 1.0, None, True),        # percent bound is inclusive
    (5.0, 1.0000001, 1.0, None, False),
    (5.0, 50.0, None, 5.0, True),       # absolute bound is inclusive
    (5.0, 1.0, 2.0, 4.0, False),        # both given: both must hold
    (INF, INF, 100.0, None, False),
])
def test_judge(absolute: float, percent: float, tp: float | None, ta: float | None, ok: bool) -> None:
    assert judge(absolute, percent, tp, ta) is ok


@pytest.mark.parametrize(("expected", "measured"), [
    (10**15, 10**15 + 1),
    (Decimal("10000000000000.00"), Decimal("10000000000000.01")),
    (10**21, 10**21 + 10**7),                                   # a wei total
    (Decimal("123456789012345678901234567890123.45"), Decimal("123456789012345678901234567890123.46")),
])
def test_threshold_percent_zero_is_exact_for_integers_and_decimals(expected: Any,
                                                                   measured: Any) -> None:
    """Plans always set a threshold (the guard blocks a check without one), so ``0`` must mean
    exact: no float slack on integer and decimal values."""
    assert not within(expected, measured, 0.0, None)
    assert not within(measured, expected, 0.0, None)
    assert within(expected, expected, 0.0, None)
    m = MetricSpec("amount", Aggregation.SUM, "amount", "amount", ThresholdSpec(percent=0.0))
    rows = [metric_row("d1", {"sum": expected}, {"sum": measured})]
    _, gates = build_gates(spec(row_count=None, duplicate_check=None, metrics=(m,)), rows, True)
    assert not gates[0].passed
    rows = [row("d1", 10**15, 10**15 + 1)]
    _, gates = build_gates(spec(row_count=ThresholdSpec(percent=0.0), duplicate_check=None),
                           rows, True)
    assert not gates[0].passed


def test_integer_and_decimal_thresholds_hold_exactly_at_the_bound() -> None:
    assert within(100, 101, 1.0, None)                                   # 1 % of 100: inclusive
    assert not within(100, Decimal("101.000000000000000000001"), 1.0, None)
    assert within(Decimal("10"), Decimal("10.5"), None, 0.5)
    assert not within(Decimal("10"), Decimal("10.5000000000000000000001"), None, 0.5)
    assert within(Decimal("1000"), Decimal("1000.1"), 0.01, None)        # 0.01 as written
    # one duplicate key among 10**15 rows is not 0 %
    _, gates = build_gates(spec(row_count=None, duplicate_check=ThresholdSpec(percent=0.0)),
                           [row("d1", 10**15, 10**15, dup_shadow=1)], True)
    assert not gates[0].passed


def test_floats_keep_a_rounding_slack_on_the_percent() -> None:
    """100.0 vs 100.01 is 0.010000000000005 % in doubles: the rounding of the values, not a
    deviation beyond 0.01 %."""
    assert within(100.0, 100.01, 0.01, None)
    assert not within(100.0, 100.0101, 0.01, None)
    assert not within(1.0, 1.0 + 1e-13, 0.0, None)                      # 1e-11 %: beyond it


def test_expected_zero_with_both_thresholds_is_judged_by_the_absolute_one() -> None:
    """A percent of 0 is not defined: with both thresholds the absolute bound decides there
    (elsewhere both must hold); with only a percent threshold, only 0 passes."""
    assert within(0, Decimal("0.001"), 0.01, 0.5)
    assert within(0.0, 0.001, 0.01, 0.5)
    assert not within(0, 1, 0.01, 0.5)
    assert not within(0, Decimal("0.001"), 0.01, None)
    assert not within(100, 100.4, 0.01, 0.5)                            # both must hold
    m = MetricSpec("m", Aggregation.SUM, "v", "v", ThresholdSpec(percent=0.01, absolute=0.5),
                   per_partition=True)
    rows = [metric_row("d1", {"sum": Decimal("0")}, {"sum": Decimal("0.001")}),
            metric_row("d2", {"sum": Decimal("1000")}, {"sum": Decimal("1000")})]
    _, gates = build_gates(spec(row_count=None, duplicate_check=None, metrics=(m,)), rows, True)
    assert [g.passed for g in gates] == [True, True, True]
    assert "the absolute bound decides" in gates[1].reason


def test_metric_partials_fold_and_finish() -> None:
    parts = combine_metric([{"sum": 10, "count": 2, "min": 3, "max": 7},
                            {"sum": None, "count": 0, "min": None, "max": None},
                            {"sum": Decimal("2.5"), "count": 1, "min": -1, "max": 4}])
    assert parts == {"sum": Decimal("12.5"), "count": 3, "min": -1, "max": 7, "cd": None,
                     "overflow": 0, "nan": 0, "posinf": 0, "neginf": 0}
    assert metric_value(Aggregation.SUM, parts) == Decimal("12.5")
    assert metric_value(Aggregation.AVG, parts) == EXACT.divide(Decimal("12.5"), 3)
    assert metric_value(Aggregation.AVG, {"sum": 12.5, "count": 3}) == pytest.approx(12.5 / 3)
    assert metric_value(Aggregation.MIN, parts) == -1
    assert metric_value(Aggregation.MAX, parts) == 7
    assert metric_value(Aggregation.COUNT, parts) == 3
    assert metric_value(Aggregation.AVG, {"sum": None, "count": 0}) is None
    assert metric_value(Aggregation.COUNT_DISTINCT, {"cd": None}) is None  # not counted
    assert metric_value(Aggregation.COUNT_DISTINCT, {"cd": 0}) == 0


def test_an_exact_average_keeps_a_cent_on_a_large_total() -> None:
    """An average of integers or decimals is divided exactly: as floats, totals of
    100000000000000.01 and .02 (or 2**53 and 2**53 + 1) over the same count are one number,
    and an exact gate would pass."""
    m = MetricSpec("avg_amount", Aggregation.AVG, "v", "v", ThresholdSpec())
    for a, b in ((Decimal("100000000000000.01"), Decimal("100000000000000.02")),
                 (2**53, 2**53 + 1)):
        rows = [metric_row("d1", {"sum": a, "count": 1}, {"sum": b, "count": 1})]
        _, gates = build_gates(spec(row_count=None, duplicate_check=None, metrics=(m,)), rows,
                               True)
        assert [g.passed for g in gates] == [False]
        same = [metric_row("d1", {"sum": a, "count": 3}, {"sum": a, "count": 3})]
        _, gates = build_gates(spec(row_count=None, duplicate_check=None, metrics=(m,)), same,
                               True)
        assert [g.passed for g in gates] == [True]


def spec(**kw: Any) -> ReconcileSpec:
    base: dict[str, Any] = {"partition_column": "p", "partition_type": PartitionType.DATE,
                            "business_keys": ("k",)}
    return ReconcileSpec(**{**base, **kw})


def row(part: str, source: int, shadow: int, **kw: Any) -> dict[str, Any]:
    return {"partition": part, "rows_source": source, "rows_shadow": shadow, "rows_target": 0,
            "dup_shadow": 0, "dup_source": 0, **kw}


def test_row_count_parity_percent_and_absolute_per_partition() -> None:
    rows = [row("d1", 1000, 1000), row("d2", 1000, 1015)]
    _, gates = build_gates(spec(row_count=ThresholdSpec(percent=1.0), row_count_per_partition=True,
                                duplicate_check=None), rows, has_source=True)
    window, d1, d2 = gates
    assert window.passed and window.measured["value"] == 2015 and window.expected == 2000
    assert window.measured["pct_diff"] == pytest.approx(0.75)
    assert d1.passed and d1.partition == "d1"
    assert not d2.passed and d2.partition == "d2"
    assert "expected 1000, got 1015" in d2.reason and "exceeds threshold <= 1%" in d2.reason
    _, gates = build_gates(spec(row_count=ThresholdSpec(absolute=15)), rows, has_source=True)
    assert gates[0].passed and gates[0].threshold == "<= 15 abs"
    _, gates = build_gates(spec(row_count=ThresholdSpec(absolute=14)), rows, has_source=True)
    assert not gates[0].passed


def test_row_count_against_target_without_source() -> None:
    rows = [{"partition": "d1", "rows_source": 0, "rows_shadow": 9, "rows_target": 10}]
    _, gates = build_gates(spec(), rows, has_source=False)
    assert not gates[0].passed and gates[0].expected == 10 and "target rows" in gates[0].reason


def test_duplicates_on_shadow_fail_and_source_duplicates_inform() -> None:
    rows = [row("d1", 10, 10, dup_shadow=2, dup_source=3), row("d2", 10, 10)]
    stats, gates = build_gates(spec(row_count=None), rows, has_source=True,
                               extra_duplicates={("customer",): 4})
    dup, extra = gates
    assert not dup.passed and dup.measured["duplicate_keys"] == 2
    assert dup.details["source_duplicate_keys"] == 3
    assert "2 business key(s) (k) occur more than once in the shadow" in dup.reason
    assert extra.gate == "duplicate_check[customer]" and not extra.passed
    assert [s.duplicate_keys_shadow for s in stats] == [2, 0]
    _, gates = build_gates(spec(row_count=None, duplicate_check=ThresholdSpec(percent=10.0)),
                           rows, has_source=True)
    assert gates[0].passed and gates[0].measured["pct_of_rows"] == pytest.approx(10.0)


def metric_row(part: str, src: dict[str, Any], shd: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return {**row(part, 1, 1), "m0_source": src, "m0_shadow": shd, **kw}


def test_metric_reconciliation_percent_absolute_and_per_partition() -> None:
    m = MetricSpec("amount", Aggregation.SUM, "amount", "amount", ThresholdSpec(percent=0.8), True)
    rows = [metric_row("d1", {"sum": 1000.0, "count": 1}, {"sum": 1004.0, "count": 1}),
            metric_row("d2", {"sum": 1000.0, "count": 1}, {"sum": 1010.0, "count": 1})]
    stats, gates = build_gates(spec(row_count=None, duplicate_check=None, metrics=(m,)), rows, True)
    window, d1, d2 = gates
    assert window.gate == "metric_reconciliation[amount]"
    assert window.passed and window.measured["value"] == 2014.0 and window.expected == 2000.0
    assert d1.passed and not d2.passed and d2.measured["pct_diff"] == pytest.approx(1.0)
    assert stats[1].metrics["amount"] == {"source": 1000.0, "shadow": 1010.0, "target": None}
    absolute = MetricSpec("amount", Aggregation.SUM, "amount", "amount", ThresholdSpec(absolute=13))
    _, gates = build_gates(spec(row_count=None, duplicate_check=None, metrics=(absolute,)), rows, True)
    assert not gates[0].passed and gates[0].measured["abs_diff"] == 14.0


def test_one_cent_on_a_38_digit_decimal_sum_is_a_deviation() -> None:
    """Decimals add and subtract exactly: as floats (or in Python's default 28-digit context)
    the cent below would vanish and an exact-match gate would pass."""
    big = Decimal("123456789012345678901234567890123.45")  # 35 digits, decimal(38, 2)
    parts = combine_metric([{"sum": big}, {"sum": Decimal("0.01")}, {"sum": big}])
    assert parts["sum"] == Decimal("246913578024691357802469135780246.91")
    assert deviation(big, Decimal("123456789012345678901234567890123.46")) \
        == (0.01, pytest.approx(float(Decimal("0.01") / big * 100)))
    assert deviation(big, big) == (0.0, 0.0)
    m = MetricSpec("amount", Aggregation.SUM, "amount", "amount", ThresholdSpec())  # exact
    rows = [metric_row("d1", {"sum": big, "count": 1}, {"sum": big, "count": 1}),
            metric_row("d2", {"sum": big, "count": 1},
                       {"sum": Decimal("123456789012345678901234567890123.46"), "count": 1})]
    _, gates = build_gates(spec(row_count=None, duplicate_check=None, metrics=(m,)), rows, True)
    assert not gates[0].passed and gates[0].measured["abs_diff"] == 0.01
    assert gates[0].measured["value"] == Decimal("246913578024691357802469135780246.91")
    _, gates = build_gates(spec(row_count=None, duplicate_check=None, metrics=(m,)),
                           [rows[0], metric_row("d2", {"sum": big}, {"sum": big})], True)
    assert gates[0].passed


def test_min_max_of_dates_and_timestamps_compare_in_days_and_seconds() -> None:
    t0 = dt.datetime(2024, 1, 1, 12)
    m = MetricSpec("first", Aggregation.MIN, "t", "t", ThresholdSpec(absolute=60))
    rows = [metric_row("d1", {"min": t0}, {"min": t0 + dt.timedelta(seconds=61)})]
    _, gates = build_gates(spec(row_count=None, duplicate_check=None, metrics=(m,)), rows, True)
    assert not gates[0].passed and gates[0].measured["abs_diff"] == 61.0
    day = MetricSpec("last", Aggregation.MAX, "d", "d", ThresholdSpec())
    rows = [metric_row("d1", {"max": dt.date(2024, 1, 2)}, {"max": dt.date(2024, 1, 1)})]
    _, gates = build_gates(spec(row_count=None, duplicate_check=None, metrics=(day,)), rows, True)
    assert not gates[0].passed and gates[0].measured["abs_diff"] == 1.0
    text = MetricSpec("code", Aggregation.MAX, "s", "s", ThresholdSpec(percent=50))
    rows = [metric_row("d1", {"max": "b"}, {"max": "a"})]
    _, gates = build_gates(spec(row_count=None, duplicate_check=None, metrics=(text,)), rows, True)
    assert not gates[0].passed  # strings: equal or not, whatever the threshold


@pytest.fixture
def new_york() -> Iterator[None]:
    """The driver's OS time zone set to one with DST changes, restored afterwards."""
    old = os.environ.get("TZ")
    os.environ["TZ"] = "America/New_York"
    time.tzset()
    try:
        yield
    finally:
        os.environ.pop("TZ") if old is None else os.environ.update(TZ=old)
        time.tzset()


def micros(text: str) -> int:
    d = dt.datetime.fromisoformat(text) - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    return (d.days * 86400 + d.seconds) * 1_000_000 + d.microseconds


def test_timestamp_min_max_compare_as_utc_instants_in_any_driver_zone(new_york: None) -> None:
    """The engine aggregates ``unix_micros`` of a ``timestamp`` and makes it an aware UTC
    datetime; pyspark's own conversion gives naive local times, which fold the repeated hour of
    the autumn change into one and stretch the spring change by an hour."""
    a, b = micros("2026-11-01T05:30:00+00:00"), micros("2026-11-01T06:30:00+00:00")
    assert utc_instant(a) == dt.datetime(2026, 11, 1, 5, 30, tzinfo=dt.UTC)
    assert utc_instant(b) - utc_instant(a) == dt.timedelta(hours=1)  # type: ignore[operator]
    exact = MetricSpec("last", Aggregation.MAX, "t", "t", ThresholdSpec(percent=0.0))
    rows = [metric_row("d1", {"max": utc_instant(a)}, {"max": utc_instant(b)})]
    _, gates = build_gates(spec(row_count=None, duplicate_check=None, metrics=(exact,)), rows, True)
    assert not gates[0].passed and gates[0].measured["abs_diff"] == 3600.0
    assert gates[0].to_dict()["expected"] == "2026-11-01T05:30:00+00:00"   # explicit UTC
    assert "expected 2026-11-01 05:30:00+00:00, got 2026-11-01 06:30:00+00:00" in gates[0].reason
    # across the spring change: 06:59Z vs 07:01Z are two minutes apart, not an hour and two
    c, d = micros("2026-03-08T06:59:00+00:00"), micros("2026-03-08T07:01:00+00:00")
    loose = MetricSpec("first", Aggregation.MIN, "t", "t", ThresholdSpec(absolute=300))
    rows = [metric_row("d1", {"min": utc_instant(c)}, {"min": utc_instant(d)})]
    _, gates = build_gates(spec(row_count=None, duplicate_check=None, metrics=(loose,)), rows, True)
    assert gates[0].passed and gates[0].measured["abs_diff"] == 120.0
    # partials fold by instant: the later UTC value wins inside the repeated hour
    parts = combine_metric([{"max": utc_instant(b)}, {"max": utc_instant(a)}])
    assert parts["max"] == utc_instant(b)


def test_timestamp_deviation_is_exact_to_the_microsecond() -> None:
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    m = MetricSpec("last", Aggregation.MAX, "t", "t", ThresholdSpec(percent=0.0))
    rows = [metric_row("d1", {"max": t0}, {"max": t0 + dt.timedelta(microseconds=1)})]
    _, gates = build_gates(spec(row_count=None, duplicate_check=None, metrics=(m,)), rows, True)
    assert not gates[0].passed and gates[0].measured["abs_diff"] == 1e-6
    ntz = dt.datetime(2026, 1, 1)  # a timestamp_ntz: wall-clock, compared as such
    rows = [metric_row("d1", {"max": ntz}, {"max": ntz})]
    _, gates = build_gates(spec(row_count=None, duplicate_check=None, metrics=(m,)), rows, True)
    assert gates[0].passed


def test_count_distinct_uses_window_totals_not_partition_sums() -> None:
    m = MetricSpec("customers", Aggregation.COUNT_DISTINCT, "c", "c", ThresholdSpec())
    rows = [metric_row(d, {"cd": 5}, {"cd": 5}, m0_source_window_cd=7, m0_shadow_window_cd=8)
            for d in ("d1", "d2")]
    _, gates = build_gates(spec(row_count=None, duplicate_check=None, metrics=(m,)), rows, True)
    assert (gates[0].expected, gates[0].measured["value"], gates[0].passed) == (7, 8, False)


def test_not_null_gate_counts_nulls_over_partitions() -> None:
    rows = [row("d1", 1, 1, null_s=2), row("d2", 1, 1, null_s=1)]
    stats, gates = build_gates(spec(row_count=None, duplicate_check=None, not_null=("s",)), rows, True)
    assert gates[0].gate == "not_null[s]" and gates[0].measured == 3 and not gates[0].passed
    assert [s.nulls for s in stats] == [{"s": 2}, {"s": 1}]


def test_result_verdicts_and_dict_shape() -> None:
    rows = [row("d1", 10, 10), row("d2", 10, 12)]
    stats, gates = build_gates(spec(row_count=ThresholdSpec(percent=0.0), row_count_per_partition=True,
                                    duplicate_check=None), rows, True)
    preview = ChangePreview(inserted=2, deleted=0, changed=1, unchanged=17,
                            changed_by_column={"x": 1}, ambiguous=0)
    res = ReconcileResult("slice 1", tuple(stats), tuple(gates), preview)
    assert not res.passed
    assert [(g.gate, g.partition) for g in res.failed] == [("row_count_parity", None),
                                                         ("row_count_parity", "d2")]
    assert res.totals() == {"rows_source": 20, "rows_shadow": 22, "rows_target": 0,
                            "duplicate_keys_shadow": 0}
    d = res.to_dict()
    assert d["scope"] == "slice 1" and d["passed"] is False
    assert d["change_preview"]["ambiguous"] == 0 and d["change_preview"]["inserted"] == 2
    assert d["gates"][0]["measured"]["pct_diff"] == pytest.approx(10.0)


def test_to_dict_is_plain_data() -> None:
    rows = [row("d1", 0, 3)]
    _, gates = build_gates(spec(), rows, True)
    d = gates[0].to_dict()
    assert d["measured"]["pct_diff"] == "inf"  # infinities and NaN become strings
    stats, _ = build_gates(spec(metrics=(MetricSpec("t", Aggregation.MAX, "t", "t", ThresholdSpec()),)),
                           [metric_row("d1", {"max": Decimal("1.5")}, {"max": dt.date(2024, 1, 1)})],
                           True)
    assert stats[0].to_dict()["metrics"]["t"] == {"source": "1.5", "shadow": "2024-01-01", "target": None}


def test_schema_contract_against_target_and_declared_contract() -> None:
    target = [ColumnInfo("id", "bigint", False), ColumnInfo("amount", "decimal(10,2)", True),
              ColumnInfo("note", "string", True)]
    shadow = [ColumnInfo("id", "bigint", True), ColumnInfo("amount", "decimal(10, 3)", True),
              ColumnInfo("extra", "int", True)]
    contract = Contract(columns=[ColumnContract(name="id", type="BIGINT", nullable=False),
                                 ColumnContract(name="amount", type="decimal(10,2)"),
                                 ColumnContract(name="gone", type="string")])
    by_target, by_contract = schema_contract_gates(shadow, target, contract)
    assert not by_target.passed and by_target.measured == 3
    assert by_target.details["differences"] == [
        "column 'amount' type decimal(10, 3) != target decimal(10,2)",
        "column 'note' missing from the recomputed rows",
        "column 'extra' not in the target"]
    assert not by_contract.passed and by_contract.measured == 2
    assert "contract column 'gone' missing" in by_contract.reason
    same = [ColumnInfo("id", "BIGINT", True), ColumnInfo("amount", "decimal(10,2)", True),
            ColumnInfo("note", "string", True)]
    gates = schema_contract_gates(same, target, Contract(match_target_schema=True))
    assert [g.passed for g in gates] == [True]
    assert schema_contract_gates(shadow, None, Contract(match_target_schema=True)) == []


def test_without_match_target_schema_the_column_names_still_must_match() -> None:
    """A promotion cannot write a column the target lacks, and one the shadow lacks fails the
    check after the commit: names are compared (case-insensitively, identity columns left to
    the target), types only for a promotion that writes the columns as they are."""
    target = [ColumnInfo("id", "bigint", True), ColumnInfo("sk", "bigint", True),
              ColumnInfo("note", "string", True), ColumnInfo("Amount", "decimal(10,2)", True)]
    off = Contract(match_target_schema=False)
    retyped = [ColumnInfo("ID", "int", True), ColumnInfo("note", "string", True),
               ColumnInfo("amount", "double", True)]
    (ok,) = schema_contract_gates(retyped, target, off, identity=["SK"])
    assert ok.gate == "columns_match_target" and ok.passed, ok
    (bad,) = schema_contract_gates([ColumnInfo("id", "bigint", True),
                                    ColumnInfo("extra", "int", True)], target, off, ["sk"])
    assert not bad.passed and bad.measured == 3
    assert bad.details["differences"] == ["column 'note' missing from the recomputed rows",
                                          "column 'Amount' missing from the recomputed rows",
                                          "column 'extra' not in the target"]
    assert "match_target_schema is off" in bad.reason
    # replace_where writes the columns as they are: their types are compared too
    (typed,) = schema_contract_gates(retyped, target, off, identity=["SK"], written_as_is=True)
    assert not typed.passed and typed.measured == 2, typed
    assert typed.details["differences"] == [
        "column 'ID' type int != target bigint",
        "column 'amount' type double != target decimal(10,2)"], typed.details
    assert "replace_where writes the recomputed columns as they are" in typed.reason
    # ... but a narrower integer is one Delta writes into the wider column as it is
    narrow = [ColumnInfo("id", "bigint", True), ColumnInfo("note", "string", True),
              ColumnInfo("amount", "decimal(10,2)", True), ColumnInfo("n", "smallint", True)]
    (ok,) = schema_contract_gates(narrow, [*target, ColumnInfo("n", "int", True)], off,
                                  identity=["sk"], written_as_is=True)
    assert ok.passed, ok


def test_spec_for_target_reads_the_plan_checks() -> None:
    plan = load_plan_text(plan_yaml(valid_plan()))
    target = plan.targets[0]
    s = spec_for_target(plan, target)
    assert s.partition_column == plan.partitioning.column  # type: ignore[union-attr]
    assert s.business_keys == tuple(target.business_keys)
    assert s.row_count == ThresholdSpec(percent=0.0)
    assert s.duplicate_check == ThresholdSpec(absolute=0.0)
    assert [(m.name, m.aggregation, m.source_expr, m.shadow_expr) for m in s.metrics][:2] == [
        ("gross_amount", Aggregation.SUM, "amount", "amount"),
        ("line_total", Aggregation.SUM, "amount * quantity", "line_total")]
    assert s.metrics[0].threshold == ThresholdSpec(percent=0.01)
    assert s.extra_duplicate_keys == ()  # replace_where: keys unique per partition suffice


@pytest.mark.parametrize("promotion", ["merge", "merge_changed"])
def test_a_merge_promotion_needs_business_keys_unique_across_the_window(promotion: str) -> None:
    """MERGE matches on the business keys alone: a key in two partitions of the window would
    match one target row twice (or insert a duplicate), so the duplicate gate spans the window."""
    data = valid_plan()
    data["backfill_plan"]["targets"][0]["promotion"] = promotion
    plan = load_plan_text(plan_yaml(data))
    s = spec_for_target(plan, plan.targets[0])
    keys = tuple(plan.targets[0].business_keys)
    assert s.extra_duplicate_keys == (keys,)
    assert s.extra_duplicate_threshold(keys) == s.duplicate_check
    _, gates = build_gates(s, [row("d1", 100, 100), row("d2", 100, 100)], True,
                           extra_duplicates={keys: 1})
    assert not {g.gate: g for g in gates}[f"duplicate_check[{','.join(keys)}]"].passed


def test_table_wide_keys_are_unique_across_the_window_under_replace_where_too() -> None:
    """``table_wide: true`` says the keys are unique across the target: a key recomputed into
    two partitions of the window is a duplicate whatever the promotion."""
    data = valid_plan()
    checks = data["backfill_plan"]["validation"]["checks"]
    dup = next(c for c in checks if c["type"] == "duplicate_check")
    dup["table_wide"] = True
    plan = load_plan_text(plan_yaml(data))
    assert plan.targets[0].promotion.value == "replace_where"
    s = spec_for_target(plan, plan.targets[0])
    keys = tuple(dup.get("key_columns") or plan.targets[0].business_keys)
    assert s.extra_duplicate_keys == (keys,)


def test_each_extra_duplicate_check_keeps_its_own_threshold() -> None:
    """The business keys at <= 5 % and a second key set with no threshold (exact): three
    duplicate keys on the second set fail, whatever the first allows."""
    data = valid_plan()
    checks = data["backfill_plan"]["validation"]["checks"]
    checks[1] = {"type": "duplicate_check", "key_columns": ["order_id"], "threshold_percent": 5}
    checks.append({"type": "duplicate_check", "key_columns": ["customer_id"]})
    plan = load_plan_text(plan_yaml(data))
    s = spec_for_target(plan, plan.targets[0])
    assert s.duplicate_check == ThresholdSpec(percent=5)
    assert s.extra_duplicate_threshold(("customer_id",)) == ThresholdSpec(absolute=0.0)
    rows = [row("d1", 100, 100, dup_shadow=3)]
    _, gates = build_gates(s, rows, True, extra_duplicates={("customer_id",): 3})
    by_name = {g.gate: g for g in gates}
    assert by_name["duplicate_check"].passed                    # 3 % <= 5 %
    extra = by_name["duplicate_check[customer_id]"]
    assert not extra.passed and extra.threshold == "<= 0 abs"
    # its own threshold when it has one; the business keys then default to exact
    checks[1] = {"type": "duplicate_check", "key_columns": ["customer_id"], "threshold_absolute": 5}
    del checks[-1]
    plan = load_plan_text(plan_yaml(data))
    s = spec_for_target(plan, plan.targets[0])
    assert s.duplicate_check == ThresholdSpec(absolute=0.0)
    _, gates = build_gates(s, [row("d1", 100, 100)], True,
                           extra_duplicates={("customer_id",): 3})
    assert [(g.gate, g.passed) for g in gates if g.check_type == "duplicate_check"] == [
        ("duplicate_check", True), ("duplicate_check[customer_id]", True)]


@pytest.mark.parametrize("shadow_kind", ["neginf", "nan"])
def test_exclude_counts_nan_and_each_infinity_apart(shadow_kind: str) -> None:
    """``nan: exclude``: the finite sums agree and each side has one non-finite row, but a +inf
    that became -inf or NaN is a change: the counts are compared per kind."""
    m = MetricSpec("m", Aggregation.SUM, "x", "x", ThresholdSpec(percent=0.0), per_partition=True,
                   nan=NanRule.EXCLUDE)
    rows = [metric_row("d1", {"sum": 10.0, "posinf": 1}, {"sum": 10.0, shadow_kind: 1})]
    _, gates = build_gates(spec(row_count=None, duplicate_check=None, metrics=(m,)), rows, True)
    by = {(g.gate, g.partition): g for g in gates}
    assert by[("metric_reconciliation[m]", None)].passed               # the finite values
    counts = by[("metric_reconciliation[m].nan_or_infinite_rows", None)]
    assert not counts.passed and not by[(counts.gate, "d1")].passed
    assert counts.expected == {"NaN": 0, "+inf": 1, "-inf": 0}
    assert counts.measured["value"][{"neginf": "-inf", "nan": "NaN"}[shadow_kind]] == 1
    same = [metric_row("d1", {"sum": 10.0, "posinf": 1, "nan": 2}, {"sum": 10.0, "posinf": 1,
                                                                     "nan": 2})]
    _, gates = build_gates(spec(row_count=None, duplicate_check=None, metrics=(m,)), same, True)
    assert all(g.passed for g in gates)


def test_nan_fail_names_each_kind() -> None:
    m = MetricSpec("m", Aggregation.MAX, "x", "x", ThresholdSpec(percent=0.0))
    rows = [metric_row("d1", {"max": 1.0, "posinf": 1}, {"max": 1.0, "neginf": 2})]
    _, gates = build_gates(spec(row_count=None, duplicate_check=None, metrics=(m,)), rows, True)
    g = gates[0]
    assert not g.passed and g.measured["nan_or_infinite_rows"] == {"source": 1, "shadow": 2}
    assert "the source has 1 NaN or infinite input row(s) (+inf 1)" in g.reason
    assert "the shadow has 2 NaN or infinite input row(s) (-inf 2)" in g.reason


def test_a_not_null_name_the_shadow_lacks_fails_its_gate() -> None:
    """A typo or another case in ``contract.not_null`` used to drop the gate silently."""
    from sparkguard.reconcile.spec import unknown_columns

    unknown = unknown_columns(("customer_id", "Amount", "custmer_id"), ("customer_id", "amount"))
    assert unknown == {"Amount": "amount", "custmer_id": None}
    _, gates = build_gates(spec(row_count=None, duplicate_check=None, not_null=("customer_id",)),
                           [row("d1", 1, 1, null_customer_id=0)], True, unknown_not_null=unknown)
    by = {g.gate: g for g in gates}
    assert by["not_null[customer_id]"].passed
    assert not by["not_null[Amount]"].passed and not by["not_null[custmer_id]"].passed
    assert "it has 'amount' (names match exactly" in by["not_null[Amount]"].reason
    assert "no such column" in by["not_null[custmer_id]"].reason


def test_guard_names_not_null_columns_a_table_lacks() -> None:
    """The live guard's helper (against a target's columns) and the static rule (against
    ``contract.columns``, a partial list: only another case is known to be wrong)."""
    from sparkguard.guard_checks import not_null_findings

    data = valid_plan()
    data["backfill_plan"]["targets"][0]["contract"]["not_null"] = ["Order_ID", "amount", "amout"]
    plan = load_plan_text(plan_yaml(data))
    t = plan.target_specs()[0]
    found = not_null_findings(t, "targets[0]", ["order_id", "amount", "order_date"], "target 't'")
    assert [(p, m) for p, m, _fix in found] == [
        ("targets[0].contract.not_null[0]", "not_null names column 'Order_ID', which target 't' "
         "does not have: it has 'order_id' (names match exactly, case included)"),
        ("targets[0].contract.not_null[2]", "not_null names column 'amout', which target 't' "
         "does not have: no such column")]
    assert [p for p, _m, _f in not_null_findings(t, "targets[0]", ["order_id", "amount"], "x",
                                                 complete=False)] == [
        "targets[0].contract.not_null[0]"]


def test_guard_names_contract_columns_the_target_has_in_another_case() -> None:
    """The shadow holds the target's column names, so a ``contract.columns`` name the target
    has in another case only would never be found by the contract gate; a name the target
    lacks altogether is left to that gate."""
    from sparkguard.guard_checks import contract_column_findings

    data = valid_plan()
    data["backfill_plan"]["targets"][0]["contract"]["columns"] = [
        {"name": "Order_ID", "type": "bigint"}, {"name": "amount", "type": "decimal(12,2)"},
        {"name": "extra", "type": "int"}]
    t = load_plan_text(plan_yaml(data)).target_specs()[0]
    found = contract_column_findings(t, "targets[0]", ["order_id", "amount"], "target 't'")
    assert found == [("targets[0].contract.columns[0].name",
                      "contract.columns names column 'Order_ID', which target 't' does not have: "
                      "it has 'order_id' (names match exactly, case included)", "write 'order_id'")]


def test_an_overflowed_decimal_sum_fails_instead_of_vanishing() -> None:
    """Spark's decimal(38, s) sum is null on overflow; a null partial used to be an empty one,
    so that group dropped out of the total (and None vs None passed)."""
    m = MetricSpec("wei", Aggregation.SUM, "v", "v", ThresholdSpec(percent=0.0), per_partition=True)
    rows = [metric_row("d1", {"sum": None, "overflow": 1}, {"sum": None, "overflow": 1}),
            metric_row("d2", {"sum": Decimal(5)}, {"sum": Decimal(5)})]
    _, gates = build_gates(spec(row_count=None, duplicate_check=None, metrics=(m,)), rows, True)
    window, d1, d2 = gates
    assert not window.passed and not d1.passed and d2.passed
    assert window.measured["overflowed_groups"] == {"source": 1, "shadow": 1}
    assert "overflowed decimal(38, s) on the source (1 group(s)) and the shadow" in window.reason


def test_markdown_evidence_shows_kind_counts_and_overflows() -> None:
    from sparkguard.evidence_md import _measured

    m = MetricSpec("m", Aggregation.SUM, "x", "x", ThresholdSpec(percent=0.0), nan=NanRule.EXCLUDE)
    rows = [metric_row("d1", {"sum": 1.0, "posinf": 1}, {"sum": 1.0, "neginf": 1})]
    _, gates = build_gates(spec(row_count=None, duplicate_check=None, metrics=(m,)), rows, True)
    assert _measured(gates[1].to_dict()["measured"]) == "NaN 0, +inf 0, -inf 1"
    wide = MetricSpec("w", Aggregation.SUM, "v", "v", ThresholdSpec(percent=0.0))
    rows = [metric_row("d1", {"sum": None, "overflow": 2}, {"sum": Decimal(1)})]
    _, gates = build_gates(spec(row_count=None, duplicate_check=None, metrics=(wide,)), rows, True)
    assert _measured(gates[0].to_dict()["measured"]) == \
        "1 (decimal sum overflowed, groups: source 2, shadow 0)"


@pytest.mark.parametrize("promotion", ["merge", "merge_changed"])
@pytest.mark.parametrize("checks", ["key-with-partition-column", "no-duplicate-check"])
def test_a_merge_checks_its_business_keys_across_the_window_whatever_the_checks_say(
        promotion: str, checks: str) -> None:
    """key_columns [order_id, order_date] (the seed template's shape) or no duplicate_check at
    all: the MERGE still matches on order_id alone, so a key in two partitions of the shadow
    must fail a gate before the commit (it failed the MERGE with exit 3 on every re-run, or
    under merge_changed moved the target's row and lost the shadow's other one)."""
    data = valid_plan()
    bp = data["backfill_plan"]
    bp["targets"][0]["promotion"] = promotion
    dups = [c for c in bp["validation"]["checks"] if c["type"] == "duplicate_check"]
    if checks == "no-duplicate-check":
        bp["validation"]["checks"] = [c for c in bp["validation"]["checks"] if c not in dups]
    else:
        for c in dups:
            c["key_columns"] = [*bp["targets"][0]["business_keys"], bp["partitioning"]["column"]]
    plan = load_plan_text(plan_yaml(data))
    s = spec_for_target(plan, plan.targets[0])
    keys = tuple(plan.targets[0].business_keys)
    assert keys in s.extra_duplicate_keys
    assert s.extra_duplicate_threshold(keys) == ThresholdSpec(absolute=0.0)
    _, gates = build_gates(s, [row("d1", 100, 100), row("d2", 100, 100)], True,
                           extra_duplicates={keys: 1})
    assert not {g.gate: g for g in gates}[f"duplicate_check[{','.join(keys)}]"].passed


def test_the_merge_key_check_is_exact_and_adds_no_twin() -> None:
    """key_columns [order_id, order_date] at 1 %: the per-partition check keeps 1 %, the
    window-wide order_id check is exact (a key twice in the shadow fails the MERGE at the
    commit, or is inserted twice); keys listed in another order are the same set (no second
    gate); business keys that hold the partition column need none (the per-partition check
    counts exactly that)."""
    data = valid_plan()
    bp = data["backfill_plan"]
    bp["targets"][0]["promotion"] = "merge"
    (dup,) = [c for c in bp["validation"]["checks"] if c["type"] == "duplicate_check"]
    dup.pop("threshold_absolute", None)
    dup.update(key_columns=["order_id", bp["partitioning"]["column"]], threshold_percent=1.0)
    plan = load_plan_text(plan_yaml(data))
    s = spec_for_target(plan, plan.targets[0])
    assert s.extra_duplicate_keys == (("order_id",),)
    assert s.duplicate_check == ThresholdSpec(percent=1.0)
    assert s.extra_duplicate_threshold(("order_id",)) == ThresholdSpec(absolute=0.0)
    bp["targets"][0]["business_keys"] = ["order_id", "customer_id"]
    dup["key_columns"] = ["customer_id", "order_id"]
    plan = load_plan_text(plan_yaml(data))
    s = spec_for_target(plan, plan.targets[0])
    assert s.extra_duplicate_keys == (("customer_id", "order_id"),)
    assert s.extra_duplicate_threshold(("customer_id", "order_id")) == ThresholdSpec(absolute=0.0)
    bp["targets"][0]["business_keys"] = ["order_id", bp["partitioning"]["column"]]
    dup["key_columns"] = None
    plan = load_plan_text(plan_yaml(data))
    assert spec_for_target(plan, plan.targets[0]).extra_duplicate_keys == ()
