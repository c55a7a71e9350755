"""Reconciliation results as frozen dataclasses, plus the pure verdict arithmetic."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from decimal import Context, Decimal
from typing import Any, TypeGuard

__all__ = [
    "EXACT",
    "FLOAT_PERCENT_SLACK",
    "NONFINITE_KINDS",
    "ChangePreview",
    "GateResult",
    "PartitionStats",
    "ReconcileResult",
    "deviation",
    "exact_add",
    "fold_partial",
    "judge",
    "within",
]

# Spark decimals have up to 38 digits and their sums over a window a few more; Python's default
# context keeps 28 and would round them
EXACT = Context(prec=120)
Number = float | int | Decimal
# a float metric's input rows counted per kind: a +inf that became -inf or NaN is a change
NONFINITE_KINDS = ("nan", "posinf", "neginf")


def exact_add(a: Any, b: Any) -> Any:
    """``a + b``; a decimal plus a decimal or an integer without rounding (Python's default
    context stops at 28 digits)."""
    if isinstance(a, Decimal | int) and isinstance(b, Decimal | int) \
            and (isinstance(a, Decimal) or isinstance(b, Decimal)):
        return EXACT.add(Decimal(a), Decimal(b))
    return a + b


def fold_partial(how: str, a: Any, b: Any) -> Any:
    """Two partial values of one aggregate folded (``how``: ``sum``, ``min`` or ``max``); a
    null partial is empty."""
    if a is None or b is None:
        return b if a is None else a
    if how == "max":
        return max(a, b)
    if how == "min":
        return min(a, b)
    return exact_add(a, b)


def _exact_deviation(expected: int | Decimal, measured: int | Decimal) -> tuple[Decimal, Decimal]:
    """Absolute and percent deviation of two integers or decimals, without rounding (percent
    to 120 digits; ``Infinity`` against 0)."""
    diff = EXACT.abs(EXACT.subtract(Decimal(measured), Decimal(expected)))
    if diff == 0:
        return Decimal(0), Decimal(0)
    if expected == 0:
        return diff, Decimal("Infinity")
    return diff, EXACT.multiply(EXACT.divide(diff, EXACT.abs(Decimal(expected))), 100)


def _exact(v: Any) -> TypeGuard[int | Decimal]:
    return isinstance(v, int | Decimal) and not isinstance(v, bool)


def deviation(expected: Number | None, measured: Number | None) -> tuple[float, float]:
    """Absolute and percent deviation of ``measured`` from ``expected``.

    Percent is relative to ``|expected|``; 0 vs 0 is 0 %, anything vs 0 is infinite.
    A null on exactly one side is an infinite deviation; nulls on both sides are equal. A NaN or
    infinite value on either side is an infinite deviation, equal or not: such a total hides
    every other difference, so it never passes a threshold.
    Integers and decimals are subtracted exactly before the result becomes a float, so one cent
    on a 20-digit total is still a deviation.
    """
    if expected is None and measured is None:
        return 0.0, 0.0
    if expected is None or measured is None:
        return math.inf, math.inf
    if _exact(expected) and _exact(measured):
        exact_abs, exact_pct = _exact_deviation(expected, measured)
        return float(exact_abs), float(exact_pct)
    e, m = float(expected), float(measured)
    if not (math.isfinite(e) and math.isfinite(m)):
        return math.inf, math.inf
    absolute = abs(m - e)
    if absolute == 0:
        return 0.0, 0.0
    if e == 0:
        return absolute, math.inf
    return absolute, absolute / abs(e) * 100.0


# Float values only: a percent may exceed its threshold by this many percentage points (1e-14
# relative, some 45 units in the last place of a double), the rounding of the float values and
# of the percent's own division. Integers and decimals get no slack.
FLOAT_PERCENT_SLACK = 1e-12


def _limit(threshold: float) -> Decimal:
    """A threshold as written in the plan (``0.1`` is 0.1, not the nearest double)."""
    return Decimal(repr(float(threshold)))


def judge(absolute: float | Decimal, percent: float | Decimal, threshold_percent: float | None,
          threshold_absolute: float | None, *, expected_zero: bool = False) -> bool:
    """Pass when every threshold given holds; with no threshold, only an exact match passes.

    Decimal deviations (from integers and decimals) are held to the thresholds exactly; float
    ones get :data:`FLOAT_PERCENT_SLACK` on the percent. ``expected_zero``: the reference value
    is 0, so a percent is not defined; when an absolute threshold is given it alone decides.
    """
    if threshold_percent is None and threshold_absolute is None:
        return absolute == 0
    exact = isinstance(absolute, Decimal)
    if threshold_absolute is not None:
        limit: float | Decimal = _limit(threshold_absolute) if exact else threshold_absolute
        if not absolute <= limit:
            return False
        if expected_zero:
            return True
    if threshold_percent is not None:
        if isinstance(percent, Decimal):
            return percent <= _limit(threshold_percent)
        return percent <= threshold_percent + FLOAT_PERCENT_SLACK
    return True


def within(expected: Number | None, measured: Number | None, threshold_percent: float | None,
           threshold_absolute: float | None) -> bool:
    """Whether ``measured`` is within the thresholds of ``expected`` (see :func:`judge`);
    integers and decimals are compared without rounding."""
    zero = expected is not None and expected == 0
    if _exact(expected) and _exact(measured):
        absolute, percent = _exact_deviation(expected, measured)
        return judge(absolute, percent, threshold_percent, threshold_absolute, expected_zero=zero)
    absolute_f, percent_f = deviation(expected, measured)
    return judge(absolute_f, percent_f, threshold_percent, threshold_absolute, expected_zero=zero)


def _clean(value: Any) -> Any:
    if isinstance(value, float) and (math.isinf(value) or math.isnan(value)):
        return str(value)
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if type(value).__name__ == "Decimal":
        return str(value)
    return value


@dataclass(frozen=True)
class GateResult:
    """One gate's verdict: what was measured against which threshold, and why it passed or not."""

    gate: str
    check_type: str
    passed: bool
    measured: Any
    threshold: Any
    reason: str
    partition: str | None = None
    expected: Any = None
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return _clean(asdict(self))


