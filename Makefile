# The two commands of README.md are `make demo` (the main job) and `make test` (the tests).
# Both set up what is missing first, so they work on a fresh machine and in CI.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
EXTRAS := dev,launcher,postgres,metrics
# torch 2.13.0's CPU build lies on this machine's disk; an unpinned torch pulls a CUDA build.
TORCH := torch==2.13.0

.PHONY: setup test lint typecheck importlint pytest demo cluster-up cluster-down clean

$(VENV)/.installed: pyproject.toml setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH)
	$(PIP) install -q -e '.[$(EXTRAS)]'
	touch $@

setup: $(VENV)/.installed
	bash slurm_conf/dev/cluster.sh install
	@# the store tests start a real Postgres server (Debian's binaries)
	@ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; }

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(VENV)/.installed
	$(VENV)/bin/mypy icefrog_slurm launcher/icefrog_launcher

importlint: $(VENV)/.installed
	$(VENV)/bin/lint-imports

pytest: setup
	$(PY) -m pytest $(PYTEST_ARGS)

# The README's test command.
test: setup lint typecheck importlint pytest

# The README's main job: a local cluster, the controller, four real training jobs.
demo: setup
	PY=$(abspath $(PY)) bash slurm_conf/dev/demo.sh

cluster-up: setup
	bash slurm_conf/dev/cluster.sh up

cluster-down:
	bash slurm_conf/dev/cluster.sh down

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
