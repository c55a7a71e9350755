"""Bounded samples: the keys picked from the level-2 groups, their rows read back in one job,
and the before/after and duplicate samples built from them.

Names with a leading underscore are internal to ``sparkguard.reconcile``.
"""

from __future__ import annotations

import base64
import datetime as dt
import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from pyspark.sql import Column, DataFrame, Row
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sparkguard.reconcile.hashing import column
from sparkguard.reconcile.layout import _BUCKETS, _KINDS, _Layout
from sparkguard.reconcile.spec import ReconcileSpec
from sparkguard.spark_types import holds_type

__all__ = ["same_value"]


@dataclass(frozen=True)
class _Sample:
    kind: str
    partition: Any
    value: int  # the integral key, or the 64-bit hash of the keys


def _pick_samples(lay: _Layout, per_part: Mapping[Any, Mapping[str, Any]],
                  size: int) -> list[_Sample]:
    """Up to ``size`` sampled keys from at most two partitions: those covering most kinds of
    difference, smallest first (the fetch reads only those partitions)."""
    if size <= 0:
        return []
    found: dict[Any, list[_Sample]] = {}
    for part, r in per_part.items():
        if part is None:
            continue
        for kind in _KINDS:
            for b in range(_BUCKETS):
                v = r.get(f"__sg_s_{kind}_{b}")
                if v is not None:
                    found.setdefault(part, []).append(_Sample(kind, part, int(v)))

    def size_of(part: Any) -> int:
        r = per_part[part]
        return int(r.get("rows_shadow") or 0) + int(r.get("rows_target") or 0)

    chosen: list[Any] = []
    covered: set[str] = set()
    for _ in range(2):  # greedy: each pick adds the most kinds not yet covered, smallest first
        left = [p for p in found if p not in chosen]
        if not left:
            break
        best = min(left, key=lambda p: (-len({s.kind for s in found[p]} - covered), size_of(p)))
        chosen.append(best)
        covered |= {s.kind for s in found[best]}
    pool = [s for part in chosen for s in found[part]]
    picked: list[_Sample] = []
    for kind in _KINDS:  # round-robin over kinds so every kind shows
        picked += [s for s in pool if s.kind == kind][:max(1, size // len(_KINDS))]
    rest = [s for s in pool if s not in picked]
    return (picked + rest)[:size]


def _key_match(lay: _Layout, samples: Sequence[_Sample]) -> Column:
    values = sorted({s.value for s in samples})
    if lay.integral_key:
        return column(lay.keys[0]).cast("long").isin(values)
    return F.xxhash64(*[column(k) for k in lay.keys]).isin(values)


def _fetch(lay: _Layout, samples: Sequence[_Sample], shadow: DataFrame, target: DataFrame | None,
           source: DataFrame | None) -> dict[str, list[dict[str, Any]]]:
    """Rows of the sampled keys, per side, in one job: a filtered read of at most two
    partitions, capped at a few rows per key."""
    out: dict[str, list[dict[str, Any]]] = {"shadow": [], "target": [], "source": []}
    if not samples:
        return out
    parts = list(dict.fromkeys(s.partition for s in samples))
    sides = [("shadow", shadow, [s for s in samples if s.kind != "dup_source"]),
             ("target", target, [s for s in samples if s.kind in ("delete", "change")]),
             ("source", source, [s for s in samples if s.kind == "dup_source"])]
    frames = []
    for name, df, mine in sides:
        if df is None or not mine:
            continue
        picked = df.filter(column(lay.p).isin(parts) & _key_match(lay, mine))
        frames.append(picked.select(
            F.lit(name).alias("__sg_side"),
            F.xxhash64(*[column(k) for k in lay.keys]).alias("__sg_kh"),
            F.struct(*[_readable(f) for f in df.schema.fields]).alias(f"__sg_row_{name}")))
    union = functools.reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), frames)
    # limit then a one-partition exchange: one job, not the incremental scans of collect-limit
    instants = {name: [f.name for f in df.schema.fields if isinstance(f.dataType, T.TimestampType)]
                for name, df, _mine in sides if df is not None}
    for r in union.limit(8 * len(samples) + 8).repartition(1).collect():
        row = {k: _plain(v) for k, v in r[f"__sg_row_{r['__sg_side']}"].asDict().items()}
        for c in instants[r["__sg_side"]]:  # naive local time (with its fold) -> aware UTC
            if row[c] is not None:
                row[c] = row[c].astimezone(dt.UTC)
        row["__sg_kh"] = r["__sg_kh"]
        out[r["__sg_side"]].append(row)
    return out


