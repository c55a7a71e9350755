"""Plan fixtures for the plan/guard/approval tests (pure: no Spark)."""

from __future__ import annotations

import copy
import datetime as dt
from pathlib import Path
from typing import Any

import yaml

from sparkguard.demo import START, demo_plan

SEED_PLAN = Path(__file__).parent / "data" / "seed" / "backfill-plan.yaml"
LAKE = Path("/lake")
WINDOW = [START + dt.timedelta(days=2 + i) for i in range(3)]  # 2026-05-03 .. 05


def valid_plan(root: Path = LAKE) -> dict[str, Any]:
    """A complete plan (the demo's) as YAML-ready data; only approvals are missing."""
    return copy.deepcopy(demo_plan(root, WINDOW))


def plan_yaml(data: dict[str, Any]) -> str:
    return yaml.safe_dump(data, sort_keys=False)
