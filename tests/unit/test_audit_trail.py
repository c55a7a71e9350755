"""The audit section and verify's checks, without Spark: evidence hashing round-trips through
YAML, the seal, naming the edited field, ledger histories, recorded commits, chain heads, and
the time zone a verifier runs in."""

from __future__ import annotations

import datetime as dt
import os
import time
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from sparkguard.audit_trail import (
    attach_audit,
    audit_key,
    check_chain,
    check_commits,
    check_evidence,
    check_ledger_history,
    commit_record,
    evidence_digest,
    evidence_record,
)
from sparkguard.doc_io import dump_yaml
from sparkguard.ledger_model import chained_hash


def _doc() -> dict[str, Any]:
    return {"release_gate_evidence": {"owner": "o", "notes": "it's \"quoted\""},
            "sparkguard": {"run_id": "r1", "written_at": "2025-01-01T00:00:00+00:00",
                           "targets": [{"gates": [{"measured": {"value": 1234.5, "nan": float("nan")},
                                                   "when": dt.date(2025, 1, 3)}]}],
                           "none": None}}


def _sealed(key: bytes | None = b"k") -> tuple[dict[str, Any], dict[str, str], str]:
    data, leaves, root, _ = attach_audit(
        _doc(), home="/h", chains={"runs": "a" * 64, "slices": None, "locks": {"/t": "b" * 64}},
        commits=[commit_record("/t", {"version": 3, "timestamp": 1735689600123,
                                      "operation": "WRITE", "userMetadata": "{}"})], key=key)
    return yaml.safe_load(yaml.safe_dump(data)), leaves, root


def test_content_hash_survives_the_yaml_round_trip_and_verifies_clean() -> None:
    data, leaves, root = _sealed()
    assert evidence_digest(data) == (leaves, root)
    record = {"content_hash": root, "seal": data["audit"]["seal"], "leaves": leaves}
    assert [f for f in check_evidence("e.yaml", data, record, b"k") if f.severity == "tamper"] == []


def test_an_earlier_genuine_copy_is_checked_against_its_own_record_and_said_superseded(
        ) -> None:
    data, leaves, root = _sealed()
    older = {"at": dt.datetime(2025, 1, 1, 1, 0, tzinfo=dt.UTC), "content_hash": root,
             "seal": data["audit"]["seal"], "leaves": leaves}
    newest = {"at": dt.datetime(2025, 1, 1, 2, 0, tzinfo=dt.UTC), "content_hash": "c" * 64,
              "seal": "d" * 64, "leaves": {}}
    record, found = evidence_record("e.yaml", data, [older, newest])
    assert record is older and [(f.kind, f.severity) for f in found] == [
        ("evidence_superseded", "info")]
    assert "2025-01-01T01:00:00+00:00" in found[0].detail
    assert [f for f in check_evidence("e.yaml", data, record, b"k") if f.severity == "tamper"] \
        == []
    assert evidence_record("e.yaml", data, [newest, older]) == (older, [])  # it is the newest
    data["release_gate_evidence"]["owner"] = "mallory"  # an edited copy matches no record
    record, found = evidence_record("e.yaml", data, [older, newest])
    assert record is newest and found == []
    assert evidence_record("e.yaml", data, []) == (None, [])


def test_an_earlier_copy_put_back_at_the_runs_evidence_path_is_tampering(tmp_path: Any) -> None:
    """A rollback rewrote the evidence at its path; the pre-rollback copy copied back over it
    (saying ``promoted``) matched the older record and passed as "superseded"."""
    data, leaves, root = _sealed()
    path = tmp_path / "run.yaml"
    path.write_text("x")
    older = {"at": dt.datetime(2025, 1, 1, 1, 0, tzinfo=dt.UTC), "content_hash": root,
             "seal": data["audit"]["seal"], "leaves": leaves, "path": str(path)}
    newest = {**older, "at": dt.datetime(2025, 1, 1, 2, 0, tzinfo=dt.UTC),
              "content_hash": "c" * 64, "seal": "d" * 64, "leaves": {}}
    for where in (str(path), str(tmp_path / "." / "run.yaml")):
        record, found = evidence_record(where, data, [older, newest])
        assert record is older and [(f.kind, f.severity) for f in found] == [
            ("evidence_reverted", "tamper")], where
    kept = tmp_path / "kept.yaml"  # a copy kept elsewhere is what it says it is
    kept.write_text("x")
    assert [f.kind for f in evidence_record(str(kept), data, [older, newest])[1]] == [
        "evidence_superseded"]


