"""The reconciliation engine against a brute-force pure-Python reference (hypothesis).

Small generated tables -- nulls, NaN, -0.0, infinities, floats within and beyond tolerance,
decimals, timestamps, strings with trailing spaces, duplicate and null keys, empty partitions --
are reconciled by the engine on Spark and by :func:`reference` in plain Python; every count,
metric, null count, change and sample must agree.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkguard.plan.model import Aggregation
from sparkguard.reconcile.engine import reconcile
from sparkguard.reconcile.spec import MetricSpec, ReconcileSpec, ThresholdSpec
from sparkguard.reconcile.verdicts import ReconcileResult
from sparkguard.sql import PartitionType

SCHEMA = "p date, k int, i int, x double, d decimal(10,2), s string, t timestamp"
COLUMNS = ("p", "k", "i", "x", "d", "s", "t")
COMPARED = ("i", "x", "d", "s", "t")
DAYS = (dt.date(2024, 1, 1), dt.date(2024, 1, 2), dt.date(2024, 1, 3))  # the last may be empty
TOL = 1e-9
# the reference's change kinds as the engine's per-partition counts (and ChangePreview) name them
PAST = {"insert": "inserted", "delete": "deleted", "change": "changed", "unchanged": "unchanged",
        "ambiguous": "ambiguous"}
T0 = dt.datetime(2024, 1, 1, 12, 0, 0)

KEYS = st.one_of(st.integers(0, 4), st.none())
INTS = st.one_of(st.none(), st.integers(-3, 3))
FLOATS = st.sampled_from([None, math.nan, 0.0, -0.0, 1.0, 1.0 + 1e-12, 1.0 + 1e-6, 2.5,
                          math.inf, -math.inf, 1e300, -7.25])
DECIMALS = st.sampled_from([None, Decimal("0.00"), Decimal("1.10"), Decimal("1.11"),
                            Decimal("-5.00"), Decimal("99999999.99")])
STRINGS = st.sampled_from([None, "", "a", "a ", " a", "b", "b  "])
TIMES = st.sampled_from([None, T0, T0 + dt.timedelta(microseconds=1), T0 + dt.timedelta(days=3)])
VALUES = {"i": INTS, "x": FLOATS, "d": DECIMALS, "s": STRINGS, "t": TIMES}


def row_strategy(days: Sequence[dt.date] = DAYS[:2]) -> st.SearchStrategy[tuple[Any, ...]]:
    return st.tuples(st.sampled_from(days), KEYS, INTS, FLOATS, DECIMALS, STRINGS, TIMES)


@st.composite
def tables(draw: st.DrawFn) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """A target and a shadow derived from it: rows kept, changed, dropped, duplicated, added."""
    target = draw(st.lists(row_strategy(), max_size=10))
    shadow: list[tuple[Any, ...]] = []
    for row in target:
        op = draw(st.sampled_from(["keep", "keep", "change", "drop", "dup"]))
        if op == "drop":
            continue
        if op == "change":
            col = draw(st.sampled_from(COMPARED))
            row = tuple(draw(VALUES[col]) if c == col else v for c, v in zip(COLUMNS, row, strict=True))
        shadow += [row, row] if op == "dup" else [row]
    shadow += draw(st.lists(row_strategy(), max_size=4))
    return target, shadow


# -- the brute-force reference ----------------------------------------------------------------

def same(col: str, a: Any, b: Any, spec: ReconcileSpec) -> bool:
    """Documented comparison of one value before (b) and after (a)."""
    if a is None or b is None:
        return a is None and b is None
    if col == "x":
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        if math.isinf(a) or math.isinf(b):  # an infinity equals only itself
            return bool(a == b)
        return a == b or abs(a - b) <= spec.float_abs_tolerance + spec.float_rel_tolerance * abs(b)
    if col == "s" and spec.ignore_trailing_spaces:
        return bool(a.rstrip(" ") == b.rstrip(" "))
    return bool(a == b)


@dataclass
class Ref:
    rows: dict[str, Counter[Any]] = field(default_factory=dict)
    dups: dict[str, Counter[Any]] = field(default_factory=dict)
    nulls: Counter[tuple[Any, str]] = field(default_factory=Counter)
    changes: dict[Any, Counter[str]] = field(default_factory=dict)
    by_column: Counter[str] = field(default_factory=Counter)
    kinds: dict[tuple[Any, Any], str] = field(default_factory=dict)
    changed_columns: dict[tuple[Any, Any], list[str]] = field(default_factory=dict)
    groups: dict[str, dict[tuple[Any, Any], list[dict[str, Any]]]] = field(default_factory=dict)


def grouped(rows: Sequence[dict[str, Any]]) -> dict[tuple[Any, Any], list[dict[str, Any]]]:
    out: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault((r["p"], r["k"]), []).append(r)
    return out


def reference(spec: ReconcileSpec, shadow: list[dict[str, Any]], target: list[dict[str, Any]],
              source: list[dict[str, Any]] | None) -> Ref:
    ref = Ref()
    sides = {"shadow": shadow, "target": target, **({"source": source} if source is not None else {})}
    for name, rows in sides.items():
        ref.rows[name] = Counter(r["p"] for r in rows)
        ref.groups[name] = grouped(rows)
        ref.dups[name] = Counter(p for (p, _k), g in ref.groups[name].items() if len(g) > 1)
    for r in shadow:
        for c in spec.not_null:
            ref.nulls[(r["p"], c)] += r[c] is None
    s_groups, t_groups = ref.groups["shadow"], ref.groups["target"]
    for key in set(s_groups) | set(t_groups):
        a, b = s_groups.get(key, []), t_groups.get(key, [])
        if a and not b:
            kind = "insert"
        elif b and not a:
            kind = "delete"
        elif len(a) > 1 or len(b) > 1:
            kind = "ambiguous"
        else:
            cols = [c for c in COMPARED if not same(c, a[0][c], b[0][c], spec)]
            ref.changed_columns[key] = cols
            ref.by_column.update(cols)
            kind = "change" if cols else "unchanged"
        ref.kinds[key] = kind
        ref.changes.setdefault(key[0], Counter())[kind] += 1
    return ref


def metric_ref(agg: Aggregation, values: list[Any]) -> Any:
    present = [v for v in values if v is not None]
    if agg is Aggregation.COUNT:
        return len(present)
    if agg is Aggregation.COUNT_DISTINCT:
        return len(set(present))
    if not present:
        return None
    if agg is Aggregation.SUM:
        return sum(present)
    if agg is Aggregation.MIN:
        return min(present)
    if agg is Aggregation.MAX:
        return max(present)
    return float(sum(present)) / len(present)


def close(a: Any, b: Any) -> bool:
    if isinstance(a, dt.datetime) and isinstance(b, dt.datetime):  # naive: local time, as
        return a.astimezone(dt.UTC) == b.astimezone(dt.UTC)        # createDataFrame read it
    if isinstance(a, float) or isinstance(b, float):
        if a is None or b is None:
            return a is b
        a, b = float(a), float(b)
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6)
    return bool(a == b)


# -- the comparison ---------------------------------------------------------------------------

METRICS = (
    MetricSpec("sum_i", Aggregation.SUM, "i", "i", ThresholdSpec(percent=1.0)),
    MetricSpec("n_s", Aggregation.COUNT, "s", "s", ThresholdSpec(absolute=0.0)),
    MetricSpec("min_t", Aggregation.MIN, "t", "t", ThresholdSpec()),
    MetricSpec("max_d", Aggregation.MAX, "d", "d", ThresholdSpec(), per_partition=True),
    MetricSpec("avg_d", Aggregation.AVG, "d", "d", ThresholdSpec(percent=0.5)),
    MetricSpec("sum_x", Aggregation.SUM, "x", "x", ThresholdSpec(percent=0.5), per_partition=True),
)
CD = MetricSpec("cd_s", Aggregation.COUNT_DISTINCT, "s", "s", ThresholdSpec(), per_partition=True)
CD_WINDOW = MetricSpec("cd_t", Aggregation.COUNT_DISTINCT, "t", "t", ThresholdSpec())


def check(result: ReconcileResult, spec: ReconcileSpec, ref: Ref, shadow: list[dict[str, Any]],
          target: list[dict[str, Any]], source: list[dict[str, Any]] | None) -> None:
    stats = {s.partition: s for s in result.partitions}
    parts = [str(d) for d in DAYS]
    assert list(stats)[:3] == parts
    ref_side = "source" if source is not None else "target"
    sides = {"shadow": shadow, "target": target, "source": source or []}
    for day in DAYS:
        s = stats[str(day)]
        assert (s.rows_shadow, s.rows_target, s.rows_source) == (
            ref.rows["shadow"][day], ref.rows["target"][day], ref.rows.get("source", Counter())[day])
        assert s.duplicate_keys_shadow == ref.dups["shadow"][day]
        assert s.duplicate_keys_source == (ref.dups["source"][day] if spec.key_source and source
                                           is not None else 0)
        assert s.nulls == {c: ref.nulls[(day, c)] for c in spec.not_null}
        got = {k: v for k, v in s.changes.items() if v}
        assert got == {PAST[k]: v for k, v in ref.changes.get(day, Counter()).items() if v}
        for m in spec.metrics:
            for side, rows in sides.items():
                if side == "source" and source is None:
                    continue
                values = [r[m.shadow_expr] for r in rows if r["p"] == day]
                if m.aggregation is Aggregation.COUNT_DISTINCT and not m.per_partition:
                    assert s.metrics[m.name][side] is None  # counted for the window only
                    continue
                assert close(s.metrics[m.name][side], metric_ref(m.aggregation, values)), (m, side, day)
    pv = result.preview
    assert pv is not None
    totals = Counter(ref.kinds.values())
    assert (pv.inserted, pv.deleted, pv.changed, pv.unchanged, pv.ambiguous) == (
        totals["insert"], totals["delete"], totals["change"], totals["unchanged"], totals["ambiguous"])
    assert pv.changed_by_column == {c: ref.by_column[c] for c in COMPARED}
    # window-level metric gates: measured (shadow) and expected (source, else target)
    window_gates = {g.gate: g for g in result.gates if g.partition is None}
    for m in spec.metrics:
        g = window_gates[f"metric_reconciliation[{m.name}]"]
        assert close(g.measured["value"], metric_ref(m.aggregation, [r[m.shadow_expr] for r in shadow]))
        ref_rows = sides[ref_side]
        assert close(g.expected, metric_ref(m.aggregation, [r[m.shadow_expr] for r in ref_rows]))
    matched_twice = sum(1 for key, rows in ref.groups["target"].items()
                        if len(rows) > 1 and ref.groups["shadow"].get(key))
    target_parts: dict[Any, set[Any]] = {}
    for p, k in ref.groups["target"]:
        target_parts.setdefault(k, set()).add(p)
    shadow_parts: dict[Any, set[Any]] = {}
    for p, k in ref.groups["shadow"]:
        shadow_parts.setdefault(k, set()).add(p)
    # keys of the shadow the target holds in two partitions, or twice in a partition the
    # shadow does not hold the key in; looked for when the preview deletes something (else
    # such a key is in two partitions of the shadow too, which the shadow's own duplicate
    # check fails)
    # (a key counted in matched_twice is not counted again: one key is one duplicate key)
    spread = sum(1 for k, parts in target_parts.items() if k in shadow_parts and (
        len(parts) > 1 or any(len(ref.groups["target"][(tp, k)]) > 1
                              for tp in parts if tp not in shadow_parts[k]))
        and not any(len(ref.groups["target"].get((sp, k), ())) > 1 for sp in shadow_parts[k])
    ) if totals["delete"] else 0
    if spec.merge_keys:  # a key of the shadow the target's window holds twice
        gate = window_gates["merge_target_keys"]
        assert gate.measured == {"duplicate_keys": matched_twice + spread,
                                 "in_one_partition": matched_twice,
                                 "across_partitions": spread}, (gate.measured, matched_twice, spread)
        assert gate.passed == (not matched_twice + spread)
    else:
        assert "merge_target_keys" not in window_gates
    for cols in spec.extra_duplicate_keys:
        n = sum(1 for v in Counter(tuple(r[c] for c in cols) for r in shadow).values() if v > 1)
        assert window_gates[f"duplicate_check[{','.join(cols)}]"].measured["duplicate_keys"] == n
    # samples: bounded, from at most two partitions, each consistent with the reference
    assert len(pv.sample) <= spec.sample_size
    assert len({e["partition"] for e in pv.sample}) <= 2
    for e in pv.sample:
        key = (e["partition"], e["key"]["k"])
        assert ref.kinds[key] == e["kind"]
        after, before = ref.groups["shadow"].get(key, []), ref.groups["target"].get(key, [])
        assert (e["after"] is None) == (not after) and (e["before"] is None) == (not before)
        if e["kind"] == "change":
            assert e["changed_columns"] == ref.changed_columns[key]
            assert e["after"]["d"] == after[0]["d"] and e["before"]["s"] == before[0]["s"]
    for e in result.duplicate_sample:
        key = (e["partition"], e["key"]["k"])
        assert len(ref.groups[e["side"]][key]) == e["rows"] > 1
    # a difference under a non-null key is sampled (null keys are counted, never sampled)
    if spec.sample_size and any(kind in ("insert", "delete", "change") and key[1] is not None
                                for key, kind in ref.kinds.items()):
        assert pv.sample
    if any(len(g) > 1 and key[1] is not None for key, g in ref.groups["shadow"].items()):
        assert any(e["side"] == "shadow" for e in result.duplicate_sample)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.data_too_large])
@given(data=tables(), source=st.one_of(st.none(), st.lists(row_strategy(), max_size=6)),
       key_source=st.booleans(), count_distinct=st.booleans(), extra_dups=st.booleans(),
       trim=st.booleans(), merge=st.booleans())
def test_engine_agrees_with_brute_force(spark: Any, data: tuple[list[Any], list[Any]],
                                        source: list[Any] | None, key_source: bool,
                                        count_distinct: bool, extra_dups: bool, trim: bool,
                                        merge: bool) -> None:
    target_rows, shadow_rows = data
    spec = ReconcileSpec(
        partition_column="p", partition_type=PartitionType.DATE, business_keys=("k",),
        row_count=ThresholdSpec(percent=0.0), row_count_per_partition=True,
        metrics=(*METRICS, *((CD, CD_WINDOW) if count_distinct else ())), not_null=("s", "i"),
        float_abs_tolerance=TOL, float_rel_tolerance=TOL, ignore_trailing_spaces=trim,
        key_source=key_source, extra_duplicate_keys=((("k",),) if extra_dups else ()),
        merge_keys=merge)

    def frame(rows: list[Any]) -> Any:
        return spark.createDataFrame(rows, SCHEMA)

    result = reconcile(spec, shadow=frame(shadow_rows), target=frame(target_rows),
                       source=frame(source) if source is not None else None,
                       partitions=list(DAYS), scope="property")
    as_dicts = [[dict(zip(COLUMNS, r, strict=True)) for r in rows]
                for rows in (shadow_rows, target_rows, source or [])]
    src = as_dicts[2] if source is not None else None
    ref = reference(spec, as_dicts[0], as_dicts[1], src)
    check(result, spec, ref, as_dicts[0], as_dicts[1], src)


def test_documented_comparison_rules(spark: Any) -> None:
    """Each documented rule on one key: what is a change and what is not."""
    day = DAYS[0]
    pairs = {  # key: (before, after) for (x, d, s, t)
        1: ((math.nan, None, "a", T0), (math.nan, None, "a", T0)),           # NaN = NaN, null = null
        2: ((0.0, Decimal("1.10"), "a", T0), (-0.0, Decimal("1.10"), "a", T0)),  # -0.0 = 0.0
        3: ((1.0, None, None, None), (1.0 + 1e-12, None, None, None)),       # within tolerance
        4: ((1.0, None, None, None), (1.0 + 1e-6, None, None, None)),        # beyond tolerance
        5: ((math.inf, None, None, None), (math.inf, None, None, None)),     # inf = inf
        6: ((math.inf, None, None, None), (-math.inf, None, None, None)),    # inf != -inf
        7: ((None, None, "a", None), (None, None, "a ", None)),              # trailing space
        8: ((None, Decimal("1.10"), None, None), (None, Decimal("1.11"), None, None)),
        9: ((None, None, None, T0), (None, None, None, T0 + dt.timedelta(microseconds=1))),
        10: ((None, None, None, None), (0.0, None, "", None)),               # null != 0 / ""
    }
    target = spark.createDataFrame([(day, k, 1, *b) for k, (b, _a) in pairs.items()], SCHEMA)
    shadow = spark.createDataFrame([(day, k, 1, *a) for k, (_b, a) in pairs.items()], SCHEMA)
    spec = ReconcileSpec(partition_column="p", partition_type=PartitionType.DATE,
                         business_keys=("k",))
    expected_columns = {4: ["x"], 6: ["x"], 7: ["s"], 8: ["d"], 9: ["t"], 10: ["x", "s"]}
    for trim in (False, True):
        res = reconcile(replace(spec, ignore_trailing_spaces=trim), shadow=shadow, target=target,
                        partitions=[day])
        changed = {k: v for k, v in expected_columns.items() if not (trim and k == 7)}
        assert res.preview is not None
        assert (res.preview.changed, res.preview.unchanged) == (len(changed), 10 - len(changed))
        assert res.preview.changed_by_column == {"i": 0, "d": 1, "s": 2 - trim, "t": 1, "x": 3}
        assert res.preview.sample
        for e in res.preview.sample:
            assert e["kind"] == "change"
            assert e["changed_columns"] == sorted(changed[e["key"]["k"]], key=COMPARED.index)


def test_extra_duplicate_keys_count_across_the_window(spark: Any) -> None:
    """A key set without the partition column is unique in the window: a key on two dates is a
    duplicate there, but not a duplicate business key (partition + keys)."""
    rows = [(DAYS[0], 1, 1, None, None, "a", None), (DAYS[1], 1, 2, None, None, "a", None),
            (DAYS[0], None, 3, None, None, "a", None), (DAYS[1], None, 4, None, None, "a", None),
            (DAYS[0], 2, 5, None, None, "a", None)]
    shadow = spark.createDataFrame(rows, SCHEMA)
    spec = ReconcileSpec(partition_column="p", partition_type=PartitionType.DATE,
                         business_keys=("k",), duplicate_check=ThresholdSpec(absolute=0.0),
                         extra_duplicate_keys=(("k",), ("p", "k")))
    res = reconcile(spec, shadow=shadow, target=shadow, partitions=list(DAYS[:2]))
    gates = {g.gate: g for g in res.gates if g.partition is None}
    assert gates["duplicate_check[k]"].measured["duplicate_keys"] == 2  # 1 and null
    assert not gates["duplicate_check[k]"].passed
    assert gates["duplicate_check[p,k]"].measured["duplicate_keys"] == 0
    assert gates["duplicate_check"].measured["duplicate_keys"] == 0
    assert [s.partition for s in res.partitions] == [str(d) for d in DAYS[:2]]  # no window row


def test_timestamp_min_max_are_utc_instants_in_any_driver_zone(spark: Any) -> None:
    """pyspark hands a timestamp to the driver as a naive datetime in the OS time zone, which
    folds New York's repeated autumn hour and stretches its spring change. The metric compares
    instants: an hour apart inside the repeated hour fails an exact gate, two minutes across the
    spring change pass a 300 s one, and the sample shows the changed value in UTC."""
    old = os.environ.get("TZ")
    os.environ["TZ"] = "America/New_York"
    time.tzset()
    try:
        schema, day = "p date, k int, t timestamp", DAYS[0]

        def frame(*ts: str) -> Any:
            return spark.createDataFrame(
                [(day, k, dt.datetime.fromisoformat(t)) for k, t in enumerate(ts)], schema)

        exact = ReconcileSpec(
            partition_column="p", partition_type=PartitionType.DATE, business_keys=("k",),
            metrics=(MetricSpec("last", Aggregation.MAX, "t", "t", ThresholdSpec(percent=0.0)),
                     MetricSpec("first", Aggregation.MIN, "t", "t", ThresholdSpec(percent=0.0))))
        before = frame("2026-11-01T05:30:00+00:00")
        after = frame("2026-11-01T06:30:00+00:00")
        res = reconcile(exact, shadow=after, source=before, target=before, partitions=[day])
        gates = {g.gate: g for g in res.gates if g.partition is None}
        for name in ("metric_reconciliation[last]", "metric_reconciliation[first]"):
            g = gates[name]
            assert not g.passed and g.measured["abs_diff"] == 3600.0, g.reason
            assert g.expected == dt.datetime(2026, 11, 1, 5, 30, tzinfo=dt.UTC)
        assert res.preview is not None and res.preview.changed == 1
        (sample,) = res.preview.sample
        assert sample["changed_columns"] == ["t"]
        assert sample["after"]["t"] == dt.datetime(2026, 11, 1, 6, 30, tzinfo=dt.UTC)
        loose = replace(exact, metrics=(
            MetricSpec("first", Aggregation.MIN, "t", "t", ThresholdSpec(absolute=300)),))
        res = reconcile(loose, shadow=frame("2026-03-08T07:01:00+00:00"),
                        source=frame("2026-03-08T06:59:00+00:00"), partitions=[day])
        (g,) = [g for g in res.gates if g.gate == "metric_reconciliation[first]"]
        assert g.passed and g.measured["abs_diff"] == 120.0, g.reason
    finally:
        os.environ.pop("TZ") if old is None else os.environ.update(TZ=old)
        time.tzset()


def test_wide_decimal_sums_stay_exact(spark: Any) -> None:
    """A decimal(38, 2) sum over keys of several kinds in one partition (unchanged, changed,
    inserted: partials folded on the driver) keeps every digit, and a one-cent change fails an
    exact metric gate."""
    big = Decimal("123456789012345678901234567890123.45")
    plus_cent = Decimal("123456789012345678901234567890123.46")  # no Python arithmetic: it rounds
    schema = "p date, k int, v decimal(38,2)"
    target = spark.createDataFrame([(DAYS[0], 1, big), (DAYS[0], 2, big), (DAYS[1], 3, big)], schema)
    shadow = spark.createDataFrame([(DAYS[0], 1, big), (DAYS[0], 2, plus_cent),
                                    (DAYS[0], 4, Decimal("0.01")), (DAYS[1], 3, big)], schema)
    m = MetricSpec("v_total", Aggregation.SUM, "v", "v", ThresholdSpec(), per_partition=True)
    spec = ReconcileSpec(partition_column="p", partition_type=PartitionType.DATE,
                         business_keys=("k",), metrics=(m,))
    res = reconcile(spec, shadow=shadow, target=target, partitions=list(DAYS[:2]))
    day0 = res.partitions[0].metrics["v_total"]
    assert day0["shadow"] == Decimal("246913578024691357802469135780246.92")
    assert day0["target"] == Decimal("246913578024691357802469135780246.90")
    window = next(g for g in res.gates if g.gate == "metric_reconciliation[v_total]"
                  and g.partition is None)
    assert not window.passed and window.measured["abs_diff"] == pytest.approx(0.02)
    assert res.preview is not None and (res.preview.changed, res.preview.inserted) == (1, 1)


def _wide_sum_gates(spark: Any, ansi: str, rows: list[tuple[Any, ...]], dtype: str,
                    shadow_rows: list[tuple[Any, ...]] | None = None) -> dict[Any, Any]:
    """The sum gates (window: None, and per partition) of a keyed shadow against an unkeyed
    source over ``rows`` (p, k, v) with ``v`` of ``dtype``, under spark.sql.ansi.enabled."""
    schema = f"p date, k int, v {dtype}"
    source = spark.createDataFrame(rows, schema)
    shadow = spark.createDataFrame(shadow_rows or rows, schema)
    m = MetricSpec("wei", Aggregation.SUM, "v", "v", ThresholdSpec(percent=0.0), per_partition=True)
    spec = ReconcileSpec(partition_column="p", partition_type=PartitionType.DATE,
                         business_keys=("k",), metrics=(m,))
    old = spark.conf.get("spark.sql.ansi.enabled")
    spark.conf.set("spark.sql.ansi.enabled", ansi)
    try:
        res = reconcile(spec, shadow=shadow, source=source, partitions=list(DAYS[:2]),
                        preview=False)
    finally:
        spark.conf.set("spark.sql.ansi.enabled", old)
    return {g.partition: g for g in res.gates if g.gate == "metric_reconciliation[wei]"}


@pytest.mark.parametrize("ansi", ["false", "true"])
def test_wide_decimal_sums_are_exact_and_only_a_real_overflow_fails(spark: Any, ansi: str) -> None:
    """decimal(38, 18) amounts of 6e19: two of them pass the type's 1e20, and with a third of
    the other sign they pass it on the way (try_sum over the values gave up there, whatever the
    row order made of it). Summed as whole and fractional parts, both totals are exact, on the
    unkeyed source (folded per partition) and the keyed shadow (folded over keys), ANSI on or
    off, and one unit of the last digit still fails. A decimal(38, 0) total past 38 digits
    overflows: the gate fails naming it."""
    big = Decimal("60000000000000000000.000000000000000001")
    rows = [(DAYS[0], 1, big), (DAYS[0], 2, big), (DAYS[0], 3, big.copy_negate()),
            (DAYS[1], 4, Decimal(1))]  # (Python's own arithmetic rounds to 28 digits)
    gates = _wide_sum_gates(spark, ansi, rows, "decimal(38,18)")
    assert all(g.passed for g in gates.values()), [g.reason for g in gates.values()]
    assert gates[None].expected == Decimal("60000000000000000001.000000000000000001")
    assert gates[str(DAYS[0])].expected == big
    two = _wide_sum_gates(spark, ansi, rows[:2] + rows[3:], "decimal(38,18)")
    assert two[None].passed
    assert two[None].expected == Decimal("120000000000000000001.000000000000000002")
    moved = [*rows[:2], (DAYS[0], 3, Decimal("-60000000000000000000.000000000000000000")),
             rows[3]]
    gates = _wide_sum_gates(spark, ansi, rows, "decimal(38,18)", moved)
    assert not gates[None].passed and not gates[str(DAYS[0])].passed
    assert Decimal(str(gates[None].measured["abs_diff"])) == Decimal("1e-18")
    huge = Decimal("6e37")
    gates = _wide_sum_gates(spark, ansi, [(DAYS[0], 1, huge), (DAYS[0], 2, huge),
                                          (DAYS[1], 3, Decimal(1))], "decimal(38,0)")
    assert not gates[None].passed and not gates[str(DAYS[0])].passed
    assert gates[None].measured["overflowed_groups"] == {"source": 1, "shadow": 1}
    assert "overflowed" in gates[None].reason
    assert gates[str(DAYS[1])].passed and gates[str(DAYS[1])].expected == Decimal(1)


@pytest.mark.parametrize("ansi", ["false", "true"])
def test_long_and_timestamp_sums_stay_exact_past_a_long(spark: Any, ansi: str) -> None:
    """Sums of longs near 2**62, and of 6,000 timestamps (their unix_micros pass 2**63), are
    exact whatever spark.sql.ansi.enabled: a plain long sum wraps silently with ANSI off (a
    wrong value in the evidence, a threshold against it) and fails the run with it on. A change
    of one unit still fails an exact gate."""
    from pyspark.sql import functions as F

    n, base = 6000, dt.datetime(2026, 3, 8, tzinfo=dt.UTC)

    def frame(bump: int) -> Any:
        return spark.range(n).select(
            F.lit(DAYS[0]).alias("p"), F.col("id").cast("int").alias("k"),
            (F.lit(2 ** 62) + F.col("id") + F.when(F.col("id") == 7, bump).otherwise(0))
            .alias("v"),
            F.timestamp_seconds(F.lit(int(base.timestamp())) + F.col("id")).alias("ts"))

    metrics = (MetricSpec("big", Aggregation.SUM, "v", "v", ThresholdSpec(percent=0.0)),
               MetricSpec("ts_total", Aggregation.SUM, "ts", "ts", ThresholdSpec(percent=0.0)))
    spec = ReconcileSpec(partition_column="p", partition_type=PartitionType.DATE,
                         business_keys=("k",), metrics=metrics)
    old = spark.conf.get("spark.sql.ansi.enabled")
    spark.conf.set("spark.sql.ansi.enabled", ansi)
    try:
        same = reconcile(spec, shadow=frame(0), source=frame(0), partitions=[DAYS[0]],
                         preview=False)
        off_by_one = reconcile(spec, shadow=frame(1), source=frame(0), partitions=[DAYS[0]],
                               preview=False)
    finally:
        spark.conf.set("spark.sql.ansi.enabled", old)
    got = same.partitions[0].metrics
    assert got["big"]["shadow"] == got["big"]["source"] == n * 2 ** 62 + n * (n - 1) // 2
    micros = int(base.timestamp()) * 10 ** 6
    assert got["ts_total"]["shadow"] == n * micros + 10 ** 6 * n * (n - 1) // 2
    assert all(g.passed for g in same.gates if g.gate.startswith("metric_")), same.gates
    gate = next(g for g in off_by_one.gates if g.gate == "metric_reconciliation[big]"
                and g.partition is None)
    assert not gate.passed and gate.measured["abs_diff"] == 1


def test_slice_gates_without_preview_keep_the_target_not_null_contract(spark: Any) -> None:
    """``preview=False`` (a slice): no change preview, but a column NOT NULL in the target is
    still checked on the shadow's values; without a source there is nothing to gate against."""
    strict = SCHEMA.replace("s string", "s string NOT NULL")
    target = spark.createDataFrame([(DAYS[0], 1, 1, None, None, "a", None)], strict)
    assert not target.schema["s"].nullable
    shadow = spark.createDataFrame([(DAYS[0], 1, 1, None, None, None, None),
                                    (DAYS[0], 2, 1, None, None, "b", None)], SCHEMA)
    spec = ReconcileSpec(partition_column="p", partition_type=PartitionType.DATE,
                         business_keys=("k",), row_count=ThresholdSpec(percent=0.0))
    res = reconcile(spec, shadow=shadow, target=target, source=shadow, partitions=[DAYS[0]],
                    preview=False)
    assert res.preview is None
    gates = {g.gate: g for g in res.gates if g.partition is None}
    assert not gates["not_null[s]"].passed and gates["not_null[s]"].measured == 1
    assert gates["row_count_parity"].passed  # against the source, not the one-row target
    with pytest.raises(ValueError, match="needs a source"):
        reconcile(spec, shadow=shadow, target=target, partitions=[DAYS[0]], preview=False)


