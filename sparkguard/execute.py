"""Evaluate the stage list against Spark and Delta: the backfill itself."""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib
import json
import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from sparkguard import delta_ops
from sparkguard.errors import (
    GateFailedError,
    GuardError,
    PlanError,
    SparkguardError,
    TargetMovedError,
)
from sparkguard.evidence import write_evidence
from sparkguard.faults import failpoint
from sparkguard.guard import blocking, static_findings, target_order
from sparkguard.guard import window_partitions as plan_partitions
from sparkguard.guard_live import live_findings
from sparkguard.ledger import Ledger, new_run_id
from sparkguard.notify import Notifier, notifiers_from_env, send_all
from sparkguard.plan.approvals import valid_approvals
from sparkguard.plan.fingerprint import fingerprint
from sparkguard.plan.model import BackfillPlan, Promotion, TargetSpec
from sparkguard.publish import PublishControl
from sparkguard.reconcile.engine import columns_of, reconcile, table_fingerprint
from sparkguard.reconcile.spec import schema_contract_gates, spec_for_target
from sparkguard.reconcile.verdicts import GateResult, ReconcileResult
from sparkguard.runner import RunOptions, Stage, build_stages, slices_of
from sparkguard.sql import TableRef, restore_statement, window_predicate

__all__ = ["RunOutcome", "run_backfill"]


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
    reconciled_version: int | None = None
    start_version: int | None = None  # target version when the run took its lock
    rollback_version: int | None = None
    promoted_version: int | None = None
    verified: bool = False
    restored: bool = False
    skipped_slices: list[int] = field(default_factory=list)


