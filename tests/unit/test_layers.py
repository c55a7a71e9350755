"""The layer contract (no Spark): which package may import which, and who creates sessions.

- ``sparkguard.plan`` imports nothing from the run, the guard, the CLI or anything with Spark;
- ``sparkguard.reconcile`` imports nothing from the run, the guard or the CLI;
- only ``sparkguard/session.py`` builds a SparkSession (entry points call it).

Imports inside functions count too. ``test_the_contract_catches_a_forbidden_import`` shows the
checker failing on a tree that breaks each rule.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "sparkguard"

# package (relative to sparkguard/) -> module prefixes it must not import
# the modules split out of guard.py, cli.py and evidence.py count as those
_GUARD = ("sparkguard.guard", "sparkguard.guard_findings", "sparkguard.guard_paths",
          "sparkguard.guard_checks", "sparkguard.guard_window_rules", "sparkguard.guard_live")
_CLI = ("sparkguard.cli", "sparkguard.commands")
_EVIDENCE = ("sparkguard.evidence", "sparkguard.evidence_md")
FORBIDDEN = {
    "plan": ("sparkguard.run", *_GUARD, *_CLI, "sparkguard.execute", "sparkguard.ledger",
             "sparkguard.publish", "sparkguard.delta_ops", "sparkguard.reconcile", *_EVIDENCE,
             "pyspark", "delta"),
    "reconcile": ("sparkguard.run", *_GUARD, *_CLI, "sparkguard.execute", *_EVIDENCE),
}
SESSION_MAKERS = {"getOrCreate", "builder"}
SESSION_HOME = {"session.py"}


def _imports(tree: ast.AST) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module


def violations(root: Path) -> list[str]:
    """Every broken rule under a package folder laid out like ``sparkguard/``."""
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        banned = FORBIDDEN.get(rel.parts[0], ()) if len(rel.parts) > 1 else ()
        for line, module in _imports(tree):
            hit = next((b for b in banned if module == b or module.startswith(b + ".")), None)
            if hit:
                out.append(f"{rel}:{line} imports {module} (sparkguard/{rel.parts[0]} must not "
                           f"import {hit})")
        if rel.name in SESSION_HOME and len(rel.parts) == 1:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in SESSION_MAKERS \
                    and not (isinstance(node.value, ast.Name) and node.value.id == "self"):
                out.append(f"{rel}:{node.lineno} creates a SparkSession (.{node.attr}); only "
                           "sparkguard/session.py may, called from an entry point")
    return out


def test_the_package_keeps_its_layers() -> None:
    assert violations(PACKAGE) == []


def test_the_contract_catches_a_forbidden_import(tmp_path: Path) -> None:
    (tmp_path / "plan").mkdir()
    (tmp_path / "reconcile").mkdir()
    (tmp_path / "plan" / "model.py").write_text("from sparkguard.guard import x\n")
    (tmp_path / "plan" / "loader.py").write_text("def f():\n    import pyspark.sql\n")
    (tmp_path / "reconcile" / "engine.py").write_text("from sparkguard.run.stages import y\n")
    (tmp_path / "ledger.py").write_text(
        "from pyspark.sql import SparkSession\ns = SparkSession.builder.getOrCreate()\n")
    (tmp_path / "session.py").write_text("from pyspark.sql import SparkSession\n"
                                         "s = SparkSession.builder.getOrCreate()\n")
    found = violations(tmp_path)
    assert [f.split(" ")[0] for f in found] == [
        "ledger.py:2", "ledger.py:2", "plan/loader.py:2", "plan/model.py:1", "reconcile/engine.py:1"]
    assert "must not import sparkguard.guard" in found[3]
