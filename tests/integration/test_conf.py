"""conf/: the Databricks Asset Bundle, the local spark-defaults.conf, and the table names a
plan may use on Databricks (Unity Catalog three-part names, paths)."""

from __future__ import annotations

import glob
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from sparkguard.cli import build_parser
from sparkguard.sql import TableRef, UnsafeSQLError, restore_statement

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
VAR_RE = re.compile(r"\$\{var\.([A-Za-z0-9_]+)\}")
JOB_PARAM_RE = re.compile(r"\{\{job\.parameters\.([A-Za-z0-9_]+)\}\}")
LOCK_PARAMS = ("takeover_stale_lock", "stale_lock_timeout")


def _yaml(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict), f"{path} is not a YAML mapping"
    return data


@pytest.fixture(scope="module")
def bundle() -> dict[str, Any]:
    return _yaml(CONF / "databricks.yml")


@pytest.fixture(scope="module")
def resource_files(bundle: dict[str, Any]) -> list[Path]:
    files = sorted(Path(p) for pattern in bundle["include"]
                   for p in glob.glob(str(CONF / pattern)))
    assert files, "the bundle's include globs match no resource file"
    return files


@pytest.fixture(scope="module")
def jobs(resource_files: list[Path]) -> dict[str, tuple[Path, dict[str, Any]]]:
    """Every job of the bundle: key -> (file it is declared in, its definition)."""
    found: dict[str, tuple[Path, dict[str, Any]]] = {}
    for path in resource_files:
        for key, job in _yaml(path)["resources"]["jobs"].items():
            assert key not in found, f"job {key} declared twice"
            found[key] = (path, job)
    return found


