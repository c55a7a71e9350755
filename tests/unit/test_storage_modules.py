"""The storage modules (``sparkguard/delta_ops/``, the ledger's Spark side) stay small,
import without cycles, and keep the functions tests replace on ``delta_ops`` reachable there.

No Spark: source files are read and parsed; the fresh-interpreter imports start no JVM.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "sparkguard"
# the ledger's Spark side (the pure ledger_model is another layer)
STORAGE = sorted([*(PACKAGE / "delta_ops").glob("*.py"),
                  *(PACKAGE / f"{m}.py" for m in ("ledger", "ledger_locks", "ledger_schema",
                                                  "ledger_tables"))])
MAX_LINES = 300


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """The sparkguard modules ``path`` imports (``from a import b`` counts ``a.b`` when that is a
    module of its own)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in out if m.startswith("sparkguard")}


def test_the_storage_modules_exist_and_stay_small() -> None:
    names = {_module(p) for p in STORAGE}
    assert {"sparkguard.delta_ops", "sparkguard.delta_ops.writes", "sparkguard.ledger",
            "sparkguard.ledger_locks"} <= names
    long = {_module(p): n for p in STORAGE
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert long == {}, f"modules over {MAX_LINES} lines: {long}"


def test_the_storage_modules_import_no_cycle() -> None:
    modules = {_module(p): p for p in STORAGE}
    # the package's __init__ imports its modules; they must not import it back
    graph = {m: {i for i in _imports(p) if i in modules and i != m} for m, p in modules.items()}
    inside = [m for m in modules if m.startswith("sparkguard.delta_ops.")]
    assert not [m for m in inside if "sparkguard.delta_ops" in graph[m]], \
        "a delta_ops module imports the package itself (a cycle through __init__)"
    done: set[str] = set()

    def visit(m: str, path: list[str]) -> None:
        assert m not in path, " -> ".join([*path, m])
        if m not in done:
            for n in sorted(graph[m]):
                visit(n, [*path, m])
            done.add(m)

    for m in sorted(graph):
        visit(m, [])


@pytest.mark.parametrize("module", sorted(_module(p) for p in STORAGE))
def test_each_storage_module_imports_first_in_a_fresh_interpreter(module: str) -> None:
    proc = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


_PATCHED = re.compile(r"setattr\(\s*(?:[A-Za-z_]+\.)?delta_ops\s*,\s*\"(\w+)\"")


def test_functions_tests_replace_on_delta_ops_are_looked_up_there() -> None:
    """A test that replaces ``delta_ops.<name>`` only changes callers that look ``<name>`` up
    on the package at call time: no module outside the package imports it by name, and no
    module inside calls it (those calls would bypass the replacement and the test would pass
    without testing anything)."""
    patched = {m for p in (ROOT / "tests").rglob("*.py")
               for m in _PATCHED.findall(p.read_text(encoding="utf-8"))}
    assert {"restore", "promote_replace_where"} <= patched
    callers: dict[str, list[str]] = {name: [] for name in patched}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        in_package = path.parent == PACKAGE / "delta_ops"
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                    "sparkguard.delta_ops"):
                direct = {a.name for a in node.names} & patched
                assert not direct or (in_package and path.stem == "__init__"), \
                    f"{_module(path)} imports {sorted(direct)} by name"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id in patched and in_package:
                pytest.fail(f"{_module(path)} calls {node.func.id} directly")
            if isinstance(node, ast.Attribute) and node.attr in patched \
                    and isinstance(node.value, ast.Name) and node.value.id == "delta_ops":
                callers[node.attr].append(_module(path))
    assert all(callers.values()), f"no caller reaches these through delta_ops: {callers}"


@pytest.mark.parametrize(("message", "gone"), [
    # classic PySpark (py4j): Spark's error on the data file, then the JVM's cause naming the
    # deletion vector's file
    ("An error occurred while calling o5440.count.\n: org.apache.spark.SparkException: "
     "[FAILED_READ_FILE.FILE_NOT_EXIST] Encountered error while reading file "
     "file:/lake/t/d=2026-05-04/part-0.c000.snappy.parquet. File does not exist. It is possible "
     "the underlying files have been updated.\nCaused by: java.io.FileNotFoundException: File "
     "file:/lake/t/deletion_vector_249044ee.bin does not exist",
     "file:/lake/t/deletion_vector_249044ee.bin"),
    # Spark Connect: the error class and its message only
    ("[FAILED_READ_FILE.FILE_NOT_EXIST] Encountered error while reading file "
     "s3://b/t/d=2026-05-04/part-0.c000.snappy.parquet. File does not exist. It is possible "
     "the underlying files have been updated.", "s3://b/t/d=2026-05-04/part-0.c000.snappy.parquet"),
    # a location with a space; S3A's wording; a JVM cause naming no path
    ("Caused by: java.io.FileNotFoundException: File file:/data/my lake/t/deletion_vector_a.bin "
     "does not exist", "file:/data/my lake/t/deletion_vector_a.bin"),
    ("Caused by: java.io.FileNotFoundException: No such file or directory: "
     "s3a://b/t/deletion_vector_a.bin", "s3a://b/t/deletion_vector_a.bin"),
    ("org.apache.spark.SparkException: task failed\nCaused by: java.io.FileNotFoundException",
     "a file the error does not name"),
    ("[DELTA_CONCURRENT_APPEND] ConcurrentAppendException: Files were added", None),
    ("[PATH_NOT_FOUND] Path does not exist: file:/lake/t.", None),
])
def test_a_failed_read_names_the_file_that_is_gone(message: str, gone: str | None) -> None:
    from sparkguard.delta_ops.files import gone_file

    assert gone_file(RuntimeError(message)) == gone


def test_spark_failing_to_read_a_variant_says_how_to_read_it() -> None:
    """SPARK-55552's failure gets the settings that read such files; other failures do not."""
    import pyspark  # noqa: F401  (the CLI reads Spark's errors only once Spark is loaded)

    from sparkguard.cli import _summary

    summary, refused = _summary(RuntimeError(
        "Job aborted due to stage failure: Lost task 0.0: java.lang.RuntimeException: Not "
        "implemented. VariantType\n\tat org.apache.spark.sql.vectorized.ColumnarBatchRow.copy"))
    assert refused is None and summary.startswith("RuntimeError: Job aborted")
    assert "spark.sql.parquet.enableVectorizedReader=false" in summary
    assert "SPARK-55552" in summary and "spark.sql.codegen.maxFields" in summary
    assert "enableVectorizedReader" not in _summary(RuntimeError("Not implemented. MapType"))[0]
