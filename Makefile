# gpufleet.reliability — the two commands of the README are `make demo` and `make test`.
# Both set everything up first (apt prerequisites, .venv with pinned dependencies, npm packages,
# the collection linked into ./collections) and need nothing outside this file.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
REPO := $(CURDIR)
export ANSIBLE_COLLECTIONS_PATH := $(REPO)/collections
export ANSIBLE_CONFIG := $(REPO)/ansible.cfg
export PATH := $(REPO)/$(BIN):$(PATH)

.PHONY: setup demo check test lint typecheck unit sanity ansible-lint integration integration-2411 integration-accounting test-221 \
	sanity-221 unit-221 test-220 sanity-220 unit-220 integration-lab integration-services ee-context wheelhouse bench fuzz lab lab-stop clean lock help

help:
	@echo "make demo   - set up and run the main job (the simulator's default comparison)"
	@echo "make check  - the edit loop (about a minute): ruff, mypy and the pure tests (brain, parsers, simulator)"
	@echo "make test   - set up and run every test, in lanes side by side (scripts/test_lanes.py --list)"
	@echo "make typecheck - mypy over plugins/module_utils (part of make lint)"
	@echo "make bench  - run the benchmarks and print figures"
	@echo "make fuzz   - fuzz every parser of untrusted text (FUZZ_N inputs each, default 100000) and print a table"
	@echo "make lab    - start the Slurm lab for a person to play with (make lab-stop stops it)"

setup: $(VENV)/.stamp-deps $(VENV)/.stamp-tools collections/ansible_collections/gpufleet/reliability node-deps
	@scripts/install-prereqs.sh

# Event-Driven Ansible (ansible-rulebook, tests/integration/monitoring) in its own venv: its pins differ from dev.txt.
EDA_VENV := .cache/eda-venv
setup: $(EDA_VENV)/.stamp
$(EDA_VENV)/.stamp: requirements/eda.txt
	test -x $(EDA_VENV)/bin/python || $(PYTHON) -m venv $(EDA_VENV)
	$(EDA_VENV)/bin/pip install -q --disable-pip-version-check -r requirements/eda.txt
	touch $@

$(VENV)/.stamp-deps: requirements/dev.txt
	@scripts/install-prereqs.sh
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements/dev.txt
	touch $@