def _plain(value: Any) -> Any:
    """A sampled value as plain data the evidence can hold: a struct (a ``Row``) as a mapping,
    arrays as lists, map keys as text, binary as base64 text (what Spark's ``to_json`` gives)."""
    if isinstance(value, Row):
        return {k: _plain(v) for k, v in value.asDict().items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(_plain(k)): _plain(v) for k, v in value.items()}
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(bytes(value)).decode("ascii")
    return value


def _readable(field: T.StructField) -> Column:
    """A sampled column as the evidence can hold it: a variant (anywhere in the value) as its
    JSON text, which the driver and YAML can take."""
    if holds_type(field.dataType, T.VariantType):
        return F.to_json(column(field.name)).alias(field.name)
    return column(field.name)


def _rows_for(lay: _Layout, rows: Sequence[Mapping[str, Any]], sample: _Sample) -> list[Mapping[str, Any]]:
    return [r for r in rows if r[lay.p] == sample.partition and _matches(lay, r, sample)]


def _matches(lay: _Layout, row: Mapping[str, Any], sample: _Sample) -> bool:
    if lay.integral_key:
        return row[lay.keys[0]] is not None and int(row[lay.keys[0]]) == sample.value
    return row.get("__sg_kh") == sample.value


def _change_sample(spec: ReconcileSpec, lay: _Layout, samples: Sequence[_Sample],
                   fetched: Mapping[str, list[dict[str, Any]]]) -> tuple[dict[str, Any], ...]:
    out = []
    for s in samples:
        if s.kind not in ("insert", "delete", "change"):
            continue
        after = _rows_for(lay, fetched["shadow"], s)
        before = _rows_for(lay, fetched["target"], s)
        a = dict(after[0]) if after else None
        b = dict(before[0]) if before else None
        ref = a or b or {}
        compared = {*lay.exact, *lay.floats}
        cols = [c for c in (a or {}) if c in compared  # in the table's column order
                if b is not None and not same_value(a.get(c) if a else None, b.get(c), spec)]
        out.append({"partition": s.partition, "key": {k: ref.get(k) for k in lay.keys},
                    "kind": s.kind, "changed_columns": cols,
                    "before": _public(b), "after": _public(a)})
    return tuple(out)


def _dup_sample(lay: _Layout, samples: Sequence[_Sample],
                fetched: Mapping[str, list[dict[str, Any]]]) -> tuple[dict[str, Any], ...]:
    out = []
    for s in samples:
        if s.kind not in ("dup_shadow", "dup_source"):
            continue
        side = "shadow" if s.kind == "dup_shadow" else "source"
        rows = _rows_for(lay, fetched[side], s)
        if rows:
            out.append({"side": side, "partition": s.partition,
                        "key": {k: rows[0].get(k) for k in lay.keys}, "rows": len(rows)})
    return tuple(out)


def _public(row: Mapping[str, Any] | None) -> dict[str, Any] | None:
    return None if row is None else {k: v for k, v in row.items() if not k.startswith("__sg_")}


def same_value(a: Any, b: Any, spec: ReconcileSpec) -> bool:
    """Python twin of the engine's comparison of two values of one column (used for samples)."""
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        if math.isinf(a) or math.isinf(b):
            return a == b
        return a == b or abs(a - b) <= spec.float_abs_tolerance + spec.float_rel_tolerance * abs(b)
    if isinstance(a, str) and isinstance(b, str) and spec.ignore_trailing_spaces:
        return a.rstrip(" ") == b.rstrip(" ")
    if isinstance(a, Decimal) and isinstance(b, Decimal):
        return a == b
    return bool(a == b)
