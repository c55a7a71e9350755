"""The walkthrough notebook runs headless, end to end, so it cannot rot.

It starts its own small Spark in the kernel process (this test process starts none), on a demo
lake of 8 x 300 orders under the test's temp folder.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest
import yaml
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "walkthrough.ipynb"

pytestmark = pytest.mark.slow


def _outputs(cell: Any, kind: str) -> str:
    """Text of a cell's outputs: ``stream`` text, or display data of a MIME type."""
    parts = []
    for out in cell.get("outputs", []):
        if kind == "stream" and out["output_type"] == "stream":
            parts.append(out["text"])
        elif out["output_type"] in ("display_data", "execute_result") and kind in out["data"]:
            parts.append(str(out["data"][kind]))
    return "".join(parts)


def _cell(nb: Any, needle: str) -> Any:
    (cell,) = [c for c in nb.cells if c.cell_type == "code" and needle in c.source]
    return cell


def test_walkthrough_notebook_runs_plan_to_rollback(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), \
        "commit the notebook without outputs"
    monkeypatch.setenv("SPARKGUARD_WALKTHROUGH_DIR", str(tmp_path))
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    client = NotebookClient(nb, timeout=900, kernel_name="python3", allow_errors=False,
                            resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    client.execute()  # raises CellExecutionError on the first failing cell (asserts included)

    guard = _outputs(_cell(nb, '"guard", str(plan), "--static-only"'), "stream")
    assert "approval" in guard.lower() and "blocking finding(s)" in guard
    explain = _outputs(_cell(nb, '"--explain"'), "stream")
    assert " promote " in explain and " proof " in explain
    run = _outputs(_cell(nb, 'main(["run", "--plan", str(plan)]) == 0'), "stream")
    assert "promoted and verified" in run and "roll back with:" in run

    evidence_cell = _cell(nb, "display(Markdown(")
    markdown = _outputs(evidence_cell, "text/markdown")
    assert markdown.startswith("# Backfill evidence: fix-orders-amounts")
    assert "**Outcome: promoted.**" in markdown
    from sparkguard.chart import chart_available

    if chart_available():
        assert _outputs(evidence_cell, "image/png"), "the evidence chart is not displayed"

    rollback = _outputs(_cell(nb, '"rollback", "--evidence"'), "stream")
    assert "rolled back run" in rollback
    assert "target equals its pre-promotion content" in rollback
    outcomes = sorted(yaml.safe_load(p.read_text())["sparkguard"]["outcome"]
                      for p in (tmp_path / "lake" / "evidence").glob("*.yaml"))
    assert outcomes == ["dry_run_passed", "promoted"]
