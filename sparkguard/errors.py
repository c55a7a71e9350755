"""The project's exceptions and the exit codes they map to."""

from __future__ import annotations

__all__ = [
    "EXIT_GATE_FAILED",
    "EXIT_OK",
    "EXIT_RUNTIME",
    "EXIT_USAGE",
    "ConcurrentRunError",
    "GateFailedError",
    "GuardError",
    "PlanError",
    "PlanProblem",
    "RollbackRefusedError",
    "SparkguardError",
    "TargetMovedError",
    "first_line",
]

EXIT_OK = 0
EXIT_GATE_FAILED = 1
EXIT_USAGE = 2
EXIT_RUNTIME = 3


def first_line(exc: BaseException) -> str:
    """An exception's first line (at most 300 characters), for a reason or a finding."""
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


class SparkguardError(Exception):
    """Root of every error sparkguard raises on purpose."""

    exit_code = EXIT_RUNTIME


class PlanProblem:
    """One problem in a plan: where (YAML path), what was there, and how to fix it."""

    __slots__ = ("fix", "message", "path", "value")

    def __init__(self, path: str, message: str, value: object = None, fix: str = "") -> None:
        self.path = path
        self.message = message
        self.value = value
        self.fix = fix

    def render(self, source: str) -> str:
        """One line: ``plan.yaml: backfill_plan.x.y: message (got 'v'); fix``."""
        line = f"{source}: {self.path}: {self.message}"
        if self.value is not None:
            shown = repr(self.value)
            if len(shown) > 80:
                shown = shown[:77] + "..."
            line += f" (got {shown})"
        if self.fix:
            line += f"; {self.fix}"
        return line

    def __repr__(self) -> str:
        return f"PlanProblem({self.path!r}, {self.message!r})"


class PlanError(SparkguardError):
    """Raised when a plan cannot be loaded or used: malformed, incomplete or unapproved.

    Carries every problem found, not only the first.
    """

    exit_code = EXIT_USAGE

    def __init__(self, source: str, problems: list[PlanProblem]) -> None:
        self.source = source
        self.problems = problems
        super().__init__("\n".join(p.render(source) for p in problems))


class GuardError(PlanError):
    """Raised when the guard finds blocking findings (static or live) in a plan."""


class ConcurrentRunError(SparkguardError):
    """Raised when another run holds the lock on a target, or a rollback of the plan's run
    stopped unfinished."""

    exit_code = EXIT_USAGE


class LockLostError(ConcurrentRunError):
    """Raised when this run's lock on a target was taken over while it worked (after the
    stale-lock timeout): it stops, and where it may have promoted a target whose lock it
    lost, it writes nothing more. ``keys``: the lock keys lost."""

    def __init__(self, message: str, keys: list[str] | None = None) -> None:
        super().__init__(message)
        self.keys = keys or []


class GateFailedError(SparkguardError):
    """Raised when a reconciliation gate or a promotion verification fails."""

    exit_code = EXIT_GATE_FAILED


class TargetMovedError(SparkguardError):
    """Raised when the target changed under the run in a way that makes promotion unsafe."""

    exit_code = EXIT_GATE_FAILED


class RollbackRefusedError(SparkguardError):
    """Raised when a rollback would be unsafe (later commits, vacuumed files, unknown run)."""

    exit_code = EXIT_USAGE
