"""The stage list (pure): order, proof first, dry run stops before promotion and leaves
publish alone, slices, waves and concurrency from the plan, auto slicing from row counts."""

from __future__ import annotations

from typing import Any

from sparkguard.plan.model import PlanDocument
from sparkguard.plan.window import plan_slices, slices_of, waves_of
from sparkguard.run.stages import Promote, RunOptions, build_stages, explain, stage_line
from tests.lakes import WINDOW, demo_plan


def _plan(mutate: Any = None) -> Any:
    from pathlib import Path

    data = demo_plan(Path("/lake"), WINDOW)
    if mutate:
        mutate(data["backfill_plan"])
    return PlanDocument.model_validate(data).backfill_plan


def test_slices_of_splits_in_order_and_keeps_the_remainder() -> None:
    assert slices_of([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]
    assert slices_of([1, 2], 5) == [[1, 2]]


def test_stage_order_real_run() -> None:
    kinds = [s.kind for s in build_stages(_plan(), RunOptions())]
    assert kinds == ["guard", "lock", "pause", "proof", "wave", "reconcile", "promote",
                     "evidence", "resume"]


def test_dry_run_stops_after_reconciliation_and_never_pauses_publish() -> None:
    kinds = [s.kind for s in build_stages(_plan(), RunOptions(dry_run=True))]
    assert kinds == ["guard", "lock", "proof", "wave", "reconcile", "dry_run_stop"]


def test_slice_size_and_concurrency_come_from_the_plan() -> None:
    def mutate(p: dict[str, Any]) -> None:
        p["execution"]["slice_partitions"] = 2
        p["execution"]["max_concurrent_slices"] = 3

    stages = build_stages(_plan(mutate), RunOptions())
    proof = [s for s in stages if s.kind == "proof"]
    slices = [s for s in stages if s.kind == "wave"]
    assert [p.partitions for p in proof] == [(str(WINDOW[0]), str(WINDOW[1]))]
    assert [(s.slice_id, s.partitions) for s in slices] == [(2, (str(WINDOW[2]),))]
    assert "up to 3 at once" in slices[0].detail


def test_defaults_auto_slices_one_at_a_time() -> None:
    def mutate(p: dict[str, Any]) -> None:
        del p["execution"]["slice_partitions"], p["execution"]["max_concurrent_slices"]

    plan = _plan(mutate)
    assert plan.execution.slice_partitions == "auto"
    assert plan.execution.max_concurrent_slices == 1
    waves = [s for s in build_stages(plan, RunOptions()) if s.kind == "wave"]
    # auto: the proof is the first partition; the rest is one slice, one wave
    assert [(w.slice_ids, w.partitions) for w in waves] == \
        [((2,), tuple(str(d) for d in WINDOW[1:]))]


def test_explicit_one_partition_slices_share_one_wave() -> None:
    def mutate(p: dict[str, Any]) -> None:
        p["execution"]["slice_partitions"] = 1

    waves = [s for s in build_stages(_plan(mutate), RunOptions()) if s.kind == "wave"]
    assert [(w.slice_ids, w.last) for w in waves] == [((2, 3), True)]
    assert "gated by the full-window reconciliation" in waves[0].detail


def test_auto_slices_follow_row_counts_and_keep_the_proof_small() -> None:
    parts: list[object] = [f"p{i}" for i in range(10)]
    rows = {f"p{i}": 400 for i in range(10)}
    assert plan_slices(parts, "auto", rows, rows_per_slice=1000) == [
        ["p0"], ["p1", "p2"], ["p3", "p4"], ["p5", "p6"], ["p7", "p8"], ["p9"]]
    # a partition bigger than the target is a slice of its own, never split or dropped
    rows["p3"] = 5000
    assert plan_slices(parts, "auto", rows, rows_per_slice=1000)[1:3] == [["p1", "p2"], ["p3"]]
    # no counts (--explain before Spark): proof + one slice
    assert plan_slices(parts, "auto") == [["p0"], parts[1:]]
    # explicit numbers keep their meaning
    assert plan_slices(parts, 4) == slices_of(parts, 4)


def test_waves_bound_rows_and_slices() -> None:
    slices: list[list[object]] = [[f"p{i}"] for i in range(8)]
    rows = {f"p{i}": 100 for i in range(8)}
    assert waves_of(slices, rows, max_rows=300) == [[1, 2, 3], [4, 5, 6], [7]]
    assert waves_of(slices, rows, max_rows=10**9, max_slices=2) == [[1, 2], [3, 4], [5, 6], [7]]
    rows["p2"] = 10**6  # a slice over the bound is a wave of its own
    assert waves_of(slices, rows, max_rows=300) == [[1], [2], [3, 4, 5], [6, 7]]


def test_two_targets_proofs_first_then_slices_then_promotion_in_dependency_order() -> None:
    def mutate(p: dict[str, Any]) -> None:
        first = dict(p["targets"][0])
        second = dict(first, name="orders_daily", dataset="/lake/target/orders_daily",
                      depends_on=["orders_clean"], business_keys=["order_date"],
                      transform={"sql": "SELECT order_date, SUM(amount) AS amount "
                                 "FROM {shadow:orders_clean} GROUP BY order_date"})
        p["targets"] = [second, first]  # listed out of order on purpose

    stages = build_stages(_plan(mutate), RunOptions())
    seq = [(s.kind, s.target) for s in stages if s.target]
    assert seq[:2] == [("proof", "orders_clean"), ("proof", "orders_daily")]
    promotes = [t for k, t in seq if k == "promote"]
    assert promotes == ["orders_clean", "orders_daily"]
    assert seq.index(("reconcile", "orders_daily")) < seq.index(("promote", "orders_clean"))


def test_explain_numbers_every_stage() -> None:
    text = explain(build_stages(_plan(), RunOptions()))
    lines = text.splitlines()
    assert len(lines) == 9
    assert lines[0].startswith(" 1. guard")
    assert "[2026-05-03]" in lines[3]  # the proof slice names its partition


def test_stage_line_estimates_what_is_left_from_the_measured_cost_per_row() -> None:
    from sparkguard.run.stages import estimate_left

    st = Promote("one commit")
    assert stage_line(1, 8, st, 0.0) == "stage 1/8 promote: one commit (elapsed 0.0s)"
    assert estimate_left(0.0, 0, 10_000) is None  # nothing measured yet: no guess
    # 10 s of slice work covered 5,000 rows; 2,000 rows still to write and reconcile
    left = estimate_left(10.0, 5_000, 2_000)
    assert stage_line(5, 8, st, 20.0, left) == \
        "stage 5/8 promote: one commit (elapsed 20.0s, about 4s left)"
