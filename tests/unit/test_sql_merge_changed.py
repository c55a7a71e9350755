"""The exact text of the change-only MERGE (no Spark)."""

from __future__ import annotations

import pytest

from sparkguard.sql import (
    PartitionType,
    TableRef,
    UnsafeSQLError,
    changed_condition,
    merge_changes_statement,
    window_predicate,
)


def test_changed_condition_is_null_safe_on_every_column() -> None:
    assert changed_condition(["a", "b"]) == "NOT (`t`.`a` <=> `s`.`a` AND `t`.`b` <=> `s`.`b`)"


def test_changed_condition_quotes_odd_names_and_compares_collated_text_in_binary() -> None:
    """Collated text compares in binary (``UTF8_LCASE`` is blind to case)."""
    got = changed_condition(["we`ird.name", "c"], binary_columns=["c"])
    assert got == ("NOT (`t`.`we``ird.name` <=> `s`.`we``ird.name` AND "
                   "collate(`t`.`c`, 'UTF8_BINARY') <=> collate(`s`.`c`, 'UTF8_BINARY'))")
    with pytest.raises(UnsafeSQLError):
        changed_condition([])


def test_merge_changes_statement_exact_text() -> None:
    window = window_predicate("d", PartitionType.DATE, ["2026-05-02"], alias="t")
    sql = merge_changes_statement(TableRef.parse("/lake/t"), "v", ["k"], ["k", "d", "x"], window)
    assert sql.splitlines() == [
        "MERGE INTO delta.`/lake/t` AS `t`",
        "USING `v` AS `s`",
        "ON (`t`.`k` <=> `s`.`k`) AND `t`.`d` IN (DATE'2026-05-02')",
        "WHEN MATCHED AND `s`.`__sg_op` = 'D' THEN DELETE",
        "WHEN MATCHED AND `s`.`__sg_op` = 'U' THEN UPDATE SET "
        "`t`.`k` = `s`.`k`, `t`.`d` = `s`.`d`, `t`.`x` = `s`.`x`",
        "WHEN NOT MATCHED AND `s`.`__sg_op` = 'I' THEN INSERT (`k`, `d`, `x`) "
        "VALUES (`s`.`k`, `s`.`d`, `s`.`x`)"]
    assert "NOT MATCHED BY SOURCE" not in sql  # it would stop Delta pruning the target's files


def test_merge_changes_statement_refuses_hostile_names() -> None:
    window = window_predicate("d", PartitionType.DATE, ["2026-05-02"], alias="t")
    with pytest.raises(UnsafeSQLError):
        merge_changes_statement(TableRef.parse("t"), "v; DROP", ["k"], ["k"], window)
    with pytest.raises(UnsafeSQLError):
        merge_changes_statement(TableRef.parse("t"), "v", ["k"], [], window)
