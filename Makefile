# make demo  - set up .venv, fetch the default weights, run n-gram vs AR speculative decoding
# make test  - set up .venv, fetch the default weights, run the test suite (without the tests
#              marked slow: multi-device meshes over every method, the costliest mutants)
# make test-all - the same with the slow tests
# make lint  - ruff check and ruff format --check (100 columns; part of make test)
# make bench - run the ar benchmark suite (replaces results/ar.json and .md)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
MODEL  ?= smollm2-135m-instruct
PYTEST_ARGS ?=
# pytest-xdist workers; with the shared XLA compile cache (tests/conftest.py). What keeps make test
# under 30 minutes on 2 cores: the slow marker (multi-device meshes over every method, the
# costliest mutant suites, sampled real goldens: make test-all), the scan layer loop, XLA
# optimisations off for tiny-model tests, pairwise-covering subsets of the golden cross-products.
PYTEST_WORKERS ?= 2

.PHONY: setup weights lint demo test test-all bench device-pack device-bench clean

# constraints.txt pins every package to the versions the suite is tested with (pyproject.toml
# keeps the ranges a user's `pip install` accepts): `make test` is reproducible
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

weights: setup
	$(BIN)/python -m scripts.fetch --model $(MODEL)

demo: weights
	$(BIN)/python -m scripts.generate --model $(MODEL) --method ngram --compare --chat \
		--limit 1 --max-new-tokens 128 --draft-length 8

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: weights lint
	JAXSPEC_SMOLLM2_GGUF="$$($(BIN)/python -m scripts.fetch --model smollm2-135m-instruct --print-path)" \
		$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal -m "not slow" $(PYTEST_ARGS)

test-all: weights
	JAXSPEC_SMOLLM2_GGUF="$$($(BIN)/python -m scripts.fetch --model smollm2-135m-instruct --print-path)" \
		$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

bench: weights
	$(BIN)/python -m scripts.benchmark --suite ar --out results/ar.json --overwrite

# device-pack: here, pack weights / wheels / prompts into device_pack/ (scripts.device_bench)
# device-bench: on a lent GPU (its image's python3), verify the pack and run every suite in 540 s
device-pack: weights
	$(BIN)/python -m scripts.device_bench pack

device-bench:
	$(PYTHON) -m scripts.device_bench run --budget-s 540

clean:
	rm -rf $(VENV) .pytest_cache
