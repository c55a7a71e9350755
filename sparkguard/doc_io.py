"""Evidence files: their YAML text, faithful to every string, and an atomic write.

PyYAML's emitter, with ``allow_unicode=True``, writes U+0085 (NEXT LINE) raw inside a quoted
scalar and its reader then folds it into a space: a sample value or an error message holding it
would read back changed. Strings holding a character YAML counts as a line break are written
double-quoted, where the emitter escapes them (``\\N``, ``\\L``, ``\\P``).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

_BREAKS = frozenset("\x85\u2028\u2029")


class _Dumper(yaml.SafeDumper):
    """SafeDumper that double-quotes strings holding a YAML line-break character."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = '"' if _BREAKS.intersection(value) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump_yaml(data: Any) -> str:
    """Block-style YAML, keys in their order, non-ASCII text kept readable."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                     allow_unicode=True, width=100)


def atomic_write(path: Path, text: str) -> None:
    """``text`` into ``path`` through a temporary file and a rename: a reader sees the old file
    or the new one, never half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)
