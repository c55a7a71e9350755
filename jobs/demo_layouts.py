"""``make demo-layouts``: ``python jobs/demo_layouts.py [ROOT [LAYOUT ...]] [--lock PATH]``.

Per supported window layout (default all), build a small lake with a defect inside
the window, run ``spark-submit jobs/backfill.py --plan ...`` on it, and print what it fixed.

One JVM at a time: the lakes are built in one, each backfill runs in its own spark-submit, and
the figures are measured in a last one. Exit 0 only when every layout passed.
"""

import argparse
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent


LOCK: list[str] = []  # ["flock", PATH] with --lock PATH: each JVM waits for the lock


def _python(*args: str) -> int:
    return subprocess.call([*LOCK, sys.executable, "-m", "sparkguard.layouts", *args],
                           cwd=HERE.parent)


def main(argv: list[str]) -> int:
    from sparkguard.layouts import LAYOUTS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", nargs="?", default="demo-layouts-lake",
                    help="folder for the lakes (replaced per layout)")
    ap.add_argument("layouts", nargs="*", metavar="LAYOUT",
                    help=f"layouts to run (default all): {', '.join(LAYOUTS)}")
    ap.add_argument("--lock", metavar="PATH", help="each JVM waits for this flock file first")
    args = ap.parse_args(argv)
    if args.lock:
        LOCK[:] = ["flock", args.lock]
    root = Path(args.root).resolve()
    names = args.layouts or list(LAYOUTS)  # the layouts to run (default all)
    unknown = sorted(set(names) - set(LAYOUTS))
    if unknown:
        print(f"unknown layout(s) {unknown}; choose from {list(LAYOUTS)}", file=sys.stderr)
        return 2
    if _python("build", str(root), *names) != 0:
        return 3
    exits = []
    from sparkguard.session import submit_conf_dir

    # as `make` exports them: Delta's conf for spark-submit, this venv's Python for the driver
    env = dict(os.environ, SPARKGUARD_HOME="")
    env.setdefault("SPARK_CONF_DIR", str(submit_conf_dir(HERE.parent / "conf")))
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    for name in names:
        log = root / name / "backfill.log"
        with log.open("w", encoding="utf-8") as out:
            code = subprocess.call([*LOCK, str(BIN / "spark-submit"), str(HERE / "backfill.py"),
                                    "--plan", str(root / name / "plan.yaml")], env=env,
                                   cwd=HERE.parent, stdout=out, stderr=subprocess.STDOUT)
        print(f"# {name}: spark-submit jobs/backfill.py exited {code} (output in {log})",
              flush=True)
        exits.append(f"{name}={code}")
    return _python("check", str(root), *exits)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