def test_not_null_names_the_shadow_lacks_fail_instead_of_vanishing(spark: Any) -> None:
    """``custmer_id`` (a typo) and ``S`` (another case) used to be dropped from the contract,
    so their gates never ran; each now fails, naming the column."""
    shadow = spark.createDataFrame([(DAYS[0], 1, 1, None, None, None, None)], SCHEMA)
    spec = ReconcileSpec(partition_column="p", partition_type=PartitionType.DATE,
                         business_keys=("k",), not_null=("i", "S", "custmer_id"))
    res = reconcile(spec, shadow=shadow, source=shadow, partitions=[DAYS[0]], preview=False)
    gates = {g.gate: g for g in res.gates}
    assert gates["not_null[i]"].passed
    assert not gates["not_null[S]"].passed and "it has 's'" in gates["not_null[S]"].reason
    assert not gates["not_null[custmer_id]"].passed and not res.passed


def plan_nodes(node: Any) -> list[Any]:
    """Every node of a JVM physical plan (inside adaptive execution too)."""
    if node.getClass().getSimpleName() == "AdaptiveSparkPlanExec":
        node = node.inputPlan()
    out, children = [node], node.children()
    for i in range(children.size()):
        out += plan_nodes(children.apply(i))
    return out


@pytest.mark.parametrize("keyed", [False, True])
def test_one_scan_per_side_and_narrow_shuffle(spark: Any, lake: Any, keyed: bool) -> None:
    """The verdict plan reads each Delta table once and shuffles only narrow columns."""
    from sparkguard.reconcile import engine

    rows = [(DAYS[0], k, k, 1.5, Decimal("1.00"), "wide value " * 20, T0) for k in range(20)]
    paths = {}
    for name in ("shadow", "target", "source"):
        paths[name] = str(lake / name)
        spark.createDataFrame(rows, SCHEMA).write.format("delta").partitionBy("p").save(paths[name])
    frames = {n: spark.read.format("delta").load(p) for n, p in paths.items()}
    spec = ReconcileSpec(partition_column="p", partition_type=PartitionType.DATE,
                         business_keys=("k",), metrics=METRICS[:2], not_null=("s",), key_source=keyed)
    lay = engine._layout(spec, frames["shadow"], frames["target"], frames["source"])
    plan = engine._verdict_frame(spec, lay, frames["shadow"], frames["target"], frames["source"])
    nodes = plan_nodes(plan._jdf.queryExecution().executedPlan())
    scans = [n for n in nodes if n.getClass().getSimpleName() == "FileSourceScanExec"]
    assert len(scans) == 3  # shadow, target and source: each read once
    data_columns = set(COLUMNS) - {"p", "k"}
    for n in nodes:
        if n.getClass().getSimpleName() == "ShuffleExchangeExec":
            out = n.output()
            shuffled = {out.apply(i).name() for i in range(out.size())}
            assert not shuffled & data_columns, shuffled
    res = engine.reconcile(spec, shadow=frames["shadow"], target=frames["target"],
                           source=frames["source"], partitions=[DAYS[0]])
    assert res.passed and res.preview is not None and res.preview.unchanged == 20

    # a count_distinct metric reads its input again, and nothing else of the row
    spec = replace(spec, metrics=(*METRICS[:2], CD))
    lay = engine._layout(spec, frames["shadow"], frames["target"], frames["source"])
    cd = engine._distinct_frame(spec, lay, {engine.SOURCE: frames["source"],
                                            engine.SHADOW: frames["shadow"],
                                            engine.TARGET: frames["target"]})
    assert cd is not None
    for n in plan_nodes(cd._jdf.queryExecution().executedPlan()):
        if n.getClass().getSimpleName() == "FileSourceScanExec":
            out = n.output()
            assert {out.apply(i).name() for i in range(out.size())} <= {"p", "s"}
    # checked for the window only: one narrow read per side, no per-partition count
    for metrics, reads in (((CD_WINDOW,), 3), ((CD, CD_WINDOW), 6)):
        spec = replace(spec, metrics=metrics)
        lay = engine._layout(spec, frames["shadow"], frames["target"], frames["source"])
        cd = engine._distinct_frame(spec, lay, {engine.SOURCE: frames["source"],
                                                engine.SHADOW: frames["shadow"],
                                                engine.TARGET: frames["target"]})
        assert cd is not None
        scans = [n for n in plan_nodes(cd._jdf.queryExecution().executedPlan())
                 if n.getClass().getSimpleName() == "FileSourceScanExec"]
        assert len(scans) == reads
    res = engine.reconcile(spec, shadow=frames["shadow"], target=frames["target"],
                           source=frames["source"], partitions=[DAYS[0]])
    (stats,) = res.partitions
    assert stats.metrics["cd_s"] == {"source": 1, "shadow": 1, "target": 1}
    assert stats.metrics["cd_t"] == {"source": None, "shadow": None, "target": None}
    window = {g.gate: g for g in res.gates if g.partition is None}
    assert window["metric_reconciliation[cd_t]"].measured["value"] == 1
    assert window["metric_reconciliation[cd_t]"].expected == 1


