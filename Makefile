# The Spark line installed and tested: 4.1 (Iceberg 1.11, Delta 4.4, Scala 2.13), the default, or 3.5
# (Iceberg 1.10, Delta 3.3, Scala 2.12), each in its own virtual environment: `make test SPARK=3.5`
# (mkdocs/docs/deployment/versions.md).
SPARK ?= 4.1
SPARK_EXTRA := spark$(subst .,,$(SPARK))
VENV ?= $(if $(filter 4.1,$(SPARK)),.venv,.venv-spark$(SPARK))
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DOCS_STAMP := $(VENV)/.docs-installed

.PHONY: demo test test-slow test-integration integration-deps jars lint docs clean install bench bytecode

BENCH_EVENTS ?= 1000000

# The venv is rebuilt whenever pyproject.toml changes.
$(STAMP): pyproject.toml
	@case "$(SPARK)" in 4.1|3.5) ;; *) echo "SPARK=$(SPARK): supported lines are 4.1 and 3.5"; exit 2;; esac
	@command -v java >/dev/null || { echo "Java 17 is required (Debian: apt-get install openjdk-17-jre-headless)"; exit 1; }
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -qq --upgrade pip
	$(PY) -m pip install -qq -e '.[dev,$(SPARK_EXTRA)]'
	@# The jars of this Spark line's sessions (Iceberg, Delta, Spark's Kafka connector), from Maven Central
	@# through mvn into ~/.cache, once.
	$(VENV)/bin/dsr fetch-jars
	@# Records the classes a run loads (~45 s, once): every later Spark start is 2-4 s shorter.
	$(VENV)/bin/dsr warm-up || echo "no class archive recorded: Spark commands start without one"
	touch $(STAMP)

install: $(STAMP) bytecode

# The package's compiled bytecode, written once (stale files only) rather than compiled again in
# every process: an editable install is not compiled by pip, and where PYTHONDONTWRITEBYTECODE is
# set, nor by Python. Importing the CLI and the runner took 2.6 CPU-seconds without it, 1.75 with.
bytecode: $(STAMP)
	$(PY) -m compileall -q src

demo: $(STAMP) bytecode
	$(VENV)/bin/dsr demo

# Two test processes, each with its own Spark (pytest-xdist, a file per process at a time): one
# process leaves a core idle while its driver plans and waits on Py4J; two keep both busy (8.4 min
# against 12.8 on 2 cores; a third gained nothing).
PARALLEL_TESTS ?= -n 2 --dist loadfile

test: $(STAMP) bytecode
	$(PY) -m pytest -q $(PARALLEL_TESTS) -m "not slow and not integration"

# Subprocess kills (failpoints, random SIGKILL) and a concurrent writer: a few minutes more.
test-slow: $(STAMP) bytecode
	$(PY) -m pytest -q $(PARALLEL_TESTS) -m slow

# Debian packages for the shared-catalog set-ups: PostgreSQL (also the intake queue several `dsr serve`
# share) and the two JDBC drivers; Chromium and its driver for the browser tests of the intake pages. Installs only what is missing (apt-get needs root,
# or sudo when there is one). Also a local Kafka broker's jars (Apache Kafka 4.1 with its dependencies,
# ~43 MB from Maven Central through mvn into ~/.cache/lakehouse-dsr/jars/kafka-broker, once): the tests
# and benchmarks on Kafka topics start one (lake/broker.py), with no Docker or Kafka installation.
DEBIAN_PACKAGES := postgresql libpostgresql-jdbc-java libxerial-sqlite-jdbc-java chromium chromium-driver
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
integration-deps: $(STAMP) jars
	$(VENV)/bin/dsr fetch-jars --kafka-broker
	@missing=$$(for p in $(DEBIAN_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing $$missing"; \
		$(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; \
	fi

# The format jars plus Hadoop's S3A connector (hadoop-aws + the AWS SDK bundle it declares), from Maven
# Central through mvn into ~/.cache/lakehouse-dsr/jars, once.
jars: $(STAMP)
	$(VENV)/bin/dsr fetch-jars --s3a

# REST catalog + S3 (SeaweedFS), JDBC on PostgreSQL and SQLite, a standalone cluster, spark-submit; two
# `dsr serve` on one PostgreSQL queue through kill -9 of either (tests/integration/test_instances.py).
# Each test starts and stops its own servers, so tests (not files) are shared out: one file holds the
# six full-cycle set-ups.
PARALLEL_INTEGRATION ?= -n 2 --dist load
test-integration: integration-deps bytecode
	$(PY) -m pytest -q $(PARALLEL_INTEGRATION) -m integration tests/integration

# The notebook's steps against `dsr run` on identical data, then a wide lake (10, 50, 100 mapped
# tables of 10k rows: whole `dsr run` processes against per-table SQL), the silver/gold propagation and
# streaming suppression, the vault (shred against erase, pseudonymize against a copy, export through
# it, at 1M and BENCH_EVENTS), the intake service under 10,000 filings from 20 clients (one instance on
# SQLite, two on a throwaway PostgreSQL: hence integration-deps, which also fetches the local Kafka
# broker's jars) against a commit per request, a DROP list of 1M hashes matched against 10M people,
# `dsr ingest` from a local Kafka broker against a plain Kafka stream (1M records, 100k of erased people),
# and seed 004's pipeline beside `dsr run` against bronze alone; JSON + charts in bench/results/.
bench: $(STAMP) integration-deps bytecode
	$(VENV)/bin/dsr bench --events $(BENCH_EVENTS)
	$(PY) bench/tables.py
	$(PY) bench/propagate.py --events $(BENCH_EVENTS)
	$(PY) bench/vault.py --events $(sort 1000000 $(BENCH_EVENTS))
	$(PY) bench/intake.py --instances 2 --queue postgresql
	$(PY) bench/drop.py
	$(PY) bench/kafka_ingest.py
	$(PY) bench/pipeline.py --events $(BENCH_EVENTS)

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench mkdocs
	$(VENV)/bin/lint-imports
	$(PY) -m mypy

# The documentation site (mkdocs/mkdocs.yml) into site/: the pinned `docs` extra, then a strict build (a broken
# link, a missing page or a docstring mkdocstrings cannot read fails). The CLI and API references are
# generated from the code at build time (mkdocs/hooks.py).
$(DOCS_STAMP): pyproject.toml $(STAMP)
	$(PY) -m pip install -qq -e '.[docs,$(SPARK_EXTRA)]'
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict -f mkdocs/mkdocs.yml

clean:
	rm -rf .venv .venv-spark3.5 lakehouse spark-warehouse exports .pytest_cache site
