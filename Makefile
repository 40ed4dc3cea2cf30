# The two commands of the README: `make demo` and `make test`. Both set up .venv themselves.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: demo demo-litellm demo-real-vllm vllm-harness test-realvllm docs test lint typecheck unit bench bench-config-server bench-config-answer \
        bench-reconcile venv clean mutation mutation-changed

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

# The whole suite: lint, types, tests.
test: lint typecheck unit

# Every GitHub workflow: the project's own and the example fleet repository's.
WORKFLOWS := $(wildcard .github/workflows/*.yml fleet-repo-example/.github/workflows/*.yml)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/actionlint -shellcheck=$(BIN)/shellcheck $(WORKFLOWS)

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest -q

# The whole fleet on this machine (docs/quickstart.md): simulated boxes, the control plane, the
# reconciler; Ctrl-C stops it. DEMO_ARGS passes options, e.g. DEMO_ARGS="--scenario move-model".
DEMO_ARGS ?=
demo: $(STAMP)
	$(BIN)/fleetllm demo $(DEMO_ARGS)

# The same with a real LiteLLM proxy built for the run by an offline harness (a folder with setup.sh, not
# part of this repository: DEMO_ARGS="--litellm-harness DIR"; as an optional fallback the demo looks for
# the project's own in ../shared/litellm-offline and further up). With your own proxy (e.g. the registry's
# litellm[proxy] and your PostgreSQL, README.md): DEMO_ARGS="--litellm-url URL" and LITELLM_MASTER_KEY.
# Building needs root; the build adds a few minutes.
demo-litellm: $(STAMP)
	FLEETLLM_DEMO_LITELLM=1 $(BIN)/fleetllm demo $(DEMO_ARGS)

# The demo plus one box of two REAL vLLM servers (vLLM's CPU build, a tiny random Llama; docs/real-vllm.md).
# The harness: VLLM_PREFIX when given (make demo-real-vllm VLLM_PREFIX=DIR), else $FLEETLLM_VLLM_PREFIX, else a
# finished one in vllm-cpu/ beside this checkout, else ~/.cache/fleetllm/vllm-cpu, built there first by
# tools/vllm-cpu/setup.sh if none is found (3.5-5.5 min and 3.4 GB, once).
VLLM_PREFIX ?= $(HOME)/.cache/fleetllm/vllm-cpu
demo-real-vllm: $(STAMP)
	$(BIN)/fleetllm demo --real-vllm --build-vllm-harness \
	  $(if $(filter command line environment,$(origin VLLM_PREFIX)),--vllm-harness $(VLLM_PREFIX)) $(DEMO_ARGS)

# The real vLLM harness alone (the repository's tools/vllm-cpu/setup.sh; idempotent).
vllm-harness:
	tools/vllm-cpu/setup.sh $(VLLM_PREFIX)

# The real-vLLM suite (tests/realvllm, a few minutes): needs the harness and a LiteLLM proxy
# (FLEETLLM_TEST_LITELLM_URL / _MASTER_KEY, as .ci/run starts one).
test-realvllm: $(STAMP) vllm-harness
	FLEETLLM_TEST_VLLM_PREFIX=$(VLLM_PREFIX) $(BIN)/pytest -q tests/realvllm

# Regenerate docs/configuration.md from the JSON Schemas and docs/metrics.md from the metrics registries
# (tests/demo/test_docs.py and tests/deploy/test_metrics_docs.py fail while either is stale).
docs: $(STAMP)
	$(BIN)/python docs/gen_config_reference.py
	$(BIN)/python docs/gen_metrics_reference.py

# The headline figures (docs/benchmarks.md), each line with the load average it was taken at: GET /vllm/config
# A/B interleaved in rounds against a bare Tornado handler, the same server's floor and the WSGI path (ratios pair by pair), the same
# with 1,000 slow connections open, the rollout step against its target (FAIL lines over it), validation.
bench: $(STAMP)
	$(BIN)/python bench/config_server_load.py --rounds 5 --seconds 5 --variants cached,bare,floor,cached-wsgi
	$(BIN)/python bench/slow_clients.py --slow 1000 --boxes 1000 --rate 200 --seconds 15
	$(BIN)/python bench/rollout_step.py --boxes 1000 3000
	$(BIN)/python bench/validate_bench.py

# The command line as a user pays it (whole processes): fleetllm --version, fleetllm validate on 1,000 boxes,
# and check-jsonschema on the same files, installed into a temporary venv (docs/benchmarks.md).
.PHONY: bench-cli
bench-cli: $(STAMP)
	$(BIN)/python bench/cli_bench.py --install

# GET /vllm/config under load: 1,000 boxes, 64 connections, every variant on the same server (docs/benchmarks.md).
bench-config-server: $(STAMP)
	$(BIN)/python bench/config_server_load.py

# Where a cached GET /vllm/config's CPU goes, in-process: with and without its log line and fetch record,
# against the bare write (docs/benchmarks.md).
bench-config-answer: $(STAMP)
	$(BIN)/python bench/config_answer_cost.py

# One reconcile pass over 1,000 boxes / 3,000 servers against local fakes (docs/benchmarks.md).
bench-reconcile: $(STAMP)
	$(BIN)/python bench/reconcile_pass.py --boxes 1000

# The gateway's request path compiled for the venv's Python (gateway/README.md, "Compiled"); run a gateway
# on it with FLEETLLM_GATEWAY_NATIVE=build/gateway-native.
.PHONY: gateway-native
gateway-native: $(STAMP)
	$(BIN)/python tools/build_gateway_native.py build/gateway-native

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis build/gateway-native

# Screenshots of the status pages (docs/screenshots/), taken by the browser tests (needs /usr/bin/chromium).
.PHONY: screenshots
screenshots: $(STAMP)
	FLEETLLM_SAVE_SCREENSHOTS=1 $(BIN)/pytest -q tests/pages/test_browser.py

# The gateway's wrk benchmark (needs `apt-get install -y wrk`); figures go to docs/benchmarks.md.
.PHONY: bench-gateway
bench-gateway: $(STAMP)
	$(BIN)/python bench/gateway_bench.py

# The gateway against LLMhop on the same upstream, with the issue 28 targets (needs wrk, and an LLMhop binary
# as $$LLMHOP or on PATH: docs/benchmarks.md, "The gateway against LLMhop").
.PHONY: bench-gateway-llmhop
bench-gateway-llmhop: $(STAMP)
	$(BIN)/python bench/gateway_llmhop.py

# 1,000 boxes booting within a second against the real control plane (docs/reliability.md).
.PHONY: bench-boot-storm
bench-boot-storm: $(STAMP)
	$(BIN)/python bench/boot_storm.py

# GET /vllm/config at 64 connections with the SQLite and with the PostgreSQL state store; and
# validation, rendering and a reconcile pass from 100 to 10,000 boxes with its plot (docs/benchmarks.md).
# Both start a throwaway PostgreSQL (Debian's postgresql package) unless FLEETLLM_TEST_PG_URL is set.
.PHONY: bench-state bench-scale
bench-state: $(STAMP)
	$(BIN)/pip install -q --disable-pip-version-check -e '.[bench]'
	$(BIN)/python bench/config_server_load.py --compare-state --rounds 20

bench-scale: $(STAMP)
	$(BIN)/pip install -q --disable-pip-version-check -e '.[bench]'
	$(BIN)/python bench/scale_bench.py

# Mutation testing of the pure core (docs/testing.md): each module mutated by mutmut against its own unit
# tests, in a scratch copy; fails when a module kills less than MUTATION_FLOOR percent of its mutants.
# Most of an hour on 2 shared cores (diff alone about 45 minutes). mutation-changed runs only
# the core modules changed since MUTATION_BASE; CI adds MUTATION_ARGS=--ci (not diff, not validation).
MUTATION_FLOOR ?= 80
MUTATION_JOBS  ?= 2
MUTATION_BASE  ?= main
MUTATION_ARGS  ?=
mutation: $(STAMP)
	$(BIN)/pip install -q --disable-pip-version-check -e '.[mutation]'
	$(BIN)/python tools/mutation.py --floor $(MUTATION_FLOOR) --max-children $(MUTATION_JOBS)

mutation-changed: $(STAMP)
	$(BIN)/pip install -q --disable-pip-version-check -e '.[mutation]'
	$(BIN)/python tools/mutation.py --changed-since $(MUTATION_BASE) --floor $(MUTATION_FLOOR) \
	  --max-children $(MUTATION_JOBS) $(MUTATION_ARGS)
