"""Run commands: ``run`` (or ``--explain`` it) and ``rollback``."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from sparkguard.commands import common
from sparkguard.errors import EXIT_OK, EXIT_USAGE, PlanError, PlanProblem
from sparkguard.sql import UnsafeSQLError

__all__ = ["cmd_rollback", "cmd_run"]


def cmd_run(args: argparse.Namespace) -> int:
    """``sparkguard run --plan PLAN``: explain, or guard and run the backfill."""
    from sparkguard.guard import blocking, static_findings
    from sparkguard.plan import load_plan
    from sparkguard.run.stages import RunOptions, build_stages, explain

    plan = load_plan(args.plan)
    opts = RunOptions(dry_run=args.dry_run, takeover_stale_lock=args.takeover_stale_lock,
                      stale_lock_after_s=args.stale_lock_timeout, explain=args.explain)
    findings = static_findings(plan)
    if args.explain:  # any plan that loads, approved or not; nothing is read or written
        try:
            stages = build_stages(plan, opts)
        except UnsafeSQLError as exc:  # a window that cannot be written (the static rules say why)
            raise PlanError(args.plan, [f.as_problem() for f in blocking(findings)] or [
                PlanProblem("backfill_plan.affected_window", str(exc),
                            fix="write the window's partitions as values of their type")]) from exc
        print(explain(stages))
        for f in blocking(findings):
            print(f"not runnable yet: {f.render(args.plan)}")
        return EXIT_OK
    if blocking(findings):
        raise PlanError(args.plan, [f.as_problem() for f in blocking(findings)])
    from sparkguard.run.evaluator import run_backfill

    evidence = common.writable_evidence_dir(args)
    spark = common.session()
    home = common.home(args, spark)
    outcome = run_backfill(spark, plan, args.plan, home=home,
                           evidence_dir=evidence,
                           options=opts)
    print(f"sparkguard: {outcome.message} (run {outcome.run_id}, exit {outcome.exit_code})")
    for label, st in outcome.targets.items():
        if st.promoted_version is not None and not st.restored:
            from sparkguard.sql import restore_statement

            assert st.rollback_version is not None
            print(f"  {label}: promoted version {st.promoted_version}; rollback point "
                  f"{st.rollback_version}")
            print(f"  roll back with: spark-submit jobs/rollback.py --run-id {outcome.run_id} "
                  f"--home {shlex.quote(str(home))}")
            print(f"     or in SQL:   {restore_statement(st.ref, st.rollback_version)}")
    if outcome.evidence_path:
        print(f"  evidence: {outcome.evidence_path}")
    return outcome.exit_code


def cmd_rollback(args: argparse.Namespace) -> int:
    """``sparkguard rollback``: restore a run's targets to their recorded versions."""
    from sparkguard.rollback import Takeover, rollback_run

    run_id = args.run_id
    home = common.checked_home(args.home, "--home") if args.home else None
    if args.evidence:
        from sparkguard.evidence import evidence_home, load_evidence

        data = load_evidence(args.evidence)
        run_id = run_id or data["sparkguard"]["run_id"]
        recorded = evidence_home(data)
        if not home and recorded:
            home = common.checked_home(recorded, f"the home {args.evidence} records")
    if not run_id:
        print("sparkguard rollback: give --run-id or --evidence", file=sys.stderr)
        return EXIT_USAGE
    if args.plan and not Path(args.plan).is_file():
        print(f"sparkguard rollback: --plan {args.plan}: plan file not found (it locates the "
              "home, <plan dir>/_sparkguard, as for run)", file=sys.stderr)
        return EXIT_USAGE
    if args.abandon is not None and (not args.abandon.strip() or args.force):
        print("sparkguard rollback: --abandon needs a reason (the evidence and the ledger keep "
              "it), and no --force: it restores nothing", file=sys.stderr)
        return EXIT_USAGE
    takeover = Takeover(args.stale_lock_timeout) if args.takeover_stale_lock else None
    spark = common.session()
    if args.abandon is not None:
        from sparkguard.rollback import abandon_rollback

        abandon_rollback(spark, home or common.home(args, spark), run_id, args.abandon.strip(),
                         takeover=takeover)
        return EXIT_OK
    points = rollback_run(spark, home or common.home(args, spark), run_id, force=args.force,
                          takeover=takeover)
    print(f"rolled back run {run_id}: " + ", ".join(
        f"{p.dataset} at version {p.rollback_version}'s content (new version {p.new_version})"
        for p in points if p.new_version is not None))
    return EXIT_OK
