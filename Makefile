# Two commands set everything up on a fresh machine: `make demo` and `make test`.
# The install step puts the library (src/) and then the research package (research/: the synthetic long-range data
# and the fine-tuning experiments, which the demo, the studies and their tests use) into the virtualenv.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo test common-tests lint fuzz bench clean

install: $(STAMP)

$(STAMP): setup.cfg constraints.txt pyproject.toml research/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e ".[test,plot,onnx]"
	$(PY) -m pip install --quiet -c constraints.txt -e research
	touch $(STAMP)

demo: install
	$(PY) examples/demo.py --output_dir outputs --overwrite

# The library's tests (tests/) and the research package's (research/tests/), in two test processes (pytest-xdist),
# each file's tests in one of them (module fixtures are built once), the longest files first (tests/support/session.py);
# TEST_WORKERS=0 runs them in this process. A test that runs past TEST_TIMEOUT seconds fails with its stack (never a
# silent hang); the 15 slowest tests are listed at the end.
TEST_WORKERS ?= 2
TEST_TIMEOUT ?= 900

test: install common-tests lint
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --timeout $(TEST_TIMEOUT) --durations=15 tests research/tests

# The linter (ruff; its rules in pyproject.toml), run by `make test` before the tests.
lint: install
	$(PY) -m ruff check src tests bench examples research

# transformers' common model tests (ModelTesterMixin), which its wheel does not ship: unpacked from the sdist of the
# installed version into .cache/transformers-tests/ (tests/test_transformers_common.py runs them on every head).
common-tests: install
	$(PY) tests/support/transformers_common.py

# The model against its loop reference over many drawn configurations and batches (before a release):
# FUZZ_EXAMPLES examples from FUZZ_SEED (a new seed each run unless given; rerun a failure with the printed one).
FUZZ_EXAMPLES ?= 3000
ifndef FUZZ_SEED
FUZZ_SEED := $(shell date +%s)
endif

fuzz: install
	@echo "make fuzz: $(FUZZ_EXAMPLES) examples, seed $(FUZZ_SEED) (rerun: make fuzz FUZZ_SEED=$(FUZZ_SEED))"
	CLUSTERFORMER_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) CLUSTERFORMER_FUZZ_SEED=$(FUZZ_SEED) \
		$(PY) -m pytest -q tests/test_encoder_reference.py --hypothesis-show-statistics

bench: install
	$(PY) bench/bench_encoder.py
	$(PY) bench/bench_kmeans.py
	$(PY) bench/bench_capture.py
	$(PY) bench/bench_export.py

clean:
	rm -rf $(VENV) outputs build src/*.egg-info research/build research/src/*.egg-info
