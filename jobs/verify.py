"""spark-submit entry point: ``spark-submit jobs/verify.py --run-id ID --home H`` (or
``--evidence FILE``, ``--all --home H``); reads only, exit 0 intact, 1 tampering, 2 usage."""

import os
import sys

# Databricks may run a python file task where __file__ is undefined; its working
# directory is then the file's own folder.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    globals().get("__file__") or os.path.join(os.getcwd(), "verify.py")))))

from sparkguard.cli import main

if __name__ == "__main__":
    sys.exit(main(["verify", *sys.argv[1:]]))