def test_count_distinct_is_one_aggregate_per_input_type(spark: Any) -> None:
    """Sides whose count_distinct input has one type share one distinct column (no row expanded
    per side); a source input of another type gets its own, and every side counts its own."""
    from sparkguard.reconcile import engine

    shadow = spark.createDataFrame(
        [(DAYS[0], k, k % 3, 1.0, None, s, T0) for k, s in enumerate(["a", "b", "b", "cc", None])],
        SCHEMA)
    target = spark.createDataFrame([(DAYS[0], k, 1, 1.0, None, "a", T0) for k in range(4)], SCHEMA)
    source = spark.createDataFrame(
        [(DAYS[0], k, k, 1.0, None, s, T0) for k, s in enumerate(["a", "bb", "ccc", "dd", "dd"])],
        SCHEMA)
    same_type = MetricSpec("cd_i", Aggregation.COUNT_DISTINCT, "i", "i", ThresholdSpec())
    by_length = MetricSpec("cd_len", Aggregation.COUNT_DISTINCT, "length(s)", "s", ThresholdSpec(),
                           per_partition=True)
    spec = ReconcileSpec(partition_column="p", partition_type=PartitionType.DATE,
                         business_keys=("k",), metrics=(same_type,))
    lay = engine._layout(spec, shadow, target, source)
    cd = engine._distinct_frame(spec, lay, {engine.SOURCE: source, engine.SHADOW: shadow,
                                            engine.TARGET: target})
    assert cd is not None
    names = {n.getClass().getSimpleName() for n in plan_nodes(cd._jdf.queryExecution().executedPlan())}
    assert "ExpandExec" not in names, names

    spec = replace(spec, metrics=(same_type, by_length))
    res = reconcile(spec, shadow=shadow, target=target, source=source, partitions=[DAYS[0]])
    window = {g.gate: g for g in res.gates if g.partition is None}
    assert (window["metric_reconciliation[cd_i]"].measured["value"],
            window["metric_reconciliation[cd_i]"].expected) == (3, 5)
    # shadow: distinct strings a, b, cc; source: distinct lengths 1, 2, 3
    assert (window["metric_reconciliation[cd_len]"].measured["value"],
            window["metric_reconciliation[cd_len]"].expected) == (3, 3)
    (stats,) = res.partitions
    assert stats.metrics["cd_len"] == {"source": 3, "shadow": 3, "target": 1}
    assert stats.metrics["cd_i"] == {"source": None, "shadow": None, "target": None}


