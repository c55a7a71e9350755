"""window_column windows without Spark: buckets, exact predicates, slices, static refusals,
fingerprints, and the example plans of templates/examples/ (loaded and guarded statically)."""

from __future__ import annotations

import copy
import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import yaml

from sparkguard.cli import main
from sparkguard.guard import approvable_findings, static_findings
from sparkguard.layouts import LAYOUTS, layout_plan, load_plan_dict
from sparkguard.plan import load_plan
from sparkguard.plan.fingerprint import fingerprint
from sparkguard.plan.window import plan_slices, slice_setting, window_partitions
from sparkguard.plan.window_spec import range_window, window_problems

EXAMPLES = Path(__file__).resolve().parents[2] / "templates" / "examples"


def _plan(name: str = "timestamp_partial_day", **changes: Any) -> Any:
    data = layout_plan(LAYOUTS[name], Path("/lake"))
    bp = data["backfill_plan"]
    for key, value in changes.items():
        parts = key.split("__")
        node = bp
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        if value is None:
            node.pop(parts[-1], None)
        else:
            node[parts[-1]] = value
    return load_plan_dict(data)


def test_timestamp_buckets_are_clipped_to_the_window_and_labelled_in_utc() -> None:
    rw = range_window(_plan(affected_window__start_utc="2026-03-10T05:00:00Z",
                            affected_window__end_utc="2026-03-10T09:30:00.000007Z"))
    assert rw is not None and rw.grain == "hour"
    assert rw.labels == ("2026-03-10T05", "2026-03-10T06", "2026-03-10T07", "2026-03-10T08",
                         "2026-03-10T09")
    last = rw.buckets[-1]
    assert last.lo == dt.datetime(2026, 3, 10, 9, tzinfo=dt.UTC)
    assert last.hi == dt.datetime(2026, 3, 10, 9, 30, 0, 7, tzinfo=dt.UTC)


def test_timestamp_predicate_has_explicit_utc_literals_to_the_microsecond() -> None:
    rw = range_window(_plan(affected_window__start_utc="2026-03-10T05:00:00Z",
                            affected_window__end_utc="2026-03-10T09:30:00.000007Z"))
    assert rw is not None
    assert rw.predicate(rw.labels) == (
        "(`event_ts` >= TIMESTAMP_LTZ'2026-03-10 05:00:00.000000+00:00' AND "
        "`event_ts` < TIMESTAMP_LTZ'2026-03-10 09:30:00.000007+00:00')")
    # non-adjacent buckets: one range each; an alias qualifies the column (bounded MERGE)
    assert rw.predicate(["2026-03-10T05", "2026-03-10T07"], "t") == (
        "((`t`.`event_ts` >= TIMESTAMP_LTZ'2026-03-10 05:00:00.000000+00:00' AND "
        "`t`.`event_ts` < TIMESTAMP_LTZ'2026-03-10 06:00:00.000000+00:00') OR "
        "(`t`.`event_ts` >= TIMESTAMP_LTZ'2026-03-10 07:00:00.000000+00:00' AND "
        "`t`.`event_ts` < TIMESTAMP_LTZ'2026-03-10 08:00:00.000000+00:00'))")


def test_timestamp_ntz_predicate_and_offset_bounds() -> None:
    rw = range_window(_plan("unpartitioned_ntz",
                            affected_window__start_utc="2026-03-10T07:00:00+02:00",
                            affected_window__end_utc="2026-03-10T06:00:00Z"))
    assert rw is not None
    assert rw.predicate(rw.labels) == (
        "(`event_ts` >= TIMESTAMP_NTZ'2026-03-10 05:00:00.000000' AND "
        "`event_ts` < TIMESTAMP_NTZ'2026-03-10 06:00:00.000000')")


def test_date_hour_predicate_uses_whole_days_and_hours() -> None:
    rw = range_window(_plan("date_hour", affected_window__start_utc="2026-03-09T22:00:00Z",
                            affected_window__end_utc="2026-03-11T02:00:00Z"))
    assert rw is not None
    assert rw.partition_by == ("dt", "hr")
    assert rw.predicate(rw.labels) == (
        "((`dt` IN (DATE'2026-03-10') AND `hr` >= 0 AND `hr` <= 23) OR "
        "(`dt` = DATE'2026-03-09' AND `hr` IN (22, 23)) OR "
        "(`dt` = DATE'2026-03-11' AND `hr` IN (0, 1)))")


def test_bucket_grain_default_and_slices() -> None:
    long = _plan(window_column__slice="1d", affected_window__start_utc="2026-03-01T06:00:00Z",
                 affected_window__end_utc="2026-03-10T00:00:00Z")
    rw = range_window(long)
    assert rw is not None and rw.grain == "day"
    assert rw.labels[0] == "2026-03-01" and rw.buckets[0].lo.hour == 6 and len(rw.labels) == 9
    six = _plan(window_column__slice="6h", affected_window__start_utc="2026-03-10T00:00:00Z",
                affected_window__end_utc="2026-03-10T15:00:00Z")
    assert slice_setting(six) == 6
    slices = plan_slices(window_partitions(six), slice_setting(six))
    assert [len(s) for s in slices] == [6, 6, 3]
    assert slice_setting(_plan(window_column__slice="1d")) == 24
    auto = _plan(window_column__slice="auto")
    parts = window_partitions(auto)
    assert plan_slices(parts, slice_setting(auto), {p: 10 for p in parts})[0] == [parts[0]]


