"""A local Spark Connect server with Delta, for the tests and ``make demo-connect``.

The server is PySpark's own (``spark-connect_2.13`` ships in PySpark's jars), started with
``spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer`` in its own JVM,
with the Delta package, extension and catalog from ``conf/spark-defaults.conf`` (the same pins
as every other local run). It listens on a free loopback port; :func:`connect_server` waits
until it answers and always stops it (its whole process group) on the way out.

As a command: ``python -m tests.system.connect_server -- CMD ARGS...`` starts the server, runs
``CMD`` with ``SPARK_REMOTE=sc://127.0.0.1:PORT`` in its environment, stops the server and
exits with ``CMD``'s exit code. ``python -m tests.system.connect_server --demo ROOT`` (``make
demo-connect``) generates the demo lake under ``ROOT`` and runs its backfill, both through the
server, then prints ``connect exit=E promoted_version=N rollback_point=M`` last.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def free_port() -> int:
    """A TCP port nothing listens on at the moment, on the loopback interface."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


def server_command(port: int, conf: dict[str, str] | None = None) -> list[str]:
    """The spark-submit command line of the server (Delta from ``conf/spark-defaults.conf``)."""
    bindir = Path(sys.executable).parent
    cmd = [str(bindir / "spark-submit"), "--class", SERVER_CLASS, "--name", "sparkguard-connect",
           "--conf", f"spark.connect.grpc.binding.port={port}",
           "--conf", "spark.connect.grpc.binding.address=127.0.0.1"]
    jars = os.environ.get("SPARKGUARD_DELTA_JARS")
    if jars:  # offline fallback, as in sparkguard.session
        cmd += ["--conf", "spark.jars.packages=", "--conf", f"spark.jars={jars}"]
    for key, value in (conf or {}).items():
        cmd += ["--conf", f"{key}={value}"]
    return cmd


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server's process group, SIGKILL it after 30 s."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


@contextlib.contextmanager
def connect_server(conf: dict[str, str] | None = None, log_dir: str | Path | None = None,
                   timeout_s: float = 300.0) -> Iterator[str]:
    """Run a Spark Connect server with Delta for the ``with`` block; yields its ``sc://`` URL.

    Raises RuntimeError, with the end of the server's log, when it exits or does not answer
    within ``timeout_s`` (the first start resolves Delta's jars into the Ivy cache).
    """
    port = free_port()
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="sparkguard-connect-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / "connect-server.log"
    bindir = str(Path(sys.executable).parent)
    env = {**os.environ, "SPARK_CONF_DIR": str(ROOT / "conf"), "PYSPARK_PYTHON": sys.executable,
           "PATH": bindir + os.pathsep + os.environ.get("PATH", "")}
    for var in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARKGUARD_FAULT_AT"):
        env.pop(var, None)
    with open(log, "wb") as out:
        proc = subprocess.Popen(server_command(port, conf), stdout=out, stderr=subprocess.STDOUT,
                                env=env, cwd=str(ROOT), start_new_session=True)
    try:
        deadline = time.monotonic() + timeout_s
        while not _answers(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace").splitlines()[-30:]
                raise RuntimeError(f"Spark Connect server did not start (exit {proc.poll()}); "
                                   f"{log}:\n" + "\n".join(tail))
            time.sleep(0.5)
        yield f"sc://127.0.0.1:{port}"
    finally:
        _stop(proc)


_PROMOTED = re.compile(r"promoted version (\d+); rollback point (\d+)")


def demo(root: str) -> int:
    """The demo over Spark Connect: lake and backfill through one server; the summary line."""
    py = sys.executable
    with connect_server(log_dir=Path(f"{root.rstrip('/')}-connect-logs").resolve()) as url:
        print(f"connect server at {url}", flush=True)
        env = {**os.environ, "SPARK_REMOTE": url}
        code = subprocess.call([py, "-m", "sparkguard.demo", root], env=env, cwd=str(ROOT))
        out = ""
        if code == 0:
            run = subprocess.run([py, "-m", "sparkguard.cli", "run", "--plan",
                                  str(Path(root) / "plan.yaml")], env=env, cwd=str(ROOT),
                                 stdout=subprocess.PIPE, text=True)
            code, out = run.returncode, run.stdout
            print(out, end="", flush=True)
    m = _PROMOTED.search(out)
    promoted, point = (m.group(1), m.group(2)) if m else ("none", "none")
    print(f"connect exit={code} promoted_version={promoted} rollback_point={point}")
    return code


def main(argv: list[str]) -> int:
    """``-- CMD ARGS...``: run CMD against a fresh server; CMD's exit code. ``--demo ROOT``:
    :func:`demo`."""
    # a SIGTERM (timeout, Ctrl-C of make) still stops the server: exit through the finally
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if argv[:1] == ["--demo"] and len(argv) == 2:
        return demo(argv[1])
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv or argv[0].startswith("-"):
        print("usage: python -m tests.system.connect_server -- CMD [ARGS...]\n"
              "       python -m tests.system.connect_server --demo ROOT", file=sys.stderr)
        return 2
    with connect_server(log_dir=os.environ.get("SPARKGUARD_CONNECT_LOG_DIR")) as url:
        print(f"connect server at {url}", flush=True)
        return subprocess.call(argv, env={**os.environ, "SPARK_REMOTE": url})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