def test_one_digit_changed_names_the_field() -> None:
    data, leaves, root = _sealed()
    data["sparkguard"]["targets"][0]["gates"][0]["measured"]["value"] = 1334.5
    found = check_evidence("e.yaml", data, {"content_hash": root, "leaves": leaves}, None)
    assert [f.detail for f in found if f.severity == "tamper"] == [
        "sparkguard.targets[0].gates[0].measured.value changed"]


def test_hash_recomputed_by_the_editor_still_fails_against_the_ledger_record() -> None:
    data, leaves, root = _sealed(None)
    data["release_gate_evidence"]["owner"] = "mallory"
    data["audit"]["content_hash"] = evidence_digest(data)[1]
    lines = [f.line() for f in check_evidence("e.yaml", data,
                                             {"content_hash": root, "leaves": leaves}, None)]
    assert any("release_gate_evidence.owner changed" in x for x in lines)
    assert any("differs from the one the ledger recorded" in x for x in lines)


def test_seal_with_the_wrong_key_or_reforged_fails() -> None:
    data, leaves, root = _sealed(b"right")
    record = {"content_hash": root, "seal": data["audit"]["seal"], "leaves": leaves}
    assert [f.kind for f in check_evidence("e", data, record, b"wrong")] == ["seal_mismatch"]
    # no key: the seal is reported, not checked
    assert [(f.kind, f.severity) for f in check_evidence("e", data, record, None)] == [
        ("seal_unchecked", "info")]
    # the seal stripped from the file (a downgrade) while the ledger recorded one
    data["audit"]["seal"] = None
    assert "seal_mismatch" in [f.kind for f in check_evidence("e", data, record, b"right")]


def test_evidence_without_an_audit_section_is_information() -> None:
    (f,) = check_evidence("e", _doc(), None, None)
    assert (f.kind, f.severity) == ("unaudited", "info")


def test_audit_key_from_the_environment() -> None:
    assert audit_key({"SPARKGUARD_AUDIT_KEY": "s3cr3t"}) == b"s3cr3t"
    assert audit_key({"SPARKGUARD_AUDIT_KEY": ""}) is None
    assert audit_key({}) is None


def _chain(n: int = 3) -> list[dict[str, Any]]:
    prev, out = None, []
    t0 = dt.datetime(2025, 3, 30, 0, 59, 59, 999999)  # around a DST change in Europe
    for i in range(n):
        row = {"run_id": "r", "at": t0 + dt.timedelta(hours=i), "state": f"s{i}",
               "details": {"x": i, "q": "it's"}}
        h = chained_hash("runs", row, prev)
        out.append({**row, "event_hash": h, "prev_hash": prev})
        prev = h
    return out


def test_chain_intact_edited_deleted_and_recorded_head() -> None:
    events = _chain()
    assert check_chain("runs", "run r", events, [events[-1]["event_hash"]]) == []
    edited = [dict(e) for e in events]
    edited[1]["state"] = "done"
    assert [f.kind for f in check_chain("runs", "run r", edited)] == ["edited"]
    kinds = [f.kind for f in check_chain("runs", "run r", events[:-1],
                                         [events[-1]["event_hash"]])]
    assert kinds == ["head_missing"]
    assert "deleted" in [f.kind for f in check_chain("runs", "run r", [events[0], events[2]])]


def test_chain_verifies_in_another_time_zone() -> None:
    """Naive timestamps are local time as PySpark writes them; the hash covers the instant."""
    if not hasattr(time, "tzset"):
        pytest.skip("no tzset on this platform")
    old = os.environ.get("TZ")
    try:
        os.environ["TZ"] = "UTC"
        time.tzset()
        events = _chain()
        instants = [e["at"].astimezone(dt.UTC) for e in events]
        os.environ["TZ"] = "America/Los_Angeles"
        time.tzset()
        moved = [{**e, "at": i.astimezone().replace(tzinfo=None)}
                 for e, i in zip(events, instants, strict=True)]
        assert moved[0]["at"] != events[0]["at"]
        assert check_chain("runs", "run r", moved) == []
    finally:
        if old is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = old
        time.tzset()


