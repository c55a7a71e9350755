"""The walkthrough notebook runs headless, end to end, so it cannot rot.

Its code cells run in order in an IPython shell inside this test process, as a notebook on
Databricks would: the notebook finds the active session (the suite's) instead of starting one,
so the test pays for no second JVM. Outputs are captured per cell as a kernel would record them
(stream text, display data). The demo lake is 8 x 300 orders under the test's temp folder.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest
import yaml
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
from traitlets.config import Config

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "walkthrough.ipynb"

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _execute(nb: Any) -> None:
    """Run the code cells in order in a fresh IPython shell; record each cell's outputs.

    The first failing cell (an ``assert`` included) fails the test with its source and output.
    """
    config = Config()
    config.HistoryManager.enabled = False
    config.InteractiveShell.colors = "nocolor"
    shell = InteractiveShell.instance(config=config)
    try:
        for index, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            with capture_output() as cap:
                result = shell.run_cell(cell.source, store_history=False)
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=cap.stdout)]
            cell.outputs += [nbformat.v4.new_output("display_data", data=out.data)
                             for out in cap.outputs]
            if not result.success:
                pytest.fail(f"cell {index} failed:\n{cell.source}\n--- output ---\n"
                            f"{cap.stdout}{cap.stderr}")
    finally:
        InteractiveShell.clear_instance()


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


def test_walkthrough_notebook_runs_plan_to_rollback(spark: Any, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), \
        "commit the notebook without outputs"
    monkeypatch.setenv("SPARKGUARD_WALKTHROUGH_DIR", str(tmp_path))
    monkeypatch.chdir(NOTEBOOK.parent)  # where Jupyter starts a notebook's kernel
    monkeypatch.setattr(sys, "path", list(sys.path))  # the first cell adds the checkout
    _execute(nb)
    assert spark.sparkContext._jsc is not None, "the notebook stopped the session it did not start"

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
    assert outcomes == ["dry_run_passed", "rolled_back"]  # the promoted run, rolled back
