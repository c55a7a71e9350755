"""The evidence as a reviewer's one-page Markdown summary (``<run id>.md``, ``sparkguard
report``), rendered from the evidence dict that :mod:`sparkguard.evidence` builds."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["render_markdown"]

_MAX_PARTITION_ROWS = 100


def left_unfinished(target: Any) -> str:
    """Where an abandoned rollback left one target, in words (its evidence entry's)."""
    if target.get("restored_version") is None:
        return f"not restored by this rollback; version now {target['current_version']}"
    return (f"this rollback's RESTORE to version {target.get('restored_to', '?')} committed as "
            f"version {target['restored_version']}, not verified; version now "
            f"{target['current_version']}")


def _line(value: Any) -> str:
    """A value on one line (a newline in a partition value or an actor cannot start a line of
    its own that reads as the summary's)."""
    return " ".join(str(value).split())


def _cell(value: Any) -> str:
    """A value as a Markdown table cell (pipes escaped, one line)."""
    return _line(value).replace("|", "\\|")


def _code(text: Any) -> str:
    """Inline code that survives backquotes inside (``RESTORE TABLE delta.`/p` ...``)."""
    text = str(text)
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def _yes(flag: Any) -> str:
    return "yes" if flag else "no"


def _measured(value: Any) -> str:
    if isinstance(value, dict) and "nan_or_infinite_rows" in value:
        rows = ", ".join(f"{k} {v}" for k, v in value["nan_or_infinite_rows"].items())
        return f"{value['value']} (NaN or infinite input rows: {rows})"
    if isinstance(value, dict) and "overflowed_groups" in value:
        groups = ", ".join(f"{k} {v}" for k, v in value["overflowed_groups"].items())
        return f"{value['value']} (decimal sum overflowed, groups: {groups})"
    if isinstance(value, dict) and isinstance(value.get("value"), dict):  # NaN/+inf/-inf rows
        return ", ".join(f"{k} {v}" for k, v in value["value"].items())
    if isinstance(value, dict) and "value" in value:
        pct = value.get("pct_diff")
        return f"{value['value']} (diff {value.get('abs_diff')}, {pct}%)"
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items())
    return str(value)


