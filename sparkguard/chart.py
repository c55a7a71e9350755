"""A PNG of per-partition deltas against their thresholds, drawn from an evidence dict.

One panel per target and check (row count, each metric): bars are the gate's measure (shadow
vs source of truth) per partition, the dashed line is the threshold, and grey markers on the
right axis show what the promotion changes against the current target. matplotlib is an
optional dependency (``pip install sparkguard[chart]``); without it no chart is drawn.

The figure stays at most ``_MAX_WIDTH_IN`` inches wide whatever the window's length, and past
``_LABEL_ALL`` partitions only the bars over their threshold carry a value label: a year of
daily partitions once drew a 16,700-pixel-wide image with 1,095 labels nobody could read, in
3.4 s of the run's time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from sparkguard.reconcile.verdicts import deviation, within

__all__ = ["Panel", "bar_labels", "chart_available", "chart_size", "panels", "write_chart"]

_MAX_WIDTH_IN = 18.0  # inches; 100 dpi
_LABEL_ALL = 40  # up to this many partitions every bar is labelled, beyond only breaches


@dataclass(frozen=True)
class Panel:
    """One check of one target: a delta per partition and the threshold it is held to."""

    title: str
    unit: str  # "%" or "abs"
    partitions: tuple[str, ...]
    deltas: tuple[float, ...]  # shadow vs source, in ``unit``; inf when a side is missing
    threshold: float | None  # in ``unit``; None when no gate applies
    changes_pct: tuple[float | None, ...]  # shadow vs current target, percent
    # per partition, whether the values fail the check's thresholds as a gate judges them
    # (integers and decimals exactly); None: from the float deltas
    over: tuple[bool, ...] | None = None

    @property
    def breaches(self) -> tuple[str, ...]:
        """Partitions whose delta exceeds the threshold."""
        if self.threshold is None:
            return ()
        if self.over is not None:
            return tuple(p for p, o in zip(self.partitions, self.over, strict=True) if o)
        return tuple(p for p, d in zip(self.partitions, self.deltas, strict=True)
                     if d > self.threshold + 1e-12)


def _num(value: Any) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _exact(value: Any) -> int | Decimal | float | None:
    """A measured value as the gate compared it: integers and decimals (written as text in the
    evidence) exactly, a float as a float."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int | Decimal):
        return value
    if isinstance(value, str):
        try:
            d = Decimal(value)
        except InvalidOperation:
            return _num(value)
        return d if d.is_finite() else float(d)
    return _num(value)


