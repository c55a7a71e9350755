"""In-process failpoints for the integration tier: a driver dying at a named failpoint
(``Crash``), or something done there, then the failpoint as it was."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import pytest


class Crash(BaseException):
    """A driver dying at a failpoint: no except-handler of the run runs, only finally."""


def _die(name: str) -> None:
    raise Crash(name)


@contextmanager
def at_failpoint(monkeypatch: pytest.MonkeyPatch, module: ModuleType, name: str,
                 act: Callable[[str], None] = _die) -> Iterator[None]:
    """Inside the block, ``module.failpoint(name)`` calls ``act(name)`` first (default: the
    driver dies); the module's own failpoint is back after it."""
    real = module.failpoint

    def hooked(fp: str) -> None:
        if fp == name:
            act(fp)
        real(fp)

    monkeypatch.setattr(module, "failpoint", hooked)
    try:
        yield
    finally:
        monkeypatch.setattr(module, "failpoint", real)


def dies_at(monkeypatch: pytest.MonkeyPatch, module: ModuleType, name: str,
            call: Callable[[], Any]) -> None:
    """Run ``call()`` and check that it died at failpoint ``name``."""
    with at_failpoint(monkeypatch, module, name), pytest.raises(Crash):
        call()
