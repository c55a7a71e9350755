"""Shared fixtures: one local Spark + Delta session per test process, a temp lake per test.

Tiers (a file's folder says what it needs; ``tests/README.md`` has the rule):

- ``tests/unit``: no Spark at all (no session, no JVM, no ``spark-submit``);
- ``tests/integration``: the one shared in-process session (``spark``) and the base lake built
  once per session (``base_lake``, copied by tests that write);
- ``tests/system``: real ``spark-submit`` runs, the local cluster, the notebook, the Spark
  Connect server and the crash/concurrency harness (``tests/system/harness``).

Every test in ``tests/system`` is marked ``system``; a test using ``spark`` is marked
``spark``. A test marked ``reliability`` is a row of the README's Reliability table: it
records its outcome as the ``reliability`` property (JSON) in pytest's results, or, with
``reliability("kind")``, just its kind; ``bench/reliability.py`` reads them.
``make test-fast`` runs every test marked neither ``spark`` nor ``slow`` (all of ``tests/unit``
and the pure tests of the other tiers).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """Session-scoped local Delta session: 2 cores, few shuffle partitions, UI off, no code
    generation (``tests.lakes.INTERPRETED_CONF``)."""
    from sparkguard.session import local_session_builder
    from tests.lakes import INTERPRETED_CONF, TEST_SESSION_CONF

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = local_session_builder(
        "sparkguard-tests", extra={**TEST_SESSION_CONF, **INTERPRETED_CONF}).getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def base_lake(spark: object, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The small demo lake (tests/lakes.py), built once per session; tests copy it, never
    write into it (``copy_lake``)."""
    from tests.lakes import build_base

    return build_base(spark, tmp_path_factory.mktemp("base") / "lake")


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Per ``latest_runs`` call: True when the newest-first read answered, False when the
    reader fell back to reading the whole table."""
    from sparkguard import delta_reader, newest_runs

    seen: list[bool] = []
    real = newest_runs.newest_runs

    def spy(*args: object) -> object:
        out = real(*args)
        seen.append(out is not None)
        return out

    monkeypatch.setattr(delta_reader, "newest_runs", spy)
    return seen


@pytest.fixture
def lake(tmp_path: Path) -> Path:
    """A fresh folder for one test's tables."""
    root = tmp_path / "lake"
    root.mkdir()
    return root


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    system = TESTS / "system"
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.spark)
        if system in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.system)
        kind = item.get_closest_marker("reliability")
        if kind is not None and kind.args:  # a row of the reliability table by its kind alone
            item.user_properties.append(("reliability", json.dumps({"kind": kind.args[0]})))