def test_sum_of_a_compared_float_column_reuses_its_shuffled_value(spark: Any) -> None:
    """A sum or average over a compared float column takes the per-side sum the comparison
    keeps (the value is shuffled once), and stays a sum for a key with several rows."""
    from sparkguard.reconcile import engine

    shadow = spark.createDataFrame([(DAYS[0], 1, 1, 1.5, None, "a", T0),
                                    (DAYS[0], 1, 1, 2.5, None, "a", T0),
                                    (DAYS[0], 2, 1, None, None, "a", T0),
                                    (DAYS[0], 3, 1, 4.0, None, "a", T0)], SCHEMA)
    target = spark.createDataFrame([(DAYS[0], 1, 1, 1.0, None, "a", T0),
                                    (DAYS[0], 3, 1, 4.0, None, "a", T0)], SCHEMA)
    metrics = (MetricSpec("sum_x", Aggregation.SUM, "x", "x", ThresholdSpec()),
               MetricSpec("avg_x", Aggregation.AVG, "x", "x", ThresholdSpec()),
               MetricSpec("n_x", Aggregation.COUNT, "x", "x", ThresholdSpec()))
    spec = ReconcileSpec(partition_column="p", partition_type=PartitionType.DATE,
                         business_keys=("k",), metrics=metrics)
    lay = engine._layout(spec, shadow, target, None)
    projected = engine._project(spec, lay, shadow, engine.SHADOW).columns
    assert "__sg_f0" in projected and not [c for c in projected if c.startswith("__sg_v")]
    res = reconcile(spec, shadow=shadow, target=target, partitions=[DAYS[0]])
    (stats,) = res.partitions
    assert stats.metrics["sum_x"] == {"source": None, "shadow": 8.0, "target": 5.0}
    assert stats.metrics["avg_x"] == {"source": None, "shadow": 8.0 / 3, "target": 2.5}
    assert stats.metrics["n_x"] == {"source": 0, "shadow": 3, "target": 2}
    assert res.preview is not None and (res.preview.unchanged, res.preview.ambiguous) == (1, 1)


