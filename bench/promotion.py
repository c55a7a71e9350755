"""Benchmark: promotion by replace_where vs merge vs merge_changed, change data feed on.

Generates a target window of 1,000,000 rows (10 daily partitions, change data feed on) and a
shadow of it with 1 % of keys changed, 0.1 % inserted and 0.1 % deleted. Each mode promotes the
shadow into its own identical copy of the target, in one Delta commit, through sparkguard's own
promotion functions (``delta_ops``). Per mode it prints: data files rewritten (removed by the
commit), bytes written, change-feed rows of the commit (an update counted once, as its
post-image) and wall time. It checks that merge_changed's change feed holds exactly the injected
changes and that every copy's window equals the shadow (exit 1 otherwise). Last line::

    cdf_rows replace_where=A merge=B merge_changed=C expected=E time merge_changed/replace_where=R

Run it alone on the machine::

    flock /tmp/sparkguard-spark.lock .venv/bin/python bench/promotion.py [--rows 1000000]
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from sparkguard import delta_ops  # noqa: E402
from sparkguard.run.data import fingerprints  # noqa: E402
from sparkguard.sql import PartitionType, TableRef, window_predicate  # noqa: E402

DAYS = 10
START = dt.date(2026, 5, 1)
MODES = ("replace_where", "merge", "merge_changed")


def _session() -> SparkSession:
    from sparkguard.session import local_session_builder

    spark = local_session_builder(
        "sparkguard-bench-promotion", master="local[2]",
        extra={"spark.driver.memory": "4g", "spark.sql.shuffle.partitions": "8",
               "spark.default.parallelism": "2", "spark.ui.enabled": "false"},
    ).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _target(spark: SparkSession, rows: int) -> DataFrame:
    return (spark.range(rows).withColumnRenamed("id", "k")
            # contiguous blocks of keys per day: the changes below fall in every partition
            .withColumn("d", F.date_add(F.lit(START), (F.col("k") * DAYS / rows).cast("int")))
            .withColumn("customer", (F.col("k") * 7919 % 100_000).cast("long"))
            .withColumn("status", F.element_at(F.array(*map(F.lit, ("paid", "open", "void"))),
                                               (F.col("k") % 3 + 1).cast("int")))
            .withColumn("amount", (F.col("k") % 10_000 / 100.0).cast("double"))
            .withColumn("note", F.when(F.col("k") % 5 == 0, None).otherwise(F.lit("ok"))))


def _shadow(target: DataFrame, rows: int) -> DataFrame:
    """1 % changed (k % 100 == 3), 0.1 % deleted (k % 1000 == 7), 0.1 % inserted."""
    kept = target.filter(F.col("k") % 1000 != 7)
    changed = kept.withColumn("amount", F.when(F.col("k") % 100 == 3, F.col("amount") + 1.0)
                              .otherwise(F.col("amount")))
    new = (_target(target.sparkSession, rows // 1000).withColumn("k", F.col("k") + rows)
           .withColumn("d", F.date_add(F.lit(START), (F.col("k") % DAYS).cast("int"))))
    return changed.unionByName(new)


def _expected(rows: int) -> tuple[int, int, int]:
    """(inserted, deleted, updated) the shadow differs from the target by."""
    deleted = sum(1 for k in range(7, rows, 1000))
    updated = sum(1 for k in range(3, rows, 100))
    return rows // 1000, deleted, updated


def _commit_figures(spark: SparkSession, ref: TableRef, version: int) -> dict[str, int]:
    commit = delta_ops.history(spark, ref).filter(f"version = {version}").first()
    assert commit is not None
    m = commit["operationMetrics"]
    files = int(m.get("numRemovedFiles") or m.get("numTargetFilesRemoved") or 0)
    written = int(m.get("numOutputBytes") or m.get("numTargetBytesAdded") or 0)
    feed = (spark.read.format("delta").option("readChangeFeed", "true")
            .option("startingVersion", version).option("endingVersion", version).load(ref.path))
    counts = {r["_change_type"]: int(r["count"])
              for r in feed.groupBy("_change_type").count().collect()}
    cdf = sum(v for k, v in counts.items() if k != "update_preimage")
    return {"files_rewritten": files, "bytes_written": written, "cdf_rows": cdf,
            **{f"cdf_{k}": v for k, v in sorted(counts.items())}}


def run(rows: int, work: Path) -> int:
    spark = _session()
    base = work / "base"
    (_target(spark, rows).repartition(DAYS, "d").write.format("delta").partitionBy("d")
     .option("delta.enableChangeDataFeed", "true").save(str(base)))
    shadow_path = str(work / "shadow")
    _shadow(spark.read.format("delta").load(str(base)), rows).write.format("delta") \
        .partitionBy("d").save(shadow_path)
    days = [START + dt.timedelta(days=i) for i in range(DAYS)]
    inserted, deleted, updated = _expected(rows)
    expected = inserted + deleted + updated
    print(f"window rows={rows} partitions={DAYS}: expected inserted={inserted} "
          f"deleted={deleted} updated={updated}")
    figures: dict[str, dict[str, Any]] = {}
    ok = True
    for mode in MODES:
        path = work / mode
        shutil.copytree(base, path)
        ref = TableRef(path=str(path))
        shadow = spark.read.format("delta").load(shadow_path)
        meta = f'{{"sparkguard": {{"bench": "{mode}"}}}}'
        t0 = time.perf_counter()
        if mode == "replace_where":
            delta_ops.promote_replace_where(
                shadow, ref, window_predicate("d", PartitionType.DATE, days), meta,
                (f"bench-{mode}", 1))
        else:
            delta_ops.promote_merge(
                spark, shadow, ref, ["k"], window_predicate("d", PartitionType.DATE, days, "t"),
                True, meta, (f"bench-{mode}", 1), changed_only=mode == "merge_changed")
        wall = time.perf_counter() - t0
        fig = _commit_figures(spark, ref, delta_ops.current_version(spark, ref))
        fig["wall_s"] = round(wall, 2)
        figures[mode] = fig
        same = fingerprints(delta_ops.read_table(spark, ref), shadow)
        if same[0] != same[1]:
            print(f"{mode}: the promoted table does not equal the shadow", file=sys.stderr)
            ok = False
        print(f"{mode}: files_rewritten={fig['files_rewritten']} "
              f"bytes_written={fig['bytes_written']} cdf_rows={fig['cdf_rows']} "
              f"wall_s={fig['wall_s']} "
              + " ".join(f"{k}={v}" for k, v in fig.items() if k.startswith("cdf_") and
                         k != "cdf_rows"))
        shutil.rmtree(path)
    spark.stop()
    if figures["merge_changed"]["cdf_rows"] != expected:
        print(f"merge_changed reported {figures['merge_changed']['cdf_rows']} change rows, "
              f"expected {expected}", file=sys.stderr)
        ok = False
    ratio = figures["merge_changed"]["wall_s"] / figures["replace_where"]["wall_s"]
    print(f"cdf_rows replace_where={figures['replace_where']['cdf_rows']} "
          f"merge={figures['merge']['cdf_rows']} merge_changed={figures['merge_changed']['cdf_rows']} "
          f"expected={expected} time merge_changed/replace_where={ratio:.2f}")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sg-bench-promotion-") as tmp:
        return run(args.rows, Path(tmp))


if __name__ == "__main__":
    sys.exit(main())