def _pct(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "n/a"
    if math.isinf(value):
        return "-inf" if value < 0 and signed else "inf"
    if value == 0:
        return "0%"
    return f"{value:+.3g}%" if signed else f"{value:.3g}%"


def _window_text(column: str, partitions: list[str], window: dict[str, Any] | None = None
                 ) -> str:
    shown = partitions if len(partitions) <= 8 else [*partitions[:3], "...", *partitions[-2:]]
    if window and window.get("range"):
        lo, hi = window["range"]
        return (f"`{column}` in [{lo}, {hi}) ({len(partitions)} {window['bucket']} bucket(s): "
                f"{', '.join(shown)})")
    return f"`{column}` in {', '.join(shown)} ({len(partitions)} partition(s))"



def _summary(data: dict[str, Any]) -> list[str]:
    sg, rg = data["sparkguard"], data["release_gate_evidence"]
    approvals = "; ".join(f"{a['role']} by {a['by']} at {a['at']}" for a in sg["approvals_used"])
    rows = [
        ("Run", f"`{sg['run_id']}`"),
        ("Plan", f"`{sg['plan']['path']}` (fingerprint `{sg['plan']['fingerprint'][:16]}`)"),
        ("Reason", sg["plan"].get("reason")),
        ("Owner", rg["owner"]),
        ("Environment", rg["environment"]),
        ("Source of truth", f"`{sg['source']['dataset']}` read at version "
                            f"{sg['source']['version_read']}"),
        ("Window", _window_text(sg["window"]["partition_column"], sg["window"]["partitions"],
                                sg["window"])),
        ("Approvals", approvals or "none"),
        ("Written at", sg["written_at"]),
    ]
    return ["| | |", "|---|---|", *(f"| {k} | {_cell(v)} |" for k, v in rows)]


def _release_gate(rg: dict[str, Any]) -> list[str]:
    rec, sv = rg["reconciliation"], rg["staged_validation"]
    rows = [
        ("Shadow run", sv["shadow_run"]),
        ("Proof (canary) scope", sv.get("canary_scope")),
        ("Row count parity", rec["row_count_status"]),
        ("Metric parity", f"{rec['metric_parity_status']} "
                          f"({', '.join(rec['checked_metrics']) or 'no metric'})"),
        ("Approvals required / granted", f"{', '.join(rg['approvals']['required'])} / "
                                         f"{', '.join(rg['approvals']['granted']) or 'none'}"),
        ("Cutover", rg["publish_control"]["cutover_strategy"]),
        ("Rollback strategy", rg["rollback"]["strategy"]),
    ]
    return ["## Release gate", "", "| check | status |", "|---|---|",
            *(f"| {k} | {_cell(v)} |" for k, v in rows)]


def _partition_table(data: dict[str, Any], target: dict[str, Any]) -> list[str]:
    from sparkguard.chart import panels

    mine = panels({"sparkguard": {**data["sparkguard"], "targets": [target]}})
    if not mine:
        return []
    rows_panel, metric_panels = mine[0], mine[1:]
    metrics = [p.title.split(": ", 1)[1] for p in metric_panels]
    head = ["partition", "rows source / shadow / target", "rows vs source",
            *(f"{m} vs source" for m in metrics),
            *(f"{m}: target -> after promotion" for m in metrics)]
    stats = {str(s["partition"]): s for s in _stats_of(target)}
    lines = ["", "Per partition: the gate's measure (shadow vs source of truth) and how each "
             "metric moves when the promotion replaces the current target (the drift).", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, part in enumerate(rows_panel.partitions[:_MAX_PARTITION_ROWS]):
        s = stats[part]
        cells = [part, f"{s.get('rows_source')} / {s.get('rows_shadow')} / {s.get('rows_target')}",
                 _flagged(rows_panel, i),
                 *(_flagged(p, i) for p in metric_panels),
                 *(_move(s, m, p.changes_pct[i]) for m, p in zip(metrics, metric_panels,
                                                                  strict=True))]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    if len(rows_panel.partitions) > _MAX_PARTITION_ROWS:
        lines.append(f"\n{len(rows_panel.partitions) - _MAX_PARTITION_ROWS} more partition(s) "
                     "in the YAML.")
    return lines


def _move(stats: dict[str, Any], metric: str, pct: float | None) -> str:
    """A metric's drift in one partition: ``before -> after (+x%)``."""
    values = (stats.get("metrics") or {}).get(metric) or {}
    return f"{values.get('target')} -> {values.get('shadow')} ({_pct(pct, signed=True)})"


def _stats_of(target: dict[str, Any]) -> list[dict[str, Any]]:
    window = target.get("full_window")
    if window and window.get("partitions"):
        return list(window["partitions"])
    return [s for sl in target.get("slices") or [] for s in sl.get("partitions") or []]


def _flagged(panel: Any, i: int) -> str:
    delta = panel.deltas[i]
    text = _pct(delta) if panel.unit == "%" else f"{delta:g}"
    return f"**{text}**" if panel.partitions[i] in panel.breaches else text


def _applied_text(promotion: str, a: dict[str, Any], done: bool) -> str:
    """One sentence: what the promotion commit does, as its change data feed reports it."""
    kept = (f", {a['kept']} kept (no longer produced; merge.when_not_matched_by_source: keep)"
            if a["kept"] else "")
    same = (f"; {a['unchanged_reported_as_changed']} unchanged row(s) rewritten as well and "
            "reported as changes by a change data feed" if a["unchanged_reported_as_changed"]
            else "; unchanged rows neither updated nor reported as changes")
    head = f"Promotion ({promotion})" + ("" if done else ", had it happened")
    return (f"{head}: {a['inserted']} inserted, {a['deleted']} deleted"
            f"{kept}, {a['updated']} updated{same}.")


def _target(data: dict[str, Any], t: dict[str, Any]) -> list[str]:
    rb = t["rollback_point"]
    lines = ["", f"## Target {_code(t['dataset'])} ({t['promotion']})", ""]
    if t["promoted_version"] is not None:
        lines.append(f"- Promoted at version {t['promoted_version']}; verified: "
                     f"{_yes(t['verified'])}; restored after a failure: "
                     f"{_yes(t['restored_after_failure'])}")
    else:
        lines.append("- Not promoted: the target was left as it was")
    tc = next((x for x in data["sparkguard"]["plan"].get("target_checks") or []
               if x["target"] == t["name"]), None)
    if tc is not None:
        ref = tc["reference"]
        against = ("the source of truth" if not ref else
                   f"its reference {_code(' '.join(str(ref.get('sql') or ref.get('callable')).split()))}")
        which = "its own" if tc["own_checks"] else "the plan's"
        names = ", ".join(c.get("metric") or c["type"] for c in tc["checks"])
        lines.append(f"- Checks: {which} ({_cell(names)}), against {against}")
    if rb.get("version_before_promotion") is not None:
        lines.append(f"- Rollback point: version {rb['version_before_promotion']}")
    if rb.get("rollback_command"):
        lines.append(f"- Roll back: {_code(rb['rollback_command'])}")
    if rb.get("restore_statement"):
        lines.append(f"- Or in SQL: {_code(rb['restore_statement'])}")
    slices = t.get("slices") or []
    skipped = t.get("skipped_slices_already_reconciled") or []
    lines.append(f"- Slices reconciled in this run: {len(slices)}"
                 + (f"; skipped as already reconciled: {skipped}" if skipped else ""))
    failed_slices = [s["scope"] for s in slices if not s["passed"]]
    if failed_slices:
        lines.append(f"- Slices that failed their gates: {_line(', '.join(failed_slices))}")
    w = t.get("full_window")
    if w:
        lines += ["", "| gate | measured | expected | threshold | result |", "|---|---|---|---|---|"]
        for g in w["gates"]:
            where = f" [{g['partition']}]" if g.get("partition") else ""
            lines.append(f"| {_cell(g['gate'] + where)} | {_cell(_measured(g['measured']))} | "
                         f"{_cell(g.get('expected'))} | {_cell(g['threshold'])} | "
                         f"{'pass' if g['passed'] else '**FAIL**'} |")
        pv = w.get("change_preview")
        applied = t.get("change_applied")
        if pv:
            gone = (f"{applied['deleted'] if applied else pv['deleted']} deleted"
                    if not applied or not applied["kept"] else
                    f"{applied['kept']} no longer produced, kept")
            moved = (f" ({pv['moved']} of the keys inserted and deleted moved to another "
                     "partition of the window; the MERGE updates them)" if pv.get("moved") else "")
            lines += ["", f"Change preview: {pv['inserted']} inserted, {gone}, "
                          f"{pv['changed']} changed, {pv['unchanged']} unchanged{moved}."]
            cols = {k: v for k, v in pv["changed_by_column"].items() if v}
            if cols:
                lines.append("Changed values per column: "
                             + ", ".join(f"{k}={v}" for k, v in sorted(cols.items())) + ".")
        if applied:
            lines.append(_applied_text(t["promotion"], applied,
                                       t["promoted_version"] is not None))
    lines += _partition_table(data, t)
    return lines


def render_markdown(data: dict[str, Any]) -> str:
    """A reviewer's one-page summary of the evidence."""
    sg, rg = data["sparkguard"], data["release_gate_evidence"]
    lines = [f"# Backfill evidence: {sg['plan']['name']}", "",
             f"**Outcome: {sg['outcome']}.** Ready to ship: "
             f"{_yes(rg['decision']['ready_to_ship'])}; publish unblocked: "
             f"{_yes(rg['publish_control']['publish_unblocked'])}.", ""]
    if sg.get("error"):
        lines += [f"> {_cell(sg['error'])}", ""]
    for target, holds in ((sg.get("publish") or {}).get("still_paused_by_others") or {}).items():
        lines += [f"Publish of `{_line(target)}` stays paused after this run: "
                  f"{_line('; '.join(holds))}.", ""]
    lines += _summary(data)
    if sg.get("failed_gates"):
        lines += ["", "## Failed gates", ""]
        lines += [f"- `{g['target']}` **{_line(g['gate'])}**"
                  + (f" [{_line(g['partition'])}]" if g.get("partition") else "")
                  + (f" ({_line(g['scope'])})" if g.get("scope") else "")
                  + f": {_line(g['reason'])}" for g in sg["failed_gates"]]
    for t in sg["targets"]:
        lines += _target(data, t)
    for rb in sg.get("rollbacks") or []:
        if rb.get("abandoned") is not None:
            lines += ["", f"## Rollback abandoned at {_line(rb['at'])} by {_line(rb['by'])}", "",
                      f"Reason: {_line(rb['abandoned'])}", ""]
            lines += [f"- {_code(r['dataset'])}: {_line(left_unfinished(r))}"
                      for r in rb.get("targets") or []]
            continue
        lines += ["", f"## Rolled back at {_line(rb['at'])} by {_line(rb['by'])}"
                      f"{' (forced)' if rb.get('forced') else ''}", ""]
        lines += [f"- {_code(r['dataset'])}: restored to version {r['rollback_version']} (new "
                  f"version {r['new_version']}); verified: {r['verified']}"
                  for r in rb.get("targets") or []]
    if sg.get("chart"):
        lines += ["", "## Per-partition deltas against thresholds", "",
                  f"![per-partition row-count and metric deltas]({sg['chart']})"]
    lines += ["", *_release_gate(rg)]
    return "\n".join(lines) + "\n"
