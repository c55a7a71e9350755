"""Evaluate the stage list against Spark and Delta: the backfill itself.

The run reads the ledger once when it starts (resume state, slices already reconciled,
recorded dry runs) and from then on only appends to it; every Delta read that can be reused
(the pinned source snapshot) is built once. ``docs/state-machine.md`` describes the events
recorded and what a re-run does after a failure at any point.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sparkguard import compat, delta_ops
from sparkguard.errors import (
    GateFailedError,
    GuardError,
    PlanError,
    PlanProblem,
    SparkguardError,
    TargetMovedError,
)
from sparkguard.evidence import write_evidence
from sparkguard.faults import failpoint
from sparkguard.guard import blocking, static_findings, target_order
from sparkguard.guard import window_partitions as plan_partitions
from sparkguard.guard_live import live_findings
from sparkguard.ledger import Ledger, PlanHistory, RunProgress, new_run_id
from sparkguard.notify import Notifier, notifiers_from_env, send_all
from sparkguard.plan.approvals import valid_approvals
from sparkguard.plan.fingerprint import fingerprint
from sparkguard.plan.model import BackfillPlan, Promotion, TargetSpec
from sparkguard.publish import PublishControl
from sparkguard.reconcile.engine import columns_of, reconcile, row_hash, table_fingerprint
from sparkguard.reconcile.spec import schema_contract_gates, spec_for_target
from sparkguard.reconcile.verdicts import GateResult, ReconcileResult
from sparkguard.runner import RunOptions, Stage, build_stages, slices_of, stage_line, timing
from sparkguard.sql import TableRef, window_predicate

__all__ = ["RunOutcome", "TargetState", "run_backfill"]


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
    promoted_version: int | None = None
    verified: bool = False
    restored: bool = False
    skipped_slices: list[int] = field(default_factory=list)
    txn_version: int = 1  # Delta txnVersion of the next promotion attempt
    notes: list[str] = field(default_factory=list)

    @property
    def baseline_version(self) -> int | None:
        """The version the window is known unchanged since: the lock, else reconciliation.

        Since the lock, not only since reconciliation: rows written into the window before
        reconciliation would otherwise be replaced without a word.
        """
        return self.start_version if self.start_version is not None else self.reconciled_version


@dataclass
class RunOutcome:
    """The result the CLI turns into an exit code and a summary."""

    run_id: str
    exit_code: int
    message: str
    evidence_path: str | None = None
    targets: dict[str, TargetState] = field(default_factory=dict)


def _key(partitions: Sequence[object]) -> str:
    return json.dumps([str(p) for p in partitions])


class _Run:
    def __init__(self, spark: SparkSession, plan: BackfillPlan, plan_path: str, home: str,
                 evidence_dir: str, options: RunOptions, out: Callable[[str], None],
                 notifiers: Sequence[Notifier] | None) -> None:
        self.spark, self.plan, self.plan_path = spark, plan, plan_path
        self.home, self.evidence_dir, self.options, self.out = home, evidence_dir, options, out
        self.fp = fingerprint(plan)
        self.t0 = time.monotonic()
        assert plan.partitioning is not None
        self.p = plan.partitioning.column
        self.ptype = plan.partitioning.type
        self.parts = plan_partitions(plan)
        self.slices = slices_of(self.parts, plan.execution.slice_partitions)
        assert plan.source_of_truth.dataset is not None
        self.source_ref = TableRef.parse(plan.source_of_truth.dataset)
        self.source_version: int | None = None
        self._source: DataFrame | None = None  # the pinned source snapshot, built once
        self.ledger = Ledger(spark, home)
        self.publish = PublishControl(spark, home)
        self.notifiers = list(notifiers) if notifiers is not None else notifiers_from_env()
        self.run_id = ""
        self.history: PlanHistory | None = None
        self.resumed: RunProgress | None = None
        self.resumed_state: str | None = None
        self.holds_locks = False
        self.targets: dict[str, TargetState] = {}
        self.locked: list[str] = []
        self.done: dict[str, dict[str, dict[str, Any]]] = {}  # label -> slice key -> event
        self._done_lock = threading.Lock()
        self.ledger_facts: dict[str, Any] = {}
        shadow_root = plan.execution.shadow_location or f"{home.rstrip('/')}/shadow"
        for t in target_order(plan):
            shadow = TableRef(path=f"{shadow_root.rstrip('/')}/{plan.name}/{self.fp[:12]}/{t.label}")
            self.targets[t.label] = TargetState(t, TableRef.parse(t.dataset), shadow)

    # -- helpers ------------------------------------------------------------------------------

    def say(self, msg: str) -> None:
        self.out(f"[{self.elapsed():7.1f}s] {msg}")

    def elapsed(self) -> float:
        return round(time.monotonic() - self.t0, 3)

    def job(self, desc: str) -> None:
        """Label this thread's next Spark jobs: group ``sparkguard-<run id>``, ``desc`` per stage."""
        group = f"sparkguard-{self.run_id}" if self.run_id else f"sparkguard-plan-{self.plan.name}"
        _set_job_label(self.spark, group, desc)

    def notify(self, event: str, **payload: Any) -> None:
        errors = send_all(self.notifiers, event, self.plan.safeguards.downstream_notifications,
                          {"run_id": self.run_id, "plan": self.plan.name, "fingerprint": self.fp,
                           **payload})
        for e in errors:
            self.say(f"notification {event} not delivered: {e}")

    def record(self, state: str, st: TargetState | None = None, **kw: Any) -> None:
        """Append a run event (target events carry the target's label and dataset)."""
        if st is not None:
            kw.setdefault("label", st.spec.label)
            kw["target"] = st.ref.display
        self.ledger.record_run(self.run_id, state, fingerprint=self.fp,
                               elapsed_s=self.elapsed(), **kw)

    def source_df(self, partitions: Sequence[object]) -> DataFrame:
        if self._source is None:
            self._source = (delta_ops.read_version(self.spark, self.source_ref, self.source_version)
                            if self.source_version is not None
                            else delta_ops.read_table(self.spark, self.source_ref))
        return self._source.filter(self.pred(partitions))

    def pred(self, partitions: Sequence[object], alias: str | None = None) -> str:
        return window_predicate(self.p, self.ptype, list(partitions), alias)

    def transform(self, st: TargetState, partitions: Sequence[object], tag: str
                  ) -> tuple[DataFrame, list[str]]:
        """The target's recomputation for ``partitions``, and the temp views it uses."""
        tr = st.spec.transform
        src = self.source_df(partitions)
        if tr.callable:
            mod_name, fn_name = tr.callable.split(":")
            fn = getattr(importlib.import_module(mod_name), fn_name)
            df = fn(self.spark, src, list(partitions))
            if not isinstance(df, DataFrame):
                idx = list(self.targets).index(st.spec.label)
                raise PlanError(self.plan_path, [PlanProblem(
                    f"backfill_plan.targets[{idx}].transform.callable",
                    f"{tr.callable} returned {type(df).__name__}, not a DataFrame", tr.callable,
                    "return the recomputed rows as a pyspark DataFrame")])
            return df, []
        assert tr.sql is not None
        view = f"__sg_src_{re.sub(r'[^A-Za-z0-9]', '_', self.run_id)}_{tag}"
        src.createOrReplaceTempView(view)
        views = [view]
        sql = tr.sql.replace("{source}", f"`{view}`").replace("{window}", self.pred(partitions))
        for label, other in self.targets.items():
            token = "{shadow:" + label + "}"
            if token in sql:
                oview = f"{view}_up_{label}"
                self.shadow_df(other, partitions).createOrReplaceTempView(oview)
                views.append(oview)
                sql = sql.replace(token, f"`{oview}`")
        return self.spark.sql(sql), views

    def shadow_df(self, st: TargetState, partitions: Sequence[object]) -> DataFrame:
        return delta_ops.read_table(self.spark, st.shadow).filter(self.pred(partitions))

    def target_df(self, st: TargetState, partitions: Sequence[object],
                  version: int | None = None) -> DataFrame:
        df = (delta_ops.read_version(self.spark, st.ref, version) if version is not None
              else delta_ops.read_table(self.spark, st.ref))
        return df.filter(self.pred(partitions))

    def reconcile_slice(self, st: TargetState, partitions: Sequence[object], scope: str,
                        target_version: int | None = None, preview: bool = False
                        ) -> ReconcileResult:
        """Gates of the shadow against the source; the change preview against the target only
        with ``preview`` (the full window's: a slice's would repeat part of it, at the cost of
        reading the target and fetching samples once more per slice)."""
        spec = spec_for_target(self.plan, st.spec)
        shadow = self.shadow_df(st, partitions)
        target = self.target_df(st, partitions, target_version)
        res = reconcile(spec, shadow=shadow, target=target, source=self.source_df(partitions),
                        partitions=list(partitions), scope=scope, preview=preview)
        schema = schema_contract_gates(columns_of(shadow), columns_of(target), st.spec.contract)
        return ReconcileResult(scope=res.scope, partitions=res.partitions,
                               gates=(*res.gates, *schema), preview=res.preview,
                               duplicate_sample=res.duplicate_sample)

    def print_gates(self, label: str, res: ReconcileResult) -> None:
        for g in res.gates:
            mark = "PASS" if g.passed else "FAIL"
            where = f" [{g.partition}]" if g.partition else ""
            measured = g.measured.get("value") if isinstance(g.measured, dict) and \
                "value" in g.measured else g.measured
            self.say(f"  {mark} {label} {g.gate}{where}: measured={_short(measured)} "
                     f"expected={_short(g.expected)} threshold={g.threshold} - {g.reason}")

    # -- stages -------------------------------------------------------------------------------

    def stage_guard(self, stage: Stage) -> None:
        self.job(f"plan {self.plan.name}: guard, live checks")
        findings = static_findings(self.plan)
        if blocking(findings):
            raise GuardError(self.plan_path, [f.as_problem() for f in blocking(findings)])
        live = live_findings(self.spark, self.plan)
        if blocking(live):
            raise GuardError(self.plan_path, [f.as_problem() for f in blocking(live)])
        for f in [*findings, *live]:
            self.say(f.render(self.plan_path))

    def stage_lock(self, stage: Stage) -> RunOutcome | None:
        """Read the ledger once, resume or start the run, lock the targets, pin the source.

        Returns an outcome, without starting a run, when the newest run of this plan already
        finished from the same source version and the targets are still as it left them.
        """
        self.job(f"plan {self.plan.name}: read the ledger")
        self.ledger.ensure()
        self.history = hist = self.ledger.load(self.fp)
        runs = hist.progress()
        if runs and runs[0].state == "done" and not self.options.dry_run:
            finished = self._already_done(runs[0])
            if finished is not None:
                return finished
        prev = hist.resumable()
        if prev is not None and self.options.dry_run and any(
                t.rollback_version is not None for t in prev.targets.values()):
            raise SparkguardError(
                f"run {prev.run_id} of this plan stopped during promotion (state {prev.state}); "
                "re-run without --dry-run to finish it before a dry run")
        self.run_id = prev.run_id if prev is not None else new_run_id()
        self.job(f"run {self.run_id}: lock targets, pin the source version, record the run")
        decisions = self.ledger.acquire(
            [st.ref.display for st in self.targets.values()], self.run_id, self.plan.owner,
            takeover=self.options.takeover_stale_lock,
            stale_after_s=self.options.stale_lock_after_s)
        self.locked = [st.ref.display for st in self.targets.values()]
        self.holds_locks = True
        took_over = {t: h.run_id for t, (what, h) in decisions.items()
                     if what == "takeover" and h is not None}
        for other in sorted(set(took_over.values()) - {self.run_id}):
            old = self.ledger.progress(other)  # recorded under its own plan's fingerprint
            self.ledger.record_run(other, "abandoned", fingerprint=old.fingerprint if old else "?",
                                   taken_over_by=self.run_id,
                                   targets=sorted(t for t, r in took_over.items() if r == other))
        if prev is not None:
            self._load_resume(prev)
        if self.source_version is None:
            self.source_version = delta_ops.current_version(self.spark, self.source_ref)
        for st in self.targets.values():
            if st.start_version is None:
                st.start_version = delta_ops.current_version(self.spark, st.ref)
        for label in self.targets:
            self.done[label] = dict(hist.done_slices(label, self.source_version))
        claim = self._dry_run_claim(hist)
        common: dict[str, Any] = dict(
            source_version=self.source_version, plan_path=self.plan_path,
            dry_run=self.options.dry_run,
            approvals=[a.model_dump(mode="json") for a in valid_approvals(self.plan)],
            recipients=list(self.plan.safeguards.downstream_notifications),
            targets={k: st.ref.display for k, st in self.targets.items()},
            start_versions={k: st.start_version for k, st in self.targets.items()},
            window={"column": self.p, "type": self.ptype.value,
                    "partitions": [str(x) for x in self.parts]},
            locks={t: what for t, (what, _h) in decisions.items()}, dry_run_claim=claim,
            took_over_locks_of=took_over or None)
        if prev is None:
            self.record("started", plan_name=self.plan.name, owner=self.plan.owner, **common)
        else:
            self.record("resumed", plan_name=self.plan.name, owner=self.plan.owner,
                        previous_state=prev.state, **common)
        self.ledger_facts = {"dry_run_claim": claim, "resumed_from_state": self.resumed_state,
                             "lock_decisions": common["locks"]}
        self.say(f"run {self.run_id}: plan {self.plan.name} fingerprint {self.fp[:12]}, source "
                 f"{self.source_ref.display} pinned at version {self.source_version}")
        failpoint("after_lock")
        return None

    def _already_done(self, done: RunProgress) -> RunOutcome | None:
        """The same plan already finished from the same source version, and no target changed
        since: nothing to do (e.g. a re-run after a crash just before the locks were released)."""
        if delta_ops.current_version(self.spark, self.source_ref) != done.source_version:
            return None
        for label, st in self.targets.items():
            tp = done.targets.get(label)
            if tp is None or tp.promoted_version is None or tp.restored or \
                    delta_ops.current_version(self.spark, st.ref) != tp.promoted_version:
                return None
        for label, st in self.targets.items():
            tp = done.targets[label]
            st.rollback_version, st.promoted_version, st.verified = (
                tp.rollback_version, tp.promoted_version, tp.verified)
        holders = self.ledger.lock_holders([st.ref.display for st in self.targets.values()])
        for target, holder in holders.items():
            if holder.held and holder.run_id == done.run_id:  # it died before releasing
                self.ledger.release_finished(target, holder)
        self.run_id = done.run_id
        self.say(f"nothing to do: run {done.run_id} already promoted this plan from source "
                 f"version {done.source_version}, and the targets are still at the versions it "
                 f"promoted; evidence {done.evidence_path}")
        return RunOutcome(done.run_id, 0, "already done by run " + done.run_id,
                          done.evidence_path, self.targets)

    def _load_resume(self, prev: RunProgress) -> None:
        self.resumed, self.resumed_state = prev, prev.state
        self.source_version = prev.source_version
        start: dict[str, int] = {}
        for e in (self.history.runs.get(prev.run_id, []) if self.history else []):
            start.update((e.get("details") or {}).get("start_versions") or {})
        for label, st in self.targets.items():
            st.start_version = start.get(label)
            tp = prev.targets.get(label)
            if tp is None:
                continue
            st.rollback_version = tp.rollback_version
            st.promoted_version = tp.promoted_version if not tp.restored else None
            st.verified = tp.verified and not tp.restored
        self.say(f"resuming run {prev.run_id} (last state {prev.state}, source pinned at version "
                 f"{prev.source_version}); slices already reconciled are skipped")

    def _dry_run_claim(self, hist: PlanHistory) -> dict[str, Any]:
        """Check ``execution.dry_run_completed`` against the dry runs the ledger recorded."""
        claimed = bool(self.plan.execution.dry_run_completed)
        recorded = hist.dry_runs()
        fact = {"claimed": claimed, "recorded_run_id": recorded[0].run_id if recorded else None,
                "recorded_at": str(recorded[0].last_at) if recorded else None}
        if self.options.dry_run:
            return fact
        if recorded:
            self.say(f"dry run of this exact plan recorded in the ledger: run {recorded[0].run_id}"
                     f" at {recorded[0].last_at:%Y-%m-%d %H:%M:%S} UTC")
        elif claimed:
            self.say("WARNING execution.dry_run_completed: true is not backed by the ledger (no "
                     f"dry run of fingerprint {self.fp[:12]} recorded); the claim is ignored and "
                     "this run proves every gate itself before promoting")
        else:
            self.say("no dry run of this plan recorded; this run proves every gate itself "
                     "before promoting")
        return fact

    def stage_pause(self, stage: Stage) -> None:
        targets = [st.ref.display for st in self.targets.values()]
        if self.resumed is not None and all(st.verified for st in self.targets.values()):
            self.say("every target already promoted and verified; publish hold left as it is")
            return
        self.job(f"run {self.run_id}: pause publish")
        self.publish.pause(targets, run_id=self.run_id, actor=self.plan.owner,
                           reason=f"backfill {self.plan.name}")
        self.record("paused", publish_paused=targets)
        self.notify("publish_paused", targets=targets)
        self.say(f"publish paused for {', '.join(targets)}")
        failpoint("after_pause")

    def _write_slice(self, st: TargetState, partitions: Sequence[object], sid: int) -> None:
        self.job(f"run {self.run_id} target {st.spec.label} slice {sid}: shadow write")
        df, views = self.transform(st, partitions, f"{st.spec.label}_{sid}")
        try:
            delta_ops.write_partitions(
                df, st.shadow, self.pred(partitions), self.p,
                metadata=delta_ops.user_metadata(self.run_id, self.fp, "shadow_write", slice=sid))
        finally:
            for v in views:
                self.spark.catalog.dropTempView(v)

    def _record_slice(self, st: TargetState, sid: int, partitions: Sequence[object],
                      res: ReconcileResult, t1: float, h: dict[str, int] | None = None) -> None:
        event = self.ledger.record_slice(
            self.run_id, self.fp, st.spec.label, sid, [str(p) for p in partitions],
            "reconciled" if res.passed else "gate_failed", self.source_version,
            rows=int(res.totals().get("rows_shadow", 0)), content_hash=json.dumps(h) if h else None,
            elapsed_s=round(time.monotonic() - t1, 3), gates=[g.to_dict() for g in res.gates])
        if res.passed:
            with self._done_lock:
                self.done[st.spec.label][_key(partitions)] = event

    def _gate_fail(self, st: TargetState, res: ReconcileResult, where: str) -> None:
        self.print_gates(st.spec.label, res)
        worst = res.failed[0]
        raise GateFailedError(f"{st.spec.label}: {where}: gate {worst.gate} failed: {worst.reason}")

    def stage_proof(self, stage: Stage) -> None:
        st = self.targets[stage.target or ""]
        parts = self.slices[0]
        t1 = time.monotonic()
        prior = self.done[st.spec.label].get(_key(parts))
        if prior is not None:
            st.proof_hash = json.loads(prior["content_hash"]) if prior.get("content_hash") else None
            st.skipped_slices.append(1)
            self.say(f"{st.spec.label}: proof slice {[str(p) for p in parts]} already written "
                     f"twice and reconciled for this plan and source version (run "
                     f"{prior['run_id']}); skipped")
            return
        self._write_slice(st, parts, 1)
        failpoint("mid_shadow_write")
        h1 = table_fingerprint(self.shadow_df(st, parts))
        self._write_slice(st, parts, 1)
        h2 = table_fingerprint(self.shadow_df(st, parts))
        if h1 != h2:
            raise GateFailedError(
                f"{st.spec.label}: idempotency proof failed: writing slice 1 twice gave different "
                f"content ({h1} vs {h2}); make the transform deterministic")
        st.proof_hash = h1
        self.job(f"run {self.run_id} target {st.spec.label} slice 1: reconcile")
        res = self.reconcile_slice(st, parts, "proof slice 1")
        st.slice_results.append(res)
        self._record_slice(st, 1, parts, res, t1, h1)
        self.say(f"{st.spec.label}: proof slice {[str(p) for p in parts]}: {h1['rows']} rows, "
                 f"written twice with identical content hash; gates "
                 f"{'passed' if res.passed else 'FAILED'} ({time.monotonic() - t1:.1f}s)")
        if not res.passed:
            self._gate_fail(st, res, "proof slice")
        self.record("proof_passed", st, content_hash=h1)
        failpoint("after_proof")

    def run_slices(self, stages: list[Stage]) -> None:
        """Remaining slices, up to ``max_concurrent_slices`` at a time, target by target."""
        by_target: dict[str, list[Stage]] = {}
        for s in stages:
            by_target.setdefault(s.target or "", []).append(s)
        total = len(self.slices)
        for label, todo in by_target.items():
            st = self.targets[label]
            t_start = time.monotonic()
            finished = 0

            def one(stage: Stage, st: TargetState = st, label: str = label
                    ) -> ReconcileResult | None:
                parts = self.slices[(stage.slice_id or 1) - 1]
                if _key(parts) in self.done[label]:
                    return None
                t1 = time.monotonic()
                self._write_slice(st, parts, stage.slice_id or 0)
                self.job(f"run {self.run_id} target {label} slice {stage.slice_id}: reconcile")
                res = self.reconcile_slice(st, parts, f"slice {stage.slice_id}")
                self._record_slice(st, stage.slice_id or 0, parts, res, t1)
                return res

            workers = max(1, self.plan.execution.max_concurrent_slices)
            with ThreadPoolExecutor(max_workers=workers) as pool:
                for stage, res in zip(todo, pool.map(one, todo), strict=True):
                    finished += 1
                    elapsed = time.monotonic() - t_start
                    if res is None:
                        st.skipped_slices.append(stage.slice_id or 0)
                        self.say(f"{label}: slice {stage.slice_id}/{total} already reconciled; "
                                 "skipped")
                        continue
                    st.slice_results.append(res)
                    tot = res.totals()
                    self.say(f"{label}: slice {stage.slice_id}/{total} {list(stage.partitions)}: "
                             f"{tot['rows_shadow']} rows, gates "
                             f"{'passed' if res.passed else 'FAILED'}; "
                             f"{timing(elapsed, finished, len(todo))}")
                    if not res.passed:
                        self._gate_fail(st, res, f"slice {stage.slice_id}")
                    if finished == 1:
                        failpoint("mid_slices")

    def stage_reconcile(self, stage: Stage) -> None:
        st = self.targets[stage.target or ""]
        self.job(f"run {self.run_id} target {st.spec.label}: full-window reconciliation")
        failpoint("mid_reconcile")
        # after a crash past the promotion commit, reconcile against the version before it,
        # so the change preview still shows what the promotion changed
        version: int | None = None
        if st.rollback_version is not None:  # resumed after the rollback point was recorded
            commits = delta_ops.commits_since(self.spark, st.ref, st.rollback_version)
            if delta_ops.promotion_state(commits, self.run_id,
                                         st.spec.label).promoted_version is not None:
                version = st.rollback_version
        if version is None:
            version = delta_ops.current_version(self.spark, st.ref)
        self._reconcile_window(st, version)

    def _reconcile_window(self, st: TargetState, version: int | None) -> None:
        res = self.reconcile_slice(st, self.parts, "full window", target_version=version,
                                   preview=True)
        st.window, st.reconciled_version = res, version
        self.say(f"{st.spec.label}: full-window reconciliation over {len(self.parts)} partitions "
                 f"(target version {version}):")
        self.print_gates(st.spec.label, res)
        if res.preview:
            pv = res.preview
            gone = (f"delete {pv.deleted}" if self._deletes_unmatched(st) else
                    f"{pv.deleted} row(s) no longer produced, kept (merge.when_not_matched_by_"
                    "source: keep)")
            self.say(f"  change preview {st.spec.label}: insert {pv.inserted}, {gone}, change "
                     f"{pv.changed}, unchanged {pv.unchanged}; by column "
                     f"{ {k: v for k, v in pv.changed_by_column.items() if v} }")
        if not res.passed:
            self._gate_fail(st, res, "full window")
        self.record("reconciled", st, version_read=version,
                    gates=[g.to_dict() for g in res.gates],
                    preview=res.preview.to_dict() if res.preview else None)

    @staticmethod
    def _deletes_unmatched(st: TargetState) -> bool:
        return (st.spec.promotion is Promotion.REPLACE_WHERE
                or st.spec.merge.when_not_matched_by_source == "delete")

    def stage_dry_run_stop(self, stage: Stage) -> None:
        self.job(f"run {self.run_id}: record the dry run")
        self.record("dry_run_passed", reconciled_versions={
            k: st.reconciled_version for k, st in self.targets.items()})

    # -- promotion ------------------------------------------------------------------------

    def stage_promote(self, stage: Stage) -> None:
        st = self.targets[stage.target or ""]
        label = st.spec.label
        if st.rollback_version is not None and self._already_promoted(st):
            return
        self.job(f"run {self.run_id} target {label}: promote")
        current = self._prepare_and_commit(st)
        failpoint("after_promote_commit")
        commits = delta_ops.commits_since(self.spark, st.ref, current)
        found = delta_ops.promotion_state(commits, self.run_id, label).promoted_version
        if found is None:
            raise SparkguardError(f"{label}: promotion commit not found in the table history "
                                  f"after version {current}")
        if found - 1 != current:
            others = [c for c in delta_ops.foreign_commits(commits, self.run_id)
                      if int(c["version"]) < found]
            note = (f"{len(others)} commit(s) by other writers landed between the rollback point "
                    f"{current} and the promotion commit {found} "
                    f"({', '.join('v' + str(c['version']) for c in others)}); the rollback point "
                    f"is version {found - 1}, just before the promotion commit")
            st.notes.append(note)
            self.say(f"{label}: {note}")
            st.rollback_version = found - 1
        st.promoted_version = found
        self.record("promoted", st, version_read=st.rollback_version, version_written=found,
                    promoted_versions={label: found}, rollback_versions={label: st.rollback_version})
        self.notify("promoted", target=st.ref.display, version=found,
                    rollback_version=st.rollback_version)
        if found - 1 != current:
            self._check_gap(st, current, found - 1)
        failpoint("after_promote_ledger")
        self._verify(st)

    def _check_gap(self, st: TargetState, checked: int, before_promotion: int) -> None:
        """Commits of other writers between the checked version and the promotion commit were
        not seen by Delta's conflict check (the promotion's transaction began after them); if
        they changed the window, the promotion replaced their rows: undo it at once."""
        label = st.spec.label
        then, now = self._fingerprints(self.target_df(st, self.parts, checked),
                                       self.target_df(st, self.parts, before_promotion))
        if then == now:
            return
        self.say(f"{label}: another writer changed the window between version {checked} and the "
                 f"promotion (window rows {then['rows']} -> {now['rows']}); undoing the promotion")
        self.restore_target(st, "another writer changed the window before the promotion")
        raise TargetMovedError(
            f"{label}: another writer changed the window of {st.ref.display} just before the "
            f"promotion (versions {checked + 1}..{before_promotion}); the promotion was undone at "
            f"once (target back at the content of version {before_promotion}, their rows kept) "
            "and publish stays paused. Re-run once that writer has finished")

    def _already_promoted(self, st: TargetState) -> bool:
        """Resume: find this run's promotion in the target history by its userMetadata."""
        assert st.rollback_version is not None
        label = st.spec.label
        commits = delta_ops.commits_since(self.spark, st.ref, st.rollback_version)
        state = delta_ops.promotion_state(commits, self.run_id, label)
        st.txn_version = state.next_txn_version
        if state.promoted_version is None:
            st.promoted_version, st.verified = None, False
            return False
        found = state.promoted_version
        self.say(f"{label}: already promoted by this run at version {found} (found in the table "
                 "history by its userMetadata); not promoting again")
        if st.promoted_version != found:  # the crash came before the ledger row
            st.promoted_version = found
            self.record("promoted", st, version_read=st.rollback_version, version_written=found,
                        promoted_versions={label: found}, found_in_history=True)
            self.notify("promoted", target=st.ref.display, version=found,
                        rollback_version=st.rollback_version)
        if st.verified:
            self.say(f"{label}: promotion already verified")
        else:
            self._verify(st)
        return True

    def _prepare_and_commit(self, st: TargetState) -> int:
        """Check the target, record the rollback point, commit; returns the rollback point.

        Bounded attempts: a target that moved (or a Delta conflict) is checked again before
        the next attempt; rows another writer put in the window stop the run.
        """
        label, attempts = st.spec.label, max(1, self.options.promote_attempts)
        for attempt in range(1, attempts + 1):
            current = delta_ops.current_version(self.spark, st.ref)
            if current != st.baseline_version:
                self._target_moved(st, current)
            st.rollback_version = current
            self.record("promoting", st, version_read=current, attempt=attempt,
                        rollback_versions={label: current})
            failpoint("before_promote")
            # Commits landing from here on do not stop the attempt: those inside the promotion's
            # transaction are Delta conflicts (retried below); those before it are outside
            # Delta's check, so stage_promote compares the window across that gap (_check_gap)
            # and moves the rollback point to just before the promotion commit.
            try:
                self._commit(st)
                return current
            except Exception as exc:
                if not delta_ops.is_conflict(exc):
                    raise
                state = delta_ops.promotion_state(
                    delta_ops.commits_since(self.spark, st.ref, current), self.run_id, label)
                if state.promoted_version is not None:  # it landed after all
                    return current
                first = delta_ops.conflict_summary(exc)
                self.say(f"{label}: delta conflict on promotion attempt {attempt}/{attempts}: "
                         f"{first}; checking the target again in "
                         f"{self.options.conflict_backoff_s * attempt:.1f}s")
                time.sleep(self.options.conflict_backoff_s * attempt)
        raise TargetMovedError(
            f"{label}: the target kept changing ({attempts} attempts); nothing was promoted and "
            "publish stays paused. Re-run once the other writers are quiet")

    def _target_moved(self, st: TargetState, current: int) -> None:
        """The target changed since the run started: go on only if the window's content is
        the same as then (commits outside the window survive the promotion; rows another
        writer put in the window would be overwritten, so the run stops instead)."""
        label = st.spec.label
        since = st.baseline_version
        assert since is not None
        moved = delta_ops.foreign_commits(
            delta_ops.commits_since(self.spark, st.ref, since), self.run_id)
        listed = ", ".join(f"v{c['version']} {c['operation']}" for c in moved[:10])
        before, after = self._fingerprints(self.target_df(st, self.parts, since),
                                           self.target_df(st, self.parts, current))
        self.record("target_moved", st, version_read=current, since_version=since,
                    commits=[{k: str(v) for k, v in c.items()} for c in moved[:50]],
                    window_unchanged=before == after)
        if before != after:
            raise TargetMovedError(
                f"{label}: another writer changed the window of {st.ref.display} during the run "
                f"(version {since} -> {current}: {listed}; window rows {before['rows']} -> "
                f"{after['rows']}); promoting would overwrite its rows, so nothing was promoted "
                "and publish stays paused. Re-run once that writer has finished: the new run "
                "reconciles against the target as it is then")
        self.say(f"{label}: target moved since reconciliation ({listed}), outside the window "
                 "only (window content unchanged); promoting over the new version")
        st.reconciled_version = current
        st.start_version = current  # the window is as it was then: later checks start here

    def _commit(self, st: TargetState) -> None:
        label = st.spec.label
        meta = delta_ops.user_metadata(self.run_id, self.fp, "promote", target=label)
        txn = (f"sparkguard-{self.run_id}-{label}", st.txn_version)
        shadow = self.shadow_df(st, self.parts)
        if st.spec.promotion is Promotion.REPLACE_WHERE:
            delta_ops.promote_replace_where(shadow, st.ref, self.pred(self.parts), meta, txn)
        else:
            delta_ops.promote_merge(self.spark, shadow, st.ref, st.spec.business_keys,
                                    self.pred(self.parts, "t"), self._deletes_unmatched(st),
                                    meta, txn)

    def _fingerprints(self, a: DataFrame, b: DataFrame) -> tuple[dict[str, int], dict[str, int]]:
        """Content hashes of two DataFrames with the same columns, in one Spark job."""
        cols = sorted(a.columns)
        if cols != sorted(b.columns):
            return table_fingerprint(a), table_fingerprint(b)
        both = (a.select(*cols).withColumn("__sg_side", F.lit(0))
                .unionByName(b.select(*cols).withColumn("__sg_side", F.lit(1))))
        h = row_hash(both, cols)
        rows = {r["__sg_side"]: r for r in both.select("__sg_side", h.alias("h"))
                .groupBy("__sg_side").agg(
                    F.count(F.lit(1)).alias("rows"),
                    F.sum(F.col("h").bitwiseAND(F.lit(0xFFFFFFFF))).alias("lo"),
                    F.sum(F.shiftrightunsigned(F.col("h"), 32)).alias("hi")).collect()}

        def one(side: int) -> dict[str, int]:
            r = rows.get(side)
            return ({"rows": int(r["rows"]), "lo": int(r["lo"] or 0), "hi": int(r["hi"] or 0)}
                    if r else {"rows": 0, "lo": 0, "hi": 0})

        return one(0), one(1)

    def _verify(self, st: TargetState) -> None:
        label = st.spec.label
        assert st.promoted_version is not None and st.rollback_version is not None
        self.job(f"run {self.run_id} target {label}: verify promotion")
        shadow_h, target_h = self._fingerprints(self.shadow_df(st, self.parts),
                                                self.target_df(st, self.parts, st.promoted_version))
        ok = shadow_h == target_h
        if not ok and not self._deletes_unmatched(st):
            # MERGE keeping unmatched rows: the window must hold every shadow row unchanged
            spec = spec_for_target(self.plan, st.spec)
            res = reconcile(spec, shadow=self.shadow_df(st, self.parts),
                            target=self.target_df(st, self.parts, st.promoted_version),
                            partitions=self.parts, scope="verification")
            ok = res.preview is not None and res.preview.inserted == 0 and res.preview.changed == 0
        if not ok:
            self.say(f"{label}: VERIFICATION FAILED (target window {target_h} != shadow "
                     f"{shadow_h}); restoring version {st.rollback_version} now")
            self.restore_target(st, "verification failed")
            raise GateFailedError(f"{label}: promoted content does not equal the shadow; target "
                                  f"restored to version {st.rollback_version}")
        st.verified = True
        self.record("verified", st, version_read=st.promoted_version, content_hash=target_h)
        self.say(f"{label}: promoted at version {st.promoted_version} and verified "
                 f"({target_h['rows']} rows in the window equal the shadow)")
        failpoint("after_verify")

    def restore_target(self, st: TargetState, why: str) -> None:
        """Undo this run's promotion of ``st``: RESTORE, or (when other writers committed after
        it) put the window back as it was, keeping their commits. Verified on the window."""
        assert st.rollback_version is not None and st.promoted_version is not None
        label, version = st.spec.label, st.rollback_version
        self.job(f"run {self.run_id} target {label}: restore version {version}")
        meta = delta_ops.user_metadata(self.run_id, self.fp, "restore", target=label, reason=why)
        after = delta_ops.foreign_commits(
            delta_ops.commits_since(self.spark, st.ref, st.promoted_version), self.run_id,
            data_only=True)
        if after:
            self.say(f"{label}: {len(after)} commit(s) by other writers after the promotion; "
                     f"putting the window back as of version {version} instead of RESTORE")
            delta_ops.revert_window(self.spark, st.ref, version, self.pred(self.parts), meta)
        else:
            delta_ops.restore(self.spark, st.ref, version, meta)
        want, got = self._fingerprints(self.target_df(st, self.parts, version),
                                       self.target_df(st, self.parts))
        st.restored, st.verified = True, False
        new_version = delta_ops.current_version(self.spark, st.ref)
        self.record("restored", st, version_read=version, version_written=new_version,
                    reason=why, verified=want == got, method="revert_window" if after else "restore")
        self.notify("restored", target=st.ref.display, version=version, reason=why)
        if want != got:
            raise SparkguardError(f"{label}: the window after restoring version {version} differs "
                                  f"from that version ({got} vs {want}); inspect the table history")

    # -- finish ---------------------------------------------------------------------------

    def stage_evidence(self, stage: Stage, outcome: str, error: str | None = None) -> str:
        path = write_evidence(self, outcome, error)
        self.say(f"evidence written to {path}")
        return path

    def stage_resume(self, stage: Stage, evidence_path: str | None) -> None:
        failpoint("before_publish_resume")
        targets = [st.ref.display for st in self.targets.values()]
        self.job(f"run {self.run_id}: reopen publish")
        after = self.publish.finish(targets, self.run_id, actor=self.plan.owner,
                                    reason=f"backfill {self.plan.name} promoted and verified")
        failpoint("mid_publish_resume")
        self.notify("publish_resumed", targets=targets)
        still = {t: s for t, s in after.items() if s.paused}
        self.record("done", evidence_path=evidence_path,
                    promoted_versions={k: st.promoted_version for k, st in self.targets.items()},
                    still_paused_by_others={t: [h["hold"] for h in s.holds]
                                            for t, s in still.items()} or None)
        if still:
            for s in still.values():
                self.say(f"this run's publish hold released; still paused by others: "
                         f"{s.describe()}")
        else:
            self.say("publish reopened")
        failpoint("before_lock_release")

    def release_locks(self) -> None:
        self.job(f"run {self.run_id}: release locks")
        self.ledger.release(self.locked, self.run_id)


