# The two commands of README.md are `make demo` (the main job) and `make test` (the tests).
# Both set up what is missing first, so they work on a fresh machine and in CI.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
EXTRAS := dev,launcher,postgres,metrics
# torch 2.13.0's CPU build lies on this machine's disk; an unpinned torch pulls a CUDA build.
TORCH := torch==2.13.0

.PHONY: setup test lint typecheck importlint pytest slurm-versions demo cluster-up cluster-down clean

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

# The Slurm version matrix: the dev cluster itself, the ClusterPort contract, the controller
# on the real cluster (release, resize through requeue, gpu<->shard, foreign jobs, slurmctld
# frozen, killed controllers), icefrog submit's jobs (their sbatch options kept across
# moves, a TERM while they stage, one trained to its target) and the end-to-end resize,
# on the host's Slurm (22.05 on
# Debian 12) and on 24.11 and 26.05 (each from a Debian root: slurm_conf/dev/cluster.sh
# --slurm, built the first time, about a minute each), in one pytest session listing each
# test once a version (test_x[host], test_x[24.11], test_x[26.05]); pytest orders them so
# that each version's cluster comes up once. Tests marked one_slurm_version (kill points the
# controller recovers from by itself, the pyslurm stand-in) run on the first version only.
# `pytest` runs everything else on the host's.
SLURM_VERSIONS ?= host,24.11,26.05
comma := ,
SLURM_MATRIX := tests/integration/test_cluster.py tests/integration/test_slurm_contract.py \
	tests/integration/controller/test_controller_slurm.py \
	tests/integration/controller/test_slurm_outage.py tests/integration/controller/test_kill.py \
	tests/integration/test_submit_sbatch.py tests/integration/test_submit_slurm.py \
	tests/e2e/test_resize.py

pytest: setup
	$(PY) -m pytest $(addprefix --ignore=,$(SLURM_MATRIX)) $(PYTEST_ARGS)

slurm-versions: setup
	for v in $(subst $(comma), ,$(SLURM_VERSIONS)); do bash slurm_conf/dev/cluster.sh install --slurm $$v; done
	ICEFROG_TEST_SLURM=$(SLURM_VERSIONS) $(PY) -m pytest -v $(SLURM_MATRIX) $(PYTEST_ARGS)

# The README's test command.
test: setup lint typecheck importlint pytest slurm-versions

# The README's main job: a local cluster, the controller, four real training jobs.
demo: setup
	PY=$(abspath $(PY)) bash slurm_conf/dev/demo.sh

cluster-up: setup
	bash slurm_conf/dev/cluster.sh up

cluster-down:
	bash slurm_conf/dev/cluster.sh down

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
