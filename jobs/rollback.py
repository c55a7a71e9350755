"""spark-submit entry point: ``spark-submit jobs/rollback.py --run-id ID [--home H]``."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sparkguard.cli import main

if __name__ == "__main__":
    sys.exit(main(["rollback", *sys.argv[1:]]))