# The checkout's code on a venv's path as two plain directories (the collection through ./collections, the simulator
# from simulator/) in place of setuptools' editable finder, which pip's `-e .` installs for the package-dir mapping:
# the finder imports pathlib, urllib and ipaddress at every Python start in the venv (25 ms of CPU each, thousands of
# starts in make test: every Ansible module run, every health check the lab's slurmd runs). The console scripts and
# the package metadata stay as pip installed them.
define static_paths
site=$$($(1) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
rm -f "$$site"/__editable__*gpufleet_reliability_tools*; \
printf '%s\n' "$(REPO)/collections" "$(REPO)/simulator" > "$$site/gpufleet_collections.pth"
endef

$(VENV)/.stamp-tools: $(VENV)/.stamp-deps pyproject.toml
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	$(call static_paths,$(PY))
	touch $@

collections/ansible_collections/gpufleet/reliability:
	mkdir -p collections/ansible_collections/gpufleet
	ln -sfn ../../.. $@

# Every folder under tests/ with a package-lock.json gets its pinned npm packages.
node-deps:
	@for lock in $$(find tests -name package-lock.json -not -path '*/node_modules/*'); do \
	  d=$$(dirname $$lock); \
	  if [ ! -f $$d/node_modules/.package-lock.json ] || [ $$lock -nt $$d/node_modules/.package-lock.json ]; then \
	    (cd $$d && npm ci --no-audit --no-fund --loglevel=error); fi; done

demo: setup
	$(BIN)/gpufleet-sim run simulator/scenarios/default-1k.yaml --out out/demo

lint: setup typecheck
	$(BIN)/ruff check .
	shellcheck $$(git ls-files '*.sh' .ci/run)
	$(BIN)/antsibull-changelog lint

# mypy over plugins/module_utils, configured in pyproject.toml [tool.mypy] (Python 3.9, every function annotated)
typecheck: setup
	$(BIN)/mypy

# The edit loop: what a change to the brain, a parser or the simulator breaks, in about a minute. Tests that run
# Ansible, a Slurm daemon or a statistical campaign are in `make test` only (markers set in tests/unit/conftest.py).
CHECK_MARKS := not ansible and not slow
check: setup
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(PY) -m pytest tests/unit -q -n 2 -m "$(CHECK_MARKS)"

unit: setup
	$(PY) -m pytest tests/unit -q -n 2 --durations=10

sanity: setup
	scripts/sanity.sh

ansible-lint: setup
	$(BIN)/ansible-lint --profile production

# Two workers a lane: each gets a Slurm lab of its own from the lab factory (tests/support/labs.py); a test file
# stays on one worker (--dist loadfile), so its module-scoped labs and daemons start once.
INTEGRATION_XDIST ?= -n 2 --dist loadfile --durations=15
integration: setup
	$(PY) -m pytest tests/integration -q $(INTEGRATION_XDIST)

# make integration in two halves, the lanes of make test: the Slurm lab tests, and the rest (the IdP, PAM, sshd,
# roles into fresh roots, the tarball, monitoring), which need no Slurm.
integration-lab: setup
	$(PY) -m pytest tests/integration -q -m lab $(INTEGRATION_XDIST)

integration-services: setup
	$(PY) -m pytest tests/integration -q -m "not lab" $(INTEGRATION_XDIST)

# The Slurm integration suite again, against Slurm 24.11 in a Debian trixie chroot.
integration-2411: setup
	SLURM_LAB_RELEASE=24.11 $(PY) -m pytest tests/integration -q -m lab $(INTEGRATION_XDIST)

# calibrate's round trip on real accounting (MariaDB, slurmdbd) alone, on both releases (make test's Slurm lanes run
# it too).
integration-accounting: setup
	$(PY) -m pytest tests/integration -q -m accounting
	SLURM_LAB_RELEASE=24.11 $(PY) -m pytest tests/integration -q -m accounting

# The ansible-core 2.21 lane: Python 3.12 (pyenv or the system's python3.12), its own venv. Versions: ansible-core
# from requirements/ansible-<release>.txt, every other pin from dev.txt (used as constraints without its ansible-core
# line). The same rule makes the 2.20 venv (make test-220).
VENV221 := .cache/venv-ansible-2.21
PY221 := $(VENV221)/bin/python
VENV220 := .cache/venv-ansible-2.20
PY220 := $(VENV220)/bin/python
PYTHON312 ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.12.*/bin/python3.12) $(shell command -v python3.12))
.cache/venv-ansible-%/.stamp: requirements/ansible-%.txt requirements/dev.txt pyproject.toml
	@test -n "$(PYTHON312)" || { echo "ansible-core $* lane: no Python 3.12 found (pyenv install 3.12)" >&2; exit 1; }
	test -x $(@D)/bin/python || $(PYTHON312) -m venv $(@D)
	grep -v '^ansible-core==' requirements/dev.txt > $(@D)/constraints.txt
	$(@D)/bin/python -m pip install -q --disable-pip-version-check -c $(@D)/constraints.txt -r requirements/ansible-$*.txt
	$(@D)/bin/python -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	$(call static_paths,$(@D)/bin/python)
	touch $@

# sanity (controller Python 3.12; the 2.19 lane covers 3.9-3.13; pylint with 2.21's plugin included: its
# ansible-bad-function check is disabled, with the reason, at the three subprocess calls of node-side code that
# does not run under AnsibleModule), the unit tests and a playbook smoke through ansible-runner, on ansible-core 2.21.
# Only what meets Ansible runs again on 2.21 (modules, plugins, roles, the runner smoke): the pure brain tests do
# not depend on ansible-core and ran once in `make unit`.
test-221: sanity-221 unit-221