def _short(v: Any) -> str:
    s = str(v)
    return s if len(s) <= 40 else s[:37] + "..."


def _set_job_label(spark: SparkSession, group: str, desc: str) -> None:
    with contextlib.suppress(Exception):  # a label never fails a run
        compat.set_job_label(spark, group, desc)


def _job_labels(spark: SparkSession) -> dict[str, str | None]:
    with contextlib.suppress(Exception):
        return compat.job_labels(spark)
    return {}


def _restore_job_labels(spark: SparkSession, labels: dict[str, str | None]) -> None:
    with contextlib.suppress(Exception):
        compat.restore_job_labels(spark, labels)


def run_backfill(spark: SparkSession, plan: BackfillPlan, plan_path: str, *, home: str,
                 evidence_dir: str, options: RunOptions | None = None,
                 out: Callable[[str], None] = print,
                 notifiers: Sequence[Notifier] | None = None) -> RunOutcome:
    """Run every stage of the plan; map the end state to an exit code (0, 1, 3).

    Plan and guard errors (exit 2) propagate before anything is written; so does a lock held
    by another run (nothing is recorded for the refused run). Every Spark job of the run
    carries the job group ``sparkguard-<run id>`` (``sparkguard-plan-<name>`` before the run
    id is known) and a description naming the stage; the caller's labels are restored after.
    """
    saved = _job_labels(spark)
    _set_job_label(spark, f"sparkguard-plan-{plan.name}", f"plan {plan.name}: open the ledger")
    try:
        return _run_backfill(spark, plan, plan_path, home=home, evidence_dir=evidence_dir,
                             options=options, out=out, notifiers=notifiers)
    finally:
        _restore_job_labels(spark, saved)


