"""``sparkguard`` command line: one ``main(argv) -> int`` that maps errors to exit codes.

Exit codes: 0 success; 1 a gate or verification failed (target unchanged or restored);
2 plan, usage or lock error (nothing written); 3 runtime failure.
"""

from __future__ import annotations

import argparse
import math
import sys
import traceback
from collections.abc import Sequence

from sparkguard.commands.plans import cmd_approve, cmd_guard, cmd_plan_init, cmd_plan_schema
from sparkguard.commands.runs import cmd_rollback, cmd_run
from sparkguard.commands.state import cmd_faults, cmd_publish, cmd_report, cmd_status, cmd_verify
from sparkguard.errors import (
    EXIT_OK,
    EXIT_RUNTIME,
    EXIT_USAGE,
    PlanError,
    SparkguardError,
)

__all__ = ["build_parser", "main"]


def _positive_seconds(text: str) -> float:
    """A finite number of seconds above zero (argparse names the flag when it refuses)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(
            f"must be a finite number of seconds above 0, such as 21600 (got {text!r})")
    return value


def _true_false(text: str) -> bool:
    """``true`` or ``false`` (any case), as a job's parameter gives a flag."""
    value = text.strip().lower()
    if value not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"must be true or false (got {text!r})")
    return value == "true"


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

    def stale_lock(p: argparse.ArgumentParser) -> None:
        p.add_argument("--takeover-stale-lock", nargs="?", const=True, default=False,
                       type=_true_false, metavar="true|false",
                       help="take over a target's lock whose holder (a run or a rollback, "
                       "on any host) has been idle --stale-lock-timeout seconds or more; "
                       "=true or =false for a job parameter")
        p.add_argument("--stale-lock-timeout", type=_positive_seconds, default=6 * 3600,
                       metavar="SECONDS", help="default 21600 (6 hours)")

    p = sub.add_parser("guard", help="check a plan: static red flags, approvals, live checks")
    p.add_argument("plan")
    p.add_argument("--static-only", action="store_true", help="skip the live (Spark) checks")
    p.add_argument("--pre-approval", action="store_true",
                   help="review before approval: approvals are not required yet, and empty "
                   "fields are listed as [FILL] (the live checks still run)")
    p.set_defaults(func=cmd_guard)

    p = sub.add_parser("approve", help="record an approval bound to the plan's fingerprint")
    p.add_argument("plan")
    p.add_argument("--role", required=True)
    p.add_argument("--by", required=True)
    p.set_defaults(func=cmd_approve)

    p = sub.add_parser("run", help="run the backfill described by an approved plan")
    p.add_argument("--plan", required=True)
    common(p)
    p.add_argument("--evidence-dir", help="default <plan dir>/evidence")
    p.add_argument("--dry-run", action="store_true",
                   help="stop after full-window reconciliation; record the dry run")
    p.add_argument("--explain", action="store_true", help="print the stages and exit")
    stale_lock(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("rollback", help="restore the targets of a run to their recorded version")
    p.add_argument("--run-id")
    p.add_argument("--evidence", help="the run's evidence YAML instead of --run-id")
    p.add_argument("--plan", help="the run's plan: its home is derived as for run "
                   "(<plan dir>/_sparkguard unless --home or $SPARKGUARD_HOME)")
    common(p)
    p.add_argument("--force", action="store_true",
                   help="restore even though other writers committed after the promotion")
    p.add_argument("--abandon", metavar="REASON",
                   help="close a rollback that stopped and cannot finish (state rolling_back): "
                   "restores nothing, records where each target is, keeps publish paused")
    stale_lock(p)
    p.set_defaults(func=cmd_rollback)

    p = sub.add_parser("status", help="runs, slices, states and next action")
    p.add_argument("--run-id", help="one run in detail: events, slices, versions, next action")
    p.add_argument("--limit", type=int, default=20, help="how many recent runs to list")
    common(p)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("report", help="render a run's evidence as Markdown")
    p.add_argument("--run-id", help="find the evidence through the ledger (or --evidence-dir)")
    p.add_argument("--evidence", help="the evidence YAML itself")
    p.add_argument("--evidence-dir")
    common(p)
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("publish", help="publish control: status, pause or resume a target",
                       description="pause sets the manual hold; resume clears every hold "
                       "(runs' and manual); a target is paused while any hold is set")
    p.add_argument("action", choices=["status", "pause", "resume"])
    p.add_argument("target", nargs="?",
                   help="target dataset (table name or path) as in the plan; status without "
                   "it lists every target")
    p.add_argument("--reason")
    common(p)
    p.set_defaults(func=cmd_publish)

    p = sub.add_parser("plan", help="plan utilities")
    psub = p.add_subparsers(dest="plan_command", required=True)
    ps = psub.add_parser("schema", help="print the plan's JSON Schema")
    ps.set_defaults(func=cmd_plan_schema)
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
    ps.set_defaults(func=cmd_plan_init)

    p = sub.add_parser("verify", help="prove a run's ledger events, evidence and commits were "
                       "not edited afterwards (reads only)",
                       epilog="exit codes: 0 intact; 1 tampering found; 2 usage error")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--run-id", help="one run of the ledger at --home")
    which.add_argument("--evidence", metavar="FILE", help="an evidence YAML (its home is the "
                       "one it records unless --home)")
    which.add_argument("--all", action="store_true", help="every run of the ledger at --home")
    common(p)
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("faults", help="list the failpoints (testing aid)")
    p.set_defaults(func=cmd_faults)
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
        summary, refused = _summary(exc)
        if refused is None:
            traceback.print_exc(file=sys.stderr)
        print(f"sparkguard: runtime failure: {summary}" if refused is None else
              f"sparkguard: runtime failure: this client's Delta cannot use a table: {refused}",
              file=sys.stderr)
        return EXIT_RUNTIME


def _summary(exc: BaseException) -> tuple[str, str | None]:
    """An unexpected failure in one line (the JVM exception's own message, not Py4J's), and
    Delta's reason when it is Delta refusing a table's protocol. Spark is looked at only when
    it is loaded already: the fast commands never import it."""
    if "pyspark" not in sys.modules:
        return f"{type(exc).__name__}: {str(exc)[:500]}", None
    from sparkguard.delta_ops.conflicts import (
        PROTOCOL_REFUSAL_FIX,
        VARIANT_READ_FIX,
        conflict_summary,
        protocol_refusal,
        variant_read_failure,
    )

    refused = protocol_refusal(exc)
    summary = conflict_summary(exc, 500)
    if variant_read_failure(exc):
        summary = f"{summary}; {VARIANT_READ_FIX}"
    return summary, (f"{refused}; {PROTOCOL_REFUSAL_FIX}" if refused else None)


if __name__ == "__main__":
    sys.exit(main())
