"""The README's examples run: its shell and Python blocks, in order, against a small demo lake.

Every fenced block is classified (``classify``) and either executed or skipped for a stated
reason; a block of a kind this file does not know fails the test, so a new example is either
run or given a reason. Shell lines run in this process on the shared session: ``sparkguard
ARGS`` as ``main(ARGS)`` and ``spark-submit jobs/<job>.py ARGS`` as that job's ``__main__``
(what its driver runs); each must exit 0 unless the line's comment says ``# exit N``.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from sparkguard.cli import build_parser, main
from tests.integration.test_exit_codes import job

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

# why a block is not run here
SKIPPED = {
    "make": "`make demo`/`make test` are the demo and this suite themselves",
    "mvn": "needs Maven and network access (the Ivy-less fallback)",
    "progress": "sample output of `run`, not a command",
    "connect": "needs a Spark Connect server (tests/system/test_connect.py runs one)",
}


def blocks() -> list[tuple[int, str, str]]:
    """(line, language, text) of every fenced block, in order (indented ones too)."""
    out, lang, start, buf = [], None, 0, []
    for n, line in enumerate(README.read_text(encoding="utf-8").splitlines(), 1):
        fence = re.fullmatch(r"\s*```(\w*)\s*", line)
        if fence and lang is None:
            lang, start, buf, indent = fence.group(1), n, [], len(line) - len(line.lstrip())
        elif fence:
            out.append((start, lang, "\n".join(buf)))
            lang = None
        elif lang is not None:
            buf.append(line[indent:] if line[:indent].strip() == "" else line)
    return out


def classify(lang: str, text: str) -> str:
    """run-shell | run-python | synopsis | a key of SKIPPED."""
    first = text.strip().split()[0] if text.strip() else ""
    if lang == "bash" and first in ("make", "mvn"):
        return first
    if lang == "bash" and all(_command(ln)[0] in ("sparkguard", "spark-submit")
                              for ln in _lines(text)):
        return "run-shell"
    if lang == "bash" and "SPARK_REMOTE" in text:
        return "connect"
    if lang == "python":
        return "run-python"
    if lang == "text" and first == "sparkguard":
        return "synopsis"
    if lang == "text" and first.startswith("["):
        return "progress"
    return f"unknown {lang} block"


def _lines(text: str) -> list[str]:
    joined = text.replace("\\\n", " ")
    return [ln for ln in joined.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def _command(line: str) -> tuple[str, list[str], int]:
    """(program, args, expected exit code) of one shell line."""
    words = shlex.split(line, comments=True)
    want = re.search(r"#\s*exit (\d)", line)
    return words[0], words[1:], int(want.group(1)) if want else 0


def run_shell(text: str) -> list[tuple[str, int, int]]:
    """Each line: (line, expected, returned)."""
    out = []
    for line in _lines(text):
        prog, args, want = _command(line)
        if prog == "sparkguard":
            got = main(args)
        else:
            script, *rest = args
            assert script.startswith("jobs/"), line
            got = job(script.removeprefix("jobs/"), *rest)
        out.append((line, want, got))
    return out


def _subcommand_flags() -> dict[str, set[str]]:
    sub = next(a for a in build_parser()._actions if isinstance(a.choices, dict))
    assert isinstance(sub.choices, dict)
    flags: dict[str, set[str]] = {}
    for name, parser in sub.choices.items():
        nested = [a for a in parser._actions if isinstance(a.choices, dict)]
        for sname, sparser in (nested[0].choices.items() if nested else [("", parser)]):
            flags[f"{name} {sname}".strip()] = {o for a in sparser._actions for o in a.option_strings}
    return flags


def check_synopsis(text: str) -> list[str]:
    """Problems: a listed command that does not exist, or a flag it does not take."""
    flags = _subcommand_flags()
    problems = []
    for line in text.splitlines():
        words = line.split()[1:]
        name = " ".join(words[:2]) if " ".join(words[:2]) in flags else words[0]
        if name not in flags:
            problems.append(f"{line}: no command {name!r}")
            continue
        cmd = line.split("  ")[0]
        problems += [f"{line}: {name} has no {f}" for f in re.findall(r"(?<![\w-])--?[a-z][\w-]*", cmd)
                     if f not in flags[name]]
    return problems


def test_every_block_is_run_or_skipped_for_a_reason() -> None:
    kinds = [classify(lang, text) for _, lang, text in blocks()]
    unknown = [(n, k) for (n, _, _), k in zip(blocks(), kinds, strict=True)
               if k not in SKIPPED and not k.startswith("run-") and k != "synopsis"]
    assert unknown == []
    assert {"run-shell", "run-python", "synopsis"} <= set(kinds)


def test_the_cli_synopsis_matches_the_parser() -> None:
    (text,) = [t for _, lang, t in blocks() if classify(lang, t) == "synopsis"]
    assert check_synopsis(text) == []
    assert len(text.splitlines()) == len(_subcommand_flags())  # every command listed once


def test_a_wrong_synopsis_is_caught() -> None:
    assert check_synopsis("sparkguard run --plan PLAN --no-such-flag   x") != []
    assert check_synopsis("sparkguard nope   x") != []


@pytest.mark.spark
def test_the_shell_and_python_examples_run_on_a_demo_lake(spark: Any, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from sparkguard.demo import generate_lake

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SPARKGUARD_HOME", raising=False)
    generate_lake(spark, tmp_path / "demo-lake", days=31, rows_per_day=40)  # the demo's shape
    ran: list[str] = []
    for n, lang, text in blocks():
        kind = classify(lang, text)
        if kind == "run-shell":
            results = run_shell(text)
            assert [(ln, want) for ln, want, got in results if got != want] == [], \
                f"README line {n}: {results}"
            ran.append(kind)
        elif kind == "run-python":
            exec(compile(text, f"README.md:{n}", "exec"), {})  # publish is open after the run
            ran.append(kind)
    assert ran.count("run-shell") >= 2 and "run-python" in ran
    assert (tmp_path / "draft.yaml").is_file()  # the drafting example wrote its draft
    # the Python example refuses to publish while a hold is set
    lake = tmp_path / "demo-lake"
    target = str(lake / "target" / "orders_clean")
    assert main(["publish", "pause", target, "--home", str(lake / "_sparkguard")]) == 0
    (py,) = [(n, t) for n, lang, t in blocks() if classify(lang, t) == "run-python"]
    with pytest.raises(SystemExit, match="being repaired"):
        exec(compile(py[1], f"README.md:{py[0]}", "exec"), {})
