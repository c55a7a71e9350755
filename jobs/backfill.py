"""spark-submit entry point: ``spark-submit jobs/backfill.py --plan plan.yaml [--dry-run]``."""

import os
import sys

# Databricks may run a python file task where __file__ is undefined; its working
# directory is then the file's own folder.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    globals().get("__file__") or os.path.join(os.getcwd(), "backfill.py")))))

from sparkguard.cli import main

if __name__ == "__main__":
    sys.exit(main(["run", *sys.argv[1:]]))
