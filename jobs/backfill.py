"""spark-submit entry point: ``spark-submit jobs/backfill.py --plan plan.yaml [--dry-run]``."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sparkguard.cli import main

if __name__ == "__main__":
    sys.exit(main(["run", *sys.argv[1:]]))
