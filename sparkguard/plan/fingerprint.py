"""The plan fingerprint: sha256 of the canonical plan content that approvals bind to."""

from __future__ import annotations

import hashlib
import json

from sparkguard.plan.model import BackfillPlan

__all__ = ["canonical_content", "fingerprint"]


def canonical_content(plan: BackfillPlan) -> str:
    """Canonical JSON of everything except granted approvals and ``status``.

    Formatting, comments and key order do not change it; any change of meaning does,
    including the list of required approval roles.
    """
    data = plan.model_dump(mode="json")
    data.pop("status", None)
    data.get("approvals", {}).pop("granted", None)
    # the self-declared claims are not content: the ledger proves them
    data.get("execution", {}).pop("dry_run_completed", None)
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def fingerprint(plan: BackfillPlan) -> str:
    """Hex sha256 of :func:`canonical_content`."""
    return hashlib.sha256(canonical_content(plan).encode("ascii")).hexdigest()
