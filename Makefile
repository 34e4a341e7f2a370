# LLM Anatomy: two commands do everything.
#   make lab    set up (venv, pinned packages, the offline model) and open JupyterLab
#   make test   the same set-up, then every test: unit, nbval on every notebook, browser, the executed book
# And to look before you run:
#   make site          the course executed, as a static HTML book in build/site/ (prints where to open it)
#   make screenshots   the README's pictures in docs/images/ (committed), from the real widgets and notebook 07
#   make busy-check    every notebook with one and with both cores burned: the same verdicts, and the times
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PYTEST_ARGS ?=
NBVAL  := --nbval-lax --nbval-current-env --nbval-cell-timeout=900
# Keep what nbval executes (outputs, figures) in build/executed/ for the book, so that no notebook runs twice.
# tools/site/capture.py only reads nbval's results; it also puts tests/browser/test_site.py after the notebooks.
BOOK_CAPTURE := -p tools.site.capture --executed-to=build/executed

.PHONY: lab test test-fast durations site screenshots busy-check setup model doctor bench notebooks lock clean

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "LLM Anatomy needs Python 3.11 or newer (transformers 5 does); found " + sys.version.split()[0])'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: requirements-lock.txt requirements-nodeps.txt pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -r requirements-lock.txt
	$(BIN)/python -m pip install -q --no-deps -r requirements-nodeps.txt
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
	$(BIN)/python -m pytest tests notebooks $(NBVAL) -p no:cacheprovider --durations=25 $(BOOK_CAPTURE) \
	    --junitxml=build/junit.xml $(PYTEST_ARGS)

# A contributor's quick run: the unit tests without notebooks and browser, leaving out those slower than 1 s in the
# last full run (tests/DURATIONS.md lists them). Every test still runs in make test.
test-fast: model
	LLM_ANATOMY_FAST=1 $(BIN)/python -m pytest tests -m "not browser" -p no:cacheprovider -q $(PYTEST_ARGS)

# The full run, then tests/DURATIONS.md from its timings (the 50 slowest, and the list test-fast leaves out).
durations: test
	$(BIN)/python tools/durations.py build/junit.xml

# The book: nbval executes every notebook once on this machine's default device (outputs kept), the browser tests
# save the widget stills and check the book, then the book is rendered from that one execution. A notebook that
# fails stops it with the notebook and cell named; a missing widget still is reported (a placeholder in its page).
site: model
	@status=0; $(BIN)/python -m pytest notebooks tests/browser $(NBVAL) -p no:cacheprovider $(BOOK_CAPTURE) \
	    $(PYTEST_ARGS) || status=$$?; \
	$(BIN)/python -m tools.site build $$([ $$status -eq 0 ] || echo --after-failed-run) || exit 1; exit $$status

# The README's pictures (docs/images/, committed): the stepper mid-generation and the attention explorer as
# Chromium renders them in JupyterLab, and notebook 07's measured roofline. Needs chromium.
screenshots: model
	$(BIN)/python -m pytest notebooks/07_prefill_and_decode.ipynb $(NBVAL) -p no:cacheprovider $(BOOK_CAPTURE) -q
	LLM_ANATOMY_README_IMAGES=1 $(BIN)/python -m pytest -p no:cacheprovider -m browser -q \
	    tests/browser/test_03_attention.py tests/browser/test_site.py::test_readme_stepper_mid_generation
	$(BIN)/python -m tools.site readme-images

# The course on a busy machine: every notebook run idle, then with one and with both cores kept busy by other
# processes (tools/busy_check.py). Every run must give the idle run's claim verdicts; the table of seconds (and the
# ratio to idle, at most 2x with one core burned) is printed and kept in build/busy/table.md. About 25 minutes on 2 cores.
busy-check: model
	$(BIN)/python tools/busy_check.py notebooks/[0-9][0-9]_*.ipynb --burn 1 --burn 2 --out build/busy

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
