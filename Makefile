# LLM Anatomy: two commands do everything.
#   make lab    set up (venv, pinned packages, the offline model) and open JupyterLab
#   make test   the same set-up, then every test: unit, nbval on every notebook, browser
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: lab test setup model doctor bench notebooks lock clean

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "LLM Anatomy needs Python 3.11 or newer (transformers 5 does); found " + sys.version.split()[0])'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: requirements-lock.txt pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -r requirements-lock.txt
	$(BIN)/python -m pip install -q --no-deps -e .
	@touch $@

setup: $(VENV)/.installed

model: setup
	$(BIN)/python -m llm_anatomy fetch

# JupyterLab refuses to run as root unless told (containers, cloud VMs); learners' laptops never need it.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

lab: model
	$(BIN)/jupyter lab --notebook-dir=notebooks $(ROOT_FLAG)

test: model
	$(BIN)/python -m pytest tests notebooks --nbval-lax --nbval-current-env --nbval-cell-timeout=900 -p no:cacheprovider $(PYTEST_ARGS)

doctor: setup
	$(BIN)/python -m llm_anatomy doctor

bench: model
	$(BIN)/python -m llm_anatomy bench load
	$(BIN)/python -m llm_anatomy bench tokenizer
	$(BIN)/python -m llm_anatomy bench stepper
	$(BIN)/python -m llm_anatomy bench decode

# After editing a notebook: add the badge and Colab cell, strip outputs.
notebooks: setup
	$(BIN)/python tools/stamp_notebooks.py

# Re-pin every package (maintainers only): resolves requirements-dev.txt in a scratch venv.
lock:
	rm -rf .lock-venv && $(PYTHON) -m venv .lock-venv
	.lock-venv/bin/python -m pip install -q --upgrade pip
	.lock-venv/bin/python -m pip install -q torch==2.13.0 -r requirements-dev.txt
	( echo "# Exact versions installed by make and CI. Regenerate with: make lock"; \
	  .lock-venv/bin/python -m pip freeze --exclude-editable | sed -e 's/+cpu$$//' ) > requirements-lock.txt
	rm -rf .lock-venv

clean:
	rm -rf $(VENV) test-artifacts .pytest_cache