def test_column_names_with_a_dot_a_backquote_and_a_space(spark: Any) -> None:
    """Columns are taken by their exact names: ``amount.usd`` is one column, not a struct field,
    and a backquote or a space is part of a name; changes and samples name them as written."""
    schema = "p date, k int, `amount.usd` double, `note``q` string, `has space` int"
    target = spark.createDataFrame([(DAYS[0], 1, 1.0, "a", 1), (DAYS[0], 2, 2.0, "b", 2),
                                    (DAYS[0], 3, None, None, 3)], schema)
    shadow = spark.createDataFrame([(DAYS[0], 1, 1.5, "a", 1), (DAYS[0], 2, 2.0, "b'", 2),
                                    (DAYS[0], 3, None, None, 4)], schema)
    spec = ReconcileSpec(partition_column="p", partition_type=PartitionType.DATE,
                         business_keys=("k",), not_null=("amount.usd",))
    res = reconcile(spec, shadow=shadow, target=target, partitions=[DAYS[0]])
    assert res.preview is not None and res.preview.changed == 3
    assert res.preview.changed_by_column == {"amount.usd": 1, "note`q": 1, "has space": 1}
    by_key = {e["key"]["k"]: e["changed_columns"] for e in res.preview.sample}
    assert by_key == {1: ["amount.usd"], 2: ["note`q"], 3: ["has space"]}
    nulls = [g for g in res.gates if g.gate.startswith("not_null") and g.partition is None]
    assert nulls and not nulls[0].passed  # key 3's amount.usd is null in the shadow
    # a metric and a table constraint naming them backquoted, as a plan and Delta write them
    spec = replace(spec, metrics=(MetricSpec("doubled", Aggregation.SUM, "`has space` * 2",
                                             "`has space` * 2", ThresholdSpec()),),
                   constraints=(("check_constraint[usd]", "`amount.usd` > 1.6"),))
    res = reconcile(spec, shadow=shadow, target=target, source=target, partitions=[DAYS[0]])
    (stats,) = res.partitions
    assert stats.metrics["doubled"] == {"source": 12, "shadow": 14, "target": 12}
    (check,) = [g for g in res.gates if g.gate == "check_constraint[usd]"]
    assert (check.measured, check.passed) == (2, False)  # 2.0 passes; 1.5 and null fail


