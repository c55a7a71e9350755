"""What a run knows: a frozen context (inputs) and a mutable state (progress).

Stage handlers receive both explicitly; nothing else is shared between them. The typed
:class:`sparkguard.run.report.RunReport` is built from the two for the evidence and the CLI.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import DataType

from sparkguard.delta_ops import WriteChecks
from sparkguard.errors import LockLostError
from sparkguard.ledger import Ledger, PlanHistory, RunProgress
from sparkguard.ledger_model import lost_lock_text
from sparkguard.notify import Notifier, send_all
from sparkguard.plan.model import BackfillPlan, Promotion, TargetSpec
from sparkguard.plan.window_spec import RangeWindow
from sparkguard.publish import PublishControl
from sparkguard.reconcile.verdicts import GateResult, ReconcileResult
from sparkguard.run.stages import RunOptions
from sparkguard.sql import PartitionType, TableRef, window_predicate

__all__ = ["RunContext", "RunState", "TargetState", "Window", "fence", "notify", "record"]


@dataclass(frozen=True)
class Window:
    """The window's partition column, its typed partitions and their slicing."""

    column: str
    type: PartitionType
    partitions: tuple[object, ...]
    slices: tuple[tuple[object, ...], ...]
    waves: tuple[tuple[int, ...], ...]  # slice indexes after the proof (0-based)
    rows: Mapping[str, int] | None = None  # source rows per partition (live guard)
    range: RangeWindow | None = None  # a window_column window: partitions are bucket labels

    def pred(self, partitions: Sequence[object], alias: str | None = None) -> str:
        if self.range is not None:
            return self.range.predicate(list(partitions), alias)
        return window_predicate(self.column, self.type, list(partitions), alias)

    @property
    def partition_by(self) -> tuple[str, ...]:
        """Partition columns of the shadow tables."""
        return self.range.partition_by if self.range is not None else (self.column,)


@dataclass
class TargetState:
    """What the run knows about one target as it goes."""

    spec: TargetSpec
    ref: TableRef
    shadow: TableRef
    proof_hash: dict[str, int] | None = None
    slice_results: list[ReconcileResult] = field(default_factory=list)
    schema_gates: list[GateResult] = field(default_factory=list)
    window: ReconcileResult | None = None
    start_version: int | None = None  # target version when the run took its lock
    reconciled_version: int | None = None
    rollback_version: int | None = None
    checked_version: int | None = None  # the version the promotion attempt checked
    promoted_version: int | None = None
    verified: bool = False
    restored: bool = False
    changed_after_promotion: bool = False  # others undid or overwrote it: left as they left it
    skipped_slices: list[int] = field(default_factory=list)
    pending_wave: tuple[int, tuple[object, ...]] | None = None  # written, gated with the window
    txn_version: int = 1  # Delta txnVersion of the next promotion attempt
    notes: list[str] = field(default_factory=list)
    # read once per run: the target's CHAR(n) columns, its CHECK constraints and generated
    # columns, the types of the latter, and its column names by their lower case (identity
    # columns, which the recomputation must leave out, excepted: a gate names them as output)
    char_lengths: dict[str, int] | None = None
    column_names: dict[str, str] = field(default_factory=dict)
    write_checks: WriteChecks | None = None
    generated_types: dict[str, DataType] = field(default_factory=dict)

    @property
    def baseline_version(self) -> int | None:
        """The version the window is known unchanged since: the lock, else reconciliation.

        Since the lock, not only since reconciliation: rows written into the window before
        reconciliation would otherwise be replaced without a word.
        """
        return self.start_version if self.start_version is not None else self.reconciled_version

    @property
    def deletes_unmatched(self) -> bool:
        """Rows the recomputation no longer produces leave the target on promotion."""
        return (self.spec.promotion is Promotion.REPLACE_WHERE
                or self.spec.merge.when_not_matched_by_source == "delete")


@dataclass(frozen=True)
class RunContext:
    """The inputs of a run; fixed once it starts."""

    spark: SparkSession
    plan: BackfillPlan
    plan_path: str
    fingerprint: str
    window: Window
    home: str
    evidence_dir: str
    options: RunOptions
    console: Callable[[str], None]
    notifiers: tuple[Notifier, ...]
    ledger: Ledger
    publish: PublishControl
    source: TableRef
    t0: float

    def elapsed(self) -> float:
        return round(time.monotonic() - self.t0, 3)

    def say(self, msg: str) -> None:
        self.console(f"[{self.elapsed():7.1f}s] {msg}")


