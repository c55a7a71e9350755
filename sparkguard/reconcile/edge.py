"""Keys of a recomputed window that the target also holds outside the window.

A fix that moves a row across the window's edge (a corrected timestamp or date) recomputes it
inside the window, while its old version stays outside, where no promotion mode looks: after
the promotion the target would hold the key twice, and the window's own gates (duplicates in
the shadow, keys of the target's window) cannot see it.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sparkguard.reconcile.hashing import column
from sparkguard.reconcile.verdicts import GateResult
from sparkguard.spark_types import EXACT_JSON

__all__ = ["EDGE_GATE", "keys_outside_window"]

EDGE_GATE = "keys_outside_window"
_SAMPLE = 5


def keys_outside_window(keys: Sequence[str], shadow: DataFrame, outside: DataFrame,
                        where: Sequence[str], gate: str = EDGE_GATE) -> GateResult:
    """The gate: no business key of ``shadow`` (the window's recomputed rows) occurs in
    ``outside`` (the target's rows outside the window), compared null-safe as a MERGE matches
    keys. One semi-join of the two sides' keys; a count, and up to five of the rows found (their
    keys and ``where`` columns as JSON text) when there are any."""
    names = list(keys)
    shown = list(dict.fromkeys([*names, *where]))
    ks = shadow.select(*[column(k).alias(f"__sg_s{i}") for i, k in enumerate(names)])
    held = outside.select(*[column(c).alias(f"__sg_t{i}") for i, c in enumerate(shown)])
    on = [F.col(f"__sg_t{i}").eqNullSafe(F.col(f"__sg_s{i}")) for i in range(len(names))]
    found = held.join(ks, on, "left_semi")
    key = F.struct(*[F.col(f"__sg_t{i}") for i in range(len(names))])
    row = found.agg(F.count_distinct(key).alias("keys"), F.count(F.lit(1)).alias("rows")).first()
    n, rows = (int(row["keys"] or 0), int(row["rows"] or 0)) if row is not None else (0, 0)
    sample: list[str] = []
    if n:
        text = F.to_json(F.struct(*[F.col(f"__sg_t{i}").alias(c) for i, c in enumerate(shown)]),
                         EXACT_JSON)
        sample = [str(r[0]) for r in found.select(text).limit(_SAMPLE).collect()]  # <= 5
    named = ", ".join(names)
    reason = (f"{n} business key(s) ({named}) of the recomputed window are also held by the "
              f"target outside the window ({rows} row(s), e.g. {'; '.join(sample)}): after the "
              "promotion the target would hold each twice (a row that moved across the "
              "window's edge, such as a corrected timestamp or date). Widen the window to "
              "cover those rows, or delete them from the target with the change; if the keys "
              "are unique only within a partition, drop table_wide from the duplicate_check"
              if n else f"no business key ({named}) of the recomputed window is held by the "
              "target outside the window")
    return GateResult(gate=gate, check_type="duplicate_check", passed=n == 0,
                      measured={"keys": n, "rows": rows}, threshold=0, expected=0,
                      reason=reason, details={"sample": sample} if sample else {})
