"""Small lakes, one per supported window layout, for ``make demo-layouts`` and the tests.

Each layout has a source of truth and a target of the same shape: events every 10 minutes over
two days, plus rows 1 µs either side of, and exactly at, each window bound. The target carries a
planted defect inside the window (amounts off, rows missing, an extra row) and, outside it, a
``note`` that differs from the source: a promotion leaking out of the window would rewrite it.
:func:`figures` measures what a run fixed inside the window and changed outside it.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

__all__ = ["LAYOUTS", "Layout", "build_layout", "figures", "layout_plan"]

DAY0 = dt.datetime(2026, 3, 9, tzinfo=dt.UTC)
_US = dt.timedelta(microseconds=1)


@dataclass(frozen=True)
class Layout:
    """One table layout and the window a plan bounds on it."""

    name: str
    start: dt.datetime
    end: dt.datetime
    window_column: dict[str, Any] | None = None  # None: a partition-value window (event_date)
    partitioned_by: tuple[str, ...] = ()
    cluster_by: tuple[str, ...] = ()
    generated_date: bool = False
    ntz: bool = False
    hour_column: bool = False
    promotion: str = "replace_where"
    execution: dict[str, Any] = field(default_factory=dict)  # added to the plan's execution

    @property
    def columns(self) -> list[str]:
        cols = ["event_id", "event_ts", "amount", "score", "note"]
        if self.hour_column:
            return [*cols, "dt", "hr"]
        return [*cols, "event_date"]


def _at(hours: float) -> dt.datetime:
    return DAY0 + dt.timedelta(hours=hours)


LAYOUTS: dict[str, Layout] = {lay.name: lay for lay in (
    Layout("date_partitions", _at(24), _at(48), partitioned_by=("event_date",)),
    Layout("timestamp_partial_day", _at(29), _at(33.5) + _US * 7,
           {"name": "event_ts", "type": "timestamp", "slice": "2h"},
           partitioned_by=("event_date",)),
    Layout("generated_date", _at(29), _at(33.5),
           {"name": "event_ts", "type": "timestamp", "slice": "auto"},
           partitioned_by=("event_date",), generated_date=True),
    Layout("date_hour", _at(29), _at(35),
           {"name": "dt", "type": "date_hour", "hour_column": "hr", "slice": "2h"},
           partitioned_by=("dt", "hr"), hour_column=True),
    Layout("unpartitioned_ntz", _at(20), _at(40),
           {"name": "event_ts", "type": "timestamp_ntz", "slice": "6h"}, ntz=True),
    Layout("unpartitioned_merge", _at(29), _at(33.5),
           {"name": "event_ts", "type": "timestamp", "slice": "auto"}, promotion="merge"),
    Layout("clustered", _at(29), _at(33.5),
           {"name": "event_ts", "type": "timestamp", "slice": "auto"}, cluster_by=("event_ts",)),
    Layout("clustered_merge", _at(6), _at(30),
           {"name": "event_ts", "type": "timestamp", "bucket": "day", "slice": "1d"},
           cluster_by=("event_ts",), promotion="merge"),
)}


def _schema(lay: Layout) -> T.StructType:
    ts: T.DataType = T.TimestampNTZType() if lay.ntz else T.TimestampType()
    fields = [T.StructField("event_id", T.LongType(), False), T.StructField("event_ts", ts),
              T.StructField("amount", T.DecimalType(12, 2)), T.StructField("score", T.DoubleType()),
              T.StructField("note", T.StringType())]
    if lay.hour_column:
        return T.StructType([*fields, T.StructField("dt", T.DateType()),
                             T.StructField("hr", T.IntegerType())])
    return T.StructType([*fields, T.StructField("event_date", T.DateType())])


def _moments(lay: Layout) -> list[dt.datetime]:
    """Every 10 minutes over two days, and the window bounds -1 µs, exactly, +1 µs."""
    out = [DAY0 + dt.timedelta(minutes=10 * i) for i in range(2 * 144)]
    for b in (lay.start, lay.end):
        out += [b - _US, b, b + _US]
    return sorted(set(out))


def _row(lay: Layout, i: int, t: dt.datetime) -> tuple[Any, ...]:
    amount = decimal.Decimal(i * 37 % 10_000) / 100 if i % 11 else None
    score = float("nan") if i % 13 == 0 else (None if i % 7 == 0 else i / 8)
    note = f'event "{i}" at {t:%H:%M}, O\'Brien'
    ts = t.replace(tzinfo=None) if lay.ntz else t
    base = (i, ts, amount, score, note)
    if lay.hour_column:
        return (*base, t.date(), t.hour)
    return (*base, t.date())


def _create(spark: SparkSession, lay: Layout, path: Path) -> None:
    """An empty Delta table of the layout at ``path`` (generated column, partitioning or
    clustering as the layout says)."""
    from delta.tables import DeltaTable

    builder = DeltaTable.create(spark).location(str(path))
    for f in _schema(lay).fields:
        gen = "CAST(event_ts AS DATE)" if f.name == "event_date" and lay.generated_date else None
        builder = builder.addColumn(f.name, f.dataType, nullable=f.nullable,
                                    generatedAlwaysAs=gen)
    if lay.partitioned_by:
        builder = builder.partitionedBy(*lay.partitioned_by)
    if lay.cluster_by:
        builder = builder.clusterBy(*lay.cluster_by)
    builder.execute()


def _append(spark: SparkSession, lay: Layout, path: Path, rows: list[tuple[Any, ...]]) -> None:
    spark.createDataFrame(rows, _schema(lay)).coalesce(2).write.format("delta").mode(
        "append").save(str(path))


def _inside(lay: Layout, t: dt.datetime) -> bool:
    if lay.hour_column:  # the window is whole hours of the dt/hr partitions
        return lay.start <= t.replace(minute=0, second=0, microsecond=0) < lay.end
    return lay.start <= t < lay.end


def layout_plan(lay: Layout, root: Path) -> dict[str, Any]:
    """The YAML-ready plan repairing the layout's window."""
    merge = lay.promotion != "replace_where"
    window: dict[str, Any] = {"start_utc": lay.start.isoformat().replace("+00:00", "Z"),
                              "end_utc": lay.end.isoformat().replace("+00:00", "Z"),
                              "max_partitions": 48}
    cols = ", ".join(f"`{c}`" for c in lay.columns)
    plan: dict[str, Any] = {
        "name": f"fix-events-{lay.name.replace('_', '-')}",
        "owner": "data-platform@example.com",
        "reason": f"Amounts wrong and rows lost between {window['start_utc']} and "
                  f"{window['end_utc']}; recompute exactly that range from the source.",
        "affected_window": window,
    }
    if lay.window_column is None:
        plan["partitioning"] = {"column": "event_date", "type": "date"}
    else:
        plan["window_column"] = dict(lay.window_column)
    plan |= {
        "source_of_truth": {"system": "delta", "dataset": str(root / "source" / "events")},
        "targets": [{"name": "events", "dataset": str(root / "target" / "events"),
                     "business_keys": ["event_id"],
                     "transform": {"sql": f"SELECT {cols} FROM {{source}} WHERE {{window}}"},
                     "promotion": lay.promotion,
                     "contract": {"match_target_schema": True, "not_null": ["event_id"]}}],
        "execution": {"mode": "merge" if merge else "replay", "idempotent": True,
                      "write_strategy": ("MERGE on event_id bounded by the window"
                                         if merge else "replaceWhere over the window"),
                      "dry_run_completed": False, "proof_slice": True, **lay.execution},
        "safeguards": {"publish_paused": True, "downstream_notifications": ["events-bi"],
                       "rollback_strategy": "RESTORE to the version recorded before promotion"},
        "validation": {"checks": [
            {"type": "row_count_parity", "threshold_percent": 0.0},
            {"type": "duplicate_check", "key_columns": ["event_id"], "table_wide": True},
            {"type": "metric_reconciliation", "metric": "amount_total", "aggregation": "sum",
             "source_expr": "amount", "shadow_expr": "amount", "threshold_percent": 0.0}]},
        "approvals": {"required": ["data-platform-owner"]},
        "status": {"state": "review"},
    }
    return {"backfill_plan": plan}


