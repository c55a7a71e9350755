"""What a run's evidence records for audit: its ledger chain heads and the Delta commits it made
on its targets (read from each target's history once, when the evidence is written)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sparkguard import delta_ops
from sparkguard.audit_trail import commit_record
from sparkguard.run.context import RunContext, RunState

__all__ = ["audit_facts"]


def _ms(ts: Any) -> int | None:
    """A history timestamp (PySpark: naive local time) in ms since the epoch."""
    if ts is None:
        return None
    if isinstance(ts, dt.datetime):
        return round(ts.astimezone(dt.UTC).timestamp() * 1000)
    return int(ts)


def audit_facts(ctx: RunContext, state: RunState) -> dict[str, Any]:
    """Chain heads and this run's commits on its targets (oldest first), for
    :func:`sparkguard.audit_trail.attach_audit`."""
    commits: list[dict[str, Any]] = []
    for st in state.targets.values():
        if st.start_version is None:
            continue
        for c in reversed(delta_ops.commits_since(ctx.spark, st.ref, st.start_version)):
            meta = delta_ops.commit_metadata(c.get("userMetadata"))
            if meta and meta.get("run_id") == state.run_id:
                commits.append(commit_record(st.ref.display,
                                             {**c, "timestamp": _ms(c.get("timestamp"))}))
    chains = ctx.ledger.chain_heads(state.run_id, list(state.lock_keys.values()))
    return {"home": ctx.home, "chains": chains, "commits": commits}
