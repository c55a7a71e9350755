"""Test helpers: build the small demo lake once, copy it per test, rewrite and approve plans."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from sparkguard.approve import record_approval
from sparkguard.demo import START, demo_plan

# the test session's settings on top of sparkguard's local defaults: 2 cores, small lakes
TEST_SESSION_CONF = {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2",
                     "spark.driver.memory": "2g",
                     "spark.databricks.delta.snapshotPartitions": "2",
                     "spark.sql.sources.parallelPartitionDiscovery.parallelism": "2"}

# The shared in-process session (tests/conftest.py) also evaluates expressions without generating
# Java code. Its queries read a few hundred rows, where building and compiling a class per query
# shape costs more than it saves: the heaviest integration modules run about 13 % faster, the
# whole suite about 3 % (docs/performance.md). spark-submit runs (tests/system) keep
# sparkguard's defaults.
INTERPRETED_CONF = {"spark.sql.codegen.wholeStage": "false",
                    "spark.sql.codegen.factoryMode": "NO_CODEGEN"}

DAYS, ROWS_PER_DAY, WINDOW_START, WINDOW_DAYS = 6, 200, 2, 3
WINDOW = [START + dt.timedelta(days=WINDOW_START + i) for i in range(WINDOW_DAYS)]


def build_base(spark: Any, root: Path) -> Path:
    """Generate the small demo lake (no approvals) under ``root``."""
    from sparkguard.demo import generate_lake

    generate_lake(spark, root, days=DAYS, rows_per_day=ROWS_PER_DAY, window_start=WINDOW_START,
                  window_days=WINDOW_DAYS, approve=False)
    return root


def put_back(spark: Any, snapshot: Path, work: Path) -> Path:
    """``work`` as ``snapshot`` holds it: a lake built once at ``work`` (its ledger, plan and
    evidence name absolute paths, so it is only ever used there) and copied aside, handed to
    each test that then changes it. File times are kept (Delta dates a commit by its log
    file's), and the JVM's cache of Delta logs is dropped: it knows ``work``'s tables at the
    versions the last test left."""
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(snapshot, work)
    spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()
    return work


def lock_key_of(spark: Any, table: Path | str) -> str:
    """The key a run or rollback locks the Delta table at ``table`` under (its location)."""
    from sparkguard.delta_ops import lock_key
    from sparkguard.sql import TableRef

    return lock_key(spark, TableRef(path=str(table)))


def count_descriptions(monkeypatch: Any) -> Counter[str]:
    """Count, by the name as written, each table ``delta_ops.lock_key`` describes from now on
    (a ``DESCRIBE DETAIL`` each)."""
    from sparkguard import delta_ops

    seen: Counter[str] = Counter()
    real = delta_ops.lock_key

    def counted(spark: Any, ref: Any) -> str:
        seen[ref.display] += 1
        return real(spark, ref)

    monkeypatch.setattr(delta_ops, "lock_key", counted)
    return seen


def copy_lake(base: Path, dest: Path) -> Path:
    """Copy the base lake's tables (Delta logs hold relative paths) to ``dest``."""
    for sub in ("source", "target"):
        shutil.copytree(base / sub, dest / sub)
    return dest


def write_plan(root: Path, mutate: Callable[[dict[str, Any]], None] | None = None,
               approve: bool = True, name: str = "plan.yaml",
               promotion: str = "replace_where") -> Path:
    """Write the demo plan for ``root`` (optionally mutated) and approve it by two people."""
    data = demo_plan(root, WINDOW, promotion=promotion)
    if mutate:
        mutate(data["backfill_plan"])  # type: ignore[arg-type]
    path = root / name
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    if approve:
        record_approval(path, "data-platform-owner", "alice@example.com")
        record_approval(path, "downstream-owner", "bob@example.com")
    return path


def set_transform(sql: str) -> Callable[[dict[str, Any]], None]:
    def mutate(plan: dict[str, Any]) -> None:
        plan["targets"][0]["transform"] = {"sql": sql}
    return mutate


def newer_protocol(spark: Any, path: Path, reader: bool) -> int:
    """Commit to the table at ``path``, as a newer Delta would, a protocol with a table feature
    this Delta does not know: a writer feature, or (``reader``) a reader-writer one. Returns
    the new version."""
    version = int(spark.sql(f"DESCRIBE HISTORY delta.`{path}`").first()["version"]) + 1
    protocol: dict[str, Any] = {"minReaderVersion": 1, "minWriterVersion": 7, "writerFeatures": [
        "appendOnly", "invariants", "futureReaderFeature" if reader else "futureWriterFeature"]}
    if reader:
        protocol |= {"minReaderVersion": 3, "readerFeatures": ["futureReaderFeature"]}
    actions = [{"commitInfo": {"timestamp": 1780000000000, "operation": "UPGRADE PROTOCOL"}},
               {"protocol": protocol}]
    (path / "_delta_log" / f"{version:020d}.json").write_text(
        "\n".join(json.dumps(a) for a in actions) + "\n")
    return version