def build_layout(spark: SparkSession, root: Path, lay: Layout, approve: bool = True) -> Path:
    """Create the layout's lake under ``root`` (replaced if present); return the plan path."""
    from sparkguard.approve import record_approval

    root = Path(root).resolve()
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    src, tgt = root / "source" / "events", root / "target" / "events"
    rows = [_row(lay, i, t) for i, t in enumerate(_moments(lay))]
    defect = []
    for r, t in zip(rows, _moments(lay), strict=True):
        i = r[0]
        if not _inside(lay, t):
            defect.append((*r[:4], f"kept outside: {r[4]}", *r[5:]))
        elif i % 5 == 1:
            continue  # lost rows
        elif i % 3 == 0 and r[2] is not None:
            defect.append((r[0], r[1], r[2] * 10, *r[3:]))
        else:
            defect.append(r)
    inside = next(t for t in _moments(lay) if _inside(lay, t))
    defect.append(_row(lay, 999_999, inside))  # a row the source does not have
    for path, data in ((src, rows), (tgt, defect)):
        _create(spark, lay, path)
        _append(spark, lay, path, data)
    plan = root / "plan.yaml"
    plan.write_text(yaml.safe_dump(layout_plan(lay, root), sort_keys=False, width=100),
                    encoding="utf-8")
    if approve:
        record_approval(plan, "data-platform-owner", "alice@example.com")
    version = spark.sql(f"DESCRIBE HISTORY delta.`{tgt}` LIMIT 1").first()
    (root / "layout.json").write_text(json.dumps(
        {"layout": lay.name, "target_version": int(version["version"]) if version else 0}))
    return plan


