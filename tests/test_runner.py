"""The stage list (pure): order, proof first, dry run stops before promotion and leaves
publish alone, slices and concurrency from the plan."""

from __future__ import annotations

from typing import Any

from sparkguard.plan.model import PlanDocument
from sparkguard.runner import RunOptions, Stage, build_stages, explain, slices_of, stage_line
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
    assert kinds == ["guard", "lock", "pause", "proof", "slice", "slice", "reconcile", "promote",
                     "evidence", "resume"]


def test_dry_run_stops_after_reconciliation_and_never_pauses_publish() -> None:
    kinds = [s.kind for s in build_stages(_plan(), RunOptions(dry_run=True))]
    assert kinds == ["guard", "lock", "proof", "slice", "slice", "reconcile", "dry_run_stop"]


def test_slice_size_and_concurrency_come_from_the_plan() -> None:
    def mutate(p: dict[str, Any]) -> None:
        p["execution"]["slice_partitions"] = 2
        p["execution"]["max_concurrent_slices"] = 3

    stages = build_stages(_plan(mutate), RunOptions())
    proof = [s for s in stages if s.kind == "proof"]
    slices = [s for s in stages if s.kind == "slice"]
    assert [p.partitions for p in proof] == [(str(WINDOW[0]), str(WINDOW[1]))]
    assert [(s.slice_id, s.partitions) for s in slices] == [(2, (str(WINDOW[2]),))]
    assert "up to 3 at once" in slices[0].detail


def test_cautious_defaults_one_partition_per_slice_one_at_a_time() -> None:
    def mutate(p: dict[str, Any]) -> None:
        del p["execution"]["slice_partitions"], p["execution"]["max_concurrent_slices"]

    plan = _plan(mutate)
    assert plan.execution.slice_partitions == 1
    assert plan.execution.max_concurrent_slices == 1
    assert len([s for s in build_stages(plan, RunOptions()) if s.kind == "slice"]) == 2


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
    assert len(lines) == 10
    assert lines[0].startswith(" 1. guard")
    assert "[2026-05-03]" in lines[3]  # the proof slice names its partition


def test_stage_line_estimates_what_is_left_from_finished_stages() -> None:
    st = Stage("promote", "one commit")
    assert stage_line(1, 8, st, 0.0, 0) == "stage 1/8 promote: one commit (elapsed 0.0s)"
    # 4 stages took 20 s: 5 s each, 4 stages still to run (this one included)
    assert stage_line(5, 8, st, 20.0, 4) == \
        "stage 5/8 promote: one commit (elapsed 20.0s, about 20s left)"
