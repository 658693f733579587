# make demo  - set up .venv, fetch the default weights, run n-gram vs AR speculative decoding
# make test  - set up .venv, fetch the default weights, run the test suite (without the tests
#              marked slow: multi-device meshes over every method, the costliest mutants)
# make test-all - the same with the slow tests
# make bench - run the benchmark suites (writes results/*.json and *.md)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
MODEL  ?= smollm2-135m-instruct
PYTEST_ARGS ?=
# pytest-xdist workers; with the shared XLA compile cache (tests/conftest.py). Fresh clone, 2-core
# AMD EPYC: 786 passed in 29 min 22 s (stop 24); CI of stops 25 and 26 took 56-57 min on a slower
# machine of the same kind. Since then: the slow marker, the scan layer loop, XLA optimisations
# off for tiny-model tests and pairwise-covering subsets of the golden cross-products; fresh
# clone on that slower machine (2026-11-26): 702 passed, pytest 28 min 25 s, make test 30 min 45 s;
# CI of stop 28: 1,996 s. Fresh clone 2026-11-26 (stop 29, AMD EPYC): 699 passed, pytest 24 min
# 55 s, make test 27 min 1 s; then three real-weight CLI tests (80 s) marked slow, and a second
# fresh clone the same day: 696 passed, pytest 28 min 0 s, make test 29 min 56 s (53 min of CPU
# against 48 for the first: the machine ran slower, not the suite). CI of stop 28: 1,877 s. Stop
# 30: the mutant suites of sps / space / diffuspec / assd-ngram / assd-fused-ngram and two
# power checks (about 290 s of CPU) moved to make test-all; every method keeps its real-code
# distribution test here. Fresh clone on a slower AMD EPYC (memory at 19 GB/s, 2026-11-26): 689
# passed, pytest 30 min 23 s, make test 32 min 49 s (59 min of CPU). Then the ngram and fused
# ASSD mutant suites and the real Spiffy golden (about 190 s) moved to make test-all too, and the
# hetero distribution test samples 5,000 rows per prompt instead of 10^4: fresh clone 688 passed,
# pytest 28 min 33 s, make test 31 min 10 s (56 min of CPU). Then the diffuspec suite test and
# the sampled mesh test (about 110 s) moved to make test-all: fresh clone 686 passed, pytest 28 min
# 0 s, make test 30 min 46 s (55 min of CPU) on that machine. Stop 31, same kind of machine, with
# seven new tests: 693 passed, make test 31 min 1 s (55.6 min of CPU); then the real n-gram CLI
# test moved to make test-all (the real goldens now assert n-gram == AR) and a second fresh clone
# ran 693 passed, make test 32 min 51 s (59.2 min of CPU: the machine ran slower). Then two sampled
# real goldens and assd-fused-ngram's greedy identity test (about 175 s of CPU in an older timing;
# tiny sampled goldens and its exact-distribution tests stay) moved to make test-all: 690 tests.
PYTEST_WORKERS ?= 2

.PHONY: setup weights demo test test-all bench clean

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
		$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal -m "not slow" $(PYTEST_ARGS)

test-all: weights
	JAXSPEC_SMOLLM2_GGUF="$$($(BIN)/python -m scripts.fetch --model smollm2-135m-instruct --print-path)" \
		$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

bench: weights
	$(BIN)/python -m scripts.benchmark --suite ar --out results/ar.json

clean:
	rm -rf $(VENV) .pytest_cache
