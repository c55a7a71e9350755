"""``sparkguard verify``: prove a run's record was not edited afterwards (reads only).

For one evidence file, one run or every run of a home it reads the ledger (delta-rs where it
can, Spark otherwise: :func:`sparkguard.state_read.read_state`) and each target's history,
then checks (pure, :mod:`sparkguard.audit_trail`):

- every ledger chain of the run (its run, slice and evidence events; the lock events and the
  publish-control events of its targets): edited, deleted, inserted, reordered events, and
  chain heads the evidence recorded that the ledger no longer holds;
- the ledger and publish-control tables' histories: an ``UPDATE``, ``DELETE``, ``MERGE``,
  ``RESTORE`` or overwrite on one of these append-only tables is tampering;
- the evidence's content hash against its content, the ledger's record of it (naming the edited
  fields) and, with ``SPARKGUARD_AUDIT_KEY`` set, its seal;
- the Delta commits the evidence recorded against each target's history; later commits on a
  target (a RESTORE outside sparkguard, another writer) are reported as information.

Nothing is written anywhere. Exit 0: intact; 1: tampering found; 2: usage error.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from sparkguard.audit import Finding
from sparkguard.audit_trail import (
    audit_key,
    check_chain,
    check_commits,
    check_evidence,
    check_ledger_history,
    evidence_record,
)
from sparkguard.errors import EXIT_OK, EXIT_USAGE, SparkguardError
from sparkguard.evidence import load_evidence
from sparkguard.state_read import read_state

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from sparkguard.state_read import StateReader

__all__ = ["EXIT_TAMPERED", "VerifyReport", "VerifyUsageError", "verify"]

EXIT_TAMPERED = 1
_LEDGER_TABLES = ("runs", "slices", "locks", "evidence", "publish")


class VerifyUsageError(SparkguardError):
    """Raised when ``verify`` is asked for something it cannot check (no such run, no home)."""

    exit_code = EXIT_USAGE


@dataclass
class VerifyReport:
    """What ``verify`` checked and found."""

    runs: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    engine: str = ""

    @property
    def tampered(self) -> bool:
        return any(f.severity == "tamper" for f in self.findings)

    @property
    def exit_code(self) -> int:
        return EXIT_TAMPERED if self.tampered else EXIT_OK

    def lines(self) -> list[str]:
        out = [f.line() for f in self.findings]
        tampers = sum(f.severity == "tamper" for f in self.findings)
        verdict = (f"TAMPERED: {tampers} finding(s)" if tampers else "intact")
        out.append(f"verify: {len(self.runs)} run(s) checked ({self.engine}): {verdict}")
        return out


@dataclass
class _Evidence:
    path: str
    data: dict[str, Any]

    @property
    def run_id(self) -> str:
        return str(self.data["sparkguard"]["run_id"])

    @property
    def audit(self) -> dict[str, Any]:
        section = self.data.get("audit")
        return section if isinstance(section, dict) else {}

    def targets(self) -> list[dict[str, Any]]:
        return [t for t in self.data["sparkguard"].get("targets") or [] if isinstance(t, dict)]


@dataclass
class _Read:
    """Everything verification needs, read in one go (so it can be retried on Spark)."""

    rows: dict[str, list[dict[str, Any]]]
    ledger_history: dict[str, list[dict[str, Any]] | None]
    target_history: dict[str, list[dict[str, Any]] | None]
    evidence_paths: dict[str, str]  # run id -> newest recorded evidence path
    engine: str


def _read(reader: StateReader, run_ids: Sequence[str] | None, datasets: Sequence[str],
          lock_keys: Sequence[str] = ()) -> _Read:
    """``lock_keys``: the locks' keys the evidence recorded heads of (a lock is keyed by the
    table's location, not by the dataset as the plan spells it)."""
    col = None if run_ids is None else "run_id"
    rows = {name: reader.rows(name, col, run_ids) for name in ("runs", "slices", "evidence")}
    if run_ids is None:
        rows["locks"] = reader.rows("locks")
        datasets = sorted({*datasets, *(r["target"] for r in rows["runs"] if r.get("target"))})
        rows["publish"] = reader.rows("publish")
    else:
        rows["locks"] = reader.rows("locks", "target", sorted({*datasets, *lock_keys}))
        rows["publish"] = reader.rows("publish", "target", list(datasets))
    paths: dict[str, str] = {}
    for r in rows["evidence"]:
        if r.get("path"):
            paths[r["run_id"]] = r["path"]
    for r in rows["runs"]:
        d = r.get("details") or {}
        if d.get("evidence_path") and r["run_id"] not in paths:
            paths[r["run_id"]] = d["evidence_path"]
    return _Read(
        rows=rows,
        ledger_history={n: reader.history(reader.table_location(n)) for n in _LEDGER_TABLES},
        target_history={d: reader.history(d) for d in datasets},
        evidence_paths=paths, engine=reader.engine)


