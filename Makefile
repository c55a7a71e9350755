# sparkguard: two commands for a fresh machine -- `make demo` and `make test`.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export PATH := $(CURDIR)/$(BIN):$(PATH)
# spark-submit's conf: conf/ with Delta's jars resolved once by `make warm` (no Ivy banner)
SUBMIT_CONF := $(VENV)/spark-conf
export SPARK_CONF_DIR := $(CURDIR)/$(SUBMIT_CONF)
export PYSPARK_PYTHON := $(CURDIR)/$(BIN)/python
# never two Spark test runs at once on this 2-core machine
SPARK_LOCK := /tmp/sparkguard-spark.lock

.PHONY: install demo demo-layouts demo-connect test test-fast test-unit test-integration test-system lint bench bench-backfill bench-ledger bench-promotion reliability clean warm

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,dev,chart]'
	touch $(STAMP)

install: $(SUBMIT_CONF)/spark-defaults.conf

$(SUBMIT_CONF)/spark-defaults.conf: $(STAMP) conf/spark-defaults.conf conf/log4j2.properties
	$(MAKE) --no-print-directory warm

# Resolve Delta's jars from Maven Central into the Ivy cache once, so tests do not each pay,
# and write $(SUBMIT_CONF): conf/ with those jar files in place of spark.jars.packages.
warm:
	SPARK_CONF_DIR=$(CURDIR)/conf $(BIN)/python -c "from pathlib import Path; from sparkguard.session import local_session_builder as b, write_submit_conf as w; s=b('warm').getOrCreate(); s.range(1).count(); w(s, Path('conf')); s.stop()"

demo: install
	$(BIN)/python -m sparkguard.demo demo-lake
	$(BIN)/spark-submit jobs/backfill.py --plan demo-lake/plan.yaml

# One small lake per supported window layout (timestamp ranges, partial days, date + hour,
# generated, unpartitioned, clustered): a backfill each, through spark-submit.
demo-layouts: install
	$(BIN)/python jobs/demo_layouts.py demo-layouts-lake

# The demo through a local Spark Connect server (PySpark's own, with Delta from
# conf/spark-defaults.conf): lake and backfill run as Connect clients (SPARK_REMOTE), the server
# is stopped afterwards; the last line is `connect exit=0 promoted_version=N rollback_point=M`.
demo-connect: $(STAMP)
	flock $(SPARK_LOCK) $(BIN)/python -m tests.system.connect_server --demo demo-lake

# All three tiers in one pytest process (one shared Spark session): tests/unit, tests/integration,
# tests/system. tests/README.md says which tier a test belongs to. Each test's time is kept in
# build/test-results.xml (JUnit XML; docs/performance.md's per-tier figures come from it).
test: install
	flock $(SPARK_LOCK) $(BIN)/python -m pytest -q --durations=25 --junitxml=build/test-results.xml tests

test-fast: install
	$(BIN)/python -m pytest -q -m "not spark and not slow" tests

test-unit: install
	$(BIN)/python -m pytest -q --durations=10 tests/unit

test-integration: install
	flock $(SPARK_LOCK) $(BIN)/python -m pytest -q --durations=25 tests/integration

test-system: install
	flock $(SPARK_LOCK) $(BIN)/python -m pytest -q --durations=25 tests/system

# ruff, mypy and the layer contract (tests/unit/test_layers.py: no Spark, a few seconds)
lint: $(STAMP)
	$(BIN)/ruff check sparkguard jobs tests bench
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/unit/test_layers.py

bench: install
	$(BIN)/pip install -q -e '.[bench]'
	flock $(SPARK_LOCK) $(BIN)/python -m bench.reconcile --rounds 5

# sparkguard against the naive job (one replaceWhere), cold spark-submit each, 3/60/365 days
bench-backfill: $(STAMP)
	flock $(SPARK_LOCK) $(BIN)/python bench/backfill.py --rounds 1

# promotion modes on a 1,000,000-row window with change data feed on (about 3 min)
bench-promotion: $(STAMP)
	flock $(SPARK_LOCK) $(BIN)/python bench/promotion.py

# sparkguard's own state with 5,000 earlier runs vs an empty ledger (about 3 min).
bench-ledger: $(STAMP)
	flock $(SPARK_LOCK) $(BIN)/python bench/ledger_scale.py

# The README's Reliability table: a real spark-submit killed at every failpoint and re-run,
# the concurrency scenarios and the hostile-plan corpus (about 25 min on 2 cores).
reliability: install
	flock $(SPARK_LOCK) $(BIN)/python bench/reliability.py

clean:
	rm -rf demo-lake demo-layouts-lake demo-lake-connect-logs spark-warehouse metastore_db derby.log .pytest_cache
