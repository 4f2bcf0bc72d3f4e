# The two README commands are `make demo` and `make test`; both set everything up themselves.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION := 1
export CDK_DISABLE_VERSION_CHECK := 1

.PHONY: help deps java-check lint typecheck test test-fast demo synth deploy bench clean

help:
	@echo "make demo    - the local fleet: DynamoDB Local, a feed, workers, a live view"
	@echo "make test    - install everything, then ruff, mypy --strict and every test"
	@echo "make synth   - cdk synth, offline"
	@echo "make deploy  - checks, service-linked roles, cdk bootstrap + deploy to your credentials' account (DEPLOY_ARGS=\"-c stage=prod\")"
	@echo "make bench   - lease-protocol benchmarks (not part of make test)"

$(BIN)/.installed: requirements.txt requirements-dev.txt worker_src/requirements.txt worker_src/pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements-dev.txt
	@touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	@touch $@

java-check:
	@bash scripts/check-java.sh

deps: $(BIN)/.installed node_modules/.installed java-check
	@bash scripts/install-test-tools.sh

lint: deps
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: deps
	$(BIN)/mypy

test: lint typecheck
	$(BIN)/pytest -q

test-fast: deps
	$(BIN)/pytest -q -m "not system"

demo: deps
	$(BIN)/leaseworker local up

# cdk.json runs `python3 app.py` (the `cdk init` convention: whatever virtualenv is active);
# here the project's .venv goes first on PATH, so `make` needs no activation.
CDK_PATH := PATH="$(CURDIR)/$(BIN):$$PATH"

synth: deps
	$(CDK_PATH) npx cdk synth --quiet

# Synth defaults to a placeholder account so that it stays offline and deterministic; a real
# deploy passes the account and region of the caller's credentials explicitly. scripts/deploy.sh
# checks Docker (or CDK_DOCKER), the region and the credentials, pre-creates the ECS service-
# linked roles, then bootstraps and deploys. DEPLOY_ARGS go to cdk deploy, e.g.
# make deploy DEPLOY_ARGS="-c stage=prod -c alarmEmail=ops@example.com"
deploy: deps
	$(CDK_PATH) bash scripts/deploy.sh $(DEPLOY_ARGS)

bench: deps
	$(BIN)/python bench/lease_bench.py


clean:
	rm -rf cdk.out .pytest_cache .mypy_cache .ruff_cache