sanity-221: setup $(VENV221)/.stamp
	GPUFLEET_SANITY_VENV=$(VENV221) scripts/sanity.sh --python 3.12

# 2.21 adds a module's arguments to its result ("invocation", which the no_log tests read) only on request
ANSIBLE_FACING := tests/unit tests/integration/test_ansible_core_smoke.py -q -n 2 -m ansible
unit-221: setup $(VENV221)/.stamp
	PATH=$(REPO)/$(VENV221)/bin:$$PATH ANSIBLE_INJECT_INVOCATION=True $(PY221) -m pytest $(ANSIBLE_FACING)

# ansible-core 2.20, between the two releases make test runs: the same sanity and Ansible-facing tests as the 2.21
# lane, on demand (not in make test, which must stay within 30 minutes on two cores). requires_ansible names 2.20
# because this passed; run it before a release.
test-220: sanity-220 unit-220

sanity-220: setup $(VENV220)/.stamp
	GPUFLEET_SANITY_VENV=$(VENV220) scripts/sanity.sh --python 3.12

unit-220: setup $(VENV220)/.stamp
	PATH=$(REPO)/$(VENV220)/bin:$$PATH ANSIBLE_INJECT_INVOCATION=True $(PY220) -m pytest $(ANSIBLE_FACING)

# Every lane side by side (scripts/test_lanes.py: lint, unit, sanity, ansible-lint, both Slurm releases, the 2.21
# lane); set-up first, so that no two lanes install at once. One lane: scripts/test_lanes.py LANE.
test: setup $(VENV221)/.stamp
	$(PY) scripts/test_lanes.py

# The AWX / AAP execution environment's build context (docs/awx/README.md): the collection tarball, also under the
# version-free name execution-environment.yml expects (a copy: the versioned tarball a requirements.yml may name
# stays), then ansible-builder create into dist/ee-context.
ee-context: setup
	rm -rf dist/ee-context dist/gpufleet-reliability.tar.gz
	$(BIN)/ansible-galaxy collection build --force --output-path dist .
	cp dist/gpufleet-reliability-$$($(PY) -c 'import yaml; print(yaml.safe_load(open("galaxy.yml"))["version"])').tar.gz \
	  dist/gpufleet-reliability.tar.gz
	$(BIN)/ansible-builder create -f execution-environment.yml -c dist/ee-context

# Wheels for the node venvs of a site without a package index (the roles' *_wheelhouse variables; README, "Nodes
# without a package index"), for the nodes' Python and platform, not this machine's: WHEELHOUSE_PYTHON=3.11 for
# Debian 12 nodes.
WHEELHOUSE_PYTHON ?= 3.9
WHEELHOUSE_PLATFORM ?= manylinux2014_x86_64
wheelhouse: setup
	$(PY) scripts/wheelhouse.py --python-version $(WHEELHOUSE_PYTHON) --platform $(WHEELHOUSE_PLATFORM)

bench: setup
	@for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b; done

# Not part of `make test` (the unit suite runs a 300-input smoke of the same harnesses). Findings land in out/fuzz.
fuzz: setup
	nice -n 10 $(PY) tests/fuzz/run.py

lab: setup
	tests/lab/slurm-lab.sh start
	@tests/lab/slurm-lab.sh env

lab-stop:
	tests/lab/slurm-lab.sh stop

lock:
	rm -rf .cache/lock-venv && $(PYTHON) -m venv .cache/lock-venv
	.cache/lock-venv/bin/pip install -q -r requirements/dev.txt && .cache/lock-venv/bin/pip freeze

clean: lab-stop
	rm -rf $(VENV) collections tests/output out