def _partition_stats(target: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Per-partition stats of the full window, or of the slices reconciled so far."""
    window = target.get("full_window")
    if window and window.get("partitions"):
        return list(window["partitions"])
    seen: dict[str, Mapping[str, Any]] = {}
    for sl in target.get("slices") or []:
        for stats in sl.get("partitions") or []:
            seen[str(stats["partition"])] = stats
    return [seen[k] for k in sorted(seen)]


def _threshold(check: Mapping[str, Any] | None) -> tuple[str, float | None]:
    if check is None:
        return "%", None
    pct, absolute = check.get("threshold_percent"), check.get("threshold_absolute")
    if pct is not None:
        return "%", float(pct)
    if absolute is not None:
        return "abs", float(absolute)
    return "%", 0.0  # no threshold given: only an exact match passes


def _panel(title: str, check: Mapping[str, Any] | None, stats: Sequence[Mapping[str, Any]],
           sides: Sequence[tuple[Any, Any, Any]]) -> Panel:
    unit, threshold = _threshold(check)
    deltas: list[float] = []
    over: list[bool] = []
    changes: list[float | None] = []
    pct = None if check is None else check.get("threshold_percent")
    absolute_limit = None if check is None else check.get("threshold_absolute")
    for source, shadow, target in sides:
        expected, measured = _exact(source), _exact(shadow)
        absolute, percent = deviation(expected, measured)
        deltas.append(percent if unit == "%" else absolute)
        over.append(check is not None and not within(
            expected, measured, None if pct is None else float(pct),
            None if absolute_limit is None else float(absolute_limit)))
        if _num(target) is None:
            changes.append(None)
        else:
            t_abs, t_pct = deviation(_num(target), _num(shadow))
            changes.append(math.copysign(t_pct, (_num(shadow) or 0) - (_num(target) or 0))
                           if t_abs else 0.0)
    return Panel(title, unit, tuple(str(s["partition"]) for s in stats), tuple(deltas),
                 threshold, tuple(changes), tuple(over))


def panels(evidence: Mapping[str, Any]) -> list[Panel]:
    """The chart's panels, from an evidence dict (pure; no matplotlib needed)."""
    sg = evidence["sparkguard"]
    plan = sg.get("plan") or {}
    own = {str(t.get("target")): t.get("checks") or [] for t in plan.get("target_checks") or []
           if isinstance(t, Mapping)}
    out: list[Panel] = []
    for target in sg.get("targets") or []:
        stats = _partition_stats(target)
        if not stats:
            continue
        name = target["name"]
        checks = own.get(str(name), plan.get("checks") or [])  # the checks its gates ran
        row_check = next((c for c in checks if c.get("type") == "row_count_parity"), None)
        metric_checks = {c.get("metric"): c for c in checks
                         if c.get("type") == "metric_reconciliation"}
        out.append(_panel(f"{name}: row count", row_check, stats,
                          [(s.get("rows_source"), s.get("rows_shadow"), s.get("rows_target"))
                           for s in stats]))
        metric_names = list(dict.fromkeys(m for s in stats for m in (s.get("metrics") or {})))
        for metric in metric_names:
            sides = [((s.get("metrics") or {}).get(metric, {}).get("source"),
                      (s.get("metrics") or {}).get(metric, {}).get("shadow"),
                      (s.get("metrics") or {}).get(metric, {}).get("target")) for s in stats]
            if all(v is None for side in sides for v in side):
                continue  # not measured per partition (a count_distinct checked for the window)
            out.append(_panel(f"{name}: {metric}", metric_checks.get(metric), stats, sides))
    return out


def chart_available() -> bool:
    """True when matplotlib can be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _finite(values: Sequence[float], cap: float) -> list[float]:
    return [cap if math.isinf(v) else v for v in values]


def write_chart(evidence: Mapping[str, Any], path: str | Path) -> bool:
    """Draw the panels into a PNG at ``path``; False (nothing written) without matplotlib or
    without per-partition data."""
    items = panels(evidence)
    if not items or not chart_available():
        return False
    from matplotlib.figure import Figure  # object API: no pyplot, no global backend change

    fig = Figure(figsize=chart_size(max(len(p.partitions) for p in items), len(items)),
                 layout="constrained")
    axes = fig.subplots(len(items), 1, squeeze=False)[:, 0]
    for ax, panel in zip(axes, items, strict=True):
        _draw(ax, panel)
    sg = evidence["sparkguard"]
    fig.suptitle(f"{sg['plan']['name']} run {sg['run_id']}: {sg['outcome']}", fontsize=11)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(str(path), format="png", dpi=100)
    return True


def bar_labels(panel: Panel) -> dict[int, str]:
    """Value labels by bar index: every bar up to ``_LABEL_ALL`` partitions, beyond that the
    first ``_LABEL_ALL`` bars over the threshold only."""
    suffix = "%" if panel.unit == "%" else ""
    every = len(panel.partitions) <= _LABEL_ALL
    breaches = set(panel.breaches)
    shown = [x for x, p in enumerate(panel.partitions) if every or p in breaches][:_LABEL_ALL]
    return {x: "inf" if math.isinf(panel.deltas[x]) else f"{panel.deltas[x]:.3g}{suffix}"
            for x in shown}


def chart_size(n_partitions: int, n_panels: int) -> tuple[float, float]:
    """The figure's (width, height) in inches: wider with the window, up to ``_MAX_WIDTH_IN``."""
    return min(_MAX_WIDTH_IN, max(6.0, 0.45 * n_partitions + 3)), 2.6 * n_panels


def _draw(ax: Any, panel: Panel) -> None:
    xs = list(range(len(panel.partitions)))
    finite = [d for d in panel.deltas if not math.isinf(d)]
    top = max([*finite, panel.threshold or 0.0, 1e-9])
    shown = _finite(panel.deltas, top * 1.5)
    breaches = set(panel.breaches)
    colors = ["#c0392b" if p in breaches else "#2e86c1" for p in panel.partitions]
    texts = bar_labels(panel)
    if len(xs) <= _LABEL_ALL:
        bars = ax.bar(xs, shown, color=colors, label="shadow vs source")
        ax.bar_label(bars, labels=[texts.get(x, "") for x in xs], fontsize=7, padding=2)
    else:  # one line collection, not a patch per bar
        ax.vlines(xs, 0, shown, colors=colors, linewidth=max(0.5, 600 / len(xs)),
                  label="shadow vs source")
        for x, text in texts.items():
            ax.annotate(text, (x, shown[x]), fontsize=7, ha="center", xytext=(0, 2),
                        textcoords="offset points")
    if panel.threshold is not None:
        ax.axhline(panel.threshold, color="#c0392b", linestyle="--", linewidth=1,
                   label=f"threshold {panel.threshold:g}{'%' if panel.unit == '%' else ''}")
    ax.set_ylim(0, top * 1.6)
    ax.set_ylabel("deviation %" if panel.unit == "%" else "abs deviation")
    verdict = f"{len(breaches)} partition(s) over threshold" if breaches else "within threshold"
    ax.set_title(f"{panel.title} ({verdict})", fontsize=10, loc="left")
    step = max(1, len(xs) // 30)  # at most ~30 tick labels
    ax.set_xticks(xs[::step], [panel.partitions[i] for i in xs[::step]], rotation=45,
                  ha="right", fontsize=8)
    changes = [(x, c) for x, c in zip(xs, panel.changes_pct, strict=True)
               if c is not None and not math.isinf(c)]
    if changes:
        right = ax.twinx()
        right.plot([x for x, _ in changes], [c for _, c in changes], "x", color="#7f8c8d",
                   label="change vs current target %")
        right.axhline(0, color="#bdc3c7", linewidth=0.5)
        right.set_ylabel("vs target %", color="#7f8c8d")
        lines, labels = ax.get_legend_handles_labels()
        more, more_labels = right.get_legend_handles_labels()
        ax.legend(lines + more, labels + more_labels, fontsize=7, loc="upper right")
    else:
        ax.legend(fontsize=7, loc="upper right")
