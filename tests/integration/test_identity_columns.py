"""A target with an identity column (``GENERATED ALWAYS AS IDENTITY``, a surrogate key): the
recomputation leaves it out; a MERGE promotion keeps the value of every key the target holds
and Delta generates one for each new key; replace_where, which would renumber the window, and
a business key the target generates are refused before anything is written."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from delta.tables import DeltaTable, IdentityGenerator
from pyspark.sql import functions as F

from sparkguard import faults
from sparkguard.approve import record_approval
from sparkguard.cli import main
from sparkguard.demo import TRANSFORM_SQL
from sparkguard.errors import EXIT_GATE_FAILED, EXIT_OK, EXIT_USAGE
from sparkguard.ledger import Ledger
from sparkguard.plan import load_plan
from sparkguard.run.evaluator import run_backfill
from tests.failpoints import fails_once_at, on_failpoint
from tests.lakes import WINDOW, copy_lake, set_transform, write_plan

pytestmark = pytest.mark.spark

OUTSIDE = WINDOW[0].replace(day=1)  # a partition outside the window


@pytest.fixture(scope="module")
def identity_lake(spark: Any, base_lake: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The base lake with its target rebuilt with ``order_sk BIGINT GENERATED ALWAYS AS
    IDENTITY`` first, built once; tests copy it."""
    root = copy_lake(base_lake, tmp_path_factory.mktemp("identity") / "lake")
    _with_identity(spark, root, always=True)
    return root


def _with_identity(spark: Any, root: Path, always: bool) -> None:
    """The lake's target rebuilt with ``order_sk`` first, ``GENERATED ALWAYS`` or ``BY
    DEFAULT AS IDENTITY``, holding the same rows (numbered by Delta)."""
    path = root / "target" / "orders_clean"
    held = root / "held"
    spark.read.format("delta").load(str(path)).write.format("delta").save(str(held))
    rows = spark.read.format("delta").load(str(held))
    shutil.rmtree(path)
    gen = IdentityGenerator(1, 1)
    builder = DeltaTable.create(spark).location(str(path)).partitionedBy("order_date")
    builder = (builder.addColumn("order_sk", "BIGINT", generatedAlwaysAs=gen) if always
               else builder.addColumn("order_sk", "BIGINT", generatedByDefaultAs=gen))
    for f in rows.schema.fields:
        builder = builder.addColumn(f.name, f.dataType)
    builder.execute()
    rows.write.format("delta").mode("append").save(str(path))
    shutil.rmtree(held)


def _target(root: Path) -> Path:
    return root / "target" / "orders_clean"


def _run(plan: Path, root: Path) -> int:
    return main(["run", "--plan", str(plan), "--home", str(root / "_sg"),
                 "--evidence-dir", str(root / "evidence")])


def _keys(spark: Any, root: Path) -> dict[int, int]:
    """order_id -> order_sk of the target (a bounded test table)."""
    return {r["order_id"]: r["order_sk"] for r in spark.read.format("delta").load(
        str(_target(root))).select("order_id", "order_sk").collect()}


def _outside(spark: Any, root: Path) -> list[Any]:
    """The target's rows outside the window, sorted."""
    return sorted(spark.read.format("delta").load(str(_target(root)))
                  .filter(~F.col("order_date").isin(*WINDOW)).collect())


def _gates(root: Path, gate: str) -> list[dict[str, Any]]:
    """Each slice's result of ``gate`` in the run's evidence."""
    (evidence,) = (root / "evidence").glob("*.yaml")
    ev = yaml.safe_load(evidence.read_text())["sparkguard"]
    return [g for t in ev["targets"] for s in t["slices"] for g in s["gates"]
            if g["gate"] == gate]


def _version(spark: Any, root: Path) -> int:
    return int(DeltaTable.forPath(spark, str(_target(root))).history(1).first()["version"])


