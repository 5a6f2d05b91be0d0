# The README's commands. Each sets up what it needs by itself.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STACK := deploy/local/stack
CODE := schemas producer outbox_relay consumer
WITH_STACK_ENV = eval "$$($(STACK) env)" &&
WITH_STACK_ENV_ABS = eval "$$($(CURDIR)/$(STACK) env)" &&

.PHONY: help venv up down status lint rules reference test test-group-protocol bench-short test-faults test-nemesis test-image test-cluster test-secure test-secure-cluster test-installed test-debezium image lock bench demo

help:
	@echo "make demo   the example service end to end: load, reordering, a lost event, audit"
	@echo "make test   virtualenv, local stack, lint, then the whole test suite"
	@echo "make test-faults  the full fault suite: kills, restarts, fuzz; prints the report"
	@echo "make test-nemesis  zombies, cut and slow links, clock jumps, full disks: 20 minutes"
	@echo "make test-secure   every program over TLS with its own least-privilege credentials"
	@echo "make test-secure-cluster  the same on three SASL_SSL brokers and a TLS Redis Cluster"
	@echo "make bench  benchmarks; writes bench-results.json and prints a table"
	@echo "make bench BASELINE=<commit>  the same, each suite side by side with that commit"
	@echo "make bench-short  every benchmark suite on small sizes (CI: none may break)"
	@echo "make image  build deploy/Dockerfile (docker, or podman installed from Debian)"
	@echo "make test-image  build, then run migrate, relay, consumer and sweeper as containers"
	@echo "make test-cluster  three Kafka nodes and a Redis Cluster: broker and Redis failover under load"
	@echo "make test-installed  build the wheel, install it in an empty folder, run it there"
	@echo "make test-debezium  Debezium's outbox event router feeding the consumer, gaps repaired"
	@echo "make lint   ruff and mypy on the four packages"
	@echo "make rules  promtool check and unit-test the alert rules"
	@echo "make lock   pin the image's dependencies with their hashes (deploy/requirements.lock)"
	@echo "make reference  rewrite the READMEs' generated tables (settings, commands, metrics, alerts) from the code"
	@echo "make down   stop every local process the stack started"

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $@

venv: $(BIN)/.installed

up:
	$(STACK) up

down:
	if [ -x $(BIN)/python ]; then $(WITH_STACK_ENV) $(BIN)/python deploy/local/demo.py down; fi
	$(STACK) down

status:
	$(STACK) status

lint: venv
	$(BIN)/ruff check $(CODE) tests deploy/local deploy/reference.py
	$(BIN)/ruff format --check $(CODE) tests deploy/local deploy/reference.py
	$(BIN)/mypy
	$(BIN)/mypy deploy/local/demo.py deploy/reference.py

reference: venv
	$(BIN)/python deploy/reference.py

rules: up
	promtool check rules deploy/prometheus/rules.yml
	promtool test rules deploy/prometheus/rules.test.yml

test: venv up
	$(MAKE) --no-print-directory lint
	$(MAKE) --no-print-directory rules
	$(WITH_STACK_ENV) $(BIN)/pytest
	$(MAKE) --no-print-directory test-group-protocol

# The consumer's and the relay's integration tests again, every group joined by
# KIP-848's consumer protocol (the broker assigns; timeouts set on the group).
test-group-protocol: venv up
	$(WITH_STACK_ENV) INORDER_TEST_GROUP_PROTOCOL=consumer $(BIN)/pytest -q \
	  tests/integration/test_consumer.py tests/integration/test_relay.py

# The fault suite at full scale (make test runs it short): every part killed or
# restarted under load, 30,000 fuzzed messages, 50,000 boundary inputs (events, outbox
# rows, republish requests and results, routes files); the report tables end the output.
test-faults: venv up
	$(WITH_STACK_ENV) INORDER_FAULTS=full $(BIN)/pytest -m faults tests/faults

# The nemesis: each fault alone (frozen processes woken as zombies, cut, blackholed, slow
# and lossy links, clock jumps, full disks), then a seeded random schedule of them with
# kills for 20 minutes (INORDER_NEMESIS_S); its report ends the output and
# INORDER_NEMESIS_SEED=N replays a schedule. make test runs a short schedule.
test-nemesis: venv up
	$(WITH_STACK_ENV) INORDER_NEMESIS_S=$${INORDER_NEMESIS_S:-1200} $(BIN)/pytest -m faults \
	  tests/faults/test_nemesis.py tests/faults/test_nemesis_schedule.py

