VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow lint clean install bench

BENCH_EVENTS ?= 1000000

# The venv is rebuilt whenever pyproject.toml changes.
$(STAMP): pyproject.toml
	@command -v java >/dev/null || { echo "Java 17 is required (Debian: apt-get install openjdk-17-jre-headless)"; exit 1; }
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -qq --upgrade pip
	$(PY) -m pip install -qq -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/dsr demo

test: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

# Subprocess kills (failpoints, random SIGKILL) and a concurrent writer: a few minutes more.
test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

# The notebook's steps against `dsr run` on identical data; JSON + charts in bench/results/.
bench: $(STAMP)
	$(VENV)/bin/dsr bench --events $(BENCH_EVENTS)

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests

clean:
	rm -rf $(VENV) lakehouse spark-warehouse exports .pytest_cache