@dataclass
class RunOutcome:
    """The result the CLI turns into an exit code and a summary."""

    run_id: str
    exit_code: int
    message: str
    evidence_path: str | None = None
    targets: dict[str, TargetState] = field(default_factory=dict)


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
        self.ledger = Ledger(spark, home)
        self.publish = PublishControl(spark, home)
        self.notifiers = list(notifiers) if notifiers is not None else notifiers_from_env()
        self.run_id = ""
        self.resumed_state: str | None = None
        self.targets: dict[str, TargetState] = {}
        self.locked: list[str] = []
        self.holds_locks = False  # False: refused or not yet locked, so the ledger is not ours
        self.stage_log: list[dict[str, Any]] = []
        shadow_root = plan.execution.shadow_location or f"{home.rstrip('/')}/shadow"
        for t in target_order(plan):
            shadow = TableRef(path=f"{shadow_root.rstrip('/')}/{plan.name}/{self.fp[:12]}/{t.label}")
            self.targets[t.label] = TargetState(t, TableRef.parse(t.dataset), shadow)

    # -- helpers ------------------------------------------------------------------------------

    def say(self, msg: str) -> None:
        self.out(f"[{time.monotonic() - self.t0:7.1f}s] {msg}")

    def job(self, desc: str) -> None:
        """Label this thread's next Spark jobs: group ``sparkguard-<run id>``, ``desc`` per stage."""
        group = f"sparkguard-{self.run_id}" if self.run_id else f"sparkguard-plan-{self.plan.name}"
        _set_job_label(self.spark, group, desc)

    def notify(self, event: str, **payload: Any) -> None:
        send_all(self.notifiers, event, self.plan.safeguards.downstream_notifications,
                 {"run_id": self.run_id, "plan": self.plan.name, "fingerprint": self.fp, **payload})

    def source_df(self, partitions: Sequence[object]) -> DataFrame:
        if self.source_version is not None:
            df = delta_ops.read_version(self.spark, self.source_ref, self.source_version)
        else:
            df = delta_ops.read_table(self.spark, self.source_ref)
        return df.filter(window_predicate(self.p, self.ptype, list(partitions)))

    def pred(self, partitions: Sequence[object], alias: str | None = None) -> str:
        return window_predicate(self.p, self.ptype, list(partitions), alias)

    def transform(self, st: TargetState, partitions: Sequence[object], tag: str) -> DataFrame:
        tr = st.spec.transform
        src = self.source_df(partitions)
        if tr.callable:
            mod_name, fn_name = tr.callable.split(":")
            fn = getattr(importlib.import_module(mod_name), fn_name)
            df = fn(self.spark, src, list(partitions))
            if not isinstance(df, DataFrame):
                raise PlanError(self.plan_path, [])
            return df
        assert tr.sql is not None
        view = f"__sg_src_{re.sub(r'[^A-Za-z0-9]', '_', self.run_id)}_{tag}"
        src.createOrReplaceTempView(view)
        sql = tr.sql.replace("{source}", f"`{view}`").replace("{window}", self.pred(partitions))
        for label, other in self.targets.items():
            token = "{shadow:" + label + "}"
            if token in sql:
                assert other.shadow.path is not None
                oview = f"{view}_up_{label}"
                (self.spark.read.format("delta").load(other.shadow.path)
                 .filter(self.pred(partitions)).createOrReplaceTempView(oview))
                sql = sql.replace(token, f"`{oview}`")
        return self.spark.sql(sql)

    def shadow_df(self, st: TargetState, partitions: Sequence[object]) -> DataFrame:
        return delta_ops.read_table(self.spark, st.shadow).filter(self.pred(partitions))

    def target_df(self, st: TargetState, partitions: Sequence[object],
                  version: int | None = None) -> DataFrame:
        df = (delta_ops.read_version(self.spark, st.ref, version) if version is not None
              else delta_ops.read_table(self.spark, st.ref))
        return df.filter(self.pred(partitions))

    def reconcile_slice(self, st: TargetState, partitions: Sequence[object], scope: str
                        ) -> ReconcileResult:
        spec = spec_for_target(self.plan, st.spec)
        shadow = self.shadow_df(st, partitions)
        target = self.target_df(st, partitions)
        res = reconcile(spec, shadow=shadow, target=target, source=self.source_df(partitions),
                        partitions=list(partitions), scope=scope)
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
        if self.plan.execution.dry_run_completed and not self.options.dry_run:
            self.say("execution.dry_run_completed is a claim; the ledger is checked")

    def stage_lock(self, stage: Stage) -> None:
        self.job(f"plan {self.plan.name}: look up a resumable run")
        resumable = self.ledger.resumable_run(self.fp)
        if resumable is not None:
            self.run_id = resumable["run_id"]
            self.resumed_state = resumable["state"]
            events = self.ledger.run_events(self.run_id)
            for e in events:
                sv = e["details"].get("source_version")
                if sv is not None:
                    self.source_version = int(sv)
                for label, rb in (e["details"].get("rollback_versions") or {}).items():
                    if label in self.targets:
                        self.targets[label].rollback_version = int(rb)
                for label, sv0 in (e["details"].get("start_versions") or {}).items():
                    if label in self.targets:
                        self.targets[label].start_version = int(sv0)
            self.say(f"resuming run {self.run_id} (last state {self.resumed_state})")
        else:
            self.run_id = new_run_id()
        self.job(f"run {self.run_id}: lock targets, pin the source version, record the run")
        for label, st in self.targets.items():
            self.ledger.acquire(st.ref.display, self.run_id, self.plan.owner,
                                takeover=self.options.takeover_stale_lock,
                                stale_after_s=self.options.stale_lock_after_s)
            self.locked.append(st.ref.display)
            del label
        self.holds_locks = True
        if self.source_version is None and self.source_ref and delta_ops.table_exists(
                self.spark, self.source_ref):
            self.source_version = delta_ops.current_version(self.spark, self.source_ref)
        for st in self.targets.values():
            if st.start_version is None and delta_ops.table_exists(self.spark, st.ref):
                st.start_version = delta_ops.current_version(self.spark, st.ref)
        if resumable is None:
            self.ledger.record_run(
                self.run_id, "started", plan_name=self.plan.name, fingerprint=self.fp,
                owner=self.plan.owner, source_version=self.source_version,
                start_versions={label: st.start_version for label, st in self.targets.items()},
                plan_path=self.plan_path, dry_run=self.options.dry_run,
                approvals=[a.model_dump(mode="json") for a in valid_approvals(self.plan)])
        self.say(f"run {self.run_id}: plan {self.plan.name} fingerprint {self.fp[:12]}, source "
                 f"{self.source_ref.display} pinned at version {self.source_version}")
        failpoint("after_lock")

    def stage_pause(self, stage: Stage) -> None:
        self.job(f"run {self.run_id}: pause publish")
        for st in self.targets.values():
            self.publish.pause(st.ref.display, self.run_id, self.plan.owner,
                               f"backfill {self.plan.name}")
        self.ledger.record_run(self.run_id, "paused", fingerprint=self.fp)
        self.notify("publish_paused", targets=[s.ref.display for s in self.targets.values()])
        self.say(f"publish paused for {', '.join(s.ref.display for s in self.targets.values())}")
        failpoint("after_pause")

    def _write_slice(self, st: TargetState, partitions: Sequence[object], sid: int) -> None:
        self.job(f"run {self.run_id} target {st.spec.label} slice {sid}: shadow write")
        df = self.transform(st, partitions, f"{st.spec.label}_{sid}")
        delta_ops.write_partitions(
            df, st.shadow, self.pred(partitions), self.p,
            metadata=delta_ops.user_metadata(self.run_id, self.fp, "shadow_write", slice=sid))

    def _slice_key(self, partitions: Sequence[object]) -> str:
        return json.dumps([str(p) for p in partitions])

    def _done(self, st: TargetState) -> set[str]:
        return self.ledger.done_slices(self.fp, st.spec.label, self.source_version)

    def _gate_fail(self, st: TargetState, res: ReconcileResult, where: str) -> None:
        self.print_gates(st.spec.label, res)
        worst = res.failed[0]
        raise GateFailedError(f"{st.spec.label}: {where}: gate {worst.gate} failed: {worst.reason}")

    def stage_proof(self, stage: Stage) -> None:
        st = self.targets[stage.target or ""]
        parts = self.slices[0]
        t1 = time.monotonic()
        if self._slice_key(parts) in self._done(st):
            self.say(f"{st.spec.label}: proof slice already reconciled for this plan and source "
                     "version; skipped")
            st.skipped_slices.append(1)
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
        self.ledger.record_slice(self.run_id, self.fp, st.spec.label, 1,
                                 [str(p) for p in parts], "reconciled" if res.passed
                                 else "gate_failed", self.source_version, json.dumps(h1),
                                 gates=[g.to_dict() for g in res.gates])
        self.say(f"{st.spec.label}: proof slice {[str(p) for p in parts]}: {h1['rows']} rows, "
                 f"written twice with identical content hash; gates "
                 f"{'passed' if res.passed else 'FAILED'} ({time.monotonic() - t1:.1f}s)")
        if not res.passed:
            self._gate_fail(st, res, "proof slice")
        self.ledger.record_run(self.run_id, "proof_passed", fingerprint=self.fp)
        failpoint("after_proof")

    def run_slices(self, stages: list[Stage]) -> None:
        """Remaining slices, up to ``max_concurrent_slices`` at a time, target by target."""
        by_target: dict[str, list[Stage]] = {}
        for s in stages:
            by_target.setdefault(s.target or "", []).append(s)
        total = len(self.slices)
        for label, todo in by_target.items():
            st = self.targets[label]
            done = self._done(st)
            t_start = time.monotonic()
            finished = 0

            def one(stage: Stage, st: TargetState = st, done: set[str] = done,
                    label: str = label) -> ReconcileResult | None:
                parts = self.slices[(stage.slice_id or 1) - 1]
                if self._slice_key(parts) in done:
                    st.skipped_slices.append(stage.slice_id or 0)
                    return None
                self._write_slice(st, parts, stage.slice_id or 0)
                self.job(f"run {self.run_id} target {label} slice {stage.slice_id}: reconcile")
                res = self.reconcile_slice(st, parts, f"slice {stage.slice_id}")
                self.ledger.record_slice(
                    self.run_id, self.fp, label, stage.slice_id or 0, [str(p) for p in parts],
                    "reconciled" if res.passed else "gate_failed", self.source_version,
                    gates=[g.to_dict() for g in res.gates])
                return res

            workers = max(1, self.plan.execution.max_concurrent_slices)
            with ThreadPoolExecutor(max_workers=workers) as pool:
                for stage, res in zip(todo, pool.map(one, todo), strict=True):
                    finished += 1
                    elapsed = time.monotonic() - t_start
                    eta = elapsed / finished * (len(todo) - finished)
                    if res is None:
                        self.say(f"{label}: slice {stage.slice_id}/{total} already reconciled; "
                                 "skipped")
                        continue
                    st.slice_results.append(res)
                    tot = res.totals()
                    self.say(f"{label}: slice {stage.slice_id}/{total} {list(stage.partitions)}: "
                             f"{tot['rows_shadow']} rows, gates "
                             f"{'passed' if res.passed else 'FAILED'}; "
                             f"elapsed {elapsed:.1f}s, about {eta:.0f}s left")
                    if not res.passed:
                        self._gate_fail(st, res, f"slice {stage.slice_id}")
                    if finished == 1:
                        failpoint("mid_slices")
        self.ledger.record_run(self.run_id, "slices_done", fingerprint=self.fp)

    def stage_reconcile(self, stage: Stage) -> None:
        st = self.targets[stage.target or ""]
        self.job(f"run {self.run_id} target {st.spec.label}: full-window reconciliation")
        failpoint("mid_reconcile")
        st.reconciled_version = delta_ops.current_version(self.spark, st.ref)
        res = self.reconcile_slice(st, self.parts, "full window")
        st.window = res
        self.say(f"{st.spec.label}: full-window reconciliation over {len(self.parts)} partitions "
                 f"(target version {st.reconciled_version}):")
        self.print_gates(st.spec.label, res)
        if res.preview:
            pv = res.preview
            self.say(f"  change preview {st.spec.label}: insert {pv.inserted}, delete "
                     f"{pv.deleted}, change {pv.changed}, unchanged {pv.unchanged}; by column "
                     f"{ {k: v for k, v in pv.changed_by_column.items() if v} }")
        if not res.passed:
            self._gate_fail(st, res, "full window")
        self.ledger.record_run(self.run_id, "reconciled", fingerprint=self.fp,
                               target=st.ref.display, reconciled_version=st.reconciled_version)

    def stage_dry_run_stop(self, stage: Stage) -> None:
        self.job(f"run {self.run_id}: record the dry run")
        self.ledger.record_run(self.run_id, "dry_run_passed", fingerprint=self.fp)

    def stage_promote(self, stage: Stage) -> None:
        st = self.targets[stage.target or ""]
        label = st.spec.label
        promo_meta = delta_ops.user_metadata(self.run_id, self.fp, "promote", target=label)
        # Already promoted by this run before a crash? Find our commit by userMetadata.
        if st.rollback_version is not None:
            found = delta_ops.find_commit(self.spark, st.ref, self.run_id, "promote",
                                          st.rollback_version)
            if found is not None:
                st.promoted_version = found
                self.say(f"{label}: already promoted by this run at version {found} "
                         f"(found in the table history); not promoting again")
                # a crash may have come between the commit and its ledger row: record it
                self.ledger.record_run(self.run_id, "promoted", fingerprint=self.fp,
                                       target=st.ref.display, promoted_versions={label: found},
                                       found_in_history=True)
                self.notify("promoted", target=st.ref.display, version=found,
                            rollback_version=st.rollback_version)
                self._verify(st)
                return
        current = delta_ops.current_version(self.spark, st.ref)
        if st.reconciled_version is not None and current != st.reconciled_version:
            moved = delta_ops.commits_since(self.spark, st.ref, st.reconciled_version, 50)
            self.say(f"{label}: target moved since reconciliation ({len(moved)} commit(s)); "
                     "recomputing the window reconciliation and change preview")
            self.stage_reconcile(Stage("reconcile", "re-check", label))
            current = delta_ops.current_version(self.spark, st.ref)
        st.rollback_version = current
        self.ledger.record_run(self.run_id, "promoting", fingerprint=self.fp,
                               target=st.ref.display,
                               rollback_versions={label: current})
        failpoint("before_promote")
        shadow = self.shadow_df(st, self.parts)
        self.job(f"run {self.run_id} target {label}: promote")
        txn = (f"sparkguard-{self.run_id}-{label}", 1)

        def do_promote() -> None:
            self._check_window_unchanged(st)  # again on every retry after a conflict
            if st.spec.promotion is Promotion.REPLACE_WHERE:
                delta_ops.promote_replace_where(shadow, st.ref, self.pred(self.parts),
                                                promo_meta, txn)
            else:
                delta_ops.promote_merge(
                    self.spark, shadow, st.ref, st.spec.business_keys,
                    self.pred(self.parts, "t"),
                    st.spec.merge.when_not_matched_by_source == "delete", promo_meta)

        delta_ops.with_conflict_retry(do_promote, log=self.say)
        failpoint("after_promote_commit")
        found = delta_ops.find_commit(self.spark, st.ref, self.run_id, "promote", current)
        if found is None:
            raise SparkguardError(f"{label}: promotion commit not found in the table history")
        st.promoted_version = found
        self.ledger.record_run(self.run_id, "promoted", fingerprint=self.fp,
                               target=st.ref.display,
                               promoted_versions={label: found})
        self.notify("promoted", target=st.ref.display, version=found,
                    rollback_version=current)
        failpoint("after_promote_ledger")
        self._verify(st)

    def _check_window_unchanged(self, st: TargetState) -> None:
        """Refuse to promote over rows another writer put in the window during the run.

        The promotion replaces the whole window, so rows committed there by someone else
        since the run took its lock would be silently lost; stop instead (target untouched,
        publish stays paused). Writes outside the window are fine and survive promotion.
        """
        if st.start_version is None:
            return
        now = delta_ops.current_version(self.spark, st.ref)
        if now == st.start_version:
            return
        before = table_fingerprint(self.target_df(st, self.parts, st.start_version))
        after = table_fingerprint(self.target_df(st, self.parts, now))
        if before != after:
            raise TargetMovedError(
                f"{st.spec.label}: another writer changed the window of {st.ref.display} during "
                f"the run (version {st.start_version} -> {now}; window rows {before['rows']} -> "
                f"{after['rows']}); promoting would overwrite its rows, so nothing was promoted "
                "and publish stays paused. Re-run once that writer has finished: the new run "
                "reconciles against the target as it is then")

    def _verify(self, st: TargetState) -> None:
        label = st.spec.label
        assert st.promoted_version is not None and st.rollback_version is not None
        self.job(f"run {self.run_id} target {label}: verify promotion")
        shadow_h = table_fingerprint(self.shadow_df(st, self.parts))
        target_h = table_fingerprint(self.target_df(st, self.parts, st.promoted_version))
        keep = (st.spec.promotion is Promotion.MERGE
                and st.spec.merge.when_not_matched_by_source == "keep")
        ok = shadow_h == target_h
        if keep and not ok:
            spec = spec_for_target(self.plan, st.spec)
            res = reconcile(spec, shadow=self.shadow_df(st, self.parts),
                            target=self.target_df(st, self.parts, st.promoted_version),
                            partitions=self.parts, scope="verification")
            ok = res.preview is not None and res.preview.inserted == 0 and \
                res.preview.changed == 0
        if not ok:
            self.say(f"{label}: VERIFICATION FAILED (target window {target_h} != shadow "
                     f"{shadow_h}); restoring version {st.rollback_version} now")
            self.restore_target(st, "verification failed")
            raise GateFailedError(f"{label}: promoted content does not equal the shadow; target "
                                  f"restored to version {st.rollback_version}")
        st.verified = True
        self.ledger.record_run(self.run_id, "verified", fingerprint=self.fp,
                               target=st.ref.display, verified={label: st.promoted_version})
        self.say(f"{label}: promoted at version {st.promoted_version} and verified "
                 f"({target_h['rows']} rows in the window equal the shadow)")
        failpoint("after_verify")

    def restore_target(self, st: TargetState, why: str) -> None:
        assert st.rollback_version is not None
        self.job(f"run {self.run_id} target {st.spec.label}: restore version {st.rollback_version}")
        delta_ops.restore(self.spark, st.ref, st.rollback_version,
                          delta_ops.user_metadata(self.run_id, self.fp, "restore", reason=why))
        st.restored = True
        self.ledger.record_run(self.run_id, "restored_after_failure", fingerprint=self.fp,
                               target=st.ref.display, reason=why,
                               restored_to={st.spec.label: st.rollback_version})
        self.notify("rolled_back", target=st.ref.display, version=st.rollback_version, reason=why)

    def stage_evidence(self, stage: Stage, outcome: str, error: str | None = None) -> str:
        path = write_evidence(self, outcome, error)
        self.say(f"evidence written to {path}")
        return path

    def stage_resume(self, stage: Stage) -> None:
        failpoint("before_publish_resume")
        self.job(f"run {self.run_id}: reopen publish")
        for st in self.targets.values():
            self.publish.resume(st.ref.display, self.run_id, self.plan.owner,
                                f"backfill {self.plan.name} promoted and verified")
        failpoint("mid_publish_resume")
        self.notify("publish_resumed", targets=[s.ref.display for s in self.targets.values()])
        self.ledger.record_run(self.run_id, "done", fingerprint=self.fp)
        self.say("publish reopened")
        failpoint("before_lock_release")

    def release_locks(self) -> None:
        self.job(f"run {self.run_id}: release locks")
        for t in self.locked:
            self.ledger.release(t, self.run_id)


