"""Benchmark: sparkguard's reconciliation vs a bare scan of both sides vs datacompy.

Generates a target and a shadow Delta table (default 2,000,000 rows x 8 columns, with known
injected differences; see ``bench/reconcile_data.py``), then times, interleaved, several rounds
of: a bare scan reading every column of both sides, sparkguard's full reconciliation (gates and
change preview) and datacompy's ``SparkSQLCompare`` with its report. It checks that sparkguard
reported exactly the injected differences (exit 1 otherwise) and prints as its last line::

    rows=N reconcile/scan=R1 datacompy/reconcile=R2

(ratios of medians). Run it alone on the machine::

    flock /tmp/sparkguard-spark.lock .venv/bin/python -m bench.reconcile [--rows 2000000]
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script too
    sys.path.insert(0, str(ROOT))

from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from bench.reconcile_data import DAYS, FLOAT_TOLERANCE, Expected, generate  # noqa: E402
from sparkguard.plan.model import Aggregation  # noqa: E402
from sparkguard.reconcile.engine import reconcile  # noqa: E402
from sparkguard.reconcile.spec import MetricSpec, ReconcileSpec, ThresholdSpec  # noqa: E402
from sparkguard.reconcile.verdicts import ReconcileResult  # noqa: E402
from sparkguard.sql import PartitionType  # noqa: E402

BENCH_SPEC = ReconcileSpec(
    partition_column="event_date",
    partition_type=PartitionType.DATE,
    business_keys=("id",),
    row_count=ThresholdSpec(percent=1.0),
    row_count_per_partition=True,
    duplicate_check=ThresholdSpec(absolute=0.0),
    metrics=(
        MetricSpec("amount_total", Aggregation.SUM, "amount", "amount", ThresholdSpec(percent=0.5)),
        MetricSpec("priced_rows", Aggregation.COUNT, "price", "price", ThresholdSpec(percent=1.0)),
        MetricSpec("customers", Aggregation.COUNT_DISTINCT, "customer_id", "customer_id",
                   ThresholdSpec(percent=1.0)),
        MetricSpec("avg_price", Aggregation.AVG, "price", "price", ThresholdSpec(percent=0.5), True),
        MetricSpec("first_update", Aggregation.MIN, "updated_at", "updated_at", ThresholdSpec()),
        MetricSpec("max_quantity", Aggregation.MAX, "quantity", "quantity", ThresholdSpec()),
    ),
    not_null=("id", "status"),
    float_abs_tolerance=FLOAT_TOLERANCE,
    float_rel_tolerance=FLOAT_TOLERANCE,
)


def session(shuffle_partitions: int) -> SparkSession:
    """The benchmark's own local session (2 cores, Delta)."""
    from sparkguard.session import local_session_builder

    spark = local_session_builder(
        "sparkguard-bench",
        master="local[2]",
        extra={"spark.driver.memory": "6g",
               "spark.sql.shuffle.partitions": str(shuffle_partitions),
               "spark.default.parallelism": "2",
               "spark.sql.adaptive.enabled": "true",
               # small local tables: the Delta log state needs no 50-way split (both sides pay it)
               "spark.databricks.delta.snapshotPartitions": "4"},
    ).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def bare_scan(shadow: DataFrame, target: DataFrame) -> None:
    """Read every column of every row of both sides, and nothing else."""
    shadow.unionByName(target).write.format("noop").mode("overwrite").save()


def sparkguard_reconcile(shadow: DataFrame, target: DataFrame, days: list[dt.date]) -> ReconcileResult:
    """Every gate plus the change preview, as a backfill's window reconciliation runs it."""
    return reconcile(BENCH_SPEC, shadow=shadow, target=target, partitions=days, scope="bench")


def datacompy_compare(spark: SparkSession, shadow: DataFrame, target: DataFrame) -> str:
    """datacompy's SparkSQLCompare and its report (DATE cast to string: Spark 4 needs it)."""
    from datacompy import SparkSQLCompare

    def as_strings(df: DataFrame) -> DataFrame:
        return df.withColumn("event_date", F.col("event_date").cast("string"))

    cmp = SparkSQLCompare(spark, as_strings(target), as_strings(shadow), join_columns=["id"],
                          abs_tol=FLOAT_TOLERANCE, rel_tol=FLOAT_TOLERANCE,
                          df1_name="target", df2_name="shadow")
    return str(cmp.report())


