"""Named failpoints: ``SPARKGUARD_FAULT_AT=<name>`` kills the process there, like SIGKILL.

A testing aid for the crash suite (``tests/system/test_crash_suite.py``, ``bench/reliability.py``):
the process exits at once with code 137, skipping ``finally`` blocks, atexit handlers and
Spark's shutdown, as a dying driver would. Unset, a failpoint costs one environment lookup.
Names are listed in the order a run reaches them; ``sparkguard faults`` prints them.
"""

from __future__ import annotations

import os
import sys

__all__ = ["FAILPOINTS", "KILLED_EXIT_CODE", "ROLLBACK_FAILPOINTS", "failpoint"]

KILLED_EXIT_CODE = 137  # 128 + SIGKILL, what a killed process reports

FAILPOINTS: dict[str, str] = {
    "after_guard": "plan guarded, nothing written yet",
    "after_lock": "lock taken, run recorded in the ledger",
    "after_pause": "publish paused, no shadow written",
    "mid_shadow_write": "first shadow slice written, its ledger row not yet",
    "after_proof": "proof slice written twice and reconciled",
    "mid_slices": "some slices written and reconciled, others not",
    "mid_reconcile": "all slices done, full-window reconciliation under way",
    "before_promote": "rollback point recorded in the ledger, target not yet changed",
    "after_promote_commit": "target promoted, ledger not yet updated",
    "after_promote_ledger": "promotion recorded, verification not yet done",
    "after_verify": "promotion verified, evidence not yet written",
    "before_publish_resume": "evidence written, publish still paused",
    "mid_publish_resume": "publish reopened, run not yet recorded as done",
    "before_lock_release": "run recorded as done, locks not yet released",
    "mid_rollback": "rollback recorded as started, RESTORE not yet run",
    "after_rollback_restore": "RESTORE committed, ledger not yet updated",
}

# Reached by ``jobs/rollback.py``; every other failpoint by ``jobs/backfill.py``.
ROLLBACK_FAILPOINTS = ("mid_rollback", "after_rollback_restore")


def failpoint(name: str) -> None:
    """Die abruptly when ``SPARKGUARD_FAULT_AT`` names this failpoint."""
    if name not in FAILPOINTS:
        raise ValueError(f"unknown failpoint {name!r}; add it to sparkguard.faults.FAILPOINTS")
    if os.environ.get("SPARKGUARD_FAULT_AT") == name:
        sys.stderr.write(f"sparkguard: failpoint {name} hit, dying\n")
        sys.stderr.flush()
        os._exit(KILLED_EXIT_CODE)
