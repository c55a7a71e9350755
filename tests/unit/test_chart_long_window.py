"""The evidence chart of a long window: bounded width, labels on the breaches only (no Spark)."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest

from sparkguard.chart import Panel, bar_labels, chart_available, chart_size, panels, write_chart


def _evidence(days: int, breach_at: int | None = None) -> dict[str, Any]:
    parts = []
    for i in range(days):
        shadow = 1000 + (7 if i == breach_at else 0)
        parts.append({"partition": f"p{i:04d}", "rows_source": 1000, "rows_shadow": shadow,
                      "rows_target": 990,
                      "metrics": {"gross_amount": {"source": 5e5, "shadow": 5e5, "target": None}}})
    return {"sparkguard": {"run_id": "r1", "outcome": "gate_failed", "plan": {"name": "p", "checks": [
        {"type": "row_count_parity", "threshold_percent": 0},
        {"type": "metric_reconciliation", "metric": "gross_amount", "threshold_percent": 0.01}]},
        "targets": [{"name": "orders_clean", "full_window": {"partitions": parts}}]}}


def test_a_short_window_labels_every_bar() -> None:
    rows = panels(_evidence(3, breach_at=1))[0]
    assert bar_labels(rows) == {0: "0%", 1: "0.7%", 2: "0%"}


def test_a_year_labels_only_the_partitions_over_their_threshold() -> None:
    rows, gross = panels(_evidence(365, breach_at=200))
    assert rows.breaches == ("p0200",)
    assert bar_labels(rows) == {200: "0.7%"}
    assert bar_labels(gross) == {}


def test_labels_stay_bounded_when_every_partition_breaches() -> None:
    panel = Panel("t", "abs", tuple(f"p{i}" for i in range(500)), tuple([float("inf")] * 500),
                  0.0, tuple([None] * 500))
    labels = bar_labels(panel)
    assert len(labels) == 40 and set(labels.values()) == {"inf"}


def test_the_figure_width_is_capped() -> None:
    assert chart_size(3, 2) == (6.0, 5.2)
    assert chart_size(30, 1)[0] == pytest.approx(16.5)
    assert chart_size(365, 3) == (18.0, pytest.approx(7.8))
    assert chart_size(3660, 1)[0] == 18.0


@pytest.mark.skipif(not chart_available(), reason="matplotlib (extra 'chart') not installed")
def test_a_year_draws_a_png_at_most_1800_pixels_wide(tmp_path: Path) -> None:
    path = tmp_path / "year.png"
    assert write_chart(_evidence(365, breach_at=10), path)
    raw = path.read_bytes()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", raw[16:24])
    assert width == 1800 and height == 520  # 100 dpi; two panels of 2.6 in
