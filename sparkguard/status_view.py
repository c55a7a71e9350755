"""The text of ``sparkguard status`` and ``sparkguard publish status``: pure functions over the
plain records either reader returns (:mod:`sparkguard.state_read`), so the answer reads the same
whichever engine read the tables."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sparkguard.ledger_model import RunProgress, instant, next_action, run_progress

if TYPE_CHECKING:
    from sparkguard.publish import PublishStatus

__all__ = ["render_publish", "render_run", "render_runs"]


def render_runs(runs: Sequence[RunProgress], home: str) -> str:
    """One line per run (newest first): id, state, plan, start, next action."""
    if not runs:
        return f"no runs in the ledger at {home}"
    return "\n".join(
        f"{prog.run_id}  {prog.state:<18} plan={prog.plan_name} "
        f"started={instant(prog.started_at):%Y-%m-%d %H:%M:%S} "
        f"{'dry-run ' if prog.dry_run else ''}next: {next_action(prog)}" for prog in runs)


def render_run(events: Sequence[dict[str, Any]], slices: Sequence[dict[str, Any]]) -> str:
    """One run in detail: targets and versions, every event, every slice, the next action."""
    prog = run_progress(events)
    out = [f"run {prog.run_id}: plan {prog.plan_name} ({prog.fingerprint[:12]}), owner "
           f"{prog.owner}, state {prog.state}{' (dry run)' if prog.dry_run else ''}; source "
           f"version {prog.source_version}"]
    for label, tp in prog.targets.items():
        out.append(f"  target {label} {tp.dataset}: reconciled at v{tp.reconciled_version}, "
                   f"rollback point v{tp.rollback_version}, promoted v{tp.promoted_version}, "
                   f"verified {tp.verified}, restored {tp.restored}")
    out.append("events:")
    for e in events:
        tlabel = (e["details"] or {}).get("label") or ""
        versions = " ".join(f"{k}={e[c]}" for k, c in (
            ("source", "source_version"), ("read", "target_version_read"),
            ("written", "target_version_written")) if e.get(c) is not None)
        extra = (e["details"] or {}).get("error") or ""
        out.append(f"  {instant(e['at']):%Y-%m-%d %H:%M:%S} +{e.get('elapsed_s') or 0:7.1f}s "
                   f"{e['state']:<18} {tlabel:<14} {versions} {extra[:120]}".rstrip())
    if slices:
        out.append("slices:")
    for sl in slices:
        failed = [g["gate"] for g in sl["gates"] if not g.get("passed")]
        out.append(f"  {instant(sl['at']):%Y-%m-%d %H:%M:%S} {sl['target']} #{sl['slice_id']} "
                   f"{', '.join(json.loads(sl['partitions']))}: {sl['state']}, {sl['rows']} "
                   f"rows, {sl['elapsed_s'] or 0:.1f}s"
                   + (f"; failed: {', '.join(failed)}" if failed else ""))
    out.append(f"next: {next_action(prog)}")
    return "\n".join(out)


def render_publish(statuses: Mapping[str, PublishStatus], control_path: str) -> str:
    """One line per target, sorted by target."""
    if not statuses:
        return f"no target was ever paused (control table at {control_path})"
    return "\n".join(statuses[t].describe() for t in sorted(statuses))
