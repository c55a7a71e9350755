"""The harness's lakes: one copy of the small demo lake per scenario, and the constants
every scenario shares (columns, business key, what a failpoint exits with)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkguard.faults import FAILPOINTS, ROLLBACK_FAILPOINTS
from tests.lakes import copy_lake, write_plan

ROOT = Path(__file__).resolve().parents[3]

KILLED = 137  # what a failpoint exits with, like SIGKILL
BACKFILL_FAILPOINTS = tuple(f for f in FAILPOINTS if f not in ROLLBACK_FAILPOINTS)
# What `make test` runs; SPARKGUARD_FULL_CRASH=1 runs every failpoint.
SUBSET = ("mid_slices", "after_promote_commit", "mid_rollback")
COLUMNS = ("order_id", "order_date", "customer_id", "currency", "status", "quantity", "amount",
           "line_total")
KEY = "order_id"
LABEL = "orders_clean"
SUBMIT_TIMEOUT_S = 900.0

Row = tuple[Any, ...]


# -- lakes ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Lake:
    """One scenario's copy of the demo lake; sparkguard's tables live under ``home``."""

    root: Path

    @property
    def plan(self) -> Path:
        return self.root / "plan.yaml"

    @property
    def source(self) -> str:
        return str(self.root / "source" / "orders")

    @property
    def target(self) -> str:
        return str(self.root / "target" / "orders_clean")

    @property
    def home(self) -> str:
        return str(self.root / "_sparkguard")  # the CLI's default: <plan dir>/_sparkguard


def new_lake(base: Path, dest: Path) -> Lake:
    """A fresh copy of the base lake with its own approved plan."""
    root = copy_lake(base, dest)
    write_plan(root)
    return Lake(root)