def _load(path: str | Path) -> _Evidence:
    data = load_evidence(path)
    if not isinstance(data["sparkguard"], dict) or not data["sparkguard"].get("run_id"):
        raise VerifyUsageError(f"{path}: the evidence names no run (sparkguard.run_id)")
    return _Evidence(str(path), data)


def verify(*, home: str | None, run_id: str | None = None, evidence: str | None = None,
           all_runs: bool = False, spark: Callable[[], SparkSession],
           engine: str | None = None, key: bytes | None = None,
           err: TextIO | None = None) -> VerifyReport:
    """Check one evidence file, one run or (``all_runs``) every run of ``home``."""
    if sum(x is not None and x is not False for x in (run_id, evidence, all_runs or None)) != 1:
        raise VerifyUsageError("give exactly one of --run-id ID, --evidence FILE or --all")
    key = key if key is not None else audit_key()
    given: _Evidence | None = _load(evidence) if evidence else None
    if given is not None:
        home = home or given.audit.get("ledger_home")
        run_id = given.run_id
    if not home:
        raise VerifyUsageError("no sparkguard home: give --home (the evidence records none)")
    if all_runs:
        data = read_state(home, lambda r: _read(r, None, []), spark=spark, engine=engine,
                          err=err)
        # the runs named in any of the run-keyed tables: a run whose events were removed from
        # the runs table (or the table recreated without them) is still checked
        run_ids = sorted({r["run_id"] for n in ("runs", "slices", "evidence")
                          for r in data.rows[n]})
    else:
        assert run_id is not None
        datasets = [str(t.get("dataset")) for t in given.targets()] if given else []
        data = read_state(home, lambda r: _read(r, [run_id], datasets, _lock_keys(given)),
                          spark=spark, engine=engine, err=err)
        if given is None and not data.rows["runs"]:
            raise VerifyUsageError(f"run {run_id}: no such run in the ledger at {home}")
        if given is None and data.evidence_paths.get(run_id):
            found = _evidence_file(data.evidence_paths[run_id])
            if found is not None:
                given = found
                more = [str(t.get("dataset")) for t in given.targets()]
                # the run's targets (their history) and its locks' keys: read them too
                data = read_state(home, lambda r: _read(r, [run_id], more, _lock_keys(found)),
                                  spark=spark, engine=engine, err=err)
        run_ids = [run_id]
    report = VerifyReport(runs=list(run_ids), engine=data.engine)
    for name in _LEDGER_TABLES:
        report.findings += check_ledger_history(name, data.ledger_history[name])
    heads_of_locks: dict[str, list[str]] = {}
    for rid in run_ids:
        ev = given if given is not None and given.run_id == rid else None
        if ev is None and data.evidence_paths.get(rid):
            ev = _evidence_file(data.evidence_paths[rid])
            if ev is None:
                report.findings.append(Finding(
                    "evidence_missing", f"run {rid}",
                    f"{data.evidence_paths[rid]} is gone (moved or deleted)", "info"))
        report.findings += _check_run(rid, ev, data, key)
        if ev is None and not any(r["run_id"] == rid for r in data.rows["runs"]):
            report.findings.append(Finding(
                "run_missing", f"run {rid}", "the ledger's slice or evidence table holds rows "
                "of this run, its runs table none: the run's events were removed (or the runs "
                "table recreated without them)"))
        if ev is not None:
            for t, h in (ev.audit.get("chains") or {}).get("locks", {}).items():
                heads_of_locks.setdefault(t, []).append(h)
    targets = sorted({r["target"] for r in data.rows["locks"]} | set(heads_of_locks))
    for t in targets:
        events = [r for r in data.rows["locks"] if r["target"] == t]
        report.findings += check_chain("locks", f"target {t}", events, heads_of_locks.get(t, []))
    for t in sorted({r["target"] for r in data.rows["publish"]}):
        events = [r for r in data.rows["publish"] if r["target"] == t]
        report.findings += check_chain("publish", f"target {t}", events)
    return report