def _pyproject_pins() -> dict[str, str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = {}
    for dep in deps:
        m = re.match(r"^([A-Za-z0-9_.-]+)\s*(.*)$", dep)
        assert m, dep
        pins[m.group(1).lower()] = m.group(2).replace(" ", "")
    return pins


# -- the bundle -------------------------------------------------------------------------------

def test_bundle_has_a_name_targets_and_both_jobs(bundle: dict[str, Any],
                                                 jobs: dict[str, Any]) -> None:
    assert bundle["bundle"]["name"] == "sparkguard"
    assert set(bundle["targets"]) == {"dev", "prod"}
    assert bundle["targets"]["dev"].get("default") is True
    assert bundle["targets"]["prod"]["mode"] == "production"
    assert set(jobs) == {"sparkguard_backfill", "sparkguard_rollback",
                         "sparkguard_backfill_serverless"}


def test_every_variable_used_is_declared(bundle: dict[str, Any],
                                         resource_files: list[Path]) -> None:
    declared = set(bundle["variables"])
    for path in [CONF / "databricks.yml", *resource_files]:
        used = set(VAR_RE.findall(path.read_text(encoding="utf-8")))
        assert used <= declared, f"{path.name} uses undeclared variables {used - declared}"
    for name, target in bundle["targets"].items():
        assert set(target.get("variables", {})) <= declared, name
    # Delta tables by path do not belong in a volume: home must be given, not defaulted there
    assert "default" not in bundle["variables"]["home"]


def test_cluster_runs_a_runtime_matching_the_pinned_spark(bundle: dict[str, Any],
                                                          jobs: dict[str, Any]) -> None:
    runtime = bundle["variables"]["spark_version"]["default"]
    pins = _pyproject_pins()
    assert pins["pyspark"].startswith("==4.0.")
    # Databricks Runtime 17.x is Spark 4.0 (Scala 2.13 only)
    assert re.fullmatch(r"17\.\d+\.x-scala2\.13", runtime), runtime
    for key, (_, job) in jobs.items():
        if key == "sparkguard_backfill_serverless":
            continue  # no cluster: test_serverless_backfill_has_no_cluster_and_an_environment
        clusters = {c["job_cluster_key"]: c["new_cluster"] for c in job["job_clusters"]}
        for task in job["tasks"]:
            cluster = clusters[task["job_cluster_key"]]
            assert cluster["spark_version"] == "${var.spark_version}", key
            assert cluster["node_type_id"] == "${var.node_type_id}", key
            assert cluster["data_security_mode"] == "SINGLE_USER", key  # Unity Catalog access


@pytest.mark.parametrize("key", ["sparkguard_backfill", "sparkguard_rollback",
                                 "sparkguard_backfill_serverless"])
def test_jobs_never_run_twice_at_once(jobs: dict[str, Any], key: str) -> None:
    assert jobs[key][1]["max_concurrent_runs"] == 1


@pytest.mark.parametrize(("key", "script"), [("sparkguard_backfill", "jobs/backfill.py"),
                                              ("sparkguard_rollback", "jobs/rollback.py"),
                                              ("sparkguard_backfill_serverless",
                                               "jobs/backfill.py")])
def test_task_runs_the_entry_point_that_the_bundle_syncs(bundle: dict[str, Any],
                                                         jobs: dict[str, Any], key: str,
                                                         script: str) -> None:
    path, job = jobs[key]
    (task,) = job["tasks"]
    python_file = (path.parent / task["spark_python_task"]["python_file"]).resolve()
    assert python_file == ROOT / script and python_file.is_file()
    synced = [(CONF / p).resolve() for p in bundle["sync"]["paths"]]
    assert all(p.is_dir() for p in synced)
    assert any(python_file.is_relative_to(p) for p in synced), "entry point not deployed"
    assert any((p / "cli.py").is_file() and p.name == "sparkguard" for p in synced), \
        "the sparkguard package is not deployed next to jobs/"


@pytest.mark.parametrize(("key", "command", "flag", "param"), [
    ("sparkguard_backfill", "run", "--plan", "plan"),
    ("sparkguard_rollback", "rollback", "--run-id", "run_id"),
    ("sparkguard_backfill_serverless", "run", "--plan", "plan"),
])
def test_job_parameters_are_wired_to_cli_flags(jobs: dict[str, Any], key: str, command: str,
                                               flag: str, param: str) -> None:
    _, job = jobs[key]
    declared = {p["name"]: p["default"] for p in job["parameters"]}
    (task,) = job["tasks"]
    args = [str(a) for a in task["spark_python_task"]["parameters"]]
    assert args[args.index(flag) + 1] == "{{job.parameters." + param + "}}"
    used = {m for a in args for m in JOB_PARAM_RE.findall(a)}
    assert used == set(declared), f"parameters declared {set(declared)} but used {used}"
    # the same argv, with values in place of the templates, is accepted by the CLI: paths,
    # and the lock parameters' own defaults (no takeover, the CLI's 6-hour timeout)
    values = {name: f"/Volumes/main/sg/{name}" for name in declared} | {
        name: str(declared[name]) for name in LOCK_PARAMS}
    argv = [JOB_PARAM_RE.sub(lambda m: values[m.group(1)], a) for a in args]
    ns = build_parser().parse_args([command, *argv])
    assert getattr(ns, param) == values[param]
    assert ns.home == values["home"]
    default = build_parser().parse_args([command, *argv[:argv.index(flag) + 2]])
    assert (ns.takeover_stale_lock, ns.stale_lock_timeout) == (
        False, default.stale_lock_timeout)
    # a re-run after the driver died on a cluster that is gone takes its lock over
    values |= {"takeover_stale_lock": "true", "stale_lock_timeout": "900"}
    argv = [JOB_PARAM_RE.sub(lambda m: values[m.group(1)], a) for a in args]
    ns = build_parser().parse_args([command, *argv])
    assert (ns.takeover_stale_lock, ns.stale_lock_timeout) == (True, 900.0)


def test_libraries_come_from_pypi_and_never_replace_the_runtimes_spark(
        jobs: dict[str, Any]) -> None:
    pins = _pyproject_pins()
    for key, (_, job) in jobs.items():
        (task,) = job["tasks"]
        if "environment_key" in task:  # serverless: the environment's dependencies
            (env,) = [e for e in job["environments"] if e["environment_key"] == task["environment_key"]]
            packages = [p.replace(" ", "") for p in env["spec"]["dependencies"]]
        else:
            packages = [lib["pypi"]["package"].replace(" ", "") for lib in task["libraries"]]
        names = {re.split(r"[<>=!~]", p, maxsplit=1)[0].lower() for p in packages}
        assert names.isdisjoint({"pyspark", "delta-spark", "sparkguard"}), key
        for package in packages:
            name = re.split(r"[<>=!~]", package, maxsplit=1)[0].lower()
            assert name in pins, f"{key}: {name} is not a dependency in pyproject.toml"
            assert package == name + pins[name], f"{key}: {package} drifted from pyproject"


def test_serverless_backfill_has_no_cluster_and_an_environment(
        bundle: dict[str, Any], jobs: dict[str, Any]) -> None:
    """Serverless: no cluster definition at all, an environment with the pinned pydantic and
    pyyaml, and otherwise the classic job's task (same entry point, same arguments)."""
    _, job = jobs["sparkguard_backfill_serverless"]
    _, classic = jobs["sparkguard_backfill"]
    (task,) = job["tasks"]
    assert "job_clusters" not in job and "job_cluster_key" not in task
    assert "new_cluster" not in task and "existing_cluster_id" not in task
    (env,) = job["environments"]
    assert task["environment_key"] == env["environment_key"]
    assert env["spec"]["environment_version"] == "${var.serverless_environment}"
    assert bundle["variables"]["serverless_environment"]["default"]
    names = {re.split(r"[<>=!~]", p, maxsplit=1)[0] for p in env["spec"]["dependencies"]}
    assert names == {"pydantic", "pyyaml"}
    (classic_task,) = classic["tasks"]
    assert task["spark_python_task"] == classic_task["spark_python_task"]
    assert job["parameters"] == classic["parameters"]
    assert task["max_retries"] == 0


# -- local spark-submit defaults --------------------------------------------------------------

def _spark_defaults() -> dict[str, str]:
    conf = {}
    for line in (CONF / "spark-defaults.conf").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, value = shlex.split(line)
            conf[key] = value
    return conf


def test_spark_defaults_bring_the_pinned_delta_and_its_catalog() -> None:
    from sparkguard.session import DELTA_CONFS

    conf = _spark_defaults()
    delta = _pyproject_pins()["delta-spark"].removeprefix("==")
    assert conf["spark.jars.packages"] == f"io.delta:delta-spark_2.13:{delta}"
    for key, value in DELTA_CONFS.items():
        assert conf[key] == value
    assert conf["spark.sql.session.timeZone"] == "UTC"


def test_spark_submit_and_local_sessions_share_their_settings() -> None:
    """``spark-submit`` (conf/spark-defaults.conf) and a session built in Python run alike."""
    from sparkguard.session import _LOCAL_DEFAULTS

    conf = _spark_defaults()
    shared = {k: v for k, v in _LOCAL_DEFAULTS.items() if k in conf}
    assert {k: conf[k] for k in shared} == shared
    # Delta's default of 50 state-rebuild tasks makes every small local run ~30% slower
    assert shared["spark.databricks.delta.snapshotPartitions"] == "4"
    # one backfill plans ~240 distinct queries: Spark's 100 cached classes made each run
    # compile them again
    assert int(shared["spark.sql.codegen.cache.maxEntries"]) >= 500
    # G1 made a cold local run ~12% slower on 2 cores than the throughput collector
    assert "-XX:+UseParallelGC" in shared["spark.driver.extraJavaOptions"].split()


@pytest.mark.spark
def test_local_session_driver_runs_the_throughput_collector(spark) -> None:
    """The JVM options reach the driver the builder launches (the suite's session is one)."""
    beans = spark.sparkContext._jvm.java.lang.management.ManagementFactory \
        .getGarbageCollectorMXBeans()
    assert "PS Scavenge" in [b.getName() for b in beans]


def test_pyspark_and_delta_pins_pair_by_minor_version() -> None:
    pins = _pyproject_pins()
    spark, delta = pins["pyspark"].removeprefix("=="), pins["delta-spark"].removeprefix("==")
    assert spark.split(".")[:2] == delta.split(".")[:2]


# -- table names on Databricks ----------------------------------------------------------------

def test_unity_catalog_three_part_name_is_a_catalog_table() -> None:
    ref = TableRef.parse("main.sales.orders")
    assert (ref.name, ref.path) == ("main.sales.orders", None)
    assert ref.sql == "`main`.`sales`.`orders`"
    assert restore_statement(ref, 7) == "RESTORE TABLE `main`.`sales`.`orders` TO VERSION AS OF 7"


@pytest.mark.parametrize("path", [
    "/Volumes/main/sales/lake/orders",
    "s3://bucket/lake/orders",
    "abfss://lake@account.dfs.core.windows.net/orders",
    "gs://bucket/orders",
    "dbfs:/mnt/lake/orders",
    "./lake/orders",
])
def test_path_based_tables(path: str) -> None:
    ref = TableRef.parse(path)
    assert (ref.name, ref.path) == (None, path)
    assert ref.sql == f"delta.`{path}`"


@pytest.mark.parametrize("bad", ["a.b.c.d", "main.sales.orders; DROP TABLE x", "main.`x;y`",
                                 "s3://bucket/or`ders", ""])
def test_unsafe_names_are_refused(bad: str) -> None:
    with pytest.raises(UnsafeSQLError):
        TableRef.parse(bad)


def test_active_session_is_used(spark: Any) -> None:
    from sparkguard.session import get_or_create_session

    assert get_or_create_session("anything") is spark


def test_three_part_catalog_name_reads_versions_and_restores(spark: Any, lake: Path) -> None:
    """``catalog.schema.table`` names work end to end against the session catalog, as Unity
    Catalog names do on Databricks."""
    from sparkguard import delta_ops

    spark.sql(f"CREATE SCHEMA IF NOT EXISTS sg_conf_uc LOCATION '{lake / 'schema'}'")
    try:
        ref = TableRef.parse("spark_catalog.sg_conf_uc.orders")
        spark.range(3).write.format("delta").saveAsTable(ref.name)
        spark.range(5).write.format("delta").mode("overwrite").saveAsTable(ref.name)
        assert delta_ops.table_exists(spark, ref)
        assert delta_ops.current_version(spark, ref) == 1
        assert delta_ops.read_version(spark, ref, 0).count() == 3
        delta_ops.restore(spark, ref, 0)
        assert delta_ops.current_version(spark, ref) == 2
        assert sorted(r.id for r in delta_ops.read_table(spark, ref).collect()) == [0, 1, 2]
    finally:
        spark.sql("DROP SCHEMA IF EXISTS sg_conf_uc CASCADE")