@dataclass
class RunState:
    """What a run has done so far: run id, versions read and written, per-target state."""

    targets: dict[str, TargetState]
    run_id: str = ""
    source_version: int | None = None
    source_df: DataFrame | None = None  # the pinned source snapshot, built once
    history: PlanHistory | None = None
    resumed: RunProgress | None = None
    holds_locks: bool = False
    publish_paused: bool = False  # this run's publish hold is set
    # resumed after an earlier attempt verified every target and cleared this run's publish
    # hold (reopened publish, or an operator did): downstream may have read the promotions,
    # so others' later commits are only noted, nothing is undone; the end is recorded
    delivered: bool = False
    held_by_others: dict[str, list[str]] = field(default_factory=dict)  # manual pauses left
    lock_keys: dict[str, str] = field(default_factory=dict)  # label -> delta_ops.lock_key
    done: dict[str, set[str]] = field(default_factory=dict)  # label -> partitions reconciled
    proof_done: dict[str, dict[str, Any]] = field(default_factory=dict)  # label -> slice event
    ledger_facts: dict[str, Any] = field(default_factory=dict)
    evidence_path: str | None = None
    work_s: float = 0.0  # seconds spent writing and reconciling slices
    work_rows: int = 0  # source rows those seconds covered
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def locked(self) -> list[str]:
        """The lock keys this run holds."""
        return sorted(set(self.lock_keys.values())) if self.holds_locks else []

    def locations(self) -> dict[str, str]:
        """Each target's name as displayed -> its lock key (its table's location)."""
        return {st.ref.display: self.lock_keys[label]
                for label, st in self.targets.items() if label in self.lock_keys}

    @property
    def resumed_state(self) -> str | None:
        return self.resumed.state if self.resumed is not None else None

    def may_have_promoted(self, label: str) -> bool:
        """Whether target ``label`` may have this run's promotion in place: recorded, or its
        rollback point recorded (the commit may have landed before a crash)."""
        st = self.targets[label]
        return (st.promoted_version is not None or st.rollback_version is not None) and \
            not st.restored

    @property
    def promoted_any(self) -> bool:
        """Whether a target of this run may have a promotion in place."""
        return any(self.may_have_promoted(label) for label in self.targets)


def fence(ctx: RunContext, state: RunState, doing: str = "going on", *,
          unreadable_ok: bool = False) -> None:
    """Go on only while this process's lock event is still the newest of every target (one
    read): a run outliving the stale-lock timeout can be taken over (by a run or a rollback,
    ``--takeover-stale-lock``), and the process that took a lock is then the only one allowed
    to change that target. Raises LockLostError naming the keys lost. With
    ``unreadable_ok``, a lock table it cannot read is said and the run goes on (as it did
    before these checks): a failed look must not undo a verified promotion."""
    try:
        lost = ctx.ledger.lost_locks(sorted(set(state.lock_keys.values())))
    except Exception as exc:
        if not unreadable_ok:
            raise
        ctx.say(f"could not read the locks before {doing} ({type(exc).__name__}); going on")
        return
    if lost:
        key = min(lost)
        raise LockLostError(f"this run no longer holds the target's lock on {key} ("
                            f"{lost_lock_text(lost[key])}); it stops before {doing}",
                            sorted(lost))


def record(ctx: RunContext, state: RunState, event: str, st: TargetState | None = None,
           **kw: Any) -> None:
    """Append a run event (target events carry the target's label and dataset)."""
    if st is not None:
        kw.setdefault("label", st.spec.label)
        kw["target"] = st.ref.display
    ctx.ledger.record_run(state.run_id, event, fingerprint=ctx.fingerprint,
                          elapsed_s=ctx.elapsed(), **kw)


def record_promoted(ctx: RunContext, state: RunState, st: TargetState, checked: int,
                    found: int, **facts: Any) -> None:
    """The promotion commit ``found`` recorded as landed, the rollback point the version just
    before it (``checked``: the version the attempt read). The one place it is recorded."""
    label = st.spec.label
    st.rollback_version, st.promoted_version, st.checked_version = found - 1, found, checked
    record(ctx, state, "promoted", st, version_read=found - 1, version_written=found,
           promoted_versions={label: found}, rollback_versions={label: found - 1},
           checked_version=checked, **facts)


def notify(ctx: RunContext, state: RunState, event: str, **payload: Any) -> None:
    """Send ``event`` to every notifier; a failed delivery is printed, never raised."""
    errors = send_all(ctx.notifiers, event, ctx.plan.safeguards.downstream_notifications,
                      {"run_id": state.run_id, "plan": ctx.plan.name,
                       "fingerprint": ctx.fingerprint, **payload})
    for e in errors:
        ctx.say(f"notification {event} not delivered: {e}")
