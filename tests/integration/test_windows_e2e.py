"""Windows as the plan states them, end to end on real Delta tables: every layout of
sparkguard.layouts through the in-process runner (shadow, gates, promotion, verify), with the
session time zone set to America/Los_Angeles; then rollback; bounds exact to the microsecond;
rows outside a partial-day window untouched (same content, and same files where untouched)."""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from sparkguard.layouts import LAYOUTS, build_layout, figures
from sparkguard.plan import load_plan
from sparkguard.run.evaluator import run_backfill
from sparkguard.run.report import RunOutcome

pytestmark = pytest.mark.spark
LA = "America/Los_Angeles"


@pytest.fixture
def la_session(spark: Any) -> Iterator[Any]:
    """The test session with its time zone set to Los Angeles (restored after)."""
    old = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", LA)
    try:
        yield spark
    finally:
        spark.conf.set("spark.sql.session.timeZone", old)


def _run(spark: Any, plan: Path, lines: list[str] | None = None) -> RunOutcome:
    root = plan.parent
    return run_backfill(spark, load_plan(plan), str(plan), home=str(root / "_sg"),
                        evidence_dir=str(root / "evidence"),
                        out=lines.append if lines is not None else (lambda _m: None))


def _version(spark: Any, table: Path) -> int:
    """The newest version of the Delta table at ``table``."""
    return int(spark.sql(f"DESCRIBE HISTORY delta.`{table}` LIMIT 1").first()["version"])


def _approved_plan(lay: Any, root: Path) -> Path:
    """The layout's plan at ``root/plan.yaml``, approved."""
    import yaml

    from sparkguard.approve import record_approval
    from sparkguard.layouts import layout_plan

    plan = root / "plan.yaml"
    plan.write_text(yaml.safe_dump(layout_plan(lay, root), sort_keys=False, width=100),
                    encoding="utf-8")
    record_approval(plan, "data-platform-owner", "alice@example.com")
    return plan


def _target(spark: Any, root: Path) -> Any:
    return spark.read.format("delta").load(str(root / "target" / "events"))


def _fixed(spark: Any, root: Path, lay: Any) -> tuple[Path, RunOutcome]:
    """Build the layout's lake at ``root``, run its plan, and check the window was fixed with
    nothing outside it changed; return the plan and the outcome."""
    plan = build_layout(spark, root, lay)
    lines: list[str] = []
    out = _run(spark, plan, lines)
    assert out.exit_code == 0, "\n".join(lines[-30:])
    f = figures(spark, root, lay)
    assert f["window_rows_fixed"] > 0
    assert f["outside_window_changed"] == 0
    assert f["window_rows_wrong"] == 0
    assert out.targets["events"].verified
    window = out.targets["events"].window
    assert window is not None and [g.passed for g in window.gates
                                   if g.gate == "keys_outside_window"] == [True]
    return plan, out


# the layouts whose window is written without the session time zone (a generated
# CAST(event_ts AS DATE) column is evaluated by Delta in the session zone: tested in UTC)
_TZ_FREE = [n for n, lay in LAYOUTS.items() if not lay.generated_date]


@pytest.mark.parametrize("name", _TZ_FREE)
def test_layout_fixes_the_window_only_in_another_time_zone(la_session: Any, tmp_path: Path,
                                                           name: str) -> None:
    lay = LAYOUTS[name]
    spark = la_session
    plan, out = _fixed(spark, tmp_path / name, lay)
    # per-bucket verdicts: one row per UTC bucket of the plan in the evidence's Markdown, and the chart
    from sparkguard.plan.window_spec import range_window

    rw = range_window(load_plan(plan))
    if rw is not None:
        assert out.evidence_path is not None
        md = Path(out.evidence_path).with_suffix(".md").read_text(encoding="utf-8")
        rows = [ln.split("|")[1].strip() for ln in md.splitlines() if ln.startswith("| 2026-")]
        assert set(rw.labels) <= set(rows), (rw.labels, rows)
        assert Path(out.evidence_path).with_suffix(".png").stat().st_size > 0


