"""Issue 6: one end-to-end backfill on a ``local-cluster`` master (separate executor JVMs).

The run uses a Python-callable transform (``sparkguard.demo:transform_orders``) and happens in
a subprocess whose session is built by ``sparkguard.session.local_session_builder`` with
``SPARKGUARD_MASTER=local-cluster[2,1,1024]``: two executor processes, so nothing may rely on
state held in the driver JVM (and Delta's jars must reach the executors).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F

from sparkguard.demo import transform_orders
from tests.lakes import WINDOW, copy_lake, write_plan

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
MASTER = "local-cluster[2,1,1024]"
CALLABLE = "sparkguard.demo:transform_orders"

# Builds the session as any entry point would, reports what the cluster looks like, then runs
# the backfill through the CLI's main in the same process (it reuses the active session).
PROBE = """
import json, os, sys
from sparkguard.session import get_or_create_session
spark = get_or_create_session("sparkguard-local-cluster")
sc = spark.sparkContext
driver_pid = sc._jvm.ProcessHandle.current().pid()
# the parent of each Python worker is the JVM that runs the task: an executor, not the driver
task_jvms = sorted(set(sc.parallelize(range(8), 4).map(lambda _: os.getppid()).collect()))
executors = [e for e in sc._jsc.sc().getExecutorIds().mkString(",").split(",") if e]
print("CLUSTER " + json.dumps({"master": sc.master, "executors": executors,
                               "driver_jvm": driver_pid, "task_jvms": task_jvms}), flush=True)
from sparkguard.cli import main
rc = main(["run", "--plan", sys.argv[1]])
spark.stop()
sys.exit(rc)
"""


def _spark_home(tmp: Path) -> str:
    """pyspark's install as SPARK_HOME (executors take its jars), through symlinks, so the
    worker folders local-cluster creates under ``$SPARK_HOME/work`` land in ``tmp``."""
    import pyspark

    real = Path(pyspark.__file__).resolve().parent
    home = tmp / "spark_home"
    home.mkdir()
    for child in real.iterdir():
        if child.name != "work":
            (home / child.name).symlink_to(child)
    return str(home)


def _callable_one_slice(plan: dict) -> None:
    """The callable transform, and the whole window as one (proof) slice: what crosses
    processes is the same in every slice, and each slice costs cold executor JVMs seconds."""
    plan["targets"][0]["transform"] = {"callable": CALLABLE}
    plan["execution"]["slice_partitions"] = len(WINDOW)


def test_backfill_on_local_cluster_with_callable_transform(spark, base_lake, tmp_path) -> None:
    root = copy_lake(base_lake, tmp_path / "lake")
    target = str(root / "target" / "orders_clean")
    plan = write_plan(root, _callable_one_slice)
    v_before = spark.sql(f"DESCRIBE HISTORY delta.`{target}`").agg(F.max("version")).first()[0]
    env = {**os.environ, "SPARKGUARD_MASTER": MASTER, "SPARK_HOME": _spark_home(tmp_path),
           "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    for key in ("SPARKGUARD_FAULT_AT", "SPARK_CONF_DIR", "PYSPARK_SUBMIT_ARGS"):
        env.pop(key, None)
    proc = subprocess.run([sys.executable, "-c", PROBE, str(plan)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900, check=False)
    log = proc.stdout[-4000:] + proc.stderr[-4000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("CLUSTER ")]
    assert lines, log
    cluster = json.loads(lines[0].removeprefix("CLUSTER "))

    assert cluster["master"] == MASTER
    assert len(cluster["executors"]) == 2, cluster
    assert cluster["task_jvms"] and cluster["driver_jvm"] not in cluster["task_jvms"], cluster
    assert proc.returncode == 0, log

    # the window equals the transform applied to the source; outside it nothing moved
    source = spark.read.format("delta").load(str(root / "source" / "orders"))
    after = spark.read.format("delta").load(target)
    in_window = F.col("order_date").isin(WINDOW)
    assert_df_equality(after.filter(in_window),
                       transform_orders(spark, source.filter(in_window), list(WINDOW)),
                       ignore_row_order=True, ignore_nullable=True)
    before = spark.read.format("delta").option("versionAsOf", v_before).load(target)
    assert_df_equality(after.filter(~in_window), before.filter(~in_window),
                       ignore_row_order=True)
    history = spark.sql(f"DESCRIBE HISTORY delta.`{target}`").select("userMetadata").collect()
    promotes = [h for h in history if h["userMetadata"] and '"promote"' in h["userMetadata"]]
    assert len(promotes) == 1
