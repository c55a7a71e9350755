"""Tamper evidence end to end on real Delta tables: a run's ledger chains, evidence hash, seal
and recorded commits verify clean; each kind of tampering is found by ``sparkguard verify``
(exit 1, one line per finding naming what changed); ``verify`` writes nothing."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from delta.tables import DeltaTable

from sparkguard.audit import AUDIT_KEY_ENV
from sparkguard.cli import main
from sparkguard.delta_ops import append_rows, create_log_table
from sparkguard.evidence import load_evidence
from sparkguard.ledger import _SCHEMAS, Ledger
from tests.lakes import copy_lake, write_plan

pytestmark = pytest.mark.spark

KEY = "test-audit-key"


def _run(root: Path) -> Path:
    plan = write_plan(root)
    assert main(["run", "--plan", str(plan), "--home", str(root / "_sg"),
                 "--evidence-dir", str(root / "evidence")]) == 0
    (evidence,) = sorted((root / "evidence").glob("*.yaml"))
    return evidence


def _verify(capsys: Any, *args: str) -> tuple[int, list[str]]:
    capsys.readouterr()
    code = main(["verify", *args])
    out = capsys.readouterr()
    return code, out.out.splitlines() + out.err.splitlines()


def _tampers(lines: list[str]) -> list[str]:
    return [x for x in lines if x.startswith("TAMPER ")]


@pytest.fixture(scope="module")
def done_run(spark: Any, base_lake: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One promoted run, sealed with ``KEY``; tests tamper with copies of its ledger and
    evidence (its targets are left alone)."""
    root = copy_lake(base_lake, tmp_path_factory.mktemp("audit") / "lake")
    os.environ[AUDIT_KEY_ENV] = KEY
    try:
        _run(root)
    finally:
        del os.environ[AUDIT_KEY_ENV]
    return root


