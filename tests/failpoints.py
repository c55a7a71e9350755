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


def on_failpoint(monkeypatch: pytest.MonkeyPatch, module: ModuleType, name: str,
                 act: Callable[[str], None] = _die, times: int | None = None) -> list[str]:
    """From now on (to the test's end), ``module.failpoint(name)`` calls ``act(name)`` first,
    the first ``times`` times (every time with None); returns the list of those calls."""
    real, seen = module.failpoint, []

    def hooked(fp: str) -> None:
        if fp == name and (times is None or len(seen) < times):
            seen.append(fp)
            act(fp)
        real(fp)

    monkeypatch.setattr(module, "failpoint", hooked)
    return seen


@contextmanager
def at_failpoint(monkeypatch: pytest.MonkeyPatch, module: ModuleType, name: str,
                 act: Callable[[str], None] = _die) -> Iterator[None]:
    """``on_failpoint`` inside the block only; the module's own failpoint is back after it."""
    real = module.failpoint
    on_failpoint(monkeypatch, module, name, act)
    try:
        yield
    finally:
        monkeypatch.setattr(module, "failpoint", real)


def dies_at(monkeypatch: pytest.MonkeyPatch, module: ModuleType, name: str,
            call: Callable[[], Any]) -> None:
    """Run ``call()`` and check that it died at failpoint ``name``."""
    with at_failpoint(monkeypatch, module, name), pytest.raises(Crash):
        call()


def fails_once_at(monkeypatch: pytest.MonkeyPatch, module: ModuleType, name: str,
                  message: str) -> None:
    """The next time ``module.failpoint(name)`` is reached, raise ``RuntimeError(message)``: a
    runtime failure the run's own handlers see (unlike ``Crash``)."""
    def fail(_name: str) -> None:
        raise RuntimeError(message)

    on_failpoint(monkeypatch, module, name, fail, times=1)