def _short(v: Any) -> str:
    s = str(v)
    return s if len(s) <= 40 else s[:37] + "..."


_JOB_LABELS = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")


def _set_job_label(spark: SparkSession, group: str, desc: str) -> None:
    with contextlib.suppress(Exception):  # Spark Connect has no SparkContext
        spark.sparkContext.setJobGroup(group, desc, False)


def _job_labels(spark: SparkSession) -> dict[str, str | None]:
    with contextlib.suppress(Exception):
        return {k: spark.sparkContext.getLocalProperty(k) for k in _JOB_LABELS}
    return {}


def _restore_job_labels(spark: SparkSession, labels: dict[str, str | None]) -> None:
    with contextlib.suppress(Exception):
        for key, value in labels.items():
            spark.sparkContext.setLocalProperty(key, value)  # type: ignore[arg-type]  # None unsets


def run_backfill(spark: SparkSession, plan: BackfillPlan, plan_path: str, *, home: str,
                 evidence_dir: str, options: RunOptions | None = None,
                 out: Callable[[str], None] = print,
                 notifiers: Sequence[Notifier] | None = None) -> RunOutcome:
    """Run every stage of the plan; map the end state to an exit code (0, 1, 3).

    Plan and guard errors (exit 2) propagate before anything is written. Every Spark job of the
    run carries the job group ``sparkguard-<run id>`` (``sparkguard-plan-<name>`` before the run
    id is known) and a description naming the stage; the caller's labels are restored after.
    """
    saved = _job_labels(spark)
    _set_job_label(spark, f"sparkguard-plan-{plan.name}", f"plan {plan.name}: open the ledger")
    try:
        return _run_backfill(spark, plan, plan_path, home=home, evidence_dir=evidence_dir,
                             options=options, out=out, notifiers=notifiers)
    finally:
        _restore_job_labels(spark, saved)