def test_ledger_history_rewrites_are_tampering_appends_and_compaction_are_not() -> None:
    history = [{"version": 0, "operation": "CREATE TABLE"},
               {"version": 1, "operation": "WRITE", "operationParameters": {"mode": "Append"}},
               {"version": 2, "operation": "OPTIMIZE"},
               {"version": 3, "operation": "SET TBLPROPERTIES",
                "operationParameters": {"properties": '{"delta.appendOnly":"false"}'}},
               {"version": 4, "operation": "UPDATE"},
               {"version": 5, "operation": "DELETE"},
               {"version": 6, "operation": "RESTORE"},
               {"version": 7, "operation": "WRITE", "operationParameters": {"mode": "Overwrite"}},
               {"version": 8, "operation": "ADD COLUMNS"},
               # appendOnly unset, then the table replaced and refilled (delta-rs can do both)
               {"version": 9, "operation": "UNSET TBLPROPERTIES",
                "operationParameters": {"properties": '["delta.appendOnly"]'}},
               {"version": 10, "operation": "CREATE OR REPLACE TABLE"},
               {"version": 11, "operation": "WRITE", "operationParameters": {"mode": "Append"}},
               {"version": 12, "operation": "UNSET TBLPROPERTIES",
                "operationParameters": {"properties": '["delta.checkpointInterval"]'}}]
    found = check_ledger_history("runs", history)
    assert [(f.where, f.severity) for f in found] == [
        ("ledger/runs@v3", "tamper"), ("ledger/runs@v4", "tamper"), ("ledger/runs@v5", "tamper"),
        ("ledger/runs@v6", "tamper"), ("ledger/runs@v7", "tamper"), ("ledger/runs@v8", "info"),
        ("ledger/runs@v9", "tamper"), ("ledger/runs@v10", "tamper"), ("ledger/runs@v12", "info")]
    created = [{"version": 0, "operation": "CREATE OR REPLACE TABLE"}]  # a first creation
    assert check_ledger_history("runs", created) == []


def test_commits_missing_different_and_later_ones() -> None:
    hist = [{"version": 3, "timestamp": 1735689600123, "operation": "WRITE",
             "userMetadata": '{"sparkguard": {"run_id": "r"}}'},
            {"version": 4, "timestamp": 1735689700000, "operation": "RESTORE",
             "userMetadata": None}]
    rec = [commit_record("/t", {**hist[0], "timestamp": 1735689600140})]  # Spark's file time
    found = check_commits("/t", rec, hist, 2)
    assert [(f.kind, f.severity) for f in found] == [("later_commit", "info")]
    assert "RESTORE" in found[0].detail and found[0].where == "/t@v4"
    other = [{**hist[0], "userMetadata": "{}"}]
    assert [f.kind for f in check_commits("/t", rec, other, 2)] == ["commit_different"]
    assert [f.kind for f in check_commits("/t", rec, hist[1:], 2)] == ["commit_missing",
                                                                       "later_commit"]
    assert [f.kind for f in check_commits("/t", rec, None, 2)] == ["commit_missing"]


def test_audit_section_removed_from_recorded_evidence_is_tampering() -> None:
    """Stripping ``audit:`` must not pass the file off as one written before auditing when the
    ledger recorded it: with or without the key, and naming the fields edited with it."""
    data, leaves, root = _sealed(b"k")
    record = {"content_hash": root, "seal": data["audit"]["seal"], "leaves": leaves}
    del data["audit"]
    data["release_gate_evidence"]["owner"] = "mallory"
    for key in (None, b"k"):
        found = check_evidence("e.yaml", data, record, key)
        assert [(f.kind, f.severity) for f in found] == [("evidence_edited", "tamper")] * 2
        assert "audit section was removed" in found[0].detail
        assert found[1].detail == "release_gate_evidence.owner changed"


