"""``sparkguard`` command line: one ``main(argv) -> int`` that maps errors to exit codes.

Exit codes: 0 success; 1 a gate or verification failed (target unchanged or restored);
2 plan, usage or lock error (nothing written); 3 runtime failure.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from sparkguard.errors import (
    EXIT_OK,
    EXIT_RUNTIME,
    EXIT_USAGE,
    PlanError,
    SparkguardError,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from sparkguard.state_read import StateReader

__all__ = ["main"]

T = TypeVar("T")


def _session() -> SparkSession:
    from sparkguard.compat import set_log_level
    from sparkguard.session import get_or_create_session

    spark = get_or_create_session("sparkguard")
    set_log_level(spark, os.environ.get("SPARKGUARD_SPARK_LOG_LEVEL", "ERROR"))
    return spark


HOME_CONF = "spark.sparkguard.home"


def _home(args: argparse.Namespace, spark: SparkSession | None = None) -> str:
    """sparkguard's home (ledger, publish control, shadows): ``--home``, else the Spark conf
    ``spark.sparkguard.home`` (cluster or Databricks job conf), else ``$SPARKGUARD_HOME``,
    else ``<plan dir>/_sparkguard`` (or ``./_sparkguard`` without a plan)."""
    if getattr(args, "home", None):
        return str(args.home)
    if spark is not None:
        conf = spark.conf.get(HOME_CONF, None)
        if conf:
            return str(conf)
    if os.environ.get("SPARKGUARD_HOME"):
        return os.environ["SPARKGUARD_HOME"]
    plan = getattr(args, "plan", None)
    base = Path(plan).resolve().parent if plan else Path.cwd()
    return str(base / "_sparkguard")


def _evidence_dir(args: argparse.Namespace) -> str:
    if getattr(args, "evidence_dir", None):
        return str(args.evidence_dir)
    plan = getattr(args, "plan", None)
    base = Path(plan).resolve().parent if plan else Path.cwd()
    return str(base / "evidence")


def _cmd_guard(args: argparse.Namespace) -> int:
    from sparkguard import guard
    from sparkguard.plan import fingerprint, load_plan

    plan = load_plan(args.plan)
    notice = guard.draft_notice(plan)
    if notice:
        print(f"{args.plan}: {notice}")
    pre = args.pre_approval
    findings = guard.pre_approval_findings(plan) if pre else guard.static_findings(plan)
    live = guard.live_checks_possible(findings) if pre else not guard.blocking(findings)
    if live and not args.static_only:
        from sparkguard.guard_live import live_findings

        findings += live_findings(_session(), plan)
    print(guard.render_findings(findings, args.plan, pre) or "no findings")
    blocks = guard.blocking(findings)
    fill = guard.to_fill(findings) if pre else []
    counts = f"{len(blocks)} blocking finding(s)"
    if fill:
        print(f"still to fill in ({len(fill)}): " + ", ".join(f.path for f in fill))
        counts = (f"{len(fill)} field(s) still to fill in, {len(blocks) - len(fill)} other "
                  "blocking finding(s)")
    print(f"plan fingerprint {fingerprint(plan)}; {counts}, {len(findings) - len(blocks)} "
          "other(s)")
    return EXIT_USAGE if blocks else EXIT_OK


def _cmd_approve(args: argparse.Namespace) -> int:
    from sparkguard.approve import record_approval

    rec = record_approval(args.plan, args.role, args.by)
    print(f"approved: role {rec.role} by {rec.by} at {rec.at.isoformat()} for fingerprint "
          f"{rec.fingerprint}")
    return EXIT_OK


def _cmd_run(args: argparse.Namespace) -> int:
    from sparkguard.guard import blocking, static_findings
    from sparkguard.plan import load_plan
    from sparkguard.run.stages import RunOptions, build_stages, explain

    plan = load_plan(args.plan)
    opts = RunOptions(dry_run=args.dry_run, takeover_stale_lock=args.takeover_stale_lock,
                      stale_lock_after_s=args.stale_lock_timeout, explain=args.explain)
    findings = static_findings(plan)
    if args.explain:  # any plan that loads, approved or not; nothing is read or written
        print(explain(build_stages(plan, opts)))
        for f in blocking(findings):
            print(f"not runnable yet: {f.render(args.plan)}")
        return EXIT_OK
    if blocking(findings):
        raise PlanError(args.plan, [f.as_problem() for f in blocking(findings)])
    from sparkguard.run.evaluator import run_backfill

    spark = _session()
    home = _home(args, spark)
    outcome = run_backfill(spark, plan, args.plan, home=home, evidence_dir=_evidence_dir(args),
                           options=opts)
    print(f"sparkguard: {outcome.message} (run {outcome.run_id}, exit {outcome.exit_code})")
    for label, st in outcome.targets.items():
        if st.promoted_version is not None and not st.restored:
            from sparkguard.sql import restore_statement

            assert st.rollback_version is not None
            print(f"  {label}: promoted version {st.promoted_version}; rollback point "
                  f"{st.rollback_version}")
            print(f"  roll back with: spark-submit jobs/rollback.py --run-id {outcome.run_id} "
                  f"--home {home}")
            print(f"     or in SQL:   {restore_statement(st.ref, st.rollback_version)}")
    if outcome.evidence_path:
        print(f"  evidence: {outcome.evidence_path}")
    return outcome.exit_code


def _cmd_rollback(args: argparse.Namespace) -> int:
    from sparkguard.rollback import rollback_run

    run_id, home = args.run_id, args.home
    if args.evidence:
        from sparkguard.evidence import load_evidence

        ev = load_evidence(args.evidence)["sparkguard"]
        run_id = run_id or ev["run_id"]
        if not home:
            cmd = next((t["rollback_point"]["rollback_command"] for t in ev["targets"]
                        if t["rollback_point"].get("rollback_command")), "")
            if "--home " in cmd:
                home = cmd.split("--home ", 1)[1].split()[0]
    if not run_id:
        print("sparkguard rollback: give --run-id or --evidence", file=sys.stderr)
        return EXIT_USAGE
    if args.plan and not Path(args.plan).is_file():
        print(f"sparkguard rollback: --plan {args.plan}: plan file not found (it locates the "
              "home, <plan dir>/_sparkguard, as for run)", file=sys.stderr)
        return EXIT_USAGE
    spark = _session()
    points = rollback_run(spark, home or _home(args, spark), run_id, force=args.force)
    print(f"rolled back run {run_id}: " + ", ".join(
        f"{p.dataset} at version {p.rollback_version}'s content (new version {p.new_version})"
        for p in points if p.new_version is not None))
    return EXIT_OK


def _spark_if_configured(args: argparse.Namespace) -> SparkSession | None:
    """The session, only where its conf may name the home: no ``--home`` or
    ``$SPARKGUARD_HOME`` and a Spark already there (Databricks, spark-submit's driver, an active
    session in this process). Elsewhere read-only commands start no JVM."""
    if getattr(args, "home", None) or os.environ.get("SPARKGUARD_HOME"):
        return None
    if os.environ.get("DATABRICKS_RUNTIME_VERSION") or os.environ.get("PYSPARK_GATEWAY_PORT"):
        return _session()
    if "pyspark" in sys.modules:
        from pyspark.sql import SparkSession

        active = SparkSession.getActiveSession()
        if active is not None:
            return _session()
    return None


def _read(args: argparse.Namespace, query: Callable[[StateReader], T]) -> tuple[str, T]:
    """``query`` over sparkguard's tables: delta-rs when it can serve, else Spark (one line on
    stderr says so); returns the home and the answer."""
    from sparkguard.state_read import read_state

    spark = _spark_if_configured(args)
    home = _home(args, spark)
    return home, read_state(home, query, spark=lambda: spark or _session())


def _cmd_status(args: argparse.Namespace) -> int:
    from sparkguard.status_view import render_run, render_runs

    if args.limit < 1:
        print(f"sparkguard status: --limit must be at least 1 (got {args.limit})",
              file=sys.stderr)
        return EXIT_USAGE
    if args.run_id:
        home, (events, slices) = _read(args, lambda r: (
            r.run_events(args.run_id), r.slice_events(args.run_id)))
        if not events:
            print(f"sparkguard status: run {args.run_id} is not in the ledger at "
                  f"{home.rstrip('/')}", file=sys.stderr)
            return EXIT_USAGE
        print(render_run(events, slices))
        return EXIT_OK
    home, runs = _read(args, lambda r: r.latest_runs(args.limit))
    print(render_runs(runs, home.rstrip("/")))
    return EXIT_OK


def _cmd_report(args: argparse.Namespace) -> int:
    from sparkguard.evidence import load_evidence, render_markdown

    path = args.evidence
    if not path and not args.run_id:
        print("sparkguard report: give --run-id or --evidence", file=sys.stderr)
        return EXIT_USAGE
    if not path and args.evidence_dir:
        path = str(Path(args.evidence_dir) / f"{args.run_id}.yaml")
    if not path:  # the ledger knows where the run wrote its evidence
        from sparkguard.ledger_model import run_progress

        _, events = _read(args, lambda r: r.run_events(args.run_id))
        recorded = run_progress(events).evidence_path if events else None
        path = recorded or str(Path(_evidence_dir(args)) / f"{args.run_id}.yaml")
    print(render_markdown(load_evidence(path)))
    return EXIT_OK


def _cmd_publish(args: argparse.Namespace) -> int:
    from sparkguard.status_view import render_publish

    if args.action != "status" and not args.target:
        print(f"sparkguard publish {args.action}: name the TARGET", file=sys.stderr)
        return EXIT_USAGE
    targets = [args.target] if args.target else None
    if args.action == "status":
        _, (statuses, path) = _read(args, lambda r: (r.publish_statuses(targets),
                                                     r.control_path))
        print(render_publish(statuses, path))
        return EXIT_OK
    from sparkguard.publish import PublishControl

    spark = _session()
    ctl = PublishControl(spark, _home(args, spark))
    actor = os.environ.get("SPARKGUARD_ACTOR") or os.environ.get("USER")
    if args.action == "pause":
        ctl.pause([args.target], actor=actor, reason=args.reason)
    elif args.action == "resume":
        cleared = ctl.resume([args.target], actor=actor, reason=args.reason)
        if cleared:
            print(f"cleared hold(s): {', '.join(cleared)}")
    print(render_publish(ctl.statuses(targets), ctl.path))
    return EXIT_OK


def _cmd_plan_schema(args: argparse.Namespace) -> int:
    from sparkguard.plan.schema import schema_text

    sys.stdout.write(schema_text())
    return EXIT_OK


def _cmd_plan_init(args: argparse.Namespace) -> int:
    from sparkguard.draft.decide import (
        check_new_file,
        parse_bound,
        read_sql_file,
        resolve_table,
        write_new_file,
    )

    if args.output:
        check_new_file(args.output)
    req_args = dict(source=resolve_table("--source", args.source),
                    target=resolve_table("--target", args.target),
                    start=parse_bound("--start", args.start), end=parse_bound("--end", args.end),
                    transform_sql=read_sql_file(args.transform_sql) if args.transform_sql else None,
                    transform_callable=args.transform_callable, name=args.name, owner=args.owner,
                    reason=args.reason)
    from sparkguard.draft.infer import DraftRequest, draft_plan

    text, draft = draft_plan(_session(), DraftRequest(**req_args))
    if args.output:
        write_new_file(args.output, text)
        print(f"draft plan written to {args.output}: business key {list(draft.keys)}, "
              f"{len(draft.partitions)} partition(s) of {draft.window_column}; next: "
              f"sparkguard guard {args.output} --pre-approval", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return EXIT_OK


def _cmd_verify(args: argparse.Namespace) -> int:
    from sparkguard.verify import verify

    home = args.home or (None if args.evidence else _home(args))
    report = verify(home=home, run_id=args.run_id, evidence=args.evidence, all_runs=args.all,
                    spark=_session)
    for line in report.lines():
        print(line)
    return report.exit_code


def _cmd_faults(args: argparse.Namespace) -> int:
    from sparkguard.faults import FAILPOINTS

    for name, what in FAILPOINTS.items():
        print(f"{name:<24} {what}")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sparkguard", description="Safe, reconciled, reversible backfills on Spark + Delta.",
        epilog="exit codes: 0 ok; 1 gate failed (target unchanged); 2 plan/usage/lock error "
               "(nothing written); 3 runtime failure")
    parser.add_argument("--debug", action="store_true", help="re-raise errors with tracebacks")
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--home", help="sparkguard's own tables (ledger, publish control, "
                       "shadows); default $SPARKGUARD_HOME or <plan dir>/_sparkguard")

    p = sub.add_parser("guard", help="check a plan: static red flags, approvals, live checks")
    p.add_argument("plan")
    p.add_argument("--static-only", action="store_true", help="skip the live (Spark) checks")
    p.add_argument("--pre-approval", action="store_true",
                   help="review before approval: approvals are not required yet, and empty "
                   "fields are listed as [FILL] (the live checks still run)")
    p.set_defaults(func=_cmd_guard)

    p = sub.add_parser("approve", help="record an approval bound to the plan's fingerprint")
    p.add_argument("plan")
    p.add_argument("--role", required=True)
    p.add_argument("--by", required=True)
    p.set_defaults(func=_cmd_approve)

    p = sub.add_parser("run", help="run the backfill described by an approved plan")
    p.add_argument("--plan", required=True)
    common(p)
    p.add_argument("--evidence-dir", help="default <plan dir>/evidence")
    p.add_argument("--dry-run", action="store_true",
                   help="stop after full-window reconciliation; record the dry run")
    p.add_argument("--explain", action="store_true", help="print the stages and exit")
    p.add_argument("--takeover-stale-lock", action="store_true")
    p.add_argument("--stale-lock-timeout", type=float, default=6 * 3600, metavar="SECONDS")
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser("rollback", help="restore the targets of a run to their recorded version")
    p.add_argument("--run-id")
    p.add_argument("--evidence", help="the run's evidence YAML instead of --run-id")
    p.add_argument("--plan", help="the run's plan: its home is derived as for run "
                   "(<plan dir>/_sparkguard unless --home or $SPARKGUARD_HOME)")
    common(p)
    p.add_argument("--force", action="store_true",
                   help="restore even though other writers committed after the promotion")
    p.set_defaults(func=_cmd_rollback)

    p = sub.add_parser("status", help="runs, slices, states and next action")
    p.add_argument("--run-id", help="one run in detail: events, slices, versions, next action")
    p.add_argument("--limit", type=int, default=20, help="how many recent runs to list")
    common(p)
    p.set_defaults(func=_cmd_status)

    p = sub.add_parser("report", help="render a run's evidence as Markdown")
    p.add_argument("--run-id", help="find the evidence through the ledger (or --evidence-dir)")
    p.add_argument("--evidence", help="the evidence YAML itself")
    p.add_argument("--evidence-dir")
    common(p)
    p.set_defaults(func=_cmd_report)

    p = sub.add_parser("publish", help="publish control: status, pause or resume a target",
                       description="pause sets the manual hold; resume clears every hold "
                       "(runs' and manual); a target is paused while any hold is set")
    p.add_argument("action", choices=["status", "pause", "resume"])
    p.add_argument("target", nargs="?",
                   help="target dataset (table name or path) as in the plan; status without "
                   "it lists every target")
    p.add_argument("--reason")
    common(p)
    p.set_defaults(func=_cmd_publish)

    p = sub.add_parser("plan", help="plan utilities")
    psub = p.add_subparsers(dest="plan_command", required=True)
    ps = psub.add_parser("schema", help="print the plan's JSON Schema")
    ps.set_defaults(func=_cmd_plan_schema)
    ps = psub.add_parser("init", help="draft a plan from the live source and target tables",
                         description="Reads both tables (aggregates and bounded samples only; "
                         "writes to no table, approves nothing) and writes a commented draft.")
    ps.add_argument("--source", required=True, help="source of truth: a path or a catalog name")
    ps.add_argument("--target", required=True, help="table to repair: a path or a catalog name")
    ps.add_argument("--start", required=True, help="window start, ISO date/time UTC (inclusive)")
    ps.add_argument("--end", required=True, help="window end, ISO date/time UTC (exclusive)")
    tr = ps.add_mutually_exclusive_group()
    tr.add_argument("--transform-sql", metavar="FILE", help="file with the transform SELECT")
    tr.add_argument("--transform-callable", metavar="MOD:FN", help="Python transform")
    ps.add_argument("--name")
    ps.add_argument("--owner")
    ps.add_argument("--reason")
    ps.add_argument("-o", "--output", metavar="PLAN", help="write here (never overwrites); "
                    "default: print")
    ps.set_defaults(func=_cmd_plan_init)

    p = sub.add_parser("verify", help="prove a run's ledger events, evidence and commits were "
                       "not edited afterwards (reads only)",
                       epilog="exit codes: 0 intact; 1 tampering found; 2 usage error")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--run-id", help="one run of the ledger at --home")
    which.add_argument("--evidence", metavar="FILE", help="an evidence YAML (its home is the "
                       "one it records unless --home)")
    which.add_argument("--all", action="store_true", help="every run of the ledger at --home")
    common(p)
    p.set_defaults(func=_cmd_verify)

    p = sub.add_parser("faults", help="list the failpoints (testing aid)")
    p.set_defaults(func=_cmd_faults)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(list(argv) if argv is not None else None)
    except SystemExit as exc:
        return EXIT_OK if exc.code in (0, None) else EXIT_USAGE
    try:
        return int(args.func(args))
    except PlanError as exc:
        if args.debug:
            raise
        print(str(exc) or f"{exc.source}: invalid plan", file=sys.stderr)
        print(f"sparkguard: plan refused ({len(exc.problems)} problem(s)); nothing was written",
              file=sys.stderr)
        return EXIT_USAGE
    except SparkguardError as exc:
        if args.debug:
            raise
        print(f"sparkguard: {exc}", file=sys.stderr)
        return exc.exit_code
    except Exception as exc:
        if args.debug:
            raise
        traceback.print_exc(file=sys.stderr)
        print(f"sparkguard: runtime failure: {type(exc).__name__}: {str(exc)[:500]}",
              file=sys.stderr)
        return EXIT_RUNTIME


if __name__ == "__main__":
    sys.exit(main())
