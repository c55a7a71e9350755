"""Commands over sparkguard's state: ``status``, ``report``, ``publish``, ``verify`` and
``faults``."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from sparkguard.commands import common
from sparkguard.errors import EXIT_OK, EXIT_USAGE

__all__ = ["cmd_faults", "cmd_publish", "cmd_report", "cmd_status", "cmd_verify"]


def cmd_status(args: argparse.Namespace) -> int:
    """``sparkguard status``: recent runs, or one run in detail."""
    from sparkguard.status_view import render_run, render_runs

    if args.limit < 1:
        print(f"sparkguard status: --limit must be at least 1 (got {args.limit})",
              file=sys.stderr)
        return EXIT_USAGE
    if args.run_id:
        home, (events, slices) = common.read(args, lambda r: (
            r.run_events(args.run_id), r.slice_events(args.run_id)))
        if not events:
            print(f"sparkguard status: run {args.run_id} is not in the ledger at "
                  f"{home.rstrip('/')}", file=sys.stderr)
            return EXIT_USAGE
        print(render_run(events, slices))
        return EXIT_OK
    home, runs = common.read(args, lambda r: r.latest_runs(args.limit))
    print(render_runs(runs, home.rstrip("/")))
    return EXIT_OK


def cmd_report(args: argparse.Namespace) -> int:
    """``sparkguard report``: a run's evidence as Markdown."""
    from sparkguard.evidence import EvidenceError, load_evidence, render_markdown

    path = args.evidence
    if not path and not args.run_id:
        print("sparkguard report: give --run-id or --evidence", file=sys.stderr)
        return EXIT_USAGE
    if not path and args.evidence_dir:
        path = str(Path(args.evidence_dir) / f"{args.run_id}.yaml")
    if not path:  # the ledger knows where the run wrote its evidence
        from sparkguard.ledger_model import run_progress

        _, events = common.read(args, lambda r: r.run_events(args.run_id))
        recorded = run_progress(events).evidence_path if events else None
        path = recorded or str(Path(common.evidence_dir(args)) / f"{args.run_id}.yaml")
    try:
        text = render_markdown(load_evidence(path))
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        what = f"the key {exc} is missing" if isinstance(exc, KeyError) else \
            f"a field has the wrong shape ({type(exc).__name__}: {exc})"
        raise EvidenceError(f"{path}: {what}: not a complete evidence file sparkguard wrote; "
                            "give the <run id>.yaml the run wrote") from None
    print(text)
    return EXIT_OK


def cmd_publish(args: argparse.Namespace) -> int:
    """``sparkguard publish status|pause|resume [TARGET]``."""
    from sparkguard.status_view import render_publish

    if args.action != "status" and not args.target:
        print(f"sparkguard publish {args.action}: name the TARGET", file=sys.stderr)
        return EXIT_USAGE
    targets = [args.target] if args.target else None
    if args.action == "status":
        _, (statuses, path) = common.read(args, lambda r: (r.publish_statuses(targets),
                                                     r.control_path))
        print(render_publish(statuses, path))
        return EXIT_OK
    from sparkguard.publish import PublishControl

    spark = common.session()
    ctl = PublishControl(spark, common.home(args, spark))
    actor = os.environ.get("SPARKGUARD_ACTOR") or os.environ.get("USER")
    if args.action == "pause":
        ctl.pause([args.target], actor=actor, reason=args.reason)
    elif args.action == "resume":
        cleared = ctl.resume([args.target], actor=actor, reason=args.reason)
        if cleared:
            print(f"cleared hold(s): {', '.join(cleared)}")
    print(render_publish(ctl.statuses(targets), ctl.path))
    return EXIT_OK


def cmd_verify(args: argparse.Namespace) -> int:
    """``sparkguard verify``: check a run's records were not edited afterwards."""
    from sparkguard.verify import verify

    home = common.home(args) if args.home or not args.evidence else None
    report = verify(home=home, run_id=args.run_id, evidence=args.evidence, all_runs=args.all,
                    spark=common.session)
    for line in report.lines():
        print(line)
    return report.exit_code


def cmd_faults(args: argparse.Namespace) -> int:
    """``sparkguard faults``: list the failpoints."""
    from sparkguard.faults import FAILPOINTS

    for name, what in FAILPOINTS.items():
        print(f"{name:<24} {what}")
    return EXIT_OK
