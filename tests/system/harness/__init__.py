"""The reliability harness: real jobs killed at every failpoint and re-run, concurrent runs and
writers, each checked against the Delta tables by independent code.

- ``lakes``: one copy of the small demo lake per scenario;
- ``checks``: the target against its two acceptable states, the ledger against the history;
- ``jobs``: ``spark-submit jobs/<job>.py`` (optionally killed), or the same command in process;
- ``scenarios``: the crash and concurrency scenarios and their outcomes.

``tests/system/test_crash_suite.py`` and ``tests/system/test_concurrency.py`` drive it and record
each outcome's row (``record()``) in pytest's results; ``bench/reliability.py`` renders the
README's Reliability table from those results.
"""

from tests.system.harness.checks import (
    Expected,
    LedgerCheck,
    TableCheck,
    check_ledger,
    check_table,
    expected_states,
)
from tests.system.harness.jobs import Proc, spark_submit
from tests.system.harness.lakes import BACKFILL_FAILPOINTS, SUBSET, Lake, new_lake
from tests.system.harness.scenarios import (
    SCENARIOS,
    WINDOW_MOMENTS,
    CrashOutcome,
    RollbackOutcome,
    ScenarioOutcome,
    appends_outside_window,
    crash_backfill,
    crash_rollback,
    paused_after_crash,
    second_run_mid_run,
    state_after_crash,
    two_runs_at_once,
    window_writer,
)

__all__ = [
    "BACKFILL_FAILPOINTS",
    "SCENARIOS",
    "SUBSET",
    "WINDOW_MOMENTS",
    "CrashOutcome",
    "Expected",
    "Lake",
    "LedgerCheck",
    "Proc",
    "RollbackOutcome",
    "ScenarioOutcome",
    "TableCheck",
    "appends_outside_window",
    "check_ledger",
    "check_table",
    "crash_backfill",
    "crash_rollback",
    "expected_states",
    "new_lake",
    "paused_after_crash",
    "second_run_mid_run",
    "spark_submit",
    "state_after_crash",
    "two_runs_at_once",
    "window_writer",
]
