"""Roll a promoted run back: RESTORE each target to its recorded version, with safety checks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyspark.sql import SparkSession

from sparkguard import delta_ops
from sparkguard.errors import RollbackRefusedError
from sparkguard.faults import failpoint
from sparkguard.ledger import Ledger
from sparkguard.reconcile.engine import table_fingerprint
from sparkguard.sql import TableRef, restore_statement

__all__ = ["rollback_points", "rollback_run"]


def rollback_points(ledger: Ledger, run_id: str) -> list[dict[str, Any]]:
    """(target, rollback version, promoted version) per target promoted by ``run_id``."""
    events = ledger.run_events(run_id)
    if not events:
        raise RollbackRefusedError(f"run {run_id} is not in the ledger at {ledger.home}; "
                                   "check --run-id and --home")
    fp = events[0].get("plan_fingerprint")
    rb: dict[str, int] = {}
    promoted: dict[str, int] = {}
    datasets: dict[str, str] = {}
    for e in events:
        d = e["details"]
        for label, v in (d.get("rollback_versions") or {}).items():
            rb[label] = int(v)
            datasets[label] = e.get("target") or datasets.get(label, "")
        for label, v in (d.get("promoted_versions") or {}).items():
            promoted[label] = int(v)
    return [{"label": k, "dataset": datasets[k], "rollback_version": rb[k],
             "promoted_version": promoted.get(k), "fingerprint": fp} for k in rb]


def rollback_run(spark: SparkSession, home: str, run_id: str, *, force: bool = False,
                 out: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Restore every target of ``run_id`` to the version recorded before promotion.

    Refuses when another writer committed after the promotion (unless ``force``), and when
    the recorded version's files are gone (VACUUM). Verifies the restored content.
    """
    ledger = Ledger(spark, home)
    points = rollback_points(ledger, run_id)
    if not points:
        raise RollbackRefusedError(f"run {run_id} never reached promotion; nothing to roll back")
    checks: list[tuple[dict[str, Any], TableRef]] = []
    for pt in points:
        ref = TableRef.parse(pt["dataset"])
        after = pt["promoted_version"] if pt["promoted_version"] is not None else pt[
            "rollback_version"]
        others = []
        for c in delta_ops.commits_since(spark, ref, after):
            meta = delta_ops.commit_metadata(c.get("userMetadata"))
            if meta and meta.get("run_id") == run_id:
                continue
            others.append(c)
        if others and not force:
            listed = "; ".join(f"v{c['version']} {c['operation']} at {c['timestamp']}"
                               for c in others[:10])
            raise RollbackRefusedError(
                f"{pt['dataset']}: {len(others)} commit(s) by other writers after the promotion "
                f"would be undone by RESTORE: {listed}. Re-run with --force to restore anyway.")
        missing = delta_ops.missing_files_for_version(spark, ref, pt["rollback_version"])
        if missing:
            raise RollbackRefusedError(
                f"{pt['dataset']}: version {pt['rollback_version']} can no longer be restored; "
                f"{len(missing)} data file(s) it needs are gone (VACUUM?): {missing[:3]}")
        checks.append((pt, ref))
    ledger.record_run(run_id, "rolling_back", fingerprint=points[0]["fingerprint"],
                      rollback_started=[p["label"] for p in points])
    failpoint("mid_rollback")
    results = []
    for pt, ref in checks:
        version = pt["rollback_version"]
        expected = table_fingerprint(delta_ops.read_version(spark, ref, version))
        delta_ops.restore(spark, ref, version,
                          delta_ops.user_metadata(run_id, pt["fingerprint"] or "", "rollback"))
        failpoint("after_rollback_restore")
        got = table_fingerprint(delta_ops.read_table(spark, ref))
        ok = got == expected
        out(f"{pt['dataset']}: {restore_statement(ref, version)} -> "
            f"{'verified: content equals version ' + str(version) if ok else 'MISMATCH'}")
        results.append({**pt, "verified": ok, "new_version": delta_ops.current_version(spark, ref)})
        if not ok:
            raise RollbackRefusedError(f"{pt['dataset']}: restored content differs from version "
                                       f"{version}")
    ledger.record_run(run_id, "rolled_back", fingerprint=points[0]["fingerprint"],
                      rolled_back=results)
    return results
