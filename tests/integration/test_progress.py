"""Progress a person can follow: one line per slice with counts, elapsed time and what is left,
and every Spark job of a run labelled (job group + description) so the Spark UI shows the run,
slice and stage."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from sparkguard.chart import chart_available
from sparkguard.demo import generate_lake
from sparkguard.evidence import load_evidence
from sparkguard.plan import load_plan
from sparkguard.run.evaluator import run_backfill
from tests.unit.test_evidence import TEMPLATE, key_paths

ROWS_PER_DAY = 50
CALLER_GROUP = "caller-of-sparkguard"


def _jobs_since(spark: Any, first_job_id: int) -> list[tuple[int, str | None, str | None]]:
    """(job id, job group, description) of every job from ``first_job_id`` on, read from the
    application status store (what the Spark UI shows)."""
    jobs = spark.sparkContext._jsc.sc().statusStore().jobsList(None)
    found = []
    for i in range(jobs.size()):
        job = jobs.apply(i)
        if job.jobId() < first_job_id:
            continue
        group, desc = job.jobGroup(), job.description()
        found.append((job.jobId(), group.get() if group.isDefined() else None,
                      desc.get() if desc.isDefined() else None))
    return sorted(found)


def _next_job_id(spark: Any) -> int:
    spark.range(1).count()
    tracker = spark.sparkContext.statusTracker()
    return max(tracker.getJobIdsForGroup(None)) + 1


def test_run_labels_every_spark_job_and_prints_progress(spark: Any, lake: Path) -> None:
    plan_path = generate_lake(spark, lake, days=3, rows_per_day=ROWS_PER_DAY, window_start=1,
                              window_days=2)
    plan = load_plan(plan_path)
    lines: list[str] = []
    first = _next_job_id(spark)
    spark.sparkContext.setJobGroup(CALLER_GROUP, "the caller's own work", False)
    try:
        outcome = run_backfill(spark, plan, str(plan_path), home=str(lake / "_sg"),
                               evidence_dir=str(lake / "evidence"), out=lines.append)
        # the caller's labels are back for its next jobs
        assert spark.sparkContext.getLocalProperty("spark.jobGroup.id") == CALLER_GROUP
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
        spark.sparkContext.setLocalProperty("spark.job.description", None)
    assert outcome.exit_code == 0, outcome.message

    run_group = f"sparkguard-{outcome.run_id}"
    jobs = _jobs_since(spark, first)
    assert jobs, "no Spark job recorded"
    tracker = spark.sparkContext.statusTracker()
    assert sorted(tracker.getJobIdsForGroup(run_group)) == [j for j, g, _ in jobs if g == run_group]
    unlabelled = [(j, g, d) for j, g, d in jobs
                  if g not in (run_group, f"sparkguard-plan-{plan.name}") or not d]
    assert unlabelled == [], "Spark jobs of the run without a sparkguard job group/description"
    descriptions = {d for _, g, d in jobs if g == run_group}
    assert all(outcome.run_id in d for d in descriptions if d)
    for stage in ("slice 1: shadow write", "slice 1: reconcile", "wave 1 slice 2: shadow write",
                  "full-window reconciliation", "promote",
                  "verify promotion", "pause publish", "reopen publish"):
        assert any(stage in d for d in descriptions if d), f"no job described as {stage!r}"

    # progress: the proof slice and every further slice on one line each, with counts
    proof = [ln for ln in lines if "proof slice ['2026-05-02']" in ln]
    assert len(proof) == 1 and f"{ROWS_PER_DAY} rows" in proof[0]
    # the last wave is gated by the full-window reconciliation that follows it at once
    slices = [m for ln in lines if (m := re.search(
        r"wave (\d+) slices (\d+)-(\d+)/(\d+) \((\d+) partitions, 1 commit\(s\)\): (\d+) rows, "
        r"gates with the full window; elapsed (\d+\.\d)s, about (\d+)s left$", ln))]
    assert [tuple(int(g) for g in m.groups()[:6]) for m in slices] == \
        [(1, 2, 2, 2, 1, ROWS_PER_DAY)]
    assert all(re.match(r"^\[\s*\d+\.\ds\] ", ln) for ln in lines), "line without elapsed time"
    # one line per stage as it starts, in order; an estimate once slice work has been measured
    # (cost per source row of the writes and reconciliations so far), never a guess before
    stages = [m for ln in lines if (m := re.search(
        r"stage (\d+)/(\d+) (\w+): .*\(elapsed (\d+\.\d)s(, about (\d+)s left)?\)$", ln))]
    assert [m.group(3) for m in stages] == ["lock", "pause", "proof", "wave", "reconcile",
                                            "promote", "evidence", "resume"]
    assert [int(m.group(1)) for m in stages] == list(range(2, 10))
    assert {m.group(2) for m in stages} == {"9"}
    assert [m.group(5) is not None for m in stages] == [False] * 4 + [True] * 4

    # evidence of the real run: YAML with every documented field, Markdown linking the chart
    assert outcome.evidence_path is not None
    evidence = Path(outcome.evidence_path)
    data = load_evidence(evidence)
    assert not key_paths(yaml.safe_load(TEMPLATE.read_text())) - key_paths(data)
    md = evidence.with_suffix(".md").read_text()
    if chart_available():
        png = evidence.with_suffix(".png")
        assert data["sparkguard"]["chart"] == png.name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({png.name})" in md