def test_min_and_max_of_a_collated_string_agree_across_groups_and_partitions(
        spark: Any) -> None:
    """Spark takes a collated string's min per group under its collation; the driver folds the
    groups (change kinds) and partitions. Both in binary order: identical source and shadow pass
    whatever the target holds, and a shadow whose binary min moved fails."""
    from pyspark.sql import functions as F

    day, day2 = DAYS[0], DAYS[1]

    def side(rows: list[tuple[dt.date, int, str]]) -> Any:
        return spark.createDataFrame(rows, "p date, k int, v string").select(
            "p", "k", F.collate("v", "UTF8_LCASE").alias("v"))

    source = side([(day, 1, "a"), (day, 2, "B"), (day2, 3, "c")])
    target = side([(day, 1, "a"), (day, 2, "x"), (day2, 3, "c")])  # key 2 changes, 1 does not
    metrics = tuple(MetricSpec(f"{a.value}_v", a, "v", "v", ThresholdSpec())
                    for a in (Aggregation.MIN, Aggregation.MAX))
    spec = ReconcileSpec(partition_column="p", partition_type=PartitionType.DATE,
                         business_keys=("k",), metrics=metrics)
    res = reconcile(spec, shadow=source, target=target, source=source, partitions=[day, day2])
    assert res.passed, [g.reason for g in res.failed]
    moved = side([(day, 1, "A"), (day, 2, "B"), (day2, 3, "c")])  # 'A' = 'a' under UTF8_LCASE
    res = reconcile(spec, shadow=moved, target=target, source=source, partitions=[day, day2])
    assert [g.gate for g in res.failed] == ["metric_reconciliation[min_v]"]


