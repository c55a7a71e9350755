"""The plan fingerprint: sha256 of the canonical plan content that approvals bind to."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel

from sparkguard.plan.model import ADDED_LATER, BackfillPlan

__all__ = ["canonical_content", "fingerprint"]


def canonical_content(plan: BackfillPlan) -> str:
    """Canonical JSON of the validated plan, minus what is not content.

    Excluded: ``approvals.granted`` (approvals cannot approve themselves), ``status`` and
    ``execution.dry_run_completed`` (self-declared claims; sparkguard's ledger holds the facts).
    Kept: everything else, defaults included, and in particular ``approvals.required`` and
    ``approvals.owner_may_self_approve``: dropping a reviewer or relaxing the policy is an edit
    that must invalidate the approvals given under the stricter plan. Formatting, comments, key
    order and equivalent spellings of a value (``2026-05-01`` / ``"2026-05-01T00:00:00Z"``) do
    not change it, because it is computed from the validated, normalised models.
    ``execution.slice_partitions: auto`` counts as ``1``, the default it replaced, so plans
    approved before keep their approvals.
    """
    data = plan.model_dump(mode="json", exclude=_added_at_default(plan) or None)
    data.pop("status", None)
    data["approvals"].pop("granted", None)
    data["execution"].pop("dry_run_completed", None)
    if data["execution"].get("slice_partitions") == "auto":
        # ``auto`` became the default after ``1``: a plan that omits the field keeps the
        # fingerprint it had (slicing changes the cost of a run, never what it promotes)
        data["execution"]["slice_partitions"] = 1
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _added_at_default(model: BaseModel) -> dict[Any, Any]:
    """Pydantic ``exclude`` of the fields marked :data:`ADDED_LATER` that hold their default,
    at any depth (lists by index)."""
    out: dict[Any, Any] = {}
    for name, info in type(model).model_fields.items():
        value = getattr(model, name)
        extra = info.json_schema_extra
        if isinstance(extra, dict) and extra.items() >= ADDED_LATER.items() and value == info.get_default(
                call_default_factory=True):
            out[name] = True
            continue
        if isinstance(value, BaseModel):
            value = {None: value}
        elif isinstance(value, list | tuple):
            value = dict(enumerate(value))
        if isinstance(value, dict):
            nested = {k: sub for k, v in value.items()
                      if isinstance(v, BaseModel) and (sub := _added_at_default(v))}
            if nested:
                out[name] = nested.pop(None) if None in nested else nested
    return out


def fingerprint(plan: BackfillPlan) -> str:
    """Hex sha256 of :func:`canonical_content`."""
    return hashlib.sha256(canonical_content(plan).encode("ascii")).hexdigest()