def _window_filter(lay: Layout) -> str:
    """The plan's own predicate over the whole window."""
    from sparkguard.plan.window import window_partitions
    from sparkguard.plan.window_spec import range_window
    from sparkguard.sql import PartitionType, window_predicate

    plan = load_plan_dict(layout_plan(lay, Path("/lake")))
    rw = range_window(plan)
    if rw is not None:
        return rw.predicate(rw.labels)
    return window_predicate("event_date", PartitionType.DATE, window_partitions(plan))


def load_plan_dict(data: dict[str, Any]) -> Any:
    """A validated plan from a YAML-ready dict."""
    from sparkguard.plan.model import PlanDocument

    return PlanDocument.model_validate(data).backfill_plan


def _diff(a: DataFrame, b: DataFrame) -> int:
    return a.exceptAll(b).count() + b.exceptAll(a).count()


def figures(spark: SparkSession, root: Path, lay: Layout) -> dict[str, int]:
    """Window rows fixed, rows changed outside the window, window rows still unlike the source.

    Compares the target now with the version recorded when the lake was built (bounded, small
    lakes: counts only, nothing collected).
    """
    root = Path(root).resolve()
    before_v = json.loads((root / "layout.json").read_text())["target_version"]
    tgt, src = str(root / "target" / "events"), str(root / "source" / "events")
    pred = _window_filter(lay)
    now = spark.read.format("delta").load(tgt).select(*lay.columns)
    before = spark.read.format("delta").option("versionAsOf", before_v).load(tgt).select(
        *lay.columns)
    truth = spark.read.format("delta").load(src).select(*lay.columns)
    wrong_before = truth.filter(pred).exceptAll(before.filter(pred))
    fixed = wrong_before.intersectAll(now.filter(pred)).count()
    return {"window_rows_fixed": fixed,
            "outside_window_changed": _diff(before.filter(f"NOT ({pred})"),
                                            now.filter(f"NOT ({pred})")),
            "window_rows_wrong": _diff(truth.filter(pred), now.filter(pred))}


def main(argv: list[str] | None = None) -> int:
    """``build ROOT`` makes every layout's lake; ``check ROOT NAME=EXIT ...`` prints a line per
    layout and ``layouts=K passed=P`` (exit 0 only when all passed)."""
    import argparse
    import sys

    from sparkguard.compat import set_log_level
    from sparkguard.session import get_or_create_session

    parser = argparse.ArgumentParser(description="lakes for make demo-layouts")
    parser.add_argument("action", choices=("build", "check"))
    parser.add_argument("root")
    parser.add_argument("items", nargs="*", help="build: layout names (default all); check: "
                        "NAME=EXIT of each run")
    args = parser.parse_args(argv)
    spark = get_or_create_session("sparkguard-demo-layouts")
    set_log_level(spark, "ERROR")
    root = Path(args.root).resolve()
    if args.action == "build":
        for name in args.items or list(LAYOUTS):
            print(build_layout(spark, root / name, LAYOUTS[name]))
        return 0
    exits = dict(e.split("=", 1) for e in args.items)
    chosen = [lay for lay in LAYOUTS.values() if lay.name in exits]
    passed = 0
    for lay in chosen:
        code = int(exits.get(lay.name, "-1"))
        f = figures(spark, root / lay.name, lay)
        ok = (code == 0 and f["window_rows_fixed"] > 0 and f["outside_window_changed"] == 0
              and f["window_rows_wrong"] == 0)
        passed += ok
        print(f"layout={lay.name} exit={code} window_rows_fixed={f['window_rows_fixed']} "
              f"outside_window_changed={f['outside_window_changed']}"
              + ("" if ok else f" window_rows_wrong={f['window_rows_wrong']} FAILED"))
    print(f"layouts={len(chosen)} passed={passed}")
    sys.stdout.flush()
    return 0 if chosen and passed == len(chosen) else 1


if __name__ == "__main__":
    raise SystemExit(main())
