"""Hash chains, leaf hashes and seals (pure): each kind of tampering is found."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from sparkguard.audit import (
    chain,
    content_hash,
    event_hash,
    leaf_differences,
    leaf_hashes,
    seal,
    seal_matches,
    verify_chain,
)

T0 = dt.datetime(2026, 5, 12, 5, 0)


def events(n: int = 4) -> list[dict]:
    return chain("runs", [{"run_id": "r1", "at": T0 + dt.timedelta(seconds=i),
                           "state": f"s{i}", "details": '{"a": "b\'c"}'} for i in range(n)])


def kinds(found) -> set[str]:
    return {f.kind for f in found if f.severity == "tamper"}


def test_an_untouched_chain_verifies_clean_in_any_read_order():
    ev = events()
    assert verify_chain("runs", "r1", list(reversed(ev)), "at", ev[-1]["event_hash"]) == []


def test_hash_covers_table_content_and_predecessor():
    e = events(1)[0]
    assert event_hash("slices", e, None) != e["event_hash"]
    assert event_hash("runs", e, "x") != e["event_hash"]
    assert event_hash("runs", {**e, "at": T0.replace(tzinfo=dt.UTC)}, None) == e["event_hash"]


def test_edited_event():
    ev = events()
    ev[1] = {**ev[1], "state": "done"}
    assert kinds(verify_chain("runs", "r1", ev, "at", ev[-1]["event_hash"])) == {"edited"}


def test_edited_and_rehashed_event_breaks_the_next_link():
    ev = events()
    forged = {**ev[1], "state": "done"}
    forged["event_hash"] = event_hash("runs", forged, forged["prev_hash"])
    ev[1] = forged
    assert "deleted" in kinds(verify_chain("runs", "r1", ev, "at"))


def test_deleted_event_in_the_middle_and_at_the_tail():
    ev = events()
    assert kinds(verify_chain("runs", "r1", [ev[0], ev[2], ev[3]], "at")) == {"deleted"}
    assert kinds(verify_chain("runs", "r1", ev[:3], "at", ev[-1]["event_hash"])) == {"head_mismatch"}


def test_inserted_event():
    ev = events()
    extra = chain("runs", [{"run_id": "r1", "at": T0, "state": "x", "details": ""}],
                  prev=ev[1]["event_hash"])[0]
    assert "inserted" in kinds(verify_chain("runs", "r1", [*ev, extra], "at"))


def test_whole_chain_rewritten_is_caught_by_the_recorded_head():
    ev = events()
    rewritten = chain("runs", [{**e, "state": "done"} for e in ev])
    assert kinds(verify_chain("runs", "r1", rewritten, "at", ev[-1]["event_hash"])) == {
        "head_mismatch"}


def test_reordered_timestamps():
    ev = chain("runs", [{"run_id": "r1", "at": T0 + dt.timedelta(seconds=s), "state": str(s)}
                        for s in (0, 2, 1)])
    assert "reordered" in kinds(verify_chain("runs", "r1", ev, "at"))


def test_events_before_auditing_are_information():
    ev = events()
    old = {"run_id": "r1", "at": T0 - dt.timedelta(days=1), "state": "done"}
    found = verify_chain("runs", "r1", [old, *ev], "at")
    assert [f.kind for f in found] == ["unchained"] and found[0].severity == "info"


def test_leaf_hashes_name_the_edited_field():
    doc = {"run_id": "r1", "targets": [{"gates": [{"measured": {"value": Decimal("12.50")}},
                                                  {"measured": {"value": float("nan")}}]}],
           "empty": {}, "none": None}
    leaves = leaf_hashes(doc)
    edited = {**doc, "targets": [{"gates": [{"measured": {"value": Decimal("12.51")}},
                                            {"measured": {"value": float("nan")}}]}]}
    now = leaf_hashes(edited)
    assert leaf_differences(leaves, now) == ["targets[0].gates[0].measured.value changed"]
    assert content_hash(leaves) != content_hash(now)
    assert content_hash(leaves) == content_hash(leaf_hashes(dict(reversed(doc.items()))))
    assert leaf_differences(leaves, leaf_hashes({**doc, "x": 1})) == ["x added"]


def test_a_dotted_key_cannot_stand_in_for_a_nested_value():
    """``{"a": {"b": ...}}`` and a key ``"a.b"`` have one path: a forger who flips the nested
    decision and adds the flat key with the old value must not get the old hashes back."""
    doc = {"release_gate_evidence": {"decision": "NO-GO", "x": 1}}
    forged = {"release_gate_evidence": {"decision": "GO", "x": 1},
              "release_gate_evidence.decision": "NO-GO"}
    leaves = leaf_hashes(doc)
    for order in (forged, dict(reversed(forged.items()))):
        now = leaf_hashes(order)
        assert content_hash(now) != content_hash(leaves)
        assert leaf_differences(leaves, now) == ["release_gate_evidence.decision changed"]
    same = leaf_hashes({"a": [1], "a[0]": 1})
    assert same == leaf_hashes({"a[0]": 1, "a": [1]}) and len(same) == 1


def test_seal_needs_the_key():
    digest = content_hash(leaf_hashes({"a": 1}))
    s = seal(b"k" * 32, digest)
    assert seal_matches(b"k" * 32, digest, s)
    assert not seal_matches(b"other", digest, s)
    assert not seal_matches(b"k" * 32, content_hash(leaf_hashes({"a": 2})), s)
    assert not seal_matches(b"k" * 32, digest, None)
