"""Publish state of one table named several ways, folded without Spark: the rule both readers
(Spark and delta-rs) share, and the location a path names."""

from __future__ import annotations

import datetime as dt
import os
from typing import Any

import pytest

from sparkguard.delta_reader import fold_publish_statuses
from sparkguard.publish import fold_statuses
from sparkguard.sql import TableRef

T0 = dt.datetime(2026, 12, 5, 10, 0, 0)
LOC = "s3://lake/orders"


def _at(minutes: int) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minutes)


@pytest.mark.parametrize(("spelled", "location"), [
    ("/lake/orders", "file:/lake/orders"),
    ("/lake/orders/", "file:/lake/orders"),
    ("/lake//orders/./", "file:/lake/orders"),
    ("file:///lake/orders", "file:/lake/orders"),
    ("./orders", "file:" + os.path.join(os.getcwd(), "orders")),
    ("s3://lake/orders/", "s3://lake/orders"),
    ("abfss://c@acct.dfs.core.windows.net/orders", "abfss://c@acct.dfs.core.windows.net/orders"),
    # one storage through another connector: one location
    ("s3a://lake/orders/", "s3://lake/orders"),
    ("S3N://lake/orders", "s3://lake/orders"),
    ("abfs://c@acct.dfs.core.windows.net/orders", "abfss://c@acct.dfs.core.windows.net/orders"),
    ("wasbs://c@acct.blob.core.windows.net/orders", "abfss://c@acct.dfs.core.windows.net/orders"),
    ("wasb://c@acct.BLOB.core.windows.net/o", "abfss://c@acct.dfs.core.windows.net/o"),
    ("gs://lake/orders/", "gs://lake/orders"),
    ("hdfs://nn:8020/lake/orders", "hdfs://nn:8020/lake/orders"),
    ("dbfs:/mnt/lake/orders/", "dbfs:/mnt/lake/orders"),
    ("main.sales.orders", None),
])
def test_a_path_names_its_location_a_catalog_name_does_not(spelled: str,
                                                            location: str | None) -> None:
    assert TableRef.parse(spelled).path_location == location


def _hold(target: str, hold: str, minutes: int, location: str | None) -> dict[str, Any]:
    return {"target": target, "hold": hold, "paused": True, "at": _at(minutes),
            "run_id": hold, "actor": "a", "reason": "r", "location": location}


def test_a_hold_counts_for_every_name_of_its_table() -> None:
    held = [_hold("main.sales.orders", "run-1", 1, LOC), _hold("other", "run-9", 2, "s3://x")]
    last = [{"target": "main.sales.orders", "at": _at(1), "locations": [LOC]},
            {"target": "other", "at": _at(2), "locations": ["s3://x"]},
            {"target": LOC, "at": _at(5), "locations": [LOC]}]
    out = fold_statuses(held, last, ["main.sales.orders", LOC, f"{LOC}/", "never"],
                        {f"{LOC}/": [LOC]})
    assert {t: [h["hold"] for h in s.holds] for t, s in out.items()} == {
        "main.sales.orders": ["run-1"], LOC: ["run-1"], f"{LOC}/": ["run-1"], "never": []}
    # the last change of a table is the newest event under any of its names
    assert out["main.sales.orders"].last_change == out[f"{LOC}/"].last_change == _at(5)
    assert out["never"].last_change is None and not out["never"].paused
    assert sorted(t for t, s in fold_statuses(held, last, None).items() if s.paused) == [
        "main.sales.orders", "other", LOC]


def test_rows_without_a_location_match_by_their_name_only() -> None:
    held = [_hold("main.sales.orders", "manual", 1, None)]
    last = [{"target": "main.sales.orders", "at": _at(1), "locations": []}]
    out = fold_statuses(held, last, ["main.sales.orders", LOC], {LOC: [LOC]})
    assert out["main.sales.orders"].paused and not out[LOC].paused


def test_delta_rs_rows_fold_to_the_same_state() -> None:
    """delta-rs hands over the newest event of every (name, hold), cleared ones too."""
    latest = [_hold("main.sales.orders", "run-1", 1, LOC),
              {**_hold("main.sales.orders", "run-0", 0, LOC), "paused": False},
              {**_hold(LOC, "manual", 3, LOC), "paused": False}]
    out = fold_publish_statuses(latest, [LOC, "main.sales.orders"], {LOC: [LOC]})
    assert out[LOC].paused and [h["target"] for h in out[LOC].holds] == ["main.sales.orders"]
    assert out[LOC].last_change == out["main.sales.orders"].last_change == _at(3)


@pytest.mark.parametrize(("described", "key"), [
    ("file:/lake/orders", "file:/lake/orders"),
    ("s3a://lake/orders/", "s3://lake/orders"),
    ("s3://lake/orders", "s3://lake/orders"),
    ("wasbs://c@acct.blob.core.windows.net/orders", "abfss://c@acct.dfs.core.windows.net/orders"),
    (None, ""),
])
def test_a_table_is_locked_under_one_key_whichever_connector_describes_it(
        described: str | None, key: str) -> None:
    """The lock key (``delta_ops.lock_key``) is the described location in its one spelling: two
    runs reaching one S3 table through ``s3a://`` and ``s3://`` take the same lock."""
    from sparkguard.delta_ops import location_key

    assert location_key(described) == key


def test_a_hold_recorded_under_another_connectors_spelling_still_counts() -> None:
    """Earlier versions recorded a location as given (``s3a://``): a job asking under the
    table's one spelling, or through the blob endpoint of an ADLS path, is still held."""
    held = [_hold("main.sales.orders", "run-0", 1, "s3a://lake/orders"),
            _hold("adls.t", "run-1", 2, "wasbs://c@acct.blob.core.windows.net/t")]
    last = [{"target": "main.sales.orders", "at": _at(1), "locations": ["s3a://lake/orders"]},
            {"target": "adls.t", "at": _at(2),
             "locations": ["wasbs://c@acct.blob.core.windows.net/t"]}]
    keys = {LOC: [LOC], "abfss://c@acct.dfs.core.windows.net/t":
            ["abfss://c@acct.dfs.core.windows.net/t"], "s3://lake/other": ["s3://lake/other"]}
    out = fold_statuses(held, last, list(keys), keys)
    assert {t: s.paused for t, s in out.items()} == {
        LOC: True, "abfss://c@acct.dfs.core.windows.net/t": True, "s3://lake/other": False}
    assert out[LOC].last_change == _at(1)


def test_a_location_is_looked_up_under_every_spelling_earlier_versions_recorded() -> None:
    from sparkguard.sql import location_spellings

    assert set(location_spellings("s3a://lake/orders/")) == {
        "s3://lake/orders", "s3a://lake/orders", "s3n://lake/orders"}
    assert set(location_spellings("wasbs://c@acct.blob.core.windows.net/t")) == {
        "abfss://c@acct.dfs.core.windows.net/t", "abfs://c@acct.dfs.core.windows.net/t",
        "wasbs://c@acct.blob.core.windows.net/t", "wasb://c@acct.blob.core.windows.net/t"}
    assert location_spellings("gs://lake/t") == ["gs://lake/t"]
    assert location_spellings("file:/lake/t") == ["file:/lake/t"]
