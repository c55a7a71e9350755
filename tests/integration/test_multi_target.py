"""Two targets in one plan: the second reads the first one's shadow through {shadow:NAME},
promotion follows the dependency order, and a failure of the second restores the first."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from chispa import assert_df_equality
from delta.tables import DeltaTable
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sparkguard import faults
from sparkguard.demo import transform_orders
from sparkguard.ledger import Ledger, run_progress
from sparkguard.plan import load_plan
from sparkguard.publish import is_paused
from sparkguard.run.evaluator import run_backfill
from tests.failpoints import fails_once_at, on_failpoint
from tests.lakes import WINDOW, copy_lake, write_plan

pytestmark = pytest.mark.spark
ENRICH_SQL = "SELECT *, amount >= 500 AS big_order FROM {shadow:orders_clean} WHERE {window}"


def _enrich(df: DataFrame) -> DataFrame:
    return df.withColumn("big_order", F.col("amount") >= 500)


@pytest.fixture(scope="module")
def base_lake(spark: Any, base_lake: Path, tmp_path_factory: Any) -> Path:
    root = copy_lake(base_lake, tmp_path_factory.mktemp("multibase") / "lake")
    # a second target built downstream of the first (so it carries the same defect)
    clean = spark.read.format("delta").load(str(root / "target" / "orders_clean"))
    _enrich(clean).write.format("delta").partitionBy("order_date").save(
        str(root / "target" / "orders_enriched"))
    return root


def _two_targets(plan: dict[str, Any]) -> None:
    first = plan["targets"][0]
    second = dict(copy.deepcopy(first), name="orders_enriched",
                  dataset=first["dataset"].replace("orders_clean", "orders_enriched"),
                  transform={"sql": ENRICH_SQL}, depends_on=["orders_clean"])
    plan["targets"] = [second, first]  # listed downstream-first: the run must reorder
    plan["execution"]["slice_partitions"] = 3


def _history(spark: Any, path: Path) -> list[dict[str, Any]]:
    return [r.asDict() for r in DeltaTable.forPath(spark, str(path)).history()
            .orderBy("version").collect()]


def _read(spark: Any, path: Path) -> DataFrame:
    return spark.read.format("delta").load(str(path)).orderBy("order_date", "order_id")


def test_two_targets_promoted_in_dependency_order(spark: Any, base_lake: Path,
                                                  tmp_path: Path) -> None:
    root = copy_lake(base_lake, tmp_path / "lake")
    plan = write_plan(root, _two_targets)
    a, b = root / "target" / "orders_clean", root / "target" / "orders_enriched"
    out = run_backfill(spark, load_plan(plan), str(plan), home=str(root / "_sg"),
                       evidence_dir=str(root / "evidence"), out=lambda _m: None)
    assert out.exit_code == 0, out.message
    expected = transform_orders(spark, spark.read.format("delta").load(
        str(root / "source" / "orders")), [])
    assert_df_equality(_read(spark, a), expected.orderBy("order_date", "order_id"),
                       ignore_nullable=True)
    assert_df_equality(_read(spark, b), _enrich(expected).orderBy("order_date", "order_id"),
                       ignore_nullable=True)
    events = Ledger(spark, str(root / "_sg")).run_events(out.run_id)
    promoted = [e["details"]["label"] for e in events if e["state"] == "promoted"]
    assert promoted == ["orders_clean", "orders_enriched"]
    ta = _history(spark, a)[-1]["timestamp"]
    tb = _history(spark, b)[-1]["timestamp"]
    assert ta <= tb


def test_failure_of_the_second_target_restores_the_first(
        spark: Any, base_lake: Path, tmp_path: Path, monkeypatch: Any) -> None:
    root = copy_lake(base_lake, tmp_path / "lake")
    plan = write_plan(root, _two_targets)
    home = str(root / "_sg")
    a, b = root / "target" / "orders_clean", root / "target" / "orders_enriched"
    before_a, before_b = _read(spark, a), _read(spark, b)
    va, vb = _history(spark, a)[-1]["version"], _history(spark, b)[-1]["version"]
    def tamper_second_shadow(_name: str) -> None:
        if len(seen) == 2:  # the second target's promotion just committed
            shadow = next((Path(home) / "shadow").glob("*/*/orders_enriched"))
            DeltaTable.forPath(spark, str(shadow)).delete(
                F.col("order_date") == F.lit(WINDOW[0]))

    seen = on_failpoint(monkeypatch, faults, "after_promote_commit", tamper_second_shadow)
    out = run_backfill(spark, load_plan(plan), str(plan), home=home,
                       evidence_dir=str(root / "evidence"), out=lambda _m: None)
    assert out.exit_code == 1 and "orders_enriched" in out.message
    assert_df_equality(_read(spark, a), before_a, ignore_nullable=True)
    assert_df_equality(_read(spark, b), before_b, ignore_nullable=True)
    ops_a = [h["operation"] for h in _history(spark, a) if h["version"] > va]
    ops_b = [h["operation"] for h in _history(spark, b) if h["version"] > vb]
    assert ops_a == ["WRITE", "RESTORE"] and ops_b == ["WRITE", "RESTORE"]
    assert "does not equal the shadow" in out.message
    events = Ledger(spark, home).run_events(out.run_id)
    restored = [(e["details"]["label"], e["details"]["reason"]) for e in events
                if e["state"] == "restored"]
    assert restored[0] == ("orders_enriched", "verification failed")  # at once
    assert restored[1][0] == "orders_clean"  # then the one promoted before it
    prog = run_progress(events)
    assert prog.state == "gate_failed"
    assert all(t.restored for t in prog.targets.values())
    assert out.targets["orders_clean"].restored and out.targets["orders_enriched"].restored
    assert is_paused(spark, str(a), home) and is_paused(spark, str(b), home)


def test_a_lock_taken_over_after_the_first_promotion_stops_the_second(
        spark: Any, base_lake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fencing across targets: once the first target is promoted and verified, a takeover of
    its lock (a rollback from another host, say) stops the run before it promotes the second;
    the run writes nothing more (the taker owns the first target; the second is unchanged)."""
    from sparkguard.errors import LockLostError
    from sparkguard.run import promote
    from tests.lakes import lock_key_of

    root = copy_lake(base_lake, tmp_path / "lake")
    plan = write_plan(root, _two_targets)
    a, b = root / "target" / "orders_clean", root / "target" / "orders_enriched"
    home, na, nb = str(root / "_sg"), len(_history(spark, a)), len(_history(spark, b))
    real = promote.verify

    def verify_then_taken_over(ctx: Any, state: Any, st: Any) -> None:
        real(ctx, state, st)
        if st.spec.label == "orders_clean":
            Ledger(spark, home).acquire([lock_key_of(spark, a)], "20261201T090000Z-taker000",
                                        "dave@example.com", takeover=True, stale_after_s=0)

    monkeypatch.setattr(promote, "verify", verify_then_taken_over)
    with pytest.raises(LockLostError, match="stops before promoting orders_enriched"):
        run_backfill(spark, load_plan(plan), str(plan), home=home,
                     evidence_dir=str(root / "evidence"), out=lambda _m: None)
    assert len(_history(spark, a)) == na + 1  # its promotion, nothing after it
    assert len(_history(spark, b)) == nb  # never promoted
    (prog,) = Ledger(spark, home).latest_runs()
    events = Ledger(spark, home).run_events(prog.run_id)
    assert [e["details"].get("label") for e in events if e["state"] == "promoted"] == [
        "orders_clean"]
    assert events[-1]["state"] == "verified"
    assert is_paused(home, str(b))