@pytest.mark.parametrize(("changes", "field"), [
    ({"partitioning": {"column": "event_date", "type": "date"}}, "partitioning"),
    ({"affected_window__partitions": ["2026-03-10"]}, "affected_window.partitions"),
    ({"window_column__hour_column": "hr"}, "window_column.hour_column"),
    ({"window_column__bucket": "day", "window_column__slice": "6h"}, "window_column.slice"),
])
def test_windows_that_cannot_be_expressed_exactly_are_refused(changes: dict[str, Any],
                                                              field: str) -> None:
    plan = _plan(**changes)
    assert [p[0] for p in window_problems(plan)] == [field]
    found = [f for f in static_findings(plan) if f.code == "window_not_exact"]
    assert found and found[0].path == f"backfill_plan.{field}" and found[0].fix


def test_date_hour_bounds_inside_an_hour_are_refused_with_the_fix() -> None:
    plan = _plan("date_hour", affected_window__end_utc="2026-03-10T10:30:00Z")
    (f,) = [f for f in static_findings(plan) if f.code == "window_not_exact"]
    assert f.path == "backfill_plan.affected_window.end_utc"
    assert "whole hour" in f.message and "timestamp" in f.fix


def test_date_hour_needs_its_hour_column() -> None:
    plan = _plan("date_hour", window_column__hour_column=None)
    assert [p[0] for p in window_problems(plan)] == ["window_column.hour_column"]


def test_bad_slice_is_a_plan_error_naming_the_field(tmp_path: Path) -> None:
    data = layout_plan(LAYOUTS["clustered"], tmp_path)
    data["backfill_plan"]["window_column"]["slice"] = "90m"
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    assert main(["guard", str(path), "--static-only"]) == 2


def test_refused_window_exits_2_from_the_guard(tmp_path: Path, capsys: Any) -> None:
    data = layout_plan(LAYOUTS["date_hour"], tmp_path)
    data["backfill_plan"]["affected_window"]["start_utc"] = "2026-03-10T05:15:00Z"
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    assert main(["guard", str(path), "--static-only"]) == 2
    out = capsys.readouterr()
    assert "affected_window.start_utc" in out.out + out.err


def test_window_column_enters_the_fingerprint_only_when_set() -> None:
    base = layout_plan(LAYOUTS["date_partitions"], Path("/lake"))
    fp = fingerprint(load_plan_dict(base))
    same = copy.deepcopy(base)
    same["backfill_plan"]["window_column"] = None
    assert fingerprint(load_plan_dict(same)) == fp
    a = fingerprint(_plan(window_column__slice="2h"))
    assert a != fingerprint(_plan(window_column__slice="3h"))


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_example_plan_loads_and_passes_the_static_guard(name: str) -> None:
    path = EXAMPLES / f"{name}.yaml"
    plan = load_plan(path)
    assert approvable_findings(plan) == []
    assert plan == load_plan_dict(layout_plan(LAYOUTS[name], Path(f"/lake/{name}")))


def test_every_layout_has_an_example() -> None:
    assert {p.stem for p in EXAMPLES.glob("*.yaml")} == set(LAYOUTS)


def test_evidence_names_the_exact_range_and_the_bucket_grain() -> None:
    from sparkguard.evidence import _range_of
    from sparkguard.evidence_md import _window_text

    plan = _plan(affected_window__end_utc="2026-03-10T09:30:00.000007Z")
    window = {"partition_column": "event_ts", "partitions": ["2026-03-10T05"], **_range_of(plan)}
    assert window["range"] == ["2026-03-10T05:00:00Z", "2026-03-10T09:30:00.000007Z"]
    assert _window_text("event_ts", ["2026-03-10T05"], window) == (
        "`event_ts` in [2026-03-10T05:00:00Z, 2026-03-10T09:30:00.000007Z) "
        "(1 hour bucket(s): 2026-03-10T05)")
    assert _range_of(load_plan_dict(layout_plan(LAYOUTS["date_partitions"], Path("/l")))) == {}


def test_a_time_range_window_checks_business_keys_across_buckets() -> None:
    """Buckets are reporting units, not key scopes: the same event_id at 05:59 and 06:01 (a
    replayed event) is a duplicate; a partition-value window keeps keys per partition."""
    from sparkguard.reconcile.spec import spec_for_target

    plan = load_plan_dict(layout_plan(LAYOUTS["timestamp_partial_day"], Path("/lake")))
    spec = spec_for_target(plan, plan.target_specs()[0])
    assert spec.duplicate_check is not None
    assert spec.extra_duplicate_keys == (("event_id",),)
    data = layout_plan(LAYOUTS["date_partitions"], Path("/lake"))
    by_date = load_plan_dict(data)  # its duplicate_check says table_wide: true
    assert spec_for_target(by_date, by_date.target_specs()[0]).extra_duplicate_keys == (
        ("event_id",),)
    for check in data["backfill_plan"]["validation"]["checks"]:
        check.pop("table_wide", None)
    by_date = load_plan_dict(data)
    assert spec_for_target(by_date, by_date.target_specs()[0]).extra_duplicate_keys == ()
