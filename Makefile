# make demo  - set up .venv, fetch the default weights, run n-gram vs AR speculative decoding
# make test  - set up .venv, fetch the default weights, run the test suite
# make bench - run the benchmark suites (writes results/*.json and *.md)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
MODEL  ?= smollm2-135m-instruct
PYTEST_ARGS ?=
# pytest-xdist workers; with the shared XLA compile cache (tests/conftest.py), on a fresh clone
# (2-core AMD EPYC, stop 24, commit 305ece0): 786 passed in 29 min 22 s of pytest, 30 min 35 s
# with the venv build; two later trims save about 75 s of worker time (not re-measured)
PYTEST_WORKERS ?= 2

.PHONY: setup weights demo test bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

weights: setup
	$(BIN)/python -m scripts.fetch --model $(MODEL)

demo: weights
	$(BIN)/python -m scripts.generate --model $(MODEL) --method ngram --compare --chat \
		--limit 1 --max-new-tokens 128 --draft-length 8

test: weights
	JAXSPEC_SMOLLM2_GGUF="$$($(BIN)/python -m scripts.fetch --model smollm2-135m-instruct --print-path)" \
		$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

bench: weights
	$(BIN)/python -m scripts.benchmark --suite ar --out results/ar.json

clean:
	rm -rf $(VENV) .pytest_cache