def _changed_source(spark: Any, root: Path) -> tuple[set[int], set[int]]:
    """The source with 3 new orders on a window day and the orders ``order_id % 97 = 0`` of the
    window deleted: (new ids, deleted ids)."""
    src = root / "source" / "orders"
    day = F.col("order_date") == F.lit(WINDOW[1])
    rows = spark.read.format("delta").load(str(src))
    new = rows.filter(day).orderBy("order_id").limit(3).withColumn(
        "order_id", F.col("order_id") + 10 ** 8)
    new_ids = {r[0] for r in new.select("order_id").collect()}
    in_window = F.col("order_date").isin(*WINDOW)
    gone = {r[0] for r in rows.filter(in_window & (F.col("order_id") % 97 == 0))
            .select("order_id").collect()}
    new.write.format("delta").mode("append").save(str(src))
    spark.sql(f"DELETE FROM delta.`{src}` WHERE order_date IN "
              f"({', '.join(repr(str(d)) for d in WINDOW)}) AND order_id % 97 = 0")
    return new_ids, gone


@pytest.mark.parametrize("promotion", ["merge_changed", "merge"])
def test_a_merge_keeps_the_identity_of_held_keys_and_new_keys_get_new_ones(
        spark: Any, identity_lake: Path, tmp_path: Path, promotion: str) -> None:
    """Updated orders keep their order_sk, new orders get values above every earlier one,
    deleted orders leave; rows outside the window are untouched; a CHECK constraint on order_sk
    is left to Delta (the shadow has no values to count it on); the promotion verifies, the
    rollback puts every order_sk back, and a later insert gets a value no promoted row had."""
    root = copy_lake(identity_lake, tmp_path / "lake")
    spark.sql(f"ALTER TABLE delta.`{_target(root)}` ADD CONSTRAINT sk_pos CHECK (order_sk > 0)")
    before, outside_before = _keys(spark, root), _outside(spark, root)
    new_ids, gone = _changed_source(spark, root)
    assert new_ids and gone
    plan = write_plan(root, promotion=promotion)
    assert _run(plan, root) == EXIT_OK
    after = _keys(spark, root)
    window = {r[0] for r in spark.read.format("delta").load(str(root / "source" / "orders"))
              .filter(F.col("order_date").isin(*WINDOW)).select("order_id").collect()}
    assert _outside(spark, root) == outside_before
    assert gone <= set(before) and not gone & set(after) and new_ids <= window
    assert set(after) == (set(before) - gone) | window
    assert all(after[k] == before[k] for k in after if k in before)  # no key renumbered
    added = [after[k] for k in set(after) - set(before)]
    assert len(added) == len(set(added)) >= 3 and min(added) > max(before.values())
    amounts = spark.read.format("delta").load(str(_target(root))).filter(
        F.col("order_date").isin(*WINDOW)).select("order_id", "amount")
    source = spark.read.format("delta").load(str(root / "source" / "orders")).filter(
        F.col("order_date").isin(*WINDOW)).select("order_id", F.col("amount").cast(
            "decimal(12,2)"))
    assert amounts.exceptAll(source).count() == 0 and source.exceptAll(amounts).count() == 0
    gates = _gates(root, "schema_matches_target")
    assert gates and all(g["passed"] and "order_sk" in g["reason"] for g in gates)
    checks = _gates(root, "check_constraint[sk_pos]")
    assert checks and all(g["passed"] and g["reason"].startswith("not counted on the shadow")
                          for g in checks), checks
    (run,) = Ledger(spark, str(root / "_sg")).latest_runs()
    assert main(["rollback", "--run-id", run.run_id, "--home", str(root / "_sg")]) == EXIT_OK
    assert _keys(spark, root) == before
    later = spark.read.format("delta").load(str(_target(root))).drop("order_sk").limit(1) \
        .withColumn("order_id", F.lit(10 ** 9).cast("bigint"))
    later.write.format("delta").mode("append").save(str(_target(root)))
    assert _keys(spark, root)[10 ** 9] > max(after.values())  # Delta kept the high-water mark


