"""The NaN rule of metric gates: a NaN or infinite total never passes silently.

``sum``, ``avg``, ``min`` and ``max`` over float inputs: with ``nan: fail`` (the default) a NaN
or infinite input on either side fails the gate, naming the side and the count; with
``nan: exclude`` the finite values are compared and the NaN, +inf and -inf row counts get a gate
of their own, compared per kind. Per window and per partition, on the source-gate path and on the path where a
metric sums a compared float column.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

import pytest

from sparkguard.plan.model import Aggregation, NanRule
from sparkguard.reconcile.engine import reconcile
from sparkguard.reconcile.spec import MetricSpec, ReconcileSpec, ThresholdSpec
from sparkguard.reconcile.verdicts import GateResult, ReconcileResult
from sparkguard.sql import PartitionType

SCHEMA = "p date, k int, x double, f float"
D1, D2 = dt.date(2024, 1, 1), dt.date(2024, 1, 2)
NAN, INF = math.nan, math.inf


def spec(*metrics: MetricSpec) -> ReconcileSpec:
    return ReconcileSpec(partition_column="p", partition_type=PartitionType.DATE,
                         business_keys=("k",), metrics=metrics)


def metric(agg: Aggregation = Aggregation.SUM, nan: NanRule = NanRule.FAIL, expr: str = "x",
           per_partition: bool = False, threshold: ThresholdSpec | None = None) -> MetricSpec:
    return MetricSpec("m", agg, expr, expr, threshold or ThresholdSpec(percent=0.01),
                      per_partition, nan)


def run(spark: Any, sp: ReconcileSpec, source: list[tuple[Any, ...]],
        shadow: list[tuple[Any, ...]], target: list[tuple[Any, ...]] | None = None
        ) -> ReconcileResult:
    def df(rows: list[tuple[Any, ...]]) -> Any:
        return spark.createDataFrame(rows, SCHEMA)
    return reconcile(sp, shadow=df(shadow), source=df(source),
                     target=df(target) if target is not None else None,
                     partitions=[D1, D2], preview=target is not None)


def gate(res: ReconcileResult, name: str = "metric_reconciliation[m]",
         partition: str | None = None) -> GateResult:
    found = [g for g in res.gates if g.gate == name and g.partition == partition]
    assert len(found) == 1, [g.gate for g in res.gates]
    return found[0]


def rows(*xs: float | None) -> list[tuple[Any, ...]]:
    return [(D1, k, x, None if x is None else float(x)) for k, x in enumerate(xs)]


@pytest.mark.parametrize("agg", [Aggregation.SUM, Aggregation.AVG, Aggregation.MIN,
                                 Aggregation.MAX])
def test_nan_on_one_side_fails_naming_side_and_count(spark: Any, agg: Aggregation) -> None:
    res = run(spark, spec(metric(agg)), source=rows(1.0, NAN, 2.0), shadow=rows(1.0, 3.0, 2.0))
    g = gate(res)
    assert not g.passed and not res.passed
    assert g.measured["nan_or_infinite_rows"] == {"source": 1, "shadow": 0}
    assert "the source has 1 NaN or infinite input row(s)" in g.reason
    assert "nan: exclude" in g.reason


def test_nan_on_both_sides_fails_where_it_used_to_pass(spark: Any) -> None:
    # half the finite amounts differ; the NaN totals used to compare equal and pass
    res = run(spark, spec(metric()), source=rows(NAN, 10.0, 20.0), shadow=rows(NAN, 5.0, 10.0))
    g = gate(res)
    assert not g.passed
    assert g.measured["nan_or_infinite_rows"] == {"source": 1, "shadow": 1}
    assert "the source has 1" in g.reason and "the shadow has 1" in g.reason


@pytest.mark.parametrize(("src", "shd"), [(INF, INF), (-INF, -INF), (INF, -INF), (1.0, -INF)])
def test_infinities_of_either_sign_fail(spark: Any, src: float, shd: float) -> None:
    for agg in (Aggregation.SUM, Aggregation.MIN, Aggregation.MAX, Aggregation.AVG):
        res = run(spark, spec(metric(agg)), source=rows(src, 1.0), shadow=rows(shd, 1.0))
        g = gate(res)
        assert not g.passed, (agg, src, shd)
        n = g.measured["nan_or_infinite_rows"]
        assert n == {"source": int(math.isinf(src)), "shadow": 1}


def test_float_column_counts_too(spark: Any) -> None:
    res = run(spark, spec(metric(expr="f")), source=rows(1.0, INF), shadow=rows(1.0, INF))
    assert gate(res).measured["nan_or_infinite_rows"] == {"source": 1, "shadow": 1}


def test_exclude_compares_finite_values_and_counts_separately(spark: Any) -> None:
    m = metric(nan=NanRule.EXCLUDE)
    same = run(spark, spec(m), source=rows(NAN, 10.0, INF, -INF),
               shadow=rows(NAN, 10.0, INF, -INF))
    assert gate(same).passed and gate(same).measured["value"] == 10.0
    assert gate(same, "metric_reconciliation[m].nan_or_infinite_rows").passed
    # a +inf that became -inf or NaN is a change, although each side has one such row
    for flipped in (-INF, NAN):
        res = run(spark, spec(m), source=rows(NAN, 10.0, INF), shadow=rows(NAN, 10.0, flipped))
        assert gate(res).passed  # the finite values agree
        c = gate(res, "metric_reconciliation[m].nan_or_infinite_rows")
        assert not c.passed and c.expected == {"NaN": 1, "+inf": 1, "-inf": 0}, flipped
    # a finite difference is found although both sides hold a NaN
    differ = run(spark, spec(m), source=rows(NAN, 10.0, 20.0), shadow=rows(NAN, 5.0, 10.0))
    assert not gate(differ).passed
    assert (gate(differ).expected, gate(differ).measured["value"]) == (30.0, 15.0)
    # the NaN/infinite counts differ: their own gate fails, the finite values agree
    counts = run(spark, spec(m), source=rows(NAN, 10.0), shadow=rows(NAN, 10.0, INF))
    assert gate(counts).passed
    c = gate(counts, "metric_reconciliation[m].nan_or_infinite_rows")
    assert not c.passed and (c.expected, c.measured["value"]) == (
        {"NaN": 1, "+inf": 0, "-inf": 0}, {"NaN": 1, "+inf": 1, "-inf": 0})


def test_exclude_average_counts_only_finite_inputs(spark: Any) -> None:
    m = metric(Aggregation.AVG, NanRule.EXCLUDE, threshold=ThresholdSpec())
    res = run(spark, spec(m), source=rows(2.0, 4.0, NAN, None), shadow=rows(2.0, 4.0, INF))
    g = gate(res)
    assert g.passed and g.expected == 3.0 and g.measured["value"] == 3.0


def test_window_of_only_nan_rows(spark: Any) -> None:
    fail = run(spark, spec(metric()), source=rows(NAN, NAN), shadow=rows(NAN, NAN))
    assert not gate(fail).passed
    assert gate(fail).measured["nan_or_infinite_rows"] == {"source": 2, "shadow": 2}
    m = metric(nan=NanRule.EXCLUDE)
    ok = run(spark, spec(m), source=rows(NAN, NAN), shadow=rows(NAN, NAN))
    assert gate(ok).passed and gate(ok).measured["value"] is None
    assert gate(ok, "metric_reconciliation[m].nan_or_infinite_rows").passed
    lost = run(spark, spec(m), source=rows(NAN, NAN), shadow=rows(NAN))
    assert not gate(lost, "metric_reconciliation[m].nan_or_infinite_rows").passed


def test_per_partition_gates_follow_the_rule(spark: Any) -> None:
    src = [(D1, 1, 1.0, None), (D2, 2, NAN, None)]
    shd = [(D1, 1, 1.0, None), (D2, 2, 2.0, None)]
    res = run(spark, spec(metric(per_partition=True)), source=src, shadow=shd)
    assert gate(res, partition=str(D1)).passed
    p2 = gate(res, partition=str(D2))
    assert not p2.passed and p2.measured["nan_or_infinite_rows"] == {"source": 1, "shadow": 0}
    assert "in partition 2024-01-02" in p2.reason
    assert not gate(res).passed


def test_sum_of_a_compared_float_column_follows_the_rule(spark: Any) -> None:
    # with a target, a sum over the compared column ``x`` reuses its shuffled per-key value
    target = rows(1.0, 2.0)
    fail = run(spark, spec(metric()), source=rows(1.0, 2.0), shadow=rows(1.0, NAN), target=target)
    assert not gate(fail).passed
    assert gate(fail).measured["nan_or_infinite_rows"] == {"source": 0, "shadow": 1}
    m = metric(nan=NanRule.EXCLUDE, threshold=ThresholdSpec())
    ok = run(spark, spec(m), source=rows(1.0, NAN), shadow=rows(1.0, NAN), target=target)
    assert gate(ok).passed and gate(ok).measured["value"] == 1.0


def test_integer_and_decimal_metrics_are_untouched(spark: Any) -> None:
    res = run(spark, spec(metric(expr="k")), source=rows(NAN, 1.0), shadow=rows(NAN, 1.0))
    g = gate(res)
    assert g.passed and "nan_or_infinite_rows" not in g.measured


def test_plan_check_carries_the_rule_to_the_spec() -> None:
    from sparkguard.plan import load_plan_text
    from sparkguard.reconcile.spec import spec_for_target
    from tests.plan_fixtures import plan_yaml, valid_plan

    data = valid_plan()
    checks = data["backfill_plan"]["validation"]["checks"]
    metric_checks = [c for c in checks if c["type"] == "metric_reconciliation"]
    metric_checks[0]["nan"] = "exclude"
    plan = load_plan_text(plan_yaml(data))
    rules = [m.nan for m in spec_for_target(plan, plan.targets[0]).metrics]
    assert rules[0] is NanRule.EXCLUDE and all(r is NanRule.FAIL for r in rules[1:])
    metric_checks[0]["nan"] = "ignore"
    with pytest.raises(Exception, match="nan"):
        load_plan_text(plan_yaml(data))


# -- drift: the current target against the shadow ----------------------------------------------

def test_drift_gate_compares_the_current_target_with_the_shadow(spark: Any) -> None:
    src = [(D1, 1, 10.0, None), (D2, 2, 20.0, None)]
    shd = [(D1, 1, 10.0, None), (D2, 2, 20.0, None)]
    target = [(D1, 1, 10.0, None), (D2, 2, 200.0, None)]  # published numbers: D2 x10
    m = MetricSpec("m", Aggregation.SUM, "x", "x", ThresholdSpec(percent=0.0), False,
                   NanRule.FAIL, ThresholdSpec(percent=5.0))
    res = run(spark, spec(m), source=src, shadow=shd, target=target)
    assert gate(res).passed  # the shadow matches the source
    window = gate(res, "metric_drift[m]")
    assert not window.passed and (window.expected, window.measured["value"]) == (210.0, 30.0)
    assert window.check_type == "metric_drift"
    assert gate(res, "metric_drift[m]", str(D1)).passed
    d2 = gate(res, "metric_drift[m]", str(D2))
    assert not d2.passed and (d2.expected, d2.measured["value"]) == (200.0, 20.0)
    # without a drift threshold the move is reported (per partition, target side) but not gated
    plain = run(spark, spec(metric(threshold=ThresholdSpec(percent=0.0))), source=src,
                shadow=shd, target=target)
    assert plain.passed and not [g for g in plain.gates if g.gate.startswith("metric_drift")]
    assert {p.partition: p.metrics["m"]["target"] for p in plain.partitions} == {
        str(D1): 10.0, str(D2): 200.0}