def _run_stages(run: _Run, stages: list[Stage]) -> RunOutcome:
    evidence_path: str | None = None
    slice_stages = [s for s in stages if s.kind == "slice"]
    count = len(stages) + 1  # the guard stage ran before these
    for i, s in enumerate(stages, 2):
        if s.kind != "slice" or slice_stages:  # the first slice stage runs them all
            run.say(stage_line(i, count, s, run.elapsed(), i - 1))
        if s.kind == "lock":
            finished = run.stage_lock(s)
            if finished is not None:
                return finished
        elif s.kind == "pause":
            run.stage_pause(s)
        elif s.kind == "proof":
            run.stage_proof(s)
        elif s.kind == "slice" and slice_stages:
            run.run_slices(slice_stages)
            slice_stages = []
        elif s.kind == "reconcile":
            run.stage_reconcile(s)
        elif s.kind == "dry_run_stop":
            run.stage_dry_run_stop(s)
            evidence_path = run.stage_evidence(s, "dry_run_passed")
            run.notify("dry_run_passed")
            return RunOutcome(run.run_id, 0, "dry run passed: every gate passed, target and "
                              "publish state untouched", evidence_path, run.targets)
        elif s.kind == "promote":
            run.stage_promote(s)
        elif s.kind == "evidence":
            evidence_path = run.stage_evidence(s, "promoted")
        elif s.kind == "resume":
            run.stage_resume(s, evidence_path)
    return RunOutcome(run.run_id, 0, "promoted and verified", evidence_path, run.targets)


