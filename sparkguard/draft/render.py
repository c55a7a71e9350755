"""Render a drafted plan as commented YAML (pure: no Spark).

The comments say what was inferred and from what, so a reviewer can judge the draft; fields
that only a person can fill are left empty (the guard names each of them).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from sparkguard.draft.decide import FLOAT_TOLERANCE_PERCENT, Column, KeyEvidence, Layout, Measure
from sparkguard.sql import PartitionType

__all__ = ["Draft", "render_draft"]


@dataclass
class Draft:
    """Everything ``plan init`` inferred, ready to render."""

    name: str
    owner: str | None
    reason: str | None
    source: str
    target: str
    label: str
    start: dt.datetime
    end: dt.datetime
    window_column: str
    window_type: PartitionType
    day_format: str | None
    partitions: list[object]
    layout: Layout
    source_layout: Layout
    source_rows: dict[str, int]
    target_rows: dict[str, int]
    target_columns: list[Column]
    keys: tuple[str, ...]
    evidence: list[KeyEvidence]
    untried: list[str]
    not_null: list[str]
    measures: list[Measure]
    transform_sql: str | None = None
    transform_callable: str | None = None
    transform_given: bool = False
    transform_notes: list[str] = field(default_factory=list)
    contract_skipped: list[str] = field(default_factory=list)
    names_skipped: list[str] = field(default_factory=list)  # not plain: no key, contract, measure
    identity_columns: tuple[str, ...] = ()  # the target's, left out of everything above


def _scalar(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000, allow_unicode=False,
                          sort_keys=False)
    return text.removesuffix("\n").removesuffix("\n...").strip()


def _comment(lines: list[str], indent: int, text: str) -> None:
    pad = " " * indent
    for line in text.splitlines() or [""]:
        lines.append(f"{pad}# {line}".rstrip())


def _block(lines: list[str], indent: int, key: str, text: str) -> None:
    """A multi-line string as a literal block when it is plain, else a quoted scalar."""
    body = text if text.endswith("\n") else text + "\n"
    # split at newlines only: str.splitlines also splits at \x0b, \x1c, U+2028, ..., which a
    # literal block would then give back as newlines (isprintable refuses them in a line)
    rows = body.split("\n")[:-1]
    plain = all(line == line.rstrip() and line.isprintable() for line in rows) \
        and body.strip() and body[:1] not in (" ", "\n")
    if not plain:
        lines.append(f"{' ' * indent}{key}: {_scalar(text)}")
        return
    lines.append(f"{' ' * indent}{key}: |{'' if text.endswith(chr(10)) else '-'}")
    lines += [f"{' ' * (indent + 2)}{line}" if line else "" for line in rows]


def _iso(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _few(items: Sequence[object], n: int = 8) -> str:
    shown = ", ".join(str(i) for i in items[:n])
    return shown + (f", ... ({len(items) - n} more)" if len(items) > n else "")


def render_draft(d: Draft) -> str:
    """The draft plan as YAML text with comments (loads with :func:`sparkguard.plan.load_plan`)."""
    L: list[str] = []
    c = _comment
    c(L, 0, f"Draft written by `sparkguard plan init` from the live tables (target {d.target},\n"
            f"source {d.source}). It is a draft, not an approval: review every inferred value,\n"
            "fill in the empty fields, then run `sparkguard guard PLAN --pre-approval`, which\n"
            "names each field still to fill. Field reference: templates/backfill-plan.yaml.")
    L.append("backfill_plan:")
    L.append(f"  name: {_scalar(d.name)}")
    c(L, 2, "FILL IN: who is accountable (a person or team address)." if not d.owner
          else "Who is accountable.")
    L.append(f"  owner: {_scalar(d.owner) if d.owner else ''}".rstrip())
    c(L, 2, "FILL IN: why the backfill is needed." if not d.reason else "Why the backfill is needed.")
    L.append(f"  reason: {_scalar(d.reason) if d.reason else ''}".rstrip())
    L.append("")
    days = len(d.partitions)
    c(L, 2, f"Window [{_iso(d.start)}, {_iso(d.end)}): end exclusive, {days} partition(s) of "
            f"{d.window_column}.\nRows in the window: target {sum(d.target_rows.values()):,}, "
            f"source {sum(d.source_rows.values()):,}.")
    empty = [str(p) for p in d.partitions if not d.target_rows.get(str(p))]
    if empty:
        c(L, 2, f"The target has no rows in {len(empty)} window partition(s): {_few(empty)} "
                "(the backfill fills them).")
    L.append("  affected_window:")
    L.append(f"    start_utc: {_scalar(_iso(d.start))}")
    L.append(f"    end_utc: {_scalar(_iso(d.end))}")
    L.append("    partitions:")
    for p in d.partitions:
        value = p.isoformat() if isinstance(p, dt.date) else p
        L.append(f"      - {_scalar(f'{d.window_column}={value}')}")
    L.append(f"    max_partitions: {max(31, days)}")
    L.append("")
    c(L, 2, f"Detected from the target: {d.layout.describe()}.")
    if d.day_format:
        c(L, 2, f"Partition values write a day as {d.day_format!r}.")
    if d.source_layout.partition_columns != d.layout.partition_columns:
        c(L, 2, f"The source is {d.source_layout.describe()}.")
    L.append("  partitioning:")
    L.append(f"    column: {_scalar(d.window_column)}")
    L.append(f"    type: {d.window_type.value}")
    L.append("")
    L.append("  source_of_truth:")
    L.append("    system: delta")
    L.append(f"    dataset: {_scalar(d.source)}")
    L.append("")
    L.append("  targets:")
    L.append(f"    - dataset: {_scalar(d.target)}")
    L.append(f"      name: {_scalar(d.label)}")
    _keys(L, d)
    L.append("      transform:")
    for note in d.transform_notes:
        c(L, 8, note)
    if d.transform_sql is not None:
        _block(L, 8, "sql", d.transform_sql)
    else:
        L.append(f"        callable: {_scalar(d.transform_callable)}")
    if d.identity_columns:
        c(L, 6, f"The target generates {', '.join(d.identity_columns)} (identity), left out of "
                "the transform and the contract: a MERGE on the business key keeps the value of "
                "every key the target holds and Delta generates one for each new key "
                "(replace_where would give every row of the window a new one).")
        L.append("      promotion: merge_changed")
    else:
        c(L, 6, "replace_where swaps exactly the window's partitions in one Delta commit.")
        L.append("      promotion: replace_where")
    L.append("      contract:")
    c(L, 8, "The recomputed rows must have exactly the target's columns and types.")
    L.append("        match_target_schema: true")
    c(L, 8, "Columns with no null in the window today (observed, not declared).")
    L.append(f"        not_null: {_scalar(d.not_null)}")
    c(L, 8, "The target's schema: names, Spark SQL types and declared nullability.")
    for skipped in d.contract_skipped:
        c(L, 8, f"Left out (its type cannot be written in a contract): {skipped}")
    if d.names_skipped:
        c(L, 8, f"Left out (a plan's fields take plain names; the transform recomputes them "
                f"and match_target_schema compares them): {', '.join(d.names_skipped)}")
    if d.target_columns:
        L.append("        columns:")
        for col in d.target_columns:
            L.append(f"          - {_scalar({'name': col.name, 'type': col.type, 'nullable': col.nullable})}")
    else:
        L.append("        columns: []")
    L.append("")
    L.append("  execution:")
    L.append("    mode: replay")
    L.append("    idempotent: true")
    strategy = ("MERGE of the changed rows on the business key, one Delta commit"
                if d.identity_columns else "replaceWhere over the window partitions, one Delta commit")
    L.append(f"    write_strategy: {_scalar(strategy)}")
    L.append("    dry_run_completed: false")
    L.append("    proof_slice: true")
    L.append("")
    L.append("  safeguards:")
    L.append("    publish_paused: true")
    c(L, 4, "FILL IN: the downstream owners to tell about the pause and the promotion.")
    L.append("    downstream_notifications: []")
    rollback = ("RESTORE the target to the version recorded before promotion "
                "(sparkguard rollback --plan PLAN --run-id RUN).")
    L.append(f"    rollback_strategy: {_scalar(rollback)}")
    L.append("")
    _checks(L, d)
    L.append("")
    L.append("  approvals:")
    c(L, 4, "FILL IN: the roles that must each approve this exact plan (sparkguard approve).\n"
            "plan init never approves anything.")
    L.append("    required: []")
    L.append("    owner_may_self_approve: false")
    L.append("")
    L.append("  status:")
    L.append("    state: draft")
    return "\n".join(L) + "\n"


def _keys(L: list[str], d: Draft) -> None:
    c = _comment
    c(L, 6, "Business key: the first candidate found exact in the window of the target (no\n"
            f"null, no duplicate {'across the window' if d.identity_columns else 'within a partition'}"
            "), counted by aggregate queries:")
    for ev in d.evidence:
        c(L, 6, f"  {ev.describe()}")
    if d.untried:
        c(L, 6, f"Not tried (a key was found first): {_few(d.untried)}")
    L.append(f"      business_keys: {_scalar(list(d.keys))}")


def _key_expr(keys: Sequence[str]) -> str:
    return keys[0] if len(keys) == 1 else f"struct({', '.join(keys)})"


def _checks(L: list[str], d: Draft) -> None:
    c = _comment
    L.append("  validation:")
    c(L, 4, "Thresholds: 0 (exact) for row counts, keys and sums of integer/decimal columns;\n"
            f"{FLOAT_TOLERANCE_PERCENT} percent (a relative 1e-6) for sums of float/double "
            "columns, whose last\nbits depend on the order Spark adds them in.")
    L.append("    checks:")
    rows = {"type": "row_count_parity", "threshold_percent": 0.0, "per_partition": True}
    L.append(f"      - {_scalar(rows)}")
    L.append(f"      - {_scalar({'type': 'duplicate_check', 'key_columns': list(d.keys)})}")
    key = _key_expr(d.keys)
    distinct = {"type": "metric_reconciliation", "metric": "distinct_keys",
                "aggregation": "count_distinct", "source_expr": key, "shadow_expr": key,
                "threshold_percent": 0.0}
    L.append(f"      - {_scalar(distinct)}")
    for m in d.measures:
        item: dict[str, Any] = {"type": "metric_reconciliation", "metric": f"sum_{m.column}",
                                "aggregation": "sum"}
        if m.has_nan:
            c(L, 6, f"{m.column} holds NaN or an infinity in the window (target or source): "
                    "nan: exclude sums\nthe finite values and compares the NaN/infinite row "
                    "counts per side separately.")
            item["nan"] = "exclude"
        if m.source_expr is None:
            c(L, 6, f"FILL IN source_expr: the source has no column {m.column}; write the "
                    "expression over\nsource columns that sums to the same total.")
        elif d.transform_given:
            c(L, 6, f"Assumes the transform keeps {m.column} as the source has it; edit "
                    "source_expr if not.")
        item["source_expr"] = m.source_expr
        item["shadow_expr"] = m.column
        item["threshold_percent"] = m.threshold_percent
        L.append(f"      - {_scalar(item)}")
