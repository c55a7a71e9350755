"""Shared fixtures: one local Spark + Delta session per test process, a temp lake per test."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """Session-scoped local Delta session: 2 cores, few shuffle partitions, UI off."""
    from sparkguard.session import local_session_builder
    from tests.lakes import TEST_SESSION_CONF

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = local_session_builder("sparkguard-tests", extra=TEST_SESSION_CONF).getOrCreate()
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
def lake(tmp_path: Path) -> Path:
    """A fresh folder for one test's tables."""
    root = tmp_path / "lake"
    root.mkdir()
    return root


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.spark)