@dataclass(frozen=True)
class PartitionStats:
    """Row counts, duplicates, nulls and metric values for one partition, per side."""

    partition: str
    rows_source: int
    rows_shadow: int
    rows_target: int
    duplicate_keys_shadow: int
    duplicate_keys_source: int
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)
    nulls: dict[str, int] = field(default_factory=dict)
    changes: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return _clean(asdict(self))


@dataclass(frozen=True)
class ChangePreview:
    """What promoting the shadow would do to the target's window, counted in business keys.

    ``inserted``: keys only in the shadow; ``deleted``: keys only in the target; ``changed`` and
    ``unchanged``: keys with exactly one row on each side, whose compared values differ or not;
    ``ambiguous``: keys on both sides with more than one row on either (rows cannot be paired;
    the duplicate gate reports them). ``changed_by_column`` counts changed keys per column;
    ``not_compared`` lists columns missing on one side or typed differently. ``moved`` (MERGE
    promotions only): keys the shadow holds in another partition of the window than the target,
    each counted once in ``inserted`` and once in ``deleted``; the MERGE updates them.
    """

    inserted: int
    deleted: int
    changed: int
    unchanged: int
    changed_by_column: dict[str, int]
    sample: tuple[dict[str, Any], ...] = ()
    not_compared: tuple[str, ...] = ()
    ambiguous: int = 0
    moved: int = 0

    def to_dict(self) -> dict[str, Any]:
        return _clean(asdict(self))


@dataclass(frozen=True)
class ReconcileResult:
    """Every gate of one reconciliation (a slice or the whole window)."""

    scope: str
    partitions: tuple[PartitionStats, ...]
    gates: tuple[GateResult, ...]
    preview: ChangePreview | None = None
    duplicate_sample: tuple[dict[str, Any], ...] = ()

    @property
    def passed(self) -> bool:
        return all(g.passed for g in self.gates)

    @property
    def failed(self) -> tuple[GateResult, ...]:
        return tuple(g for g in self.gates if not g.passed)

    def totals(self) -> dict[str, int]:
        return {
            "rows_source": sum(p.rows_source for p in self.partitions),
            "rows_shadow": sum(p.rows_shadow for p in self.partitions),
            "rows_target": sum(p.rows_target for p in self.partitions),
            "duplicate_keys_shadow": sum(p.duplicate_keys_shadow for p in self.partitions),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "scope": self.scope,
            "passed": self.passed,
            "totals": self.totals(),
            "gates": [g.to_dict() for g in self.gates],
            "partitions": [p.to_dict() for p in self.partitions],
            "change_preview": self.preview.to_dict() if self.preview else None,
            "duplicate_sample": _clean(list(self.duplicate_sample)),
        }
