# Every target sets itself up: `make test` and `make run` work on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.installed-bench

.PHONY: venv test test-partitions lint format typecheck unit bench run flower chaos clean

# The embedded runtime keeps its private Redis and the task workspaces here.
export ORGA_HOME ?= $(CURDIR)/.orga
export ORGA_WORKSPACE_ROOT ?= $(ORGA_HOME)/workspaces

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check shared coordinator workers orga tests bench
	$(VENV)/bin/ruff format --check shared coordinator workers orga tests bench

format: $(STAMP)
	$(VENV)/bin/ruff format shared coordinator workers orga tests bench
	$(VENV)/bin/ruff check --fix shared coordinator workers orga tests bench

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# The bench extra too, so that the benchmark peers' own tests (tests/bench/) run rather than skip.
unit: $(STAMP) $(BENCH_STAMP)
	$(VENV)/bin/pytest -q

test: lint typecheck unit

# The integration suite again with every process and client on 16 partitions (issue 25; the
# harness takes the count from ORGA_TEST_PARTITIONS, default 1). CI does not run it (it would
# double make test's 25 min); make test runs the tests marked on_16_partitions on both counts
# (docs/reliability.md §11 says what runs where).
test-partitions: $(STAMP)
	ORGA_TEST_PARTITIONS=16 $(VENV)/bin/pytest -q tests/integration

# The README's first command: two example tasks on the embedded runtime (private Redis, a real
# Celery worker, the coordinator), with a scripted model. The second one ends in human review
# (exit code 3), which is what it demonstrates.
run: $(STAMP)
	$(VENV)/bin/orga run examples/bugfix/task.yaml
	$(VENV)/bin/orga run examples/wanderer/task.yaml || test $$? -eq 3

# Flower against the workers' broker (ORGA_BROKER_URL, else ORGA_REDIS_URL), with basic auth.
flower: $(STAMP)
	@test -n "$$ORGA_REDIS_URL" || (echo "set ORGA_REDIS_URL (and ORGA_BROKER_URL when Celery's broker is not that Redis) to the deployment Flower should watch" && exit 2)
	$(VENV)/bin/celery -A orga flower --port=$${FLOWER_PORT:-5555} \
		--basic-auth=$${FLOWER_BASIC_AUTH:-admin:change-me}

# The benchmarks' extra (LangGraph, aiohttp and arq: the slow-model benchmark's peers). When it
# cannot be installed the benchmark runs without those peers and says so; the install is tried
# again next time.
$(BENCH_STAMP): pyproject.toml $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,bench]' && touch $(BENCH_STAMP) \
		|| echo "the bench extra (langgraph, aiohttp, arq) could not be installed: their peers are skipped"

bench: $(STAMP) $(BENCH_STAMP)
	$(PY) bench/tracker_cost.py
	$(PY) bench/stagnation_eval.py
	$(PY) bench/primitives_bench.py
	$(PY) bench/outbox_bench.py
	$(PY) bench/runtime_bench.py
	$(PY) bench/slow_model_bench.py
	$(PY) bench/slow_model_bench.py --fairness
	$(PY) bench/slow_model_bench.py --events
	$(PY) bench/slow_model_bench.py --streaming
	$(PY) bench/conversation_cost.py
	$(PY) bench/scale_bench.py
	$(PY) bench/coordinator_cpu.py --count-calls
	$(PY) bench/reasoning_cpu.py --count-calls

# Fault injection under load: worker processes, the coordinator and Redis are killed while
# 200 tasks run (docs/reliability.md). `make chaos CHAOS_ARGS="--tasks 50"` for a shorter run.
# Then the slow-model variant: the reasoning worker is killed while model calls are in flight
# (`CHAOS_SLOW_ARGS="--tasks 20"` for a shorter one). Then the delegation case: the coordinator
# killed while parents wait on their two sub-agents (`CHAOS_DELEGATION_ARGS="--parents 4"`).
# Then on a Redis Cluster (3 masters, 3 replicas): a master killed while 100 tasks run, a
# coordinator killed, a relay killed holding outbox entries (`CHAOS_CLUSTER_ARGS="--tasks 30"`).
# All run; the target fails if any does. The first three take `--partitions 16` (in their ARGS)
# to run every process on 16 partitions; the cluster one always does.
chaos: $(STAMP)
	status=0; \
	$(PY) bench/chaos.py $(CHAOS_ARGS) || status=1; \
	$(PY) bench/chaos_slow_model.py $(CHAOS_SLOW_ARGS) || status=1; \
	$(PY) bench/chaos_delegation.py $(CHAOS_DELEGATION_ARGS) || status=1; \
	$(PY) bench/chaos_cluster.py $(CHAOS_CLUSTER_ARGS) || status=1; \
	exit $$status

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache build *.egg-info