def _compared_pairwise(spark: Any, schema: str, pairs: dict[int, tuple[Any, Any]]
                       ) -> tuple[ReconcileResult, dict[int, bool], Any]:
    """Reconcile a target of each pair's first row against a shadow of its second (key ``k``,
    one day); whether each key's two rows have different content fingerprints; the target."""
    from sparkguard.reconcile.hashing import table_fingerprint

    day = DAYS[0]
    target = spark.createDataFrame([(day, k, *b) for k, (b, _a) in pairs.items()], schema)
    shadow = spark.createDataFrame([(day, k, *a) for k, (_b, a) in pairs.items()], schema)
    spec = ReconcileSpec(partition_column="p", partition_type=PartitionType.DATE,
                         business_keys=("k",))
    res = reconcile(spec, shadow=shadow, target=target, partitions=[day])
    differ = {k: table_fingerprint(spark.createDataFrame([(day, k, *b)], schema))
              != table_fingerprint(spark.createDataFrame([(day, k, *a)], schema))
              for k, (b, a) in pairs.items()}
    return res, differ, target


def test_maps_compare_by_shape_nulls_included(spark: Any) -> None:
    """A map's entries sorted by key keep their shape too: a null value moved to another key,
    a null element dropped from an array value, a null moved between a struct value's fields
    are changes for the preview and for the content fingerprint (verification); the same map
    built in another key order is not."""
    schema = ("p date, k int, mv map<string,string>, ma map<string,array<string>>, "
              "ms map<string,struct<a:string,b:string>>")
    same = ({"a": "b"}, {"x": ["a"]}, {"x": ("1", "2")})
    pairs = {
        1: (({"a": None, "b": "c"}, *same[1:]), ({"a": "b", "c": None}, *same[1:])),
        2: ((same[0], {"x": ["a", None]}, same[2]), same),
        3: ((*same[:2], {"x": (None, "v")}), (*same[:2], {"x": ("v", None)})),
        4: (({"a": "b", "c": "d"}, *same[1:]), ({"c": "d", "a": "b"}, *same[1:])),
    }
    res, differ, _target = _compared_pairwise(spark, schema, pairs)
    assert res.preview is not None
    assert (res.preview.changed, res.preview.unchanged) == (3, 1)
    assert res.preview.changed_by_column == {"mv": 1, "ma": 1, "ms": 1}
    assert differ == {1: True, 2: True, 3: True, 4: False}


def test_arrays_and_structs_compare_by_shape_nulls_included(spark: Any) -> None:
    """Spark's hashes skip null elements and fields and hash no lengths: a null element
    dropped, elements moved between inner arrays or a null moved between struct fields must
    still be changes, for the preview and for the content fingerprint (verification)."""
    from sparkguard.reconcile.hashing import table_fingerprint

    schema = ("p date, k int, arr array<string>, nest array<array<int>>, "
              "st struct<a:int,b:int>, xs array<double>")
    same = (["a"], [[1]], (1, 2), [-0.0, math.nan])
    pairs = {
        1: ((["a", None], *same[1:]), same),
        2: ((same[0], [[1, 2], [3]], *same[2:]), (same[0], [[1], [2, 3]], *same[2:])),
        3: ((*same[:2], (None, 1), same[3]), (*same[:2], (1, None), same[3])),
        4: (([None], *same[1:]), ([], *same[1:])),
        5: (same, (*same[:3], [0.0, math.nan])),  # -0.0 = 0.0 and NaN = NaN inside too
    }
    res, differ, target = _compared_pairwise(spark, schema, pairs)
    assert res.preview is not None
    assert (res.preview.changed, res.preview.unchanged) == (4, 1)
    assert res.preview.changed_by_column == {"arr": 2, "nest": 1, "st": 1, "xs": 0}
    assert differ == {1: True, 2: True, 3: True, 4: True, 5: False}
    assert table_fingerprint(target) == table_fingerprint(target.orderBy(target.k.desc()))
    # a map inside another type compares as JSON text, to the microsecond
    nested = "k int, m array<map<string, struct<t:timestamp,n:int>>>"
    t0 = dt.datetime(2026, 5, 3, 1, 2, 3, 4)
    one = spark.createDataFrame([(1, [{"x": (t0, 1)}])], nested)
    two = spark.createDataFrame([(1, [{"x": (t0 + dt.timedelta(microseconds=1), 1)}])], nested)
    assert table_fingerprint(one) != table_fingerprint(two)
    assert table_fingerprint(one) == table_fingerprint(spark.createDataFrame(
        [(1, [{"x": (t0, 1)}])], nested))