@pytest.fixture
def copied(done_run: Path, tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(evidence copy, home copy) of the done run."""
    home = tmp_path / "_sg"
    shutil.copytree(done_run / "_sg" / "ledger", home / "ledger")
    (evidence,) = sorted((done_run / "evidence").glob("*.yaml"))
    ev = tmp_path / evidence.name
    shutil.copy(evidence, ev)
    yield ev, home


def _files(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")
            if p.is_file()}


def test_untouched_run_verifies_clean_in_every_mode_and_writes_nothing(
        spark: Any, done_run: Path, capsys: Any, monkeypatch: Any) -> None:
    (evidence,) = sorted((done_run / "evidence").glob("*.yaml"))
    before = _files(done_run)
    home = str(done_run / "_sg")
    run_id = load_evidence(evidence)["sparkguard"]["run_id"]
    monkeypatch.chdir(done_run)
    for args in (["--evidence", str(evidence)], ["--run-id", run_id, "--home", home],
                 ["--all", "--home", home]):
        code, lines = _verify(capsys, *args)
        assert code == 0, lines
        assert _tampers(lines) == []
        assert "intact" in lines[-1]
        assert any("seal_unchecked" in x for x in lines)  # sealed, no key given
    monkeypatch.setenv(AUDIT_KEY_ENV, KEY)
    code, lines = _verify(capsys, "--evidence", str(evidence))
    assert code == 0 and not any("seal" in x for x in lines[:-1]), lines
    assert _files(done_run) == before  # no file added, changed or removed: no Delta version
    # the same answer through Spark (catalog tables, schemes delta-rs cannot open)
    monkeypatch.setenv("SPARKGUARD_READER", "spark")
    code, through_spark = _verify(capsys, "--evidence", str(evidence))
    assert code == 0 and through_spark[:-1] == lines[:-1], through_spark
    assert "(spark)" in through_spark[-1] and "(delta-rs)" in lines[-1]
    assert _files(done_run) == before


def test_audit_section_records_heads_commits_and_the_ledger_record(done_run: Path) -> None:
    (evidence,) = sorted((done_run / "evidence").glob("*.yaml"))
    section = load_evidence(evidence)["audit"]
    assert section["ledger_home"] == str(done_run / "_sg")
    assert len(section["chains"]["runs"]) == 64 and len(section["chains"]["slices"]) == 64
    target = str(done_run / "target" / "orders_clean")
    assert list(section["chains"]["locks"]) == [f"file:{target}"]  # the table's location
    (commit,) = section["commits"]
    assert commit["table"] == target and commit["operation"] in ("WRITE", "MERGE")
    assert '"action": "promote"' in commit["userMetadata"]
    assert len(section["content_hash"]) == 64 and len(section["seal"]) == 64


def _edit_gate_digit(path: Path) -> None:
    """Change one digit of the first full-window gate's measured value, as a person would."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    start = next(i for i, x in enumerate(lines) if x.strip() == "full_window:")
    i = next(i for i in range(start, len(lines)) if re.match(r"\s+value: '?\d", lines[i]))
    m = re.search(r"\d", lines[i])
    assert m
    digit = m.group()
    lines[i] = lines[i][:m.start()] + str((int(digit) + 1) % 10) + lines[i][m.end():]
    path.write_text("".join(lines), encoding="utf-8")


def test_one_digit_of_a_gate_value_changed_exits_1_naming_the_field(
        copied: tuple[Path, Path], capsys: Any) -> None:
    ev, home = copied
    _edit_gate_digit(ev)
    code, lines = _verify(capsys, "--evidence", str(ev), "--home", str(home))
    assert code == 1
    assert _tampers(lines) == [
        f"TAMPER evidence_edited {ev}: sparkguard.targets[0].full_window.gates[0].measured.value "
        "changed"]


def _sql(spark: Any, statement: str) -> None:
    spark.sql(statement).collect()


def _unprotect(spark: Any, path: Path) -> None:
    _sql(spark, f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.appendOnly' = 'false')")


def test_ledger_row_edited_by_update(spark: Any, copied: tuple[Path, Path], capsys: Any) -> None:
    ev, home = copied
    runs = home / "ledger" / "runs"
    _unprotect(spark, runs)
    _sql(spark, f"UPDATE delta.`{runs}` SET owner = 'someone-else' WHERE state = 'promoted'")
    code, lines = _verify(capsys, "--evidence", str(ev), "--home", str(home))
    assert code == 1
    found = _tampers(lines)
    assert any(x.startswith("TAMPER edited runs[run ") and "content does not match" in x
               for x in found), found
    assert any("ledger/runs@v" in x and "UPDATE" in x for x in found), found
    assert any("append-only protection switched off" in x for x in found), found


def test_ledger_row_deleted(spark: Any, copied: tuple[Path, Path], capsys: Any) -> None:
    ev, home = copied
    runs = home / "ledger" / "runs"
    _unprotect(spark, runs)
    _sql(spark, f"DELETE FROM delta.`{runs}` WHERE state = 'promoting'")
    code, lines = _verify(capsys, "--evidence", str(ev), "--home", str(home))
    assert code == 1
    found = _tampers(lines)
    assert any(x.startswith("TAMPER deleted runs[run ") for x in found), found
    assert any("DELETE on an append-only ledger table" in x for x in found), found


def test_ledger_table_restored(spark: Any, copied: tuple[Path, Path], capsys: Any) -> None:
    ev, home = copied
    slices = home / "ledger" / "slices"
    versions = DeltaTable.forPath(spark, str(slices)).history().count()
    _sql(spark, f"RESTORE TABLE delta.`{slices}` TO VERSION AS OF {versions - 2}")
    code, lines = _verify(capsys, "--evidence", str(ev), "--home", str(home))
    assert code == 1
    found = _tampers(lines)
    assert any("ledger/slices@v" in x and "RESTORE" in x for x in found), found
    assert any(x.startswith("TAMPER head_missing slices[run ") for x in found), found


def test_seal_forged_with_the_wrong_key(copied: tuple[Path, Path], capsys: Any,
                                        monkeypatch: Any) -> None:
    """An editor without the key changes a value, recomputes the content hash and seals it
    with a key of their own: the seal (and the ledger's record) give it away."""
    import yaml

    from sparkguard.audit_trail import attach_audit, evidence_digest

    ev, home = copied
    data = load_evidence(ev)
    data["release_gate_evidence"]["owner"] = "mallory@example.com"
    section = data.pop("audit")
    attach_audit(data, home=section["ledger_home"], chains=section["chains"],
                 commits=section["commits"], key=b"not-the-key")
    assert evidence_digest(data)[1] == data["audit"]["content_hash"]
    ev.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    monkeypatch.setenv(AUDIT_KEY_ENV, KEY)
    code, lines = _verify(capsys, "--evidence", str(ev), "--home", str(home))
    assert code == 1
    found = _tampers(lines)
    assert any("seal_mismatch" in x for x in found), found
    assert any("release_gate_evidence.owner changed" in x for x in found), found
    # the right file checked with a wrong key fails too
    monkeypatch.setenv(AUDIT_KEY_ENV, "guess")
    shutil.copy(next(Path(section["ledger_home"]).parent.glob("evidence/*.yaml")), ev)
    code, lines = _verify(capsys, "--evidence", str(ev), "--home", str(home))
    assert code == 1 and [x.split()[1] for x in _tampers(lines)] == ["seal_mismatch"]


def test_rollback_reseals_and_an_out_of_band_restore_of_the_target_is_reported(
        spark: Any, base_lake: Path, tmp_path: Path, capsys: Any) -> None:
    """sparkguard's own rollback edits the evidence and re-seals it (still intact; its restore
    is a later commit); a RESTORE outside sparkguard is reported as information with its
    version and operation."""
    root = copy_lake(base_lake, tmp_path / "lake")
    evidence = _run(root)
    target = root / "target" / "orders_clean"
    data = load_evidence(evidence)
    promoted = data["sparkguard"]["targets"][0]["promoted_version"]
    earlier = tmp_path / "sent-to-the-auditor-before-the-rollback.yaml"
    shutil.copy(evidence, earlier)
    assert main(["rollback", "--run-id", data["sparkguard"]["run_id"],
                 "--home", str(root / "_sg")]) == 0
    code, lines = _verify(capsys, "--evidence", str(evidence))
    assert code == 0, lines
    assert load_evidence(evidence)["sparkguard"]["rollbacks"]
    assert not [x for x in lines if "evidence_superseded" in x]
    # the copy taken before the rollback is genuine, not tampered: it matches the ledger's
    # earlier evidence record and is reported as superseded by the newest one
    code, lines = _verify(capsys, "--home", str(root / "_sg"), "--evidence", str(earlier))
    assert code == 0 and not _tampers(lines), lines
    assert [x.split()[:2] for x in lines if "superseded" in x] == [
        ["INFO", "evidence_superseded"]]
    _edit_gate_digit(earlier)  # an edited earlier copy is still tampering
    code, lines = _verify(capsys, "--home", str(root / "_sg"), "--evidence", str(earlier))
    assert code == 1 and {x.split()[1] for x in _tampers(lines)} == {"evidence_edited"}, lines
    assert [x.split()[1] for x in lines if x.startswith("INFO later_commit")] == [
        "later_commit"]
    _sql(spark, f"RESTORE TABLE delta.`{target}` TO VERSION AS OF {promoted}")
    code, lines = _verify(capsys, "--evidence", str(evidence))
    assert code == 0, lines  # information: the record itself is intact
    later = [x for x in lines if x.startswith("INFO later_commit")]
    assert len(later) == 2 and all("RESTORE after this run" in x for x in later)
    assert later[1].startswith(f"INFO later_commit {target}@v{promoted + 2}: RESTORE")


def test_rollback_leaves_evidence_edited_after_it_was_written_as_it_is(
        base_lake: Path, tmp_path: Path, capsys: Any) -> None:
    """Evidence edited by hand, then the run rolled back: the rollback restores the target but
    does not re-hash (or re-seal) the edited file, which would record the edit in the ledger as
    the evidence and make it verify intact."""
    root = copy_lake(base_lake, tmp_path / "lake")
    evidence = _run(root)
    run_id = load_evidence(evidence)["sparkguard"]["run_id"]
    _edit_gate_digit(evidence)
    edited = evidence.read_text(encoding="utf-8")
    capsys.readouterr()
    assert main(["rollback", "--run-id", run_id, "--home", str(root / "_sg")]) == 0
    out = capsys.readouterr().out
    assert f"WARNING the evidence {evidence} does not match the ledger's record" in out
    assert "evidence_edited" in out
    assert evidence.read_text(encoding="utf-8") == edited  # not rewritten, not re-hashed
    code, lines = _verify(capsys, "--evidence", str(evidence))
    assert code == 1 and [x.split()[1] for x in _tampers(lines)] == ["evidence_edited"]


def test_ledger_written_before_auditing_keeps_working(spark: Any, tmp_path: Path,
                                                     capsys: Any) -> None:
    """Tables without the hash columns: old rows read as unchained (information), new events
    add the columns and chain."""
    import datetime as dt

    home = tmp_path / "_sg"
    for name, schema in _SCHEMAS.items():
        create_log_table(spark, str(home / "ledger" / name), schema)
    old = ("old-run", dt.datetime(2024, 1, 1), "started", None, "p", "fp", "o", 1, None, None,
           None, "{}")
    append_rows(spark, str(home / "ledger" / "runs"), _SCHEMAS["runs"], [old])
    ledger = Ledger(spark, str(home))
    ledger.record_run("old-run", "failed", fingerprint="fp", error="boom")
    ledger.record_run("new-run", "started", fingerprint="fp")
    ledger.record_run("new-run", "done", fingerprint="fp")
    events = ledger.run_events("old-run")
    assert events[0]["event_hash"] is None and len(events[1]["event_hash"]) == 64
    code, lines = _verify(capsys, "--all", "--home", str(home))
    assert code == 0, lines
    assert any(x.startswith("INFO unchained runs[run old-run]") for x in lines), lines
    assert any("SET TBLPROPERTIES" not in x for x in lines)


@pytest.fixture
def with_control(done_run: Path, copied: tuple[Path, Path]) -> tuple[Path, Path, Path]:
    """(evidence copy, home copy, control table copy): the copy with its publish control."""
    ev, home = copied
    shutil.copytree(done_run / "_sg" / "control", home / "control")
    return ev, home, home / "control" / "publish"


def _control_rows(spark: Any, control: Path) -> list[dict[str, Any]]:
    return [r.asDict() for r in spark.read.format("delta").load(str(control)).orderBy("at")
            .collect()]  # a handful of rows: one test run's publish events


def test_publish_events_chain_per_target_and_verify_clean(
        spark: Any, done_run: Path, with_control: tuple[Path, Path, Path], capsys: Any) -> None:
    """The run's pause and its finish's release are one chain on the target (the release
    continues the pause), and an untouched chain verifies clean in every mode."""
    ev, home, control = with_control
    target = str(done_run / "target" / "orders_clean")
    rows = _control_rows(spark, control)
    assert [(r["target"], r["paused"]) for r in rows] == [(target, True), (target, False)]
    assert rows[0]["prev_hash"] is None and len(rows[0]["event_hash"]) == 64
    assert rows[1]["prev_hash"] == rows[0]["event_hash"]
    run_id = load_evidence(ev)["sparkguard"]["run_id"]
    for args in (["--evidence", str(ev)], ["--run-id", run_id], ["--all"]):
        code, lines = _verify(capsys, *args, "--home", str(home))
        assert code == 0 and _tampers(lines) == [], lines
        assert not any("publish[" in x for x in lines), lines


def test_publish_event_edited_by_update(spark: Any, with_control: tuple[Path, Path, Path],
                                        capsys: Any) -> None:
    ev, home, control = with_control
    _unprotect(spark, control)
    _sql(spark, f"UPDATE delta.`{control}` SET actor = 'someone-else' WHERE paused")
    for reader in ("delta-rs", "spark"):
        os.environ["SPARKGUARD_READER"] = reader
        try:
            code, lines = _verify(capsys, "--evidence", str(ev), "--home", str(home))
        finally:
            del os.environ["SPARKGUARD_READER"]
        assert code == 1
        found = _tampers(lines)
        edited = [x for x in found if x.startswith("TAMPER edited publish[target ")]
        assert len(edited) == 1 and "content does not match its event_hash" in edited[0], found
        assert any("control/publish@v" in x and "UPDATE" in x for x in found), found


def test_publish_event_deleted(spark: Any, done_run: Path, with_control: tuple[Path, Path, Path],
                               capsys: Any) -> None:
    ev, home, control = with_control
    target = str(done_run / "target" / "orders_clean")
    _unprotect(spark, control)
    _sql(spark, f"DELETE FROM delta.`{control}` WHERE paused")
    code, lines = _verify(capsys, "--evidence", str(ev), "--home", str(home))
    assert code == 1
    found = _tampers(lines)
    assert any(x.startswith(f"TAMPER deleted publish[target {target}] event at ")
               and "the event before it" in x for x in found), found
    assert any("DELETE on an append-only ledger table" in x for x in found), found


def test_publish_event_inserted(spark: Any, with_control: tuple[Path, Path, Path],
                                capsys: Any) -> None:
    """A forged release appended with a copied predecessor hash forks the chain."""
    from sparkguard.publish import _write_schema

    ev, home, control = with_control
    first = _control_rows(spark, control)[0]
    forged = {**first, "paused": False, "actor": "mallory"}
    append_rows(spark, str(control), _write_schema(),
                [tuple(forged[f.name] for f in _write_schema().fields)])
    code, lines = _verify(capsys, "--evidence", str(ev), "--home", str(home))
    assert code == 1
    found = _tampers(lines)
    assert any(x.startswith("TAMPER edited publish[target ") for x in found), found
    assert any(x.startswith("TAMPER inserted publish[target ") for x in found), found


def test_publish_control_written_before_auditing_keeps_working(
        spark: Any, tmp_path: Path, capsys: Any) -> None:
    """An old control table gains the hash columns on the next append; old rows read as
    unchained (information), new events chain from there; is_paused answers the same through
    delta-rs and Spark."""
    import datetime as dt

    from pyspark.sql.types import StructType

    from sparkguard.publish import PublishControl, _schema, is_paused

    home = tmp_path / "_sg"
    control = home / "control" / "publish"
    first = StructType(_schema().fields[:7])  # the first control table: no hashes, no location
    create_log_table(spark, str(control), first)
    append_rows(spark, str(control), first,
                [("t1", "manual", True, dt.datetime(2024, 1, 1), None, "ops", "old pause")])
    assert is_paused(str(home), "t1") and is_paused(spark, "t1", str(home))
    ctl = PublishControl(spark, str(home))
    assert ctl.resume(["t1", "t2"], actor="ops") == ["t1: manual"]
    PublishControl(spark, str(home)).pause(["t2"], run_id="r1", actor="ops")
    ctl.release(["t2"], "r1")
    ctl.pause(["t1"], actor="ops", reason="quotes ' and \" and é")
    rows = _control_rows(spark, control)
    assert rows[0]["event_hash"] is None
    by_target: dict[str, list[dict[str, Any]]] = {}
    for r in rows[1:]:
        by_target.setdefault(r["target"], []).append(r)
    for events in by_target.values():
        assert events[0]["prev_hash"] is None
        assert [e["prev_hash"] for e in events[1:]] == [e["event_hash"] for e in events[:-1]]
    for t, paused in (("t1", True), ("t2", False)):
        assert is_paused(str(home), t) is paused and is_paused(spark, t, str(home)) is paused
    code, lines = _verify(capsys, "--all", "--home", str(home))
    assert code == 0, lines
    assert [x.split()[1:3] for x in lines if x.startswith("INFO unchained")] == [
        ["unchained", "publish[target"]], lines


def test_chained_control_table_without_locations_stays_intact_as_locations_are_added(
        spark: Any, tmp_path: Path, capsys: Any) -> None:
    """A control table written with hashes but before events recorded the table's location: the
    next event adds the column, the old rows (null there) still verify against the hashes they
    were written with, and a hold set under a path is seen through the catalog name of the same
    table from then on."""
    import datetime as dt

    from pyspark.sql.types import StringType, StructField, StructType

    from sparkguard.ledger_model import chained_hash
    from sparkguard.publish import PublishControl, _schema, is_paused

    table = tmp_path / "orders"
    spark.range(3).write.format("delta").save(str(table))
    spark.sql(f"CREATE TABLE sg_named_orders USING DELTA LOCATION '{table}'")
    try:
        home = tmp_path / "_sg"
        control = home / "control" / "publish"
        names = _schema().names[:7]
        before = StructType([*_schema().fields[:7],
                             *[StructField(n, StringType(), True) for n in ("event_hash",
                                                                            "prev_hash")]])
        rows, prev = [], None
        for i, (hold, paused) in enumerate((("old-run", True), ("old-run", False))):
            row = (str(table), hold, paused, dt.datetime(2024, 1, 1, 0, 0, i), hold, "ops", "r")
            h = chained_hash("publish", dict(zip(names, row, strict=True)), prev)
            rows.append((*row, h, prev))
            prev = h
        create_log_table(spark, str(control), before)
        append_rows(spark, str(control), before, rows)
        PublishControl(spark, str(home)).pause([str(table)], run_id="new-run", actor="ops")
        assert "location" in spark.read.format("delta").load(str(control)).columns
        for named in (str(table), f"{table}/", "sg_named_orders"):
            assert is_paused(spark, named, str(home)), named
        assert is_paused(str(home), f"file://{table}")  # delta-rs: the path's location form
        code, lines = _verify(capsys, "--all", "--home", str(home))
        assert code == 0 and _tampers(lines) == [], lines
    finally:
        spark.sql("DROP TABLE IF EXISTS sg_named_orders")


def test_usage_errors_exit_2(tmp_path: Path, capsys: Any) -> None:
    assert main(["verify"]) == 2
    assert main(["verify", "--evidence", str(tmp_path / "nope.yaml")]) == 2
    assert main(["verify", "--run-id", "x", "--all", "--home", str(tmp_path)]) == 2
    code, lines = _verify(capsys, "--run-id", "no-such-run", "--home", str(tmp_path))
    assert code == 2 and "no such run" in " ".join(lines)
    assert list(tmp_path.iterdir()) == []


def test_audit_section_stripped_from_the_evidence_is_tampering(
        copied: tuple[Path, Path], capsys: Any, monkeypatch: Any) -> None:
    """Removing ``audit:`` (and editing the file) does not pass it off as written before
    auditing: the ledger recorded it, with or without the key."""
    import yaml

    ev, home = copied
    data = load_evidence(ev)
    del data["audit"]
    data["release_gate_evidence"]["owner"] = "mallory@example.com"
    ev.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    for key in (None, KEY):
        if key:
            monkeypatch.setenv(AUDIT_KEY_ENV, key)
        code, lines = _verify(capsys, "--evidence", str(ev), "--home", str(home))
        assert code == 1, lines
        found = _tampers(lines)
        assert any("audit section was removed" in x for x in found), found
        assert any("release_gate_evidence.owner changed" in x for x in found), found


def test_evidence_of_a_run_the_ledger_never_held_is_not_intact(
        copied: tuple[Path, Path], capsys: Any) -> None:
    """A file re-labelled with a run id the ledger does not know (its chain heads blanked and
    its content hash recomputed, no key needed) does not verify as intact."""
    import yaml

    from sparkguard.audit_trail import attach_audit

    ev, home = copied
    data = load_evidence(ev)
    section = data.pop("audit")
    data["sparkguard"]["run_id"] = "20990101T000000Z-forged00"
    attach_audit(data, home=section["ledger_home"], chains={}, commits=section["commits"],
                 key=None)
    ev.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    code, lines = _verify(capsys, "--evidence", str(ev), "--home", str(home))
    assert code == 1, lines
    assert any(x.startswith("TAMPER run_missing run 20990101T000000Z-forged00:")
               for x in _tampers(lines)), lines


def test_lock_table_recreated_without_the_targets_events_loses_the_recorded_head(
        spark: Any, done_run: Path, copied: tuple[Path, Path], capsys: Any) -> None:
    """The evidence recorded the target's lock chain head; a lock table recreated empty (no
    rewrite in its history) holds no event of that target, and the head used to go unchecked."""
    ev, home = copied
    target = f"file:{done_run / 'target' / 'orders_clean'}"  # a lock is keyed by the location
    locks = home / "ledger" / "locks"
    shutil.rmtree(locks)
    create_log_table(spark, str(locks), _SCHEMAS["locks"])
    code, lines = _verify(capsys, "--evidence", str(ev), "--home", str(home))
    assert code == 1, lines
    assert any(x.startswith(f"TAMPER head_missing locks[target {target}]")
               for x in _tampers(lines)), lines


def test_evidence_table_removed_and_the_seal_stripped_is_not_intact(
        copied: tuple[Path, Path], capsys: Any, monkeypatch: Any) -> None:
    """An editor removes the ledger's evidence records (the whole table), edits the file,
    recomputes its content hash and leaves it unsealed: the run's own chained events name the
    evidence it wrote, so the missing record is tampering, with the key set or not."""
    import yaml

    from sparkguard.audit_trail import attach_audit

    ev, home = copied
    data = load_evidence(ev)
    section = data.pop("audit")
    data["release_gate_evidence"]["owner"] = "mallory@example.com"
    attach_audit(data, home=section["ledger_home"], chains=section["chains"],
                 commits=section["commits"], key=None)
    ev.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    shutil.rmtree(home / "ledger" / "evidence")
    for key in (None, KEY):
        if key:
            monkeypatch.setenv(AUDIT_KEY_ENV, key)
        code, lines = _verify(capsys, "--evidence", str(ev), "--home", str(home))
        assert code == 1, lines
        run_id = data["sparkguard"]["run_id"]
        assert [x.split(":")[0] for x in _tampers(lines)] == [
            f"TAMPER evidence_record_missing run {run_id}"], lines


def test_a_driver_in_another_zone_stores_the_instant_and_verifies_across_dst_changes(
        spark: Any, tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    """A driver whose OS zone is New York writes ledger and publish events at 02:30 UTC on the
    day New York skips 02:00-03:00, and in its repeated autumn hour (one append of two publish
    events, a microsecond apart, across it). The tables hold the true UTC instants, and the
    chains verify intact read back through delta-rs and through Spark, in any zone."""
    import datetime as dt
    import time

    from sparkguard.ledger_model import CLOCK
    from sparkguard.publish import PublishControl

    if not hasattr(time, "tzset"):
        pytest.skip("no tzset on this platform")
    moments = iter([dt.datetime(2026, 3, 8, 2, 30, tzinfo=dt.UTC),  # naive 02:30: no such NY time
                    dt.datetime(2026, 3, 8, 2, 31, tzinfo=dt.UTC),
                    dt.datetime(2026, 11, 1, 5, 59, 59, 999_999, tzinfo=dt.UTC),  # 01:59:59 EDT
                    dt.datetime(2026, 11, 1, 6, 0, 30, tzinfo=dt.UTC)])
    monkeypatch.setattr(CLOCK, "source", lambda: next(moments))
    monkeypatch.setattr(CLOCK, "_last", None)
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        home = tmp_path / "_sg"
        ledger = Ledger(spark, str(home))
        ledger.record_run("ny-run", "started", fingerprint="fp")
        ledger.record_run("ny-run", "failed", fingerprint="fp", error="boom")
        control = PublishControl(spark, str(home))
        targets = ["/lake/a", "/lake/b"]
        control.pause(targets, run_id="ny-run", locations={t: f"file:{t}" for t in targets})
        control.finish(targets, "ny-run", locations={t: f"file:{t}" for t in targets})
        stored = [r[0] for r in spark.sql(  # the session zone is UTC: the stored instants
            f"SELECT date_format(at, 'yyyy-MM-dd HH:mm:ss.SSSSSS') FROM delta.`{home}/ledger/runs` "
            f"UNION ALL SELECT date_format(at, 'yyyy-MM-dd HH:mm:ss.SSSSSS') FROM "
            f"delta.`{home}/control/publish` ORDER BY 1").collect()]
        assert stored == ["2026-03-08 02:30:00.000000", "2026-03-08 02:31:00.000000",
                          "2026-11-01 05:59:59.999999", "2026-11-01 06:00:00.000000",
                          "2026-11-01 06:00:30.000000", "2026-11-01 06:00:30.000001"]
        for reader in ("delta-rs", "spark"):
            monkeypatch.setenv("SPARKGUARD_READER", reader)
            code, lines = _verify(capsys, "--all", "--home", str(home))
            assert code == 0 and _tampers(lines) == [], (reader, lines)
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_runs_table_recreated_without_a_run_fails_verify_all(
        spark: Any, copied: tuple[Path, Path], capsys: Any) -> None:
    """``verify --all`` took its runs from the runs table alone: recreated empty (no rewrite in
    its history), it checked nothing and said intact. The run is still named by its slices
    and its evidence record."""
    ev, home = copied
    runs = home / "ledger" / "runs"
    shutil.rmtree(runs)
    create_log_table(spark, str(runs), _SCHEMAS["runs"])
    code, lines = _verify(capsys, "--all", "--home", str(home))
    assert code == 1, lines
    run_id = load_evidence(ev)["sparkguard"]["run_id"]
    assert any(x.startswith(f"TAMPER run_missing run {run_id}") for x in _tampers(lines)), lines


def test_an_edited_markdown_summary_is_reported(
        done_run: Path, copied: tuple[Path, Path], capsys: Any) -> None:
    """The Markdown is not hashed: verify said nothing when its outcome line was edited."""
    ev, home = copied
    (original,) = sorted((done_run / "evidence").glob("*.md"))
    md = ev.with_suffix(".md")
    md.write_text(original.read_text(encoding="utf-8"), encoding="utf-8")
    code, lines = _verify(capsys, "--evidence", str(ev), "--home", str(home))
    assert code == 0 and not any("markdown_differs" in x for x in lines), lines
    md.write_text(md.read_text(encoding="utf-8").replace(
        "**Outcome: promoted.**", "**Outcome: promoted, reviewed.**"), encoding="utf-8")
    code, lines = _verify(capsys, "--evidence", str(ev), "--home", str(home))
    assert any(x.startswith(f"INFO markdown_differs {md}") for x in lines), lines