def test_a_rerun_after_publish_reopened_never_undoes_a_target_another_writer_changed_since(
        spark: Any, base_lake: Path, tmp_path: Path, monkeypatch: Any) -> None:
    """Both targets promoted and verified, the evidence written, publish reopened; recording
    the end fails. Downstream reads both; then an incremental job updates promoted rows of the
    first. The re-run used to see that change as another writer undoing the promotion and
    RESTORE the second target, with publish open: downstream saw the first backfilled and the
    second reverted. Now it records the run as done and touches neither."""
    root = copy_lake(base_lake, tmp_path / "lake")
    plan = write_plan(root, _two_targets)
    home = str(root / "_sg")
    a, b = root / "target" / "orders_clean", root / "target" / "orders_enriched"
    fails_once_at(monkeypatch, faults, "mid_publish_resume", "ledger storage hiccup")
    with pytest.raises(RuntimeError, match="ledger storage hiccup"):
        run_backfill(spark, load_plan(plan), str(plan), home=home,
                     evidence_dir=str(root / "evidence"), out=lambda _m: None)
    assert not is_paused(spark, str(a), home) and not is_paused(spark, str(b), home)
    spark.sql(f"UPDATE delta.`{a}` SET amount = amount + 1 "
              f"WHERE order_date = DATE'{WINDOW[1]}' AND order_id % 7 = 0")
    theirs_a, promoted_b = _read(spark, a).collect(), _read(spark, b).collect()
    va, vb = _history(spark, a)[-1]["version"], _history(spark, b)[-1]["version"]
    out = run_backfill(spark, load_plan(plan), str(plan), home=home,
                       evidence_dir=str(root / "evidence"), out=lambda _m: None)
    assert out.exit_code == 0, out.message
    assert _history(spark, a)[-1]["version"] == va and _history(spark, b)[-1]["version"] == vb
    assert _read(spark, a).collect() == theirs_a and _read(spark, b).collect() == promoted_b
    prog = run_progress(Ledger(spark, home).run_events(out.run_id))
    assert prog.state == "done" and not any(t.restored for t in prog.targets.values())
    assert not is_paused(spark, str(a), home) and not is_paused(spark, str(b), home)
    (note,) = out.targets["orders_clean"].notes  # said, in the evidence too
    assert "changed rows it promoted" in note and "already delivered" in note
    assert not out.targets["orders_enriched"].notes


def test_rolling_back_a_run_that_died_after_its_first_promotion_reopens_both_targets(
        spark: Any, base_lake: Path, tmp_path: Path, monkeypatch: Any) -> None:
    """The run paused both targets, promoted the first and died. Its rollback restores the
    first; the run's hold on the second, never promoted, used to stay with the run over
    (rolled_back): publish of the second stayed paused with nothing to clear it."""
    from sparkguard.cli import main
    from tests.failpoints import Crash

    root = copy_lake(base_lake, tmp_path / "lake")
    plan = write_plan(root, _two_targets)
    home = str(root / "_sg")
    a, b = root / "target" / "orders_clean", root / "target" / "orders_enriched"
    before_a = _read(spark, a).collect()
    on_failpoint(monkeypatch, faults, "after_promote_ledger", times=1)
    with pytest.raises(Crash):
        run_backfill(spark, load_plan(plan), str(plan), home=home,
                     evidence_dir=str(root / "evidence"), out=lambda _m: None)
    (run,) = Ledger(spark, home).latest_runs()
    assert is_paused(spark, str(a), home) and is_paused(spark, str(b), home)
    assert main(["rollback", "--run-id", run.run_id, "--home", home,
                 "--takeover-stale-lock", "--stale-lock-timeout", "0.001"]) == 0
    assert _read(spark, a).collect() == before_a
    assert run_progress(Ledger(spark, home).run_events(run.run_id)).state == "rolled_back"
    assert not is_paused(spark, str(a), home)
    assert not is_paused(spark, str(b), home)