def test_collated_text_compares_by_its_characters(spark: Any) -> None:
    """Spark 4.0 hashes ``UTF8_LCASE`` text by its collation key, so 'abc' and 'ABC' would
    hash alike: a change of case at the top, in a struct, an array or a map value must still be
    a change for the preview and for the content fingerprint (verification)."""
    lcase = "string collate UTF8_LCASE"
    schema = (f"p date, k int, s {lcase}, st struct<a:{lcase}>, arr array<{lcase}>, "
              f"m map<string,{lcase}>")
    same = ("abc", ("abc",), ["abc"], {"x": "abc"})
    pairs = {
        1: (same, ("ABC", *same[1:])),
        2: (same, (same[0], ("aBc",), *same[2:])),
        3: (same, (*same[:2], ["abC"], same[3])),
        4: (same, (*same[:3], {"x": "Abc"})),
        5: (same, same),
    }
    res, differ, _target = _compared_pairwise(spark, schema, pairs)
    assert res.preview is not None
    assert (res.preview.changed, res.preview.unchanged) == (4, 1)
    assert res.preview.changed_by_column == {"s": 1, "st": 1, "arr": 1, "m": 1}
    assert differ == {1: True, 2: True, 3: True, 4: True, 5: False}


def test_a_variant_null_is_not_a_sql_null_wherever_it_is(spark: Any) -> None:
    """A variant holding JSON ``null`` and a SQL null are different values (``IS NULL`` tells
    them apart), but a JSON rendering of an array, map or struct writes both as ``null``: each
    key whose variant changed between the two, at the top or nested, is a change for the
    preview and for the content fingerprint (verification)."""
    from sparkguard.reconcile.hashing import table_fingerprint

    sql_null, json_null, one = "CAST(NULL AS VARIANT)", "parse_json('null')", "parse_json('1')"
    cols = ("top", "arr", "m", "st")
    shape = ("{top} AS top, array({arr}) AS arr, map('k', {m}) AS m, "
             "named_struct('v', {st}) AS st")

    def rows(values: list[dict[str, str]]) -> Any:
        return spark.sql(" UNION ALL ".join(
            f"SELECT DATE'{DAYS[0]}' AS p, {k} AS k, " + shape.format(**v)
            for k, v in enumerate(values, 1)))

    target = [dict.fromkeys(cols, sql_null) for _ in range(5)]
    shadow = [{**dict.fromkeys(cols, sql_null), c: json_null} for c in cols] + [target[4]]
    spec = ReconcileSpec(partition_column="p", partition_type=PartitionType.DATE,
                         business_keys=("k",))
    res = reconcile(spec, shadow=rows(shadow), target=rows(target), partitions=[DAYS[0]])
    assert res.preview is not None
    assert (res.preview.changed, res.preview.unchanged) == (4, 1)
    assert res.preview.changed_by_column == dict.fromkeys(cols, 1)
    for c in cols:
        assert table_fingerprint(rows([{**target[0], c: json_null}])) \
            != table_fingerprint(rows([target[0]])), c
    ab, ba = "parse_json('{\"a\": 1, \"b\": 2}')", "parse_json('{\"b\": 2, \"a\": 1}')"
    assert table_fingerprint(rows([{**target[0], "arr": ab, "top": one}])) \
        == table_fingerprint(rows([{**target[0], "arr": ba, "top": one}]))  # keys sorted


def test_a_nested_not_null_field_in_the_target_is_still_compared(spark: Any) -> None:
    """The target declares ``addr.city`` NOT NULL (and tags ``tags``' elements non-null); its
    Delta-written shadow has the whole schema nullable. The column used to be left out of the
    comparison for that alone: a key whose only change was in ``addr`` counted as unchanged,
    and a MERGE keep promotion failed its verification on every run."""
    from pyspark.sql import types as T

    def schema(strict: bool) -> T.StructType:
        return T.StructType([
            T.StructField("p", T.DateType()), T.StructField("k", T.IntegerType()),
            T.StructField("addr", T.StructType([
                T.StructField("city", T.StringType(), not strict),
                T.StructField("zip", T.StringType())])),
            T.StructField("tags", T.ArrayType(T.StringType(), not strict))])

    day = DAYS[0]
    before = [(day, 1, ("Oslo", "0150"), ["a"]), (day, 2, ("Bergen", "5003"), ["b"])]
    after = [(day, 1, ("Oslo", "0150"), ["a"]), (day, 2, ("Bergen", "5004"), ["b"])]
    target = spark.createDataFrame(before, schema(strict=True))
    shadow = spark.createDataFrame(after, schema(strict=False))
    assert target.schema != shadow.schema  # the nullability differs, not the values' types
    spec = ReconcileSpec(partition_column="p", partition_type=PartitionType.DATE,
                         business_keys=("k",))
    res = reconcile(spec, shadow=shadow, target=target, partitions=[day])
    assert res.preview is not None and res.preview.not_compared == ()
    assert (res.preview.changed, res.preview.unchanged) == (1, 1)
    assert res.preview.changed_by_column == {"addr": 1, "tags": 0}


def _merge_keys_gate(spark: Any, target: Sequence[tuple[Any, int]],
                     shadow: Sequence[tuple[Any, int]]) -> Any:
    """The window's ``merge_target_keys`` gate for rows given as (day, key)."""
    def rows(keys: Sequence[tuple[Any, int]]) -> Any:
        return spark.createDataFrame([(d, k, 1, None, None, "a", None) for d, k in keys], SCHEMA)

    spec = ReconcileSpec(partition_column="p", partition_type=PartitionType.DATE,
                         business_keys=("k",), merge_keys=True)
    res = reconcile(spec, shadow=rows(shadow), target=rows(target), partitions=list(DAYS[:2]))
    return {g.gate: g for g in res.gates if g.partition is None}["merge_target_keys"]


def test_a_key_the_target_holds_twice_in_another_partition_fails_merge_target_keys(
        spark: Any) -> None:
    """The target holds key 7 twice on day 0 (an earlier double append); the shadow holds it
    once on day 1. A MERGE would update both rows into duplicates on day 1: the gate used to
    pass (and say every key matches at most one row), leaving it to the check after the
    commit."""
    gate = _merge_keys_gate(spark, [(DAYS[0], 7), (DAYS[0], 7), (DAYS[0], 1), (DAYS[1], 2)],
                            [(DAYS[0], 1), (DAYS[1], 2), (DAYS[1], 7)])
    assert not gate.passed
    assert gate.measured == {"duplicate_keys": 1, "in_one_partition": 0, "across_partitions": 1}


def test_a_key_held_twice_in_its_own_partition_and_again_elsewhere_counts_once(
        spark: Any) -> None:
    """The target holds key 7 twice on day 1, where the shadow holds it, and once more on day
    0: one business key, counted in the shadow's partition, not again across partitions (the
    gate said two keys)."""
    gate = _merge_keys_gate(
        spark, [(DAYS[1], 7), (DAYS[1], 7), (DAYS[0], 7), (DAYS[0], 1), (DAYS[1], 2)],
        [(DAYS[0], 1), (DAYS[1], 2), (DAYS[1], 7)])
    assert not gate.passed
    assert gate.measured == {"duplicate_keys": 1, "in_one_partition": 1, "across_partitions": 0}
