"""The guard's checks of window_column windows: pure figures, and live on real Delta tables
(column and type in source and target, blast radius, most of an unpartitioned table)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sparkguard.guard_window import rewrites_most
from sparkguard.layouts import LAYOUTS, build_layout, layout_plan, load_plan_dict


def test_rewrites_most_gives_the_figures_past_half_the_files_or_bytes() -> None:
    assert rewrites_most(1, 10, 100, 1000) is None
    assert rewrites_most(5, 10, 500, 1000) is None
    text = rewrites_most(6, 10, 600_000, 1_000_000)
    assert text is not None and "6 of its 10 file(s) (60%)" in text and "0.60 of 1.00 MB" in text
    assert rewrites_most(1, 10, 900, 1000) is not None  # one big file is most of the bytes
    assert rewrites_most(0, 0, 0, 0) is None


def _variant_with_deletion_vectors(spark: Any, root: Path, layout: str) -> None:
    """The layout's target gets a VARIANT column and deletion vectors."""
    table = layout_plan(LAYOUTS[layout], root)["backfill_plan"]["targets"][0]["dataset"]
    spark.sql(f"ALTER TABLE delta.`{table}` SET TBLPROPERTIES ('delta.feature.variantType' = "
              "'supported', 'delta.enableDeletionVectors' = 'true')")
    spark.sql(f"ALTER TABLE delta.`{table}` ADD COLUMNS (attrs VARIANT)")


def _live(spark: Any, root: Path, layout: str, promotion: str | None = None,
          **window: Any) -> list[Any]:
    from sparkguard.guard_live import live_findings

    data = layout_plan(LAYOUTS[layout], root)
    if promotion:
        data["backfill_plan"]["targets"][0]["promotion"] = promotion
    data["backfill_plan"]["window_column"].update(window)
    return live_findings(spark, load_plan_dict(data))


@pytest.mark.spark
def test_live_guard_on_window_columns(spark: Any, tmp_path: Path) -> None:
    root = tmp_path / "u"
    build_layout(spark, root, LAYOUTS["unpartitioned_ntz"], approve=False)
    found = _live(spark, root, "unpartitioned_ntz")
    codes = {f.code for f in found}
    assert "partition_type_mismatch" not in codes and "partition_column_missing" not in codes
    radius = [f for f in found if f.code == "blast_radius" and "targets[0]" in f.path]
    assert radius and " rows in " in radius[0].message
    (most,) = [f for f in found if f.code == "window_rewrites_most"]
    assert "file(s)" in most.message and "MB" in most.message and most.fix
    # a timestamp_ntz column declared as timestamp: refused in the source and the target
    wrong = _live(spark, root, "unpartitioned_ntz", type="timestamp")
    paths = sorted(f.path for f in wrong if f.code == "partition_type_mismatch")
    assert paths == ["backfill_plan.window_column", "backfill_plan.window_column"]
    assert "timestamp_ntz" in next(f for f in wrong if f.code == "partition_type_mismatch").message
    missing = _live(spark, root, "unpartitioned_ntz", name="event_time")
    assert any(f.code == "partition_column_missing" and "event_time" in f.message
               for f in missing)
    # replace_where over a column the table is not partitioned by leaves deletion vectors,
    # which this (interpreted) session cannot read a VARIANT column from
    _variant_with_deletion_vectors(spark, root, "unpartitioned_ntz")
    (variant,) = [f for f in _live(spark, root, "unpartitioned_ntz")
                  if f.code == "variant_deletion_vectors"]
    assert "replace_where promotion over event_ts, which the table is not partitioned by" in (
        variant.message)


@pytest.mark.spark
def test_live_guard_checks_both_columns_of_a_date_hour_window(spark: Any, tmp_path: Path) -> None:
    root = tmp_path / "dh"
    build_layout(spark, root, LAYOUTS["date_hour"], approve=False)
    codes = {f.code for f in _live(spark, root, "date_hour")}
    assert not codes & {"partition_type_mismatch", "partition_column_missing"}
    # the hour column is a string column: refused, naming it and the integer types it needs
    wrong = [f for f in _live(spark, root, "date_hour", hour_column="note")
             if f.code == "partition_type_mismatch"]
    assert len(wrong) == 2 and all("'note'" in f.message and "int" in f.message for f in wrong)
    missing = _live(spark, root, "date_hour", hour_column="hour")
    assert any(f.code == "partition_column_missing" and "'hour'" in f.message for f in missing)
    # the date column named as the hour's integer column: refused for its type
    swapped = _live(spark, root, "date_hour", name="hr", hour_column="dt")
    assert any(f.code == "partition_type_mismatch" and "'hr'" in f.message and "date" in f.message
               for f in swapped)
    # replace_where over both partition columns replaces whole files: no deletion vectors
    _variant_with_deletion_vectors(spark, root, "date_hour")
    assert "variant_deletion_vectors" not in {f.code for f in _live(spark, root, "date_hour")}
    (merge,) = [f for f in _live(spark, root, "date_hour", promotion="merge")
                if f.code == "variant_deletion_vectors"]
    assert "set promotion: replace_where" in merge.fix
