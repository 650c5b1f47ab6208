# The two commands of the README. Both create .venv if it is missing and install what they need.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml constraints-cpu.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints-cpu.txt torch==2.13.0
	$(PIP) install -q -c constraints-cpu.txt -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/recallm-demo

test: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check recallm data_gen rewards tests bench

bench: $(STAMP)
	$(PY) bench/recall_mask.py
	$(PY) bench/rewards.py
	$(PY) bench/data_gen.py
	$(PY) bench/sft_step.py

clean:
	rm -rf $(VENV) outputs .pytest_cache