def test_generated_partition_column_is_pruned_by_the_timestamp_predicate(spark: Any,
                                                                         tmp_path: Path) -> None:
    from sparkguard.plan.window_spec import range_window

    lay = LAYOUTS["generated_date"]
    plan = build_layout(spark, tmp_path / "g", lay)
    rw = range_window(load_plan(plan))
    assert rw is not None
    df = _target(spark, tmp_path / "g").filter(rw.predicate(rw.labels))
    scan = df._jdf.queryExecution().executedPlan().toString()
    # Delta derives a filter on the generated partition column from the timestamp predicate
    assert "PartitionFilters: [" in scan and "event_date" in scan.split("PartitionFilters: [")[1]
    out = _run(spark, plan)
    assert out.exit_code == 0
    f = figures(spark, tmp_path / "g", lay)
    assert f["window_rows_fixed"] > 0 and f["outside_window_changed"] == 0
    assert f["window_rows_wrong"] == 0


def test_bounds_are_exact_to_the_microsecond(la_session: Any, tmp_path: Path) -> None:
    """Rows 1 µs before start and at end stay as they were; rows at start and 1 µs before end
    are replaced, in a session whose time zone is not UTC."""
    spark = la_session
    lay = LAYOUTS["timestamp_partial_day"]
    root = tmp_path / "t"
    out = _run(spark, build_layout(spark, root, lay))
    assert out.exit_code == 0
    us = dt.timedelta(microseconds=1)
    rows = {r["m"]: r["note"] for r in _target(spark, root).selectExpr(
        "unix_micros(event_ts) AS m", "note").collect()}
    for t, inside in ((lay.start - us, False), (lay.start, True), (lay.start + us, True),
                      (lay.end - us, True), (lay.end, False), (lay.end + us, False)):
        t = (t - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // us  # type: ignore[assignment]
        assert t in rows, t
        assert rows[t].startswith("kept outside") is not inside, (t, rows[t])


def test_partial_day_keeps_the_rest_of_the_day_and_its_untouched_files(spark: Any,
                                                                       tmp_path: Path) -> None:
    lay = LAYOUTS["timestamp_partial_day"]
    root = tmp_path / "p"
    plan = build_layout(spark, root, lay)
    from sparkguard.plan.window_spec import range_window

    rw = range_window(load_plan(plan))
    assert rw is not None
    pred = rw.predicate(rw.labels)
    before = _target(spark, root)
    touched = {r["f"] for r in before.filter(pred).select(
        before["_metadata.file_path"].alias("f")).collect()}
    before_files = {r["f"] for r in before.select(before["_metadata.file_path"].alias("f"))
                    .distinct().collect()}
    assert _run(spark, plan).exit_code == 0
    after = _target(spark, root)
    after_files = {r["f"] for r in after.select(after["_metadata.file_path"].alias("f"))
                   .distinct().collect()}
    # files holding no window row are kept as they were (same files), the others replaced
    assert before_files - touched <= after_files
    assert not touched & after_files
    assert figures(spark, root, lay)["outside_window_changed"] == 0
    # the same day's rows outside the window are still the target's, not the source's
    day = after.filter("event_date = DATE'2026-03-10'")
    assert day.filter(f"NOT ({pred})").filter("note LIKE 'kept outside%'").count() == \
        day.filter(f"NOT ({pred})").count() > 0


def test_rollback_restores_a_timestamp_window(spark: Any, tmp_path: Path) -> None:
    from sparkguard.cli import main

    lay = LAYOUTS["unpartitioned_merge"]
    root = tmp_path / "r"
    plan = build_layout(spark, root, lay)
    version = json.loads((root / "layout.json").read_text())["target_version"]
    built = spark.read.format("delta").option("versionAsOf", version).load(
        str(root / "target" / "events"))

    def differs() -> int:  # rows unlike the target as built, both ways (NaN equals NaN)
        now = _target(spark, root)
        return now.exceptAll(built).count() + built.exceptAll(now).count()

    out = _run(spark, plan)
    assert out.exit_code == 0
    assert differs() > 0
    code = main(["rollback", "--run-id", out.run_id, "--home", str(root / "_sg")])
    assert code == 0
    assert differs() == 0


def test_a_key_repeated_in_another_bucket_fails_the_duplicate_gate(spark: Any,
                                                                  tmp_path: Path) -> None:
    """The last event of a slice recomputed with the slice's first event id (another hour bucket,
    same row count, same amounts) is a duplicate key: the run stops before promotion, the
    evidence names the window-wide duplicate gate and the target keeps its version."""
    import yaml

    from sparkguard.approve import record_approval

    lay = LAYOUTS["timestamp_partial_day"]
    root = tmp_path / "dup"
    plan = build_layout(spark, root, lay, approve=False)
    doc = yaml.safe_load(plan.read_text(encoding="utf-8"))
    target = doc["backfill_plan"]["targets"][0]
    ids = "(SELECT {f}(event_id) FROM {{source}} WHERE {{window}})"
    collide = (f"CASE WHEN event_id = {ids.format(f='max')} THEN {ids.format(f='min')} "
               "ELSE event_id END AS `event_id`")
    target["transform"]["sql"] = target["transform"]["sql"].replace("`event_id`", collide, 1)
    plan.write_text(yaml.safe_dump(doc, sort_keys=False, width=100), encoding="utf-8")
    record_approval(plan, "data-platform-owner", "alice@example.com")
    tgt = root / "target" / "events"
    before = _version(spark, tgt)
    lines: list[str] = []
    out = _run(spark, plan, lines)
    assert out.exit_code == 1, "\n".join(lines[-30:])
    assert out.evidence_path is not None
    evidence = yaml.safe_load(Path(out.evidence_path).read_text(encoding="utf-8"))
    failed = {g["gate"] for g in _gates(evidence) if not g.get("passed")}
    assert "duplicate_check[event_id]" in failed, failed
    assert not {"row_count_parity", "metric_reconciliation[amount_total]"} & failed, failed
    assert _version(spark, tgt) == before


def _gates(node: Any) -> Iterator[dict[str, Any]]:
    """Every gate record anywhere in an evidence document."""
    if isinstance(node, dict):
        if "gate" in node and "passed" in node:
            yield node
        for v in node.values():
            yield from _gates(v)
    elif isinstance(node, list):
        for v in node:
            yield from _gates(v)


@pytest.mark.parametrize("name", ["timestamp_partial_day", "unpartitioned_merge", "clustered_merge",
                                  "date_hour"])
def test_merge_changed_promotion_on_time_range_layouts(la_session: Any, tmp_path: Path,
                                                       name: str) -> None:
    """``promotion: merge_changed`` bounded by a time-range window: the window is fixed, the
    rows outside it are untouched, in another session time zone."""
    import dataclasses

    lay = dataclasses.replace(LAYOUTS[name], promotion="merge_changed")
    spark = la_session
    _fixed(spark, tmp_path / name, lay)
    op = spark.sql(f"DESCRIBE HISTORY delta.`{tmp_path / name / 'target' / 'events'}` LIMIT 1"
                   ).first()["operation"]
    assert op == "MERGE"


@pytest.mark.parametrize(("name", "together"), [("unpartitioned_ntz", 1), ("clustered", 1),
                                              ("date_hour", 2)])
def test_concurrent_slices_by_shadow_layout(spark: Any, tmp_path: Path, name: str,
                                            together: int) -> None:
    """``max_concurrent_slices: 2``: a date+hour shadow takes a wave's slices as concurrent
    commits; a timestamp window's unpartitioned shadow takes them as one commit (concurrent
    ``replaceWhere`` commits there conflict). Either way the window is fixed exactly."""
    import dataclasses

    lay = LAYOUTS[name]
    lay = dataclasses.replace(lay, execution={"max_concurrent_slices": 2},
                              window_column={**(lay.window_column or {}), "slice": "1h"})
    _, out = _fixed(spark, tmp_path / name, lay)
    shadow = out.targets["events"].shadow
    slices = []
    for row in spark.sql(f"DESCRIBE HISTORY {shadow.sql}").collect():
        meta = json.loads(row["userMetadata"] or "{}").get("sparkguard", {})
        if meta.get("action") == "shadow_write":
            slices.append(meta["slice"])
    proof = min(slices)
    assert slices.count(proof) == 2  # the proof slice, written twice
    waves = [s for s in slices if s != proof]
    assert len(waves) == together  # the window's other slices: one wave, `together` commits


@pytest.mark.parametrize(("writer", "runner", "lost"),
                         [("UTC", "Asia/Kolkata", 4), ("Asia/Kolkata", "UTC", 3)])
def test_generated_date_column_in_another_zone_never_leaves_window_rows_unrepaired(
        spark: Any, tmp_path: Path, writer: str, runner: str, lost: int) -> None:
    """Source and target partitioned by ``event_date GENERATED ALWAYS AS (CAST(event_ts AS
    DATE))``, written by one zone's session (one file per few hours, as an hourly job leaves
    them); the backfill runs in another zone's. Delta prunes the generated partitions by the
    runner's dates of each bucket's bounds, so rows of the window's first 4 hours (20:00 to 24:00
    UTC, 03-08 in UTC and 03-09 in Kolkata) are read from neither table (all 4 from Kolkata; 3
    from UTC, whose 23:00 bucket ends on 03-09 and so reads that partition too): the run must
    not end 0 with those rows still wrong. Written from Kolkata and run in UTC, the check used to be skipped
    (it took UTC as the truth)."""

    from sparkguard.errors import GuardError
    from sparkguard.layouts import DAY0, Layout, _append, _create, _row

    at = lambda h: DAY0 + dt.timedelta(hours=h)  # noqa: E731  (DAY0: 2026-03-09 00:00 UTC)
    lay = Layout("generated_ist", at(-4), at(12),
                 {"name": "event_ts", "type": "timestamp", "slice": "auto"},
                 partitioned_by=("event_date",), generated_date=True)
    root = tmp_path / "ist"
    root.mkdir()
    chunks = [[at(h) for h in range(a, b)] for a, b in ((-24, -4), (-4, 0), (0, 12), (12, 24))]
    old = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", writer)  # the tables' writer
    try:
        for side in ("source", "target"):
            path = root / side / "events"
            _create(spark, lay, path)
            for chunk in chunks:
                rows = [_row(lay, int((t - DAY0).total_seconds()) // 3600 + 100, t)
                        for t in chunk]
                if side == "target":  # every window row wrong in the target
                    rows = [(r[0], r[1], decimal.Decimal("-1.00"), *r[3:]) if lay.start <= t < lay.end else r
                            for r, t in zip(rows, chunk, strict=True)]
                # the writer's date, as Delta checks the generated column in its zone
                rows = [(*r[:-1], t.astimezone(ZoneInfo(writer)).date())
                        for r, t in zip(rows, chunk, strict=True)]
                _append(spark, lay, path, rows)
        plan = _approved_plan(lay, root)
        tgt_path = root / "target" / "events"
        before = _version(spark, tgt_path)
        spark.conf.set("spark.sql.session.timeZone", runner)
        lines: list[str] = []
        with pytest.raises(GuardError) as info:  # it used to end 0, "promoted and verified"
            _run(spark, plan, lines)
        assert "window_zone_dependent" in str(info.value), str(info.value)
        assert f"{lost} window row(s)" in str(info.value), str(info.value)
        assert spark.conf.get("spark.sql.session.timeZone") == runner
        assert spark.conf.get("spark.databricks.delta.generatedColumn."
                              "partitionFilterOptimization.enabled", None) is None  # put back
        spark.conf.set("spark.sql.session.timeZone", writer)
        assert _version(spark, tgt_path) == before
        # in the writers' zone the same plan repairs every window row
        out = _run(spark, plan, lines)
        assert out.exit_code == 0, "\n".join(lines[-20:])
        window = "event_ts >= TIMESTAMP_LTZ'2026-03-08 20:00:00+00:00' AND " \
                 "event_ts < TIMESTAMP_LTZ'2026-03-09 12:00:00+00:00'"
        src = spark.read.format("delta").load(str(root / "source" / "events")).filter(window)
        tgt = spark.read.format("delta").load(str(tgt_path)).filter(window)
        assert src.count() == 16
        assert tgt.exceptAll(src).count() + src.exceptAll(tgt).count() == 0
    finally:
        spark.conf.set("spark.sql.session.timeZone", old)


def _at(hours: int) -> dt.datetime:
    from sparkguard.layouts import DAY0

    return DAY0 + dt.timedelta(hours=hours)


@contextlib.contextmanager
def _written_in_utc_run_from_new_york(spark: Any, root: Path, start_h: int, end_h: int
                                      ) -> Iterator[tuple[Path, list[dt.datetime]]]:
    """Dense rows (every 10 minutes) in source and target, ``event_date GENERATED ALWAYS AS
    (CAST(event_ts AS DATE))``, written by a UTC session, and an approved plan for the hours
    ``[start_h, end_h)`` after DAY0 (hour slices); yields (the plan, the rows' moments) with
    the session in New York, after asserting that the guard refuses the plan and writes
    nothing. The session's zone is restored after."""
    from sparkguard.layouts import Layout, _append, _create, _moments, _row

    lay = Layout("generated_ny", _at(start_h), _at(end_h),
                 {"name": "event_ts", "type": "timestamp", "slice": "auto"},
                 partitioned_by=("event_date",), generated_date=True)
    old = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "UTC")  # the tables' writer
    try:
        for side in ("source", "target"):
            _create(spark, lay, root / side / "events")
            _append(spark, lay, root / side / "events",
                    [_row(lay, i, t) for i, t in enumerate(_moments(lay))])
        plan = _approved_plan(lay, root)
        before = _version(spark, root / "target" / "events")
        spark.conf.set("spark.sql.session.timeZone", "America/New_York")
        yield plan, list(_moments(lay))
        assert _version(spark, root / "target" / "events") == before
        assert not (root / "_sg" / "shadow").exists()
    finally:
        spark.conf.set("spark.sql.session.timeZone", old)


def test_a_slice_that_reads_no_rows_in_another_zone_is_refused_before_anything_is_written(
        spark: Any, tmp_path: Path) -> None:
    """A window 02:00-05:00 UTC (hour slices) backfilled from New York over tables written in
    UTC with a date partition generated from the timestamp. The whole window reads all its rows
    there (its bounds' New York dates, 03-09 and 03-10, cover both partitions), but the 02:00
    UTC slice is 22:00 on 03-09 in New York: Delta prunes it to partition 03-09 and it reads
    none of its rows. The run used to write its shadows and fail its gates (shadow 13 rows
    against the source's 20); the guard now refuses it first, naming the rows that no slice
    would read."""
    from sparkguard.errors import GuardError

    root = tmp_path / "ny"
    with _written_in_utc_run_from_new_york(spark, root, 26, 29) as (plan, moments):
        window = (f"event_ts >= TIMESTAMP'{_at(26):%Y-%m-%d %H:%M:%S}+00:00' AND "
                  f"event_ts < TIMESTAMP'{_at(29):%Y-%m-%d %H:%M:%S}+00:00'")
        tgt = spark.read.format("delta").load(str(root / "target" / "events"))
        assert tgt.filter(window).count() == sum(
            1 for t in moments if _at(26) <= t < _at(29))  # the window alone loses nothing
        with pytest.raises(GuardError) as info:
            _run(spark, plan)
    msg = str(info.value)
    lost = sum(1 for t in moments if _at(26) <= t < _at(27))  # the 02:00 UTC slice
    assert "window_zone_dependent" in msg and f"so {lost} window row(s)" in msg, msg
    assert "2026-03-10T02" in msg, msg


def test_a_session_that_refuses_the_pruning_setting_is_checked_against_utc(
        spark: Any, tmp_path: Path, monkeypatch: Any) -> None:
    """A serverless session refuses to show or take settings it does not expose: the check
    cannot turn Delta's generated-partition pruning off, so it counts the buckets again in a
    UTC session (the zone writers normally use) and still refuses the New York run of UTC-written
    tables, naming the rows no slice would read."""
    from pyspark.sql.conf import RuntimeConfig

    from sparkguard.errors import GuardError
    from sparkguard.guard_live import _GENERATED_PRUNING

    real_get = RuntimeConfig.get

    def refusing_get(self: Any, key: str, *args: Any) -> Any:
        if key == _GENERATED_PRUNING:
            raise RuntimeError(f"[CONFIG_NOT_AVAILABLE] {key}")
        return real_get(self, key, *args)

    monkeypatch.setattr(RuntimeConfig, "get", refusing_get)
    with (_written_in_utc_run_from_new_york(spark, tmp_path / "ny", 26, 29) as (plan, moments),
          pytest.raises(GuardError) as info):
        _run(spark, plan)
    lost = sum(1 for t in moments if _at(26) <= t < _at(27))
    assert f"so {lost} window row(s)" in str(info.value), str(info.value)


def test_the_zone_check_counts_every_bucket_not_only_the_first_query_s(
        spark: Any, tmp_path: Path, monkeypatch: Any) -> None:
    """The check counts its buckets in queries of ``_ZONE_BUCKETS`` (400); here 2, so the seven
    hour buckets 22:00-05:00 UTC take four queries. From New York (UTC-4 on 2026-03-10) the
    buckets 00:00, 01:00 and 02:00 UTC fall on 03-09 at both bounds and are pruned to that
    partition: they read none of their rows, which sit in 03-10. The first query's buckets
    (22:00, 23:00) lose nothing; the check used to count those alone and let the run start."""
    from sparkguard import guard_live
    from sparkguard.errors import GuardError

    monkeypatch.setattr(guard_live, "_ZONE_BUCKETS", 2)
    with (_written_in_utc_run_from_new_york(spark, tmp_path / "ny", 22, 29) as (plan, moments),
          pytest.raises(GuardError) as info):
        _run(spark, plan)
    msg = str(info.value)
    lost = sum(1 for t in moments if _at(24) <= t < _at(27))
    assert lost and f"so {lost} window row(s)" in msg, msg
    assert "2026-03-10T00" in msg and "2026-03-09T22" not in msg, msg


def test_date_hour_whole_day_means_hours_0_to_23_in_every_slice(spark: Any,
                                                                 tmp_path: Path) -> None:
    """A whole-day date_hour window cut into 6h slices, over a day that also has a row with a
    NULL hour and one with hour 24: the window is hours 0-23, so both stay outside it. The
    whole-day predicate (``dt IN (...)``) used to take them in while no slice (``hr IN (0..5)``
    ...) wrote them: the full window's gates failed on rows no slice could produce, and under a
    row tolerance the promotion would have deleted them from the target."""
    import dataclasses

    from sparkguard.layouts import DAY0, _append

    lay = dataclasses.replace(LAYOUTS["date_hour"], start=DAY0 + dt.timedelta(hours=24),
                              end=DAY0 + dt.timedelta(hours=48),
                              window_column={"name": "dt", "type": "date_hour",
                                             "hour_column": "hr", "slice": "6h"})
    root = tmp_path / "dh"
    plan = build_layout(spark, root, lay)
    t = DAY0 + dt.timedelta(hours=30)
    odd = {"source": [(5_000_000, None, "1.00"), (5_000_001, 24, "2.00")],
           "target": [(5_000_000, None, "9.00"), (5_000_001, 24, "8.00")]}
    for side, rows in odd.items():
        _append(spark, lay, root / side / "events",
                [(i, t, decimal.Decimal(a), 1.0, "odd", t.date(), hr) for i, hr, a in rows])
    lines: list[str] = []
    out = _run(spark, plan, lines)
    assert out.exit_code == 0, "\n".join(lines[-20:])
    kept = {r["event_id"]: str(r["amount"]) for r in _target(spark, root).filter(
        "event_id >= 5000000").collect()}
    assert kept == {5_000_000: "9.00", 5_000_001: "8.00"}  # outside the window: untouched
    f = figures(spark, root, lay)
    assert f["window_rows_fixed"] > 0 and f["window_rows_wrong"] == 0


def test_a_key_that_moved_across_the_window_edge_stops_the_run(spark: Any,
                                                                tmp_path: Path) -> None:
    """A fix that moves a row across the window's edge: the source has an event inside the
    window whose old version the target holds the day before it. Every window gate passes (the
    key is once in the shadow and once in neither side's window), but a promotion would leave
    the key in the target twice. The full-window gate ``keys_outside_window`` fails, naming the
    key and where it is, and nothing is promoted."""
    lay = LAYOUTS["date_partitions"]
    root = tmp_path / "edge"
    plan = build_layout(spark, root, lay)
    before = lay.start - dt.timedelta(hours=3)
    i0, window = _edge_failure(spark, root, plan, lay, before, "keys_outside_window")
    (gate,) = [g for g in window.gates if not g.passed]
    assert gate.details["sample"] == [f'{{"event_id":{i0},"event_date":"{before.date()}"}}']


def _edge_failure(spark: Any, root: Path, plan: Path, lay: Any, moved_from: dt.datetime,
                  gate_name: str) -> tuple[int, Any]:
    """Give the target, at ``moved_from`` (outside the window), a row whose event the source
    has inside it; run ``plan``: the gate ``gate_name`` fails on that one key and row, nothing
    is promoted. Returns the event id and the full window's result."""
    from sparkguard.errors import EXIT_GATE_FAILED
    from sparkguard.layouts import _append, _inside, _moments, _row

    tgt = root / "target" / "events"
    i0 = next(i for i, t in enumerate(_moments(lay)) if _inside(lay, t) and i % 5 != 1)
    _append(spark, lay, tgt, [_row(lay, i0, moved_from)])
    before = _version(spark, tgt)
    lines: list[str] = []
    out = _run(spark, plan, lines)
    assert out.exit_code == EXIT_GATE_FAILED, "\n".join(lines[-20:])
    assert _version(spark, tgt) == before
    window = out.targets["events"].window
    assert window is not None
    gate = next(g for g in window.gates if g.gate == gate_name)
    assert not gate.passed and gate.measured == {"keys": 1, "rows": 1}
    return i0, window


def test_a_date_hour_key_with_its_date_still_moves_across_the_window_edge(
        spark: Any, tmp_path: Path) -> None:
    """A ``date_hour`` window (05:00-11:00 of one day) and table-wide keys ``(event_id, dt)``:
    a row moved from 12:00 into the window keeps its date, so its key is held outside the
    window in the same ``dt``. Keys holding the date alone do not make the gate moot (the hour
    is the other window column): it runs and fails."""
    import yaml

    from sparkguard.approve import record_approval
    from sparkguard.layouts import layout_plan

    lay = LAYOUTS["date_hour"]
    root = tmp_path / "dh"
    build_layout(spark, root, lay)
    data = layout_plan(lay, root)
    for check in data["backfill_plan"]["validation"]["checks"]:
        if check["type"] == "duplicate_check":
            check["key_columns"] = ["event_id", "dt"]
    plan = root / "plan.yaml"
    plan.write_text(yaml.safe_dump(data, sort_keys=False, width=100), encoding="utf-8")
    record_approval(plan, "data-platform-owner", "alice@example.com")
    later = lay.end + dt.timedelta(hours=1)  # the same day, an hour after the window
    assert later.date() == (lay.end - dt.timedelta(hours=1)).date()
    _i0, window = _edge_failure(spark, root, plan, lay, later,
                                "keys_outside_window[event_id,dt]")
    (gate,) = [g for g in window.gates if not g.passed]
    assert f'"hr":{later.hour}' in gate.details["sample"][0], gate.details