@pytest.mark.parametrize(("name", "match_target_schema"), [("order_sk", True),
                                                           ("ORDER_SK", False)])
def test_a_recomputation_that_outputs_the_identity_column_fails_its_gate(
        spark: Any, identity_lake: Path, tmp_path: Path, name: str,
        match_target_schema: bool) -> None:
    """The transform carries order_sk, in any case, with or without the target-schema contract
    (Delta would refuse the value at the MERGE): a gate says to leave it out, before any commit;
    the schema gate does not count it again."""
    root = copy_lake(identity_lake, tmp_path / "lake")
    v0 = _version(spark, root)
    sql = TRANSFORM_SQL.replace("SELECT order_id,", f"SELECT CAST(order_id AS BIGINT) AS {name},"
                                " order_id,")

    def mutate(plan: dict[str, Any]) -> None:
        set_transform(sql)(plan)
        plan["targets"][0]["contract"]["match_target_schema"] = match_target_schema

    assert _run(write_plan(root, mutate, promotion="merge_changed"), root) == EXIT_GATE_FAILED
    assert _version(spark, root) == v0
    (g,) = _gates(root, "identity_left_to_target")
    assert not g["passed"] and g["measured"] == 1, g
    assert f"{name!r} is an identity column of the target" in g["reason"]
    assert "leave it out of the recomputed rows" in g["reason"]
    assert all(s["passed"] for s in _gates(root, "schema_matches_target"))


@pytest.mark.parametrize(("mutate", "promotion", "rule", "field"), [
    (None, "replace_where", "identity_replace_where", "targets[0].promotion"),
    (lambda p: p["targets"][0].update(business_keys=["order_sk"]), "merge_changed",
     "identity_column_named", "targets[0].business_keys[0]"),
    (lambda p: p["targets"][0]["contract"]["not_null"].append("Order_SK"), "merge_changed",
     "identity_column_named", "targets[0].contract.not_null[2]"),
], ids=["replace_where", "identity-key", "identity-not-null"])
def test_a_plan_that_would_renumber_or_key_on_the_identity_is_refused_before_writing(
        spark: Any, identity_lake: Path, tmp_path: Path, capsys: Any, mutate: Any,
        promotion: str, rule: str, field: str) -> None:
    root = copy_lake(identity_lake, tmp_path / "lake")
    v0 = _version(spark, root)
    capsys.readouterr()
    assert _run(write_plan(root, mutate, promotion=promotion), root) == EXIT_USAGE
    out = capsys.readouterr()
    text = out.out + out.err
    assert rule in text and field in text, text
    assert _version(spark, root) == v0
    assert not (root / "_sg").exists() and not (root / "evidence").exists()