def check(result: ReconcileResult, expected: Expected) -> list[str]:
    """Differences between what sparkguard reported and what was injected."""
    problems: list[str] = []
    pv = result.preview
    if pv is None:
        return ["no change preview"]
    got: dict[str, Any] = {
        "inserted": pv.inserted, "deleted": pv.deleted, "changed": pv.changed,
        "duplicate_keys": result.totals()["duplicate_keys_shadow"],
        "rows_shadow": result.totals()["rows_shadow"], "rows_target": result.totals()["rows_target"],
        "changed_by_column": dict(pv.changed_by_column),
        "ambiguous": getattr(pv, "ambiguous", expected.duplicate_keys),
    }
    want: dict[str, Any] = {
        "inserted": expected.inserted, "deleted": expected.deleted, "changed": expected.changed,
        "duplicate_keys": expected.duplicate_keys, "rows_shadow": expected.rows_shadow,
        "rows_target": expected.rows_target, "changed_by_column": expected.changed_by_column,
        "ambiguous": expected.duplicate_keys,
    }
    for name, value in want.items():
        if got[name] != value:
            problems.append(f"{name}: sparkguard reported {got[name]}, injected {value}")
    if not pv.sample or not result.duplicate_sample:
        problems.append("missing change or duplicate sample")
    return problems


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2_000_000, help="target rows (default 2,000,000)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of each (default 3)")
    ap.add_argument("--shuffle-partitions", type=int, default=4)
    ap.add_argument("--skip-datacompy", action="store_true", help="time only scan and sparkguard")
    ap.add_argument("--root", help="folder for the generated tables (default: a temp folder)")
    args = ap.parse_args(argv)

    spark = session(args.shuffle_partitions)
    with tempfile.TemporaryDirectory(prefix="sg-bench-") as tmp:
        root = args.root or tmp
        t_gen, (tpath, spath, expected) = timed(lambda: generate(spark, root, args.rows))
        print(f"generated {args.rows} target rows x 8 columns in {t_gen:.1f}s under {root}", flush=True)
        shadow = spark.read.format("delta").load(spath)
        target = spark.read.format("delta").load(tpath)
        days = [dt.date(2024, 3, 1) + dt.timedelta(days=i) for i in range(DAYS)]

        bare_scan(shadow, target)  # warm-up: JIT, file listing, Delta log
        times: dict[str, list[float]] = {"scan": [], "sparkguard": [], "datacompy": []}
        problems: list[str] = []
        for rnd in range(1, args.rounds + 1):
            t, _ = timed(lambda: bare_scan(shadow, target))
            times["scan"].append(t)
            t, res = timed(lambda: sparkguard_reconcile(shadow, target, days))
            times["sparkguard"].append(t)
            problems = check(res, expected)
            line = f"round {rnd}: scan {times['scan'][-1]:.2f}s  sparkguard {t:.2f}s"
            if not args.skip_datacompy:
                t, _ = timed(lambda: datacompy_compare(spark, shadow, target))
                times["datacompy"].append(t)
                line += f"  datacompy {t:.2f}s"
            print(line, flush=True)
            if problems:
                break
        spark.stop()
    if problems:
        print("sparkguard did NOT report the injected differences:", *problems, sep="\n  ")
        return 1
    med = {k: statistics.median(v) for k, v in times.items() if v}
    print("medians: " + "  ".join(f"{k} {v:.2f}s" for k, v in med.items()))
    print(f"injected and found: {expected}")
    r1 = med["sparkguard"] / med["scan"]
    r2 = med["datacompy"] / med["sparkguard"] if "datacompy" in med else float("nan")
    print(f"rows={args.rows} reconcile/scan={r1:.2f} datacompy/reconcile={r2:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
