"""The exact text of the change-only MERGE (no Spark)."""

from __future__ import annotations

import pytest

from sparkguard.sql import (
    PartitionType,
    TableRef,
    UnsafeSQLError,
    changed_condition,
    merge_statement,
    window_predicate,
)


def test_changed_condition_is_null_safe_on_every_column() -> None:
    assert changed_condition(["a", "b"]) == "NOT (`t`.`a` <=> `s`.`a` AND `t`.`b` <=> `s`.`b`)"


def test_changed_condition_quotes_odd_names_and_compares_maps_as_json() -> None:
    got = changed_condition(["we`ird.name", "m"], json_columns=["m"])
    assert got == ("NOT (`t`.`we``ird.name` <=> `s`.`we``ird.name` AND "
                   "to_json(`t`.`m`) <=> to_json(`s`.`m`))")
    with pytest.raises(UnsafeSQLError):
        changed_condition([])


def test_merge_statement_with_an_update_condition() -> None:
    window = window_predicate("d", PartitionType.DATE, ["2026-05-02"], alias="t")
    sql = merge_statement(TableRef.parse("/lake/t"), "v", ["k"], ["k", "d", "x"], window,
                          delete_unmatched=True, update_condition=changed_condition(["d", "x"]))
    assert sql.splitlines() == [
        "MERGE INTO delta.`/lake/t` AS `t`",
        "USING `v` AS `s`",
        "ON (`t`.`k` <=> `s`.`k`) AND `t`.`d` IN (DATE'2026-05-02')",
        "WHEN MATCHED AND NOT (`t`.`d` <=> `s`.`d` AND `t`.`x` <=> `s`.`x`) THEN UPDATE SET "
        "`t`.`k` = `s`.`k`, `t`.`d` = `s`.`d`, `t`.`x` = `s`.`x`",
        "WHEN NOT MATCHED THEN INSERT (`k`, `d`, `x`) VALUES (`s`.`k`, `s`.`d`, `s`.`x`)",
        "WHEN NOT MATCHED BY SOURCE AND `t`.`d` IN (DATE'2026-05-02') THEN DELETE"]


def test_merge_statement_without_update_when_every_column_is_a_key() -> None:
    window = window_predicate("d", PartitionType.DATE, ["2026-05-02"], alias="t")
    sql = merge_statement(TableRef.parse("t"), "v", ["k"], ["k"], window,
                          delete_unmatched=False, update=False)
    assert "WHEN MATCHED" not in sql and "WHEN NOT MATCHED THEN INSERT" in sql