def _run_backfill(spark: SparkSession, plan: BackfillPlan, plan_path: str, *, home: str,
                  evidence_dir: str, options: RunOptions | None,
                  out: Callable[[str], None], notifiers: Sequence[Notifier] | None) -> RunOutcome:
    options = options or RunOptions()
    run = _Run(spark, plan, plan_path, home, evidence_dir, options, out, notifiers)
    stages = build_stages(plan, options)
    run.stage_guard(stages[0])
    failpoint("after_guard")
    evidence_path: str | None = None
    try:
        run.stage_lock(stages[1])
        run.stage_pause(stages[2])
        slice_stages = [s for s in stages if s.kind == "slice"]
        for s in stages[3:]:
            if s.kind == "proof":
                run.stage_proof(s)
            elif s.kind == "slice":
                if slice_stages:
                    run.run_slices(slice_stages)
                    slice_stages = []
            elif s.kind == "reconcile":
                run.stage_reconcile(s)
            elif s.kind == "dry_run_stop":
                run.stage_dry_run_stop(s)
                evidence_path = run.stage_evidence(s, "dry_run_passed")
                for st in run.targets.values():
                    run.publish.resume(st.ref.display, run.run_id, plan.owner,
                                       "dry run finished; target untouched")
                run.notify("dry_run_passed")
                return RunOutcome(run.run_id, 0, "dry run passed: every gate passed, target "
                                  "untouched", evidence_path, run.targets)
            elif s.kind == "promote":
                run.stage_promote(s)
            elif s.kind == "evidence":
                evidence_path = run.stage_evidence(s, "promoted")
            elif s.kind == "resume":
                run.stage_resume(s)
        return RunOutcome(run.run_id, 0, "promoted and verified", evidence_path, run.targets)
    except (GateFailedError, TargetMovedError) as exc:
        restored = _restore_promoted(run, str(exc))
        run.ledger.record_run(run.run_id, "gate_failed", fingerprint=run.fp, error=str(exc),
                              restored=restored)
        run.notify("gate_failed", error=str(exc))
        evidence_path = run.stage_evidence(Stage("evidence", ""), "gate_failed", str(exc))
        run.say(f"GATE FAILED: {exc}. Target unchanged{' (restored)' if restored else ''}; "
                "publish stays paused.")
        return RunOutcome(run.run_id, 1, str(exc), evidence_path, run.targets)
    except (PlanError, SparkguardError) as exc:
        if run.holds_locks:  # a run refused its lock writes nothing (the holder's run is live)
            run.ledger.record_run(run.run_id, "failed", fingerprint=run.fp, error=str(exc))
        raise
    except Exception as exc:
        if run.holds_locks:
            restored = _restore_promoted(run, f"runtime failure: {exc}")
            run.ledger.record_run(run.run_id, "failed", fingerprint=run.fp,
                                  error=str(exc)[:2000], restored=restored)
            with contextlib.suppress(Exception):
                run.stage_evidence(Stage("evidence", ""), "failed", str(exc)[:2000])
        raise
    finally:
        if run.run_id:
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


def restore_sql(ref: TableRef, version: int) -> str:
    return restore_statement(ref, version)


def now_utc() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def evidence_file(evidence_dir: str, run_id: str) -> Path:
    return Path(evidence_dir) / f"{run_id}.yaml"
