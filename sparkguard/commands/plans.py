"""Plan commands: ``guard``, ``approve``, ``plan schema`` and ``plan init``."""

from __future__ import annotations

import argparse
import sys

from sparkguard.commands import common
from sparkguard.errors import EXIT_OK, EXIT_USAGE

__all__ = ["cmd_approve", "cmd_guard", "cmd_plan_init", "cmd_plan_schema"]


def cmd_guard(args: argparse.Namespace) -> int:
    """``sparkguard guard PLAN``: static findings, then the live ones when nothing blocks."""
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

        findings += live_findings(common.session(), plan)
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


def cmd_approve(args: argparse.Namespace) -> int:
    """``sparkguard approve PLAN --role R --by NAME``: record an approval."""
    from sparkguard.approve import record_approval

    rec = record_approval(args.plan, args.role, args.by)
    print(f"approved: role {rec.role} by {rec.by} at {rec.at.isoformat()} for fingerprint "
          f"{rec.fingerprint}")
    return EXIT_OK


def cmd_plan_schema(args: argparse.Namespace) -> int:
    """``sparkguard plan schema``: print the plan's JSON Schema."""
    from sparkguard.plan.schema import schema_text

    sys.stdout.write(schema_text())
    return EXIT_OK


def cmd_plan_init(args: argparse.Namespace) -> int:
    """``sparkguard plan init``: draft a plan from the live source and target."""
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

    text, draft = draft_plan(common.session(), DraftRequest(**req_args))
    if args.output:
        write_new_file(args.output, text)
        print(f"draft plan written to {args.output}: business key {list(draft.keys)}, "
              f"{len(draft.partitions)} partition(s) of {draft.window_column}; next: "
              f"sparkguard guard {args.output} --pre-approval", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return EXIT_OK