def _markdown(ev: _Evidence) -> list[Finding]:
    """The Markdown beside the evidence is not hashed: it is compared with the evidence as this
    sparkguard renders it (another version may render it otherwise, hence info)."""
    from sparkguard.evidence import render_markdown

    md = Path(ev.path).with_suffix(".md")
    try:
        text = md.read_text(encoding="utf-8")
        same = text == render_markdown(ev.data)
    except (OSError, UnicodeDecodeError, KeyError, TypeError, ValueError):
        return []  # no Markdown there (or an evidence it cannot render): nothing to compare
    if same:
        return []
    return [Finding("markdown_differs", str(md), "the Markdown summary differs from the "
                    "evidence as rendered by this sparkguard: edited, or written by another "
                    "version. The YAML is what is verified; read the summary `sparkguard report "
                    f"--evidence {ev.path}` renders from it", "info")]


def _lock_keys(ev: _Evidence | None) -> list[str]:
    """The lock keys whose chain heads the evidence recorded."""
    locks = (ev.audit.get("chains") or {}).get("locks") if ev is not None else None
    return sorted(map(str, locks)) if isinstance(locks, dict) else []


def _evidence_file(path: str) -> _Evidence | None:
    if not os.path.exists(path):
        return None
    return _load(path)


def _check_run(run_id: str, ev: _Evidence | None, data: _Read, key: bytes | None
               ) -> list[Finding]:
    chains = (ev.audit.get("chains") or {}) if ev else {}
    found: list[Finding] = []
    for name in ("runs", "slices", "evidence"):
        events = [r for r in data.rows[name] if r["run_id"] == run_id]
        if name == "runs" and not events and ev is not None:
            found.append(Finding("run_missing", f"run {run_id}", "the ledger holds no event of "
                                 "the run this evidence names: it was not written by a run of "
                                 "this ledger (another --home?), or the run's events were removed"))
        head = chains.get(name) if name != "evidence" else None
        found += check_chain(name, f"run {run_id}", events, [head] if head else [])
    records = [r for r in data.rows["evidence"] if r["run_id"] == run_id]
    named = [d["evidence_path"] for e in data.rows["runs"] if e["run_id"] == run_id
             and e.get("event_hash") and (d := e.get("details") or {}).get("evidence_path")]
    if named and not records:  # a run records its evidence before naming it in a run event
        found.append(Finding("evidence_record_missing", f"run {run_id}",
                             f"the run's chained events name the evidence it wrote ({named[-1]}), "
                             "but the ledger holds no evidence record of the run (the ledger's "
                             "evidence table, or the run's rows in it, removed)"))
    if ev is None:
        return found
    record, found_record = evidence_record(ev.path, ev.data, records)
    found += found_record + check_evidence(ev.path, ev.data, record, key) + _markdown(ev)
    if records and not records[-1].get("seal") and any(r.get("seal") for r in records[:-1]):
        found.append(Finding("seal_mismatch", ev.path, "the ledger recorded this evidence sealed, "
                             "its newest record is unsealed: rewritten without the key (by an "
                             "editor, or a rollback run without it)"))
    recorded = ev.audit.get("commits") or []
    for t in ev.targets():
        dataset = str(t.get("dataset"))
        mine = [c for c in recorded if isinstance(c, dict) and c.get("table") == dataset]
        if dataset in data.target_history:
            base = t.get("version_reconciled_against")
            found += check_commits(dataset, mine, data.target_history[dataset],
                                   int(base) if isinstance(base, int) else None)
    return found