# The cluster mode: three KRaft nodes and a Redis Cluster beside the usual stack. The
# broker-loss and Redis-failover tests under load (their report table ends the output),
# then the step routes' integration tests with parking on the Redis Cluster.
# INORDER_CLUSTER_TESTS=short runs the failover tests only.
CLUSTER_STEP_TESTS := tests/integration/test_steps_store.py tests/integration/test_steps_consumer.py \
	tests/integration/test_parking_layout.py tests/integration/test_sweeper.py \
	tests/integration/test_admin_commands.py tests/integration/test_admin_review.py \
	tests/integration/test_admin_read_only.py
WITH_CLUSTER_ENV = eval "$$($(STACK) env --cluster)" &&

test-cluster: venv
	$(STACK) up --cluster
	$(WITH_CLUSTER_ENV) $(BIN)/pytest -m cluster tests/cluster
	if [ "$${INORDER_CLUSTER_TESTS:-}" != short ]; then \
	  $(WITH_CLUSTER_ENV) $(BIN)/pytest -q $(CLUSTER_STEP_TESTS); fi

# The secured stack (TLS everywhere, a credential per program, ACLs on) beside the usual
# one, and every program run on it with its own least-privilege credentials.
test-secure: venv
	$(STACK) up --secure
	$(BIN)/pytest -m secure tests/secure

# The same pipeline on the secured cluster: three SASL_SSL brokers with ACLs, a Redis
# Cluster on TLS (bus and replication too) with ACL users, the secured PostgreSQL.
test-secure-cluster: venv
	$(STACK) up --cluster --secure
	INORDER_SECURE_CLUSTER=1 $(BIN)/pytest -m secure tests/secure/test_secured_pipeline.py

# Debezium beside the stack (a Kafka Connect worker with Debezium's PostgreSQL connector,
# jars from Maven Central): a Debezium outbox feeding the consumer, the republish-only
# relay answering the sweeper's requests from that outbox.
test-debezium: venv up
	$(STACK) up debezium
	$(WITH_STACK_ENV) $(BIN)/pytest -m debezium tests/debezium
	$(STACK) down debezium

# As a user installs it: the wheel built, installed into a fresh virtualenv in an empty
# folder, and run there against the local stack (tests/installed/check.py says each step).
INSTALLED := $(shell mktemp -u -d /tmp/inorder-installed.XXXXXX)
test-installed: venv up
	rm -rf dist && $(BIN)/pip wheel -q --no-deps -w dist .
	mkdir -p $(INSTALLED)/empty
	$(PYTHON) -m venv $(INSTALLED)/venv
	$(INSTALLED)/venv/bin/pip install -q "$$(ls dist/inorder-*.whl)"
	cd $(INSTALLED)/empty && $(WITH_STACK_ENV_ABS) $(INSTALLED)/venv/bin/python $(CURDIR)/tests/installed/check.py
	rm -rf $(INSTALLED)

# The image's dependencies, pinned with their hashes, resolved afresh from pyproject.toml.
lock: venv
	$(BIN)/pip-compile --quiet --generate-hashes --strip-extras --no-emit-index-url \
	  --no-emit-find-links --output-file=deploy/requirements.lock pyproject.toml \
	  deploy/lock-extra.in
	$(BIN)/pip-compile --quiet --generate-hashes --strip-extras --allow-unsafe --no-emit-index-url \
	  --no-emit-find-links --output-file=deploy/build-backend.lock deploy/build-backend.in

image:
	deploy/image/build

# Exit code 3 from the build: no container runtime can be had (not root, none installed);
# that skips with one line, except in CI.
test-image: venv up
	@deploy/image/build; rc=$$?; \
	if [ $$rc -eq 3 ] && [ -z "$${CI:-}" ]; then echo "test-image: skipped, no container runtime can be had here"; exit 0; fi; \
	[ $$rc -eq 0 ] || exit $$rc; \
	$(WITH_STACK_ENV) $(BIN)/pytest -s -m image tests/image

$(BIN)/.bench: $(BIN)/.installed
	$(BIN)/pip install -q -e '.[test,bench]'
	touch $@

# BASELINE=<commit>: each suite also measured at that commit, just before, side by side.
bench: venv up $(BIN)/.bench
	$(WITH_STACK_ENV) INORDER_BENCH_BASELINE=$(BASELINE) $(BIN)/python -m tests.benchmarks

# Every suite on small sizes, each within 5 minutes: CI's check that none has broken.
# Its figures are not judged (bench-results.short.json).
bench-short: venv up $(BIN)/.bench
	$(WITH_STACK_ENV) INORDER_BENCH=short $(BIN)/python -m tests.benchmarks

demo: venv up
	$(WITH_STACK_ENV) $(BIN)/python deploy/local/demo.py up
