"""Evidence says what each promotion mode and option does to the window (no Spark): rows the
recomputation no longer produces are "kept" under ``when_not_matched_by_source: keep``, and only
``merge_changed`` leaves unchanged rows alone. (The same counts against a real change data feed:
tests/integration/test_merge_changed_run.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkguard.evidence import change_applied, load_evidence, render_markdown
from sparkguard.plan.model import Promotion

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
PREVIEW = {"inserted": 6, "deleted": 4, "changed": 39, "unchanged": 155}


@pytest.mark.parametrize(("promotion", "deletes", "expected"), [
    (Promotion.REPLACE_WHERE, True, (6, 4, 0, 39, 155)),
    (Promotion.MERGE, True, (6, 4, 0, 39, 155)),
    (Promotion.MERGE, False, (6, 0, 4, 39, 155)),
    (Promotion.MERGE_CHANGED, True, (6, 4, 0, 39, 0)),
    (Promotion.MERGE_CHANGED, False, (6, 0, 4, 39, 0)),
])
def test_change_applied_per_mode(promotion: Promotion, deletes: bool,
                                 expected: tuple[int, ...]) -> None:
    got = change_applied(PREVIEW, promotion, deletes)
    assert got is not None
    assert tuple(got[k] for k in ("inserted", "deleted", "kept", "updated",
                                  "unchanged_reported_as_changed")) == expected
    assert change_applied(None, promotion, deletes) is None


@pytest.mark.parametrize("name", ["evidence_merge_keep", "evidence_merge_changed"])
def test_markdown_says_kept_not_deleted(name: str) -> None:
    md = render_markdown(load_evidence(GOLDEN / f"{name}.yaml"))
    assert "4 no longer produced, kept" in md and "4 deleted" not in md
    assert "0 deleted, 4 kept (no longer produced" in md


def test_markdown_per_mode_on_unchanged_rows() -> None:
    changed = render_markdown(load_evidence(GOLDEN / "evidence_merge_changed_delete.yaml"))
    assert ("Promotion (merge_changed): 6 inserted, 4 deleted, 39 updated; unchanged rows "
            "neither updated nor reported as changes.") in changed
    replaced = render_markdown(load_evidence(GOLDEN / "evidence.yaml"))
    assert "155 unchanged row(s) rewritten as well and reported as changes" in replaced
