# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo test bench clean

install: $(STAMP)

$(STAMP): setup.cfg constraints.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e ".[test,plot]"
	touch $(STAMP)

demo: install
	$(PY) examples/demo.py --output_dir outputs --overwrite

test: install
	$(PY) -m pytest -q tests

bench: install
	$(PY) bench/bench_encoder.py
	$(PY) bench/bench_kmeans.py
	$(PY) bench/bench_capture.py

clean:
	rm -rf $(VENV) outputs build src/*.egg-info
