"""The naive backfill the benchmark compares against: ``spark-submit bench/naive_backfill.py
--plan P``. It reads the plan's source, applies the first target's transform SQL to the window
and writes the result with one ``replaceWhere`` commit: no guard, ledger, shadow, proof,
reconciliation, publish control or verification. Same session setup as ``jobs/backfill.py``.
"""

from __future__ import annotations

import argparse
import sys


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plan", required=True)
    args = ap.parse_args()
    from sparkguard.plan import load_plan
    from sparkguard.plan.window import window_partitions
    from sparkguard.session import get_or_create_session
    from sparkguard.sql import window_predicate

    plan = load_plan(args.plan)
    assert plan.partitioning is not None and plan.source_of_truth.dataset is not None
    target = plan.target_specs()[0]
    assert target.transform.sql is not None
    spark = get_or_create_session("naive-backfill")
    spark.sparkContext.setLogLevel("ERROR")
    pred = window_predicate(plan.partitioning.column, plan.partitioning.type,
                            window_partitions(plan))
    spark.read.format("delta").load(plan.source_of_truth.dataset).filter(pred) \
        .createOrReplaceTempView("naive_source")
    out = spark.sql(target.transform.sql.replace("{source}", "naive_source")
                    .replace("{window}", pred))
    (out.write.format("delta").mode("overwrite").option("replaceWhere", pred)
     .save(target.dataset))
    return 0


if __name__ == "__main__":
    sys.exit(main())
