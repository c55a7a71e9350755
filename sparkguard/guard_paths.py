"""Guard rules on paths and names: allowed roots, overlapping locations, duplicated or
self-referencing targets, transform placeholders (static, no Spark)."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import PurePosixPath
from urllib.parse import urlsplit

from sparkguard.guard_findings import Collector
from sparkguard.plan.model import BackfillPlan, TargetSpec
from sparkguard.plan.window import target_order
from sparkguard.sql import (
    TableRef,
    UnsafeSQLError,
    canonical_location,
    placeholders,
    table_name_parts,
)

__all__ = ["allowed_roots", "outside_roots", "placeholder_rules", "target_rules"]


def allowed_roots() -> list[str]:
    """``SPARKGUARD_ALLOWED_ROOTS``: ':'-separated local roots or URI prefixes (',' also works)."""
    raw = os.environ.get("SPARKGUARD_ALLOWED_ROOTS", "")
    out: list[str] = []
    for chunk in raw.split(","):
        # a URI root contains "://" whose ':' must not split it
        out += [r for r in re.split(r":(?!//)", chunk.strip()) if r]
    return out


def _norm(path: str) -> tuple[str, str]:
    """(scheme+authority, normalised absolute path) for a local path or a URI (``s3a://`` as
    ``s3://`` and the like: ``sql.canonical_location``)."""
    if path.startswith("dbfs:") and "://" not in path:
        path = "dbfs://" + path[len("dbfs:"):]
    if "://" in path:
        parts = urlsplit(canonical_location(path))
        where = f"{parts.scheme.lower()}://{parts.netloc}"
        if parts.scheme.lower() == "file":
            where = ""
        return where, os.path.normpath("/" + parts.path.lstrip("/"))
    return "", os.path.realpath(os.path.abspath(path))


def outside_roots(path: str, roots: Sequence[str]) -> bool:
    """True when roots are configured and ``path`` is not one of them or below one."""
    if not roots:
        return False
    where, p = _norm(path)
    for root in roots:
        rwhere, rp = _norm(root)
        if rwhere == where and (p == rp or p.startswith(rp.rstrip("/") + "/")):
            return False
    return True


def _overlaps(a: str, b: str) -> bool:
    """Same location, or one inside the other."""
    (wa, pa), (wb, pb) = _norm(a), _norm(b)
    if wa != wb:
        return False
    ppa, ppb = PurePosixPath(pa), PurePosixPath(pb)
    return ppa == ppb or ppa in ppb.parents or ppb in ppa.parents


def target_rules(plan: BackfillPlan, c: Collector) -> None:
    """The targets: complete, distinct, apart from the source and the shadow, under the
    allowed roots, with known placeholders and acyclic dependencies."""
    datasets: list[str] = []
    for i, t in enumerate(plan.targets):
        if isinstance(t, str):
            c.add("target_incomplete", f"targets[{i}]",
                  f"target {t!r} has no business_keys or transform",
                  "write it as a mapping: {dataset, business_keys, transform, promotion}")
            datasets.append(t)
        else:
            datasets.append(t.dataset)
            _transform(plan, i, t, c)
    seen: dict[object, int] = {}
    for i, ds in enumerate(datasets):
        j = seen.setdefault(_identity(ds), i)
        if j != i:
            c.add("target_duplicated", "targets", f"a target is listed twice: targets[{j}] "
                  f"{datasets[j]!r} and targets[{i}] {ds!r} name the same table",
                  "list each target once")
    labels = [t.label for t in plan.target_specs()]
    if len(set(labels)) != len(labels):
        c.add("target_duplicated", "targets", "two targets share a name",
              "give each target a distinct name")
    src = plan.source_of_truth.dataset
    if src and any(_same_dataset(src, d) for d in datasets):
        c.add("source_is_target", "source_of_truth.dataset", "the source of truth is also a target",
              "recompute from an upstream dataset")
    shadow = plan.execution.shadow_location
    if shadow:
        for label, d in [("source_of_truth.dataset", src), *[
                (f"targets[{i}].dataset", d) for i, d in enumerate(datasets)]]:
            if d and TableRef.parse(d).path and _overlaps(shadow, d):
                c.add("no_shadow", "execution.shadow_location",
                      f"shadow location {shadow!r} overlaps {label} {d!r}",
                      "point shadow_location at a separate folder")
    roots = allowed_roots()
    for label, d in [("source_of_truth.dataset", src), ("execution.shadow_location", shadow),
                     *[(f"targets[{i}].dataset", d) for i, d in enumerate(datasets)]]:
        if not d or TableRef.parse(d).path is None:
            continue
        if outside_roots(d, roots):
            c.add("path_outside_roots", label, f"path {d!r} is outside the allowed roots {roots}",
                  "use a location under SPARKGUARD_ALLOWED_ROOTS")
        if d.startswith(("./", "../")):
            c.add("relative_path", label, f"path {d!r} is relative to the driver's working "
                  "directory", "use an absolute path or a URI")
    try:
        target_order(plan)
    except ValueError as exc:
        c.add("target_dependencies", "targets", str(exc), "fix depends_on")


def _identity(dataset: str) -> object:
    """What names one table, however it is spelt: a path normalised (``/lake/t/``,
    ``/lake//t`` and ``file:///lake/t`` are ``/lake/t``), a name without case, backquotes or
    the default catalog (``spark_catalog.db.t`` and `` `db`.t `` are ``db.t``)."""
    try:
        ref = TableRef.parse(dataset)
    except UnsafeSQLError:
        return dataset
    if ref.path is not None:
        return _norm(ref.path)
    return ".".join(table_name_parts(str(ref.name))).lower().removeprefix("spark_catalog.")


def _same_dataset(a: str, b: str) -> bool:
    """The same table, or (paths) one table's folder inside the other's."""
    ra, rb = TableRef.parse(a), TableRef.parse(b)
    if ra.path is not None and rb.path is not None:
        return _overlaps(ra.path, rb.path)
    return _identity(a) == _identity(b)


def _transform(plan: BackfillPlan, i: int, t: TargetSpec, c: Collector) -> None:
    if t.transform.sql is not None:
        placeholder_rules(plan, t, t.transform.sql, f"targets[{i}].transform.sql", c)


def placeholder_rules(plan: BackfillPlan, t: TargetSpec, sql: str, path: str,
                  c: Collector) -> None:
    """The placeholders of a transform's (or a reference's) SQL: it reads the source or an
    upstream shadow, names only known placeholders and upstream targets it depends on."""
    labels = {x.label for x in plan.target_specs()}
    names = placeholders(sql)
    if "source" not in names and not any(n.startswith("shadow:") for n in names):
        c.add("transform_placeholder", path, "the query reads neither {source} nor an upstream "
              "{shadow:NAME}", "read the pinned source as FROM {source} (sparkguard filters it "
              "to the slice)")
    for name in names:
        if name in ("source", "window"):
            continue
        if name.startswith("fill:"):
            c.add("transform_unfilled", path, f"column {name[5:]!r} has no expression yet "
                  f"({{{name}}})", f"replace {{{name}}} with the SQL expression computing it from "
                  "the source's columns", unfilled=True)
            continue
        if name.startswith("shadow:"):
            up = name.split(":", 1)[1]
            if up not in labels or up == t.label:
                c.add("transform_placeholder", path, f"{{{name}}} names no other target",
                      f"use one of {sorted(labels - {t.label})}")
            elif up not in t.depends_on:
                c.add("transform_placeholder", path, f"{{{name}}} is read but {up!r} is not in "
                      "depends_on", f"add depends_on: [{up}]")
        else:
            c.add("transform_placeholder", path, f"unknown placeholder {{{name}}}",
                  "use {source}, {window} or {shadow:NAME}")