def _run_backfill(spark: SparkSession, plan: BackfillPlan, plan_path: str, *, home: str,
                  evidence_dir: str, options: RunOptions | None,
                  out: Callable[[str], None], notifiers: Sequence[Notifier] | None) -> RunOutcome:
    options = options or RunOptions()
    run = _Run(spark, plan, plan_path, home, evidence_dir, options, out, notifiers)
    stages = build_stages(plan, options)
    run.stage_guard(stages[0])
    failpoint("after_guard")
    try:
        return _run_stages(run, stages[1:])
    except (GateFailedError, TargetMovedError) as exc:
        if not run.holds_locks:
            raise
        restored = _restore_promoted(run, str(exc))
        run.record("gate_failed", error=str(exc), restored=restored)
        run.notify("gate_failed", error=str(exc))
        evidence_path = run.stage_evidence(Stage("evidence", ""), "gate_failed", str(exc))
        run.say(f"GATE FAILED: {exc}. Target unchanged{' (restored)' if restored else ''}; "
                "publish stays paused.")
        return RunOutcome(run.run_id, 1, str(exc), evidence_path, run.targets)
    except Exception as exc:
        if run.holds_locks:  # a run refused its lock writes nothing (the holder's run is live)
            why = str(exc)[:2000] if isinstance(exc, SparkguardError) else \
                f"runtime failure: {type(exc).__name__}: {str(exc)[:2000]}"
            restored = _restore_promoted(run, why)
            run.record("failed", error=why, restored=restored)
            with contextlib.suppress(Exception):
                run.stage_evidence(Stage("evidence", ""), "failed", why)
        raise
    finally:
        if run.holds_locks:
            run.release_locks()


def _restore_promoted(run: _Run, why: str) -> list[str]:
    """Restore every target this run promoted (multi-target all-or-nothing)."""
    restored = []
    for st in run.targets.values():
        if st.promoted_version is not None and not st.restored and st.rollback_version is not None:
            run.say(f"{st.spec.label}: restoring version {st.rollback_version} because: {why}")
            run.restore_target(st, why)
            restored.append(st.spec.label)
    return restored
