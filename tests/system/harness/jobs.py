"""Running the real jobs: ``spark-submit jobs/<job>.py`` (optionally killed at a failpoint), or
the same command in this process for a re-run that needs no fresh JVM."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from tests.system.harness.lakes import KILLED, ROOT, SUBMIT_TIMEOUT_S, Lake


@dataclass(frozen=True)
class Proc:
    """One finished spark-submit."""

    argv: list[str]
    code: int
    seconds: float
    log: Path

    def tail(self, n: int = 30) -> str:
        lines = self.log.read_text(encoding="utf-8", errors="replace").splitlines()
        return "\n".join(lines[-n:])

    def died_at(self, fault: str) -> bool:
        """The failpoint, not something else, ended the process."""
        text = self.log.read_text(encoding="utf-8", errors="replace")
        return self.code == KILLED and f"failpoint {fault} hit" in text


def submit_env(fault: str | None = None) -> dict[str, str]:
    """The environment the README documents for spark-submit, plus the failpoint."""
    env = dict(os.environ)
    env.pop("SPARKGUARD_FAULT_AT", None)
    env["PATH"] = f"{ROOT / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    from sparkguard.session import submit_conf_dir

    env["SPARK_CONF_DIR"] = str(submit_conf_dir(ROOT / "conf"))  # jars resolved once: no Ivy
    env["PYSPARK_PYTHON"] = env["PYSPARK_DRIVER_PYTHON"] = str(ROOT / ".venv" / "bin" / "python")
    if fault:
        env["SPARKGUARD_FAULT_AT"] = fault
    return env


# Hadoop's local file system without its checksum sidecars (``.NAME.crc``), for JVMs started at
# the same moment that commit to the same tables. On a local disk, Delta's commit (a check that
# the version's file is absent, then a rename, which replaces) is exclusive only within one JVM:
# two processes can both commit one version, the second replacing the first (sparkguard reads the
# lock table's history after its lock commit, so the run whose commit was replaced stops). The
# sidecar of that file is renamed separately and can then be the other process's: every later
# read of that commit fails with a ChecksumException. Cloud stores and HDFS have neither problem.
NO_CHECKSUM_FILES = {
    "spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
    "spark.hadoop.fs.AbstractFileSystem.file.impl": "org.apache.hadoop.fs.local.RawLocalFs"}


def start_submit(job: str, args: Sequence[str], log: Path, fault: str | None = None,
                 env: dict[str, str] | None = None, conf: Mapping[str, str] | None = None
                 ) -> tuple[subprocess.Popen[bytes], list[str]]:
    """Start ``spark-submit [--conf k=v ...] jobs/<job> args`` with output to ``log``; returns
    (process, argv)."""
    confs = [a for k, v in (conf or {}).items() for a in ("--conf", f"{k}={v}")]
    argv = ["spark-submit", *confs, str(ROOT / "jobs" / job), *args]
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as fh:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env or submit_env(fault), stdout=fh,
                                stderr=subprocess.STDOUT)
    return proc, argv


def spark_submit(job: str, args: Sequence[str], log: Path, fault: str | None = None,
                 env: dict[str, str] | None = None) -> Proc:
    """Run ``spark-submit jobs/<job> args`` to the end."""
    t0 = time.monotonic()
    proc, argv = start_submit(job, args, log, fault, env)
    try:
        code = proc.wait(timeout=SUBMIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
    return Proc(argv, code, time.monotonic() - t0, log)


def _cli_in_process(argv: list[str], out: TextIO, err: TextIO) -> int:
    """``sparkguard <argv>`` in this process (its active session), output to ``out``/``err``."""
    from sparkguard.cli import main

    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        return main(argv)


_JOB_COMMAND = {"backfill.py": "run", "rollback.py": "rollback"}


def run_here(job: str, args: Sequence[str], log: Path) -> Proc:
    """What ``jobs/<job> args`` runs, in this process on its active session, output to ``log``.

    For a re-run after a crash: everything it resumes from is on disk (ledger, shadow tables,
    the target's history), so it needs no fresh JVM to prove the recovery.
    """
    argv = [_JOB_COMMAND[job], *args]
    t0 = time.monotonic()
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w", encoding="utf-8") as fh:
        code = _cli_in_process(argv, fh, fh)
    return Proc(["sparkguard", *argv], code, time.monotonic() - t0, log)


def _job(job: str, args: list[str], lake: Lake, tag: str, fault: str | None,
         here: bool) -> Proc:
    log = lake.root.parent / f"{lake.root.name}-{tag}.log"
    if here:
        assert fault is None, "a failpoint kills the process: only for spark-submit"
        return run_here(job, args, log)
    return spark_submit(job, args, log, fault)


def _backfill(lake: Lake, tag: str, fault: str | None = None, here: bool = False) -> Proc:
    return _job("backfill.py", ["--plan", str(lake.plan)], lake, tag, fault, here)


def _rollback(lake: Lake, run_id: str, tag: str, fault: str | None = None,
              here: bool = False) -> Proc:
    return _job("rollback.py", ["--run-id", run_id, "--home", lake.home], lake, tag, fault, here)
