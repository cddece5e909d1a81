# sparsecomm: everything a user or CI runs goes through here.
#   make env    project-local environment (.venv): OpenMPI, torch, TF, Horovod 0.28.1, ...
#   make build  the compiled extension (torch ops; TF op library when TF is present)
#   make lint   ruff (lint and format check) over the Python tree, clang-format over csrc/
#   make format rewrites both into the project's style
#   make test   env + build + lint, then the whole suite (single-process and horovodrun multi-rank)
#   make demo   train a small real model on 2 ranks, dense vs sparsecomm, print a table
#   make check  self-check of this machine (its GPUs when present): op tests, kernel benchmark,
#               2-rank training; a verdict table, exit 1 on a FAIL (CHECK_ARGS=--quick: about 1 min)
#   make bench  kernels, the DDP hook's step on one rank, end-to-end speed on an emulated
#               1/10 Gbit/s network, convergence on real data; writes docs/results/ (JSON, PNG)
#               and docs/results.md
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(abspath $(VENV))/bin:$(PATH)
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1

CSRC := $(shell find csrc -type f 2>/dev/null)
CXX_SOURCES := $(filter %.h %.cpp %.cc %.cu %.cuh,$(CSRC))

.PHONY: env build lint format test demo check bench clean distclean

env: $(VENV)/.stamp-horovod

$(VENV)/.stamp-system:
	@scripts/setup_env.sh system
	@mkdir -p $(VENV) && touch $@

$(VENV)/.stamp-venv: $(VENV)/.stamp-system
	@scripts/setup_env.sh venv
	@touch $@

$(VENV)/.stamp-deps: requirements.txt benchmarks/requirements.txt $(VENV)/.stamp-venv
	@scripts/setup_env.sh deps
	@touch $@

$(VENV)/.stamp-horovod: scripts/setup_env.sh sparsecomm/install_horovod.py sparsecomm/cuda_toolkit.py $(VENV)/.stamp-deps
	@scripts/setup_env.sh horovod
	@touch $@

# The extension is rebuilt whenever a source under csrc/ or setup.py changes.
build: $(VENV)/.stamp-build

# Its compiles go through ccache where it is installed (make env installs it; CCACHE_DISABLE=1 turns
# it off): a fresh clone's build reads back the objects of any earlier build of the same sources.
CCACHE_MASQUERADE := $(wildcard /usr/lib/ccache)
CCACHE_ENV := $(if $(CCACHE_MASQUERADE),PATH="$(CCACHE_MASQUERADE):$$PATH" CCACHE_BASEDIR="$(CURDIR)" \
  CCACHE_DIR="$${CCACHE_DIR:-$${SPARSECOMM_CACHE:-$${XDG_CACHE_HOME:-$$HOME/.cache}/sparsecomm}/ccache}")

$(VENV)/.stamp-build: $(VENV)/.stamp-horovod setup.py $(CSRC)
	@echo "[build] compiling sparsecomm's extension (torch ops; TF op library)"
	@$(CCACHE_ENV) $(PY) -m pip install -q --no-deps --no-build-isolation -e . > $(VENV)/build.log 2>&1 \
	  || { tail -40 $(VENV)/build.log; echo "[build] FAILED: see $(VENV)/build.log"; exit 1; }
	@touch $@

# The whole suite: kernels vs references, compressors, horovodrun multi-rank runs (torch and
# TF), and the CUDA compile check (nvcc -c of every .cu, whenever nvcc exists). TEST_WORKERS=N:
# N pytest-xdist workers; the tests that start processes run on one of them, one after another, and
# the single-process files beside them (tests/conftest.py); TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
test: build lint
	$(PY) -m pytest tests -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# Style (configs: pyproject.toml's [tool.ruff], .clang-format); the versions are pinned in
# requirements.txt, since a formatter's output changes between releases.
lint: $(VENV)/.stamp-deps
	@$(PY) -m ruff check --quiet . && $(PY) -m ruff format --check --quiet . \
	  && $(VENV)/bin/clang-format --dry-run --Werror $(CXX_SOURCES) \
	  || { echo "[lint] FAILED: run 'make format' (ruff check's own findings need a hand)"; exit 1; }
	@echo "[lint] ruff and clang-format: clean"

format: $(VENV)/.stamp-deps
	$(PY) -m ruff check --fix --quiet . || true
	$(PY) -m ruff format --quiet .
	$(VENV)/bin/clang-format -i $(CXX_SOURCES)

demo: build
	$(PY) -m benchmarks.demo

# On a GPU machine: op tests on cuda, kernels vs torch.topk and memcpy, NCCL training on 2 ranks.
check: build
	$(PY) -m sparsecomm.check $(CHECK_ARGS)

# Shaping the network needs root (ip netns, tc); without it the end-to-end part runs on plain
# loopback and says so.
bench: build
	$(PY) -m benchmarks all --out docs/results --results-md docs/results.md

clean:
	rm -rf build *.egg-info sparsecomm/*.so sparsecomm/*/*.so $(VENV)/.stamp-build

distclean: clean
	rm -rf $(VENV)