@pytest.mark.parametrize("always", [True, False], ids=["always", "by_default"])
def test_undoing_past_another_writer_writes_identity_values_back_only_if_delta_lets_it(
        spark: Any, identity_lake: Path, base_lake: Path, tmp_path: Path, monkeypatch: Any,
        always: bool) -> None:
    """The run promotes and verifies, another writer appends outside the window, then the run
    fails. Putting the window back apart from their commit writes the old order_sk values:
    GENERATED BY DEFAULT takes them (the window is back, their rows kept); GENERATED ALWAYS
    refuses them, so nothing is undone, the failure says why and how to roll back, and their
    rows and the promotion are both still there."""
    if always:
        root = copy_lake(identity_lake, tmp_path / "lake")
    else:
        root = copy_lake(base_lake, tmp_path / "lake")
        _with_identity(spark, root, always=False)
    before = _keys(spark, root)
    theirs = (spark.read.format("delta").load(str(_target(root))).drop("order_sk").limit(3)
              .withColumn("order_date", F.lit(OUTSIDE))
              .withColumn("order_id", F.col("order_id") + 10 ** 8))
    on_failpoint(monkeypatch, faults, "after_promote_ledger",
                 lambda _n: theirs.write.format("delta").mode("append").save(str(_target(root))),
                 times=1)
    fails_once_at(monkeypatch, faults, "after_verify", "storage hiccup after the verification")
    plan = write_plan(root, lambda p: p["execution"].update(slice_partitions=3),
                      promotion="merge_changed")
    v0 = _version(spark, root)
    with pytest.raises(Exception, match="storage hiccup") as err:
        run_backfill(spark, load_plan(plan), str(plan), home=str(root / "_sg"),
                     evidence_dir=str(root / "evidence"), out=lambda _m: None)
    ops = [r["operation"] for r in DeltaTable.forPath(spark, str(_target(root))).history()
           .filter(F.col("version") > v0).orderBy("version").collect()]
    after = _keys(spark, root)
    assert all(after[k] == v for k, v in before.items())  # no order_sk changed either way
    assert sum(k >= 10 ** 8 for k in after) == 3  # their rows
    if not always:
        assert ops == ["MERGE", "WRITE", "WRITE"]  # the promotion, theirs, the window put back
        assert len(after) == len(before) + 3
        return
    assert "GENERATED ALWAYS identity column(s) order_sk" in str(err.value)
    assert "--force" in str(err.value)
    assert ops == ["MERGE", "WRITE"]  # the promotion, theirs; nothing undone
    assert len(after) > len(before) + 3  # the promotion's new orders are there too


def test_plan_init_leaves_the_identity_column_to_the_target(
        spark: Any, identity_lake: Path, tmp_path: Path, capsys: Any) -> None:
    """The drafted plan keys on order_id, neither computes nor contracts nor measures order_sk,
    promotes by merge_changed, and the guard finds nothing to block in it (only fill-ins);
    filled in and approved, it runs, every order keeping its order_sk."""
    root = copy_lake(identity_lake, tmp_path / "lake")
    before = _keys(spark, root)
    out = tmp_path / "draft.yaml"
    assert main(["plan", "init", "--source", str(root / "source" / "orders"),
                 "--target", str(_target(root)), "--start", str(WINDOW[0]),
                 "--end", str(WINDOW[-1]), "--owner", "data@example.com", "--reason", "fix",
                 "-o", str(out)]) == EXIT_OK
    plan = load_plan(out)
    (t,) = plan.target_specs()
    assert t.business_keys == ["order_id"] and t.promotion.value == "merge_changed"
    assert t.transform.sql is not None and "order_sk" not in t.transform.sql
    assert "order_sk" not in {c.name for c in t.contract.columns}
    assert "order_sk" not in t.contract.not_null
    assert not any("order_sk" in f"{c.source_expr} {c.shadow_expr}"
                   for c in plan.validation.checks if c.metric)
    assert "generates order_sk (identity)" in out.read_text()
    capsys.readouterr()
    main(["guard", str(out), "--pre-approval"])
    tagged = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("[")]
    assert tagged and not [ln for ln in tagged if ln.startswith(("[BLOCK]", "[WARN ]"))], tagged
    data = yaml.safe_load(out.read_text())
    bp = data["backfill_plan"]
    bp["targets"][0]["transform"]["sql"] = TRANSFORM_SQL
    bp["approvals"]["required"] = ["data-owner"]
    bp["safeguards"]["downstream_notifications"] = ["bi"]
    for check in bp["validation"]["checks"]:
        if check.get("metric") and not check.get("source_expr"):  # line_total: the source lacks it
            check["source_expr"] = "amount * quantity"
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    record_approval(out, "data-owner", "reviewer@example.com")
    assert _run(out, root) == EXIT_OK
    after = _keys(spark, root)
    assert all(after[k] == v for k, v in before.items()) and len(after) > len(before)
