"""``make demo-layouts`` on two layouts (a partial-day timestamp window and a date + hour
window): lakes built, each backfill through ``spark-submit jobs/backfill.py``, figures printed.
The in-process runs of every layout are in tests/integration/test_windows_e2e.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.spark
@pytest.mark.slow
def test_demo_layouts_prints_a_line_per_layout_and_all_passed(tmp_path: Path) -> None:
    names = ["timestamp_partial_day", "date_hour"]
    proc = subprocess.run([sys.executable, "jobs/demo_layouts.py", str(tmp_path / "lake"),
                           *names], cwd=ROOT, capture_output=True, text=True, timeout=900)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("layout")]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert lines[-1] == "layouts=2 passed=2"
    for name, line in zip(names, lines, strict=False):
        fields = dict(kv.split("=") for kv in line.split())
        assert fields["layout"] == name and fields["exit"] == "0"
        assert int(fields["window_rows_fixed"]) > 0 and fields["outside_window_changed"] == "0"


def test_demo_layouts_refuses_an_unknown_layout(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "jobs/demo_layouts.py", str(tmp_path), "nope"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "nope" in proc.stderr
