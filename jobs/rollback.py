"""spark-submit entry point: ``spark-submit jobs/rollback.py --run-id ID [--home H]``."""

import os
import sys

# Databricks may run a python file task where __file__ is undefined; its working
# directory is then the file's own folder.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    globals().get("__file__") or os.path.join(os.getcwd(), "rollback.py")))))

from sparkguard.cli import main

if __name__ == "__main__":
    sys.exit(main(["rollback", *sys.argv[1:]]))
