"""JSON Schema of the plan, generated from the models (``sparkguard plan schema``)."""

from __future__ import annotations

import json
from typing import Any

from sparkguard.plan.model import PlanDocument

__all__ = ["SCHEMA_ID", "plan_json_schema", "schema_text"]

SCHEMA_ID = "https://sparkguard.dev/schemas/backfill-plan.schema.json"


def plan_json_schema() -> dict[str, Any]:
    """The schema of a whole plan document (``backfill_plan:`` at the top)."""
    schema = PlanDocument.model_json_schema()
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID,
            **schema}


def schema_text() -> str:
    """The schema as committed in ``templates/backfill-plan.schema.json`` (stable key order)."""
    return json.dumps(plan_json_schema(), indent=2, sort_keys=True) + "\n"
