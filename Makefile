# Two commands on a fresh clone: `make demo` and `make test`. Both create/reuse .venv.
PY      ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
TSTAMP  := $(VENV)/.installed-test

.PHONY: demo test bench coverage sweep clean

$(VPY):
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(VPY)
	$(VPY) -m pip install -q -e .
	touch $@

$(TSTAMP): pyproject.toml $(STAMP)
	$(VPY) -m pip install -q -e '.[test]'
	touch $@

demo: $(STAMP)
	$(VPY) tools/demo.py

test: $(TSTAMP)
	$(VPY) -m pytest tests

bench: $(STAMP)
	$(VPY) tools/bench.py

coverage: $(TSTAMP)
	$(VPY) tools/op_coverage.py

sweep: $(TSTAMP)
	$(VPY) tools/model_sweep.py

clean:
	rm -rf $(VENV) build *.egg-info