def test_evidence_naming_a_run_the_ledger_never_held_is_not_intact(
        tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """A file given a run id the ledger does not know, its chain heads blanked and its content
    hash recomputed (no key needed), used to verify as intact with exit 0 (read by delta-rs:
    no Spark)."""
    from pathlib import Path

    from sparkguard.cli import main
    from sparkguard.evidence import load_evidence

    golden = Path(__file__).resolve().parents[1] / "golden" / "evidence.yaml"
    data = load_evidence(golden)
    data.pop("audit", None)
    data["sparkguard"]["run_id"] = "20990101T000000Z-forged00"
    home = tmp_path / "_sg"
    home.mkdir()
    attach_audit(data, home=str(home), chains={}, commits=[], key=None)
    forged = tmp_path / "forged.yaml"
    forged.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    assert main(["verify", "--evidence", str(forged)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert any(x.startswith("TAMPER run_missing run 20990101T000000Z-forged00: ") for x in out)
    assert out[-1].endswith("TAMPERED: 1 finding(s)")


def test_a_sealed_evidence_rewritten_unsealed_is_a_seal_mismatch() -> None:
    """The ledger's first record of the evidence carried a seal, its newest does not (a
    rollback run without the key, or an editor who appended a fresh record): with or without
    the key this used to read as 'INFO unsealed' and verify intact."""
    from sparkguard.verify import _check_run, _Evidence, _Read

    runs = _chain(1)  # run "r"
    chains = {"runs": runs[0]["event_hash"], "slices": None, "locks": {}}
    data, leaves, root, sealed = attach_audit(_doc(), home="/h", chains=chains, commits=[],
                                              key=b"k")
    first = {"run_id": "r", "content_hash": root, "seal": sealed, "leaves": leaves}
    del data["audit"]
    data["sparkguard"]["rollbacks"] = [{"at": "x", "by": "ops", "forced": False, "targets": []}]
    data, leaves, root, _ = attach_audit(data, home="/h", chains=chains, commits=[], key=None)
    newest = {"run_id": "r", "content_hash": root, "seal": None, "leaves": leaves}
    data = yaml.safe_load(yaml.safe_dump(data))
    read = _Read(rows={"runs": runs, "slices": [], "evidence": [first, newest]},
                 ledger_history={}, target_history={}, evidence_paths={}, engine="test")
    alone = _Read(rows={**read.rows, "evidence": [newest]}, ledger_history={},
                  target_history={}, evidence_paths={}, engine="test")
    assert [f.kind for f in _check_run("r", _Evidence("e.yaml", data), alone, b"k")
            if f.severity == "tamper"] == []  # never sealed: information only
    for key in (None, b"k"):
        found = _check_run("r", _Evidence("e.yaml", data), read, key)
        assert [f.kind for f in found if f.severity == "tamper"] == ["seal_mismatch"], found


@given(st.text())
def test_evidence_yaml_reads_back_every_string(value: str) -> None:
    assert yaml.safe_load(dump_yaml({"v": [value], value: 1})) == {"v": [value], value: 1}


@pytest.mark.parametrize("char", ["\x85", "\u2028", "\u2029"])
def test_a_sample_value_holding_a_yaml_line_break_is_kept_and_verifies(char: str) -> None:
    # Latin-1 text read as UTF-8 leaves U+0085 in real columns; PyYAML folded it to a space,
    # so the evidence showed the auditor a value the table does not hold.
    value = f"caf{char}e \"x\" 'y'"
    doc = _doc()
    doc["sparkguard"]["targets"][0]["samples"] = [{"key": value, "shadow": value}]
    data, leaves, root, _ = attach_audit(doc, home="/h", chains={"runs": "a" * 64}, commits=[],
                                         key=b"k")
    read = yaml.safe_load(dump_yaml(data))
    assert read["sparkguard"]["targets"][0]["samples"] == [{"key": value, "shadow": value}]
    record = {"content_hash": root, "seal": data["audit"]["seal"], "leaves": leaves}
    assert [f for f in check_evidence("e", read, record, b"k") if f.severity == "tamper"] == []


def test_a_ledger_history_that_no_longer_starts_at_version_0_is_said() -> None:
    """Log retention removes old commits (a DELETE among them included): said, as info."""
    from sparkguard.audit_trail import check_ledger_history

    whole = [{"version": v, "operation": "WRITE", "operationParameters": {"mode": "Append"}}
             for v in range(3)]
    assert check_ledger_history("runs", whole) == []
    (f,) = check_ledger_history("runs", whole[2:])
    assert (f.kind, f.severity, f.where) == ("history_truncated", "info", "ledger/runs")
    assert "version 2" in f.detail
    assert check_ledger_history("runs", None) == []
