# Two commands on a fresh clone: `make demo` and `make test`. Both create/reuse .venv.
PY      ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
TSTAMP  := $(VENV)/.installed-test
LSTAMP  := $(VENV)/.installed-lint

.PHONY: demo test check bench coverage sweep clean coldcompile

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
	$(VPY) -m pytest -n 2 --dist loadfile --durations=25 tests

$(LSTAMP): pyproject.toml $(TSTAMP)
	$(VPY) -m pip install -q -e '.[test,lint]'
	touch $@

# ruff (rules in pyproject.toml), the docstring examples as doctests, the import graph and the
# op table (docs/OPS.md current)
check: $(LSTAMP)
	$(VENV)/bin/ruff check .
	$(VPY) -m pytest -p no:cacheprovider --doctest-modules eager_neuron kernels cache
	$(VPY) -m pytest -p no:cacheprovider tests/test_imports.py tests/test_op_table.py

bench: $(STAMP)
	$(VPY) tools/bench.py

coverage: $(TSTAMP)
	$(VPY) tools/op_coverage.py

sweep: $(TSTAMP)
	$(VPY) tools/model_sweep.py

# cold Numba compile seconds per kernel family on a fixed corpus (fresh cache per run)
coldcompile: $(STAMP)
	$(VPY) tools/bench_coldcompile.py --runs 3

clean:
	rm -rf $(VENV) build *.egg-info

# adaptive eager: long randomized differential run (CPU vs plain vs adaptive); FUZZ_N programs
FUZZ_N ?= 2000
.PHONY: fuzz fuzz-adaptive fuzz-fastpath
fuzz: fuzz-adaptive
fuzz-adaptive: $(TSTAMP)
	$(VPY) tools/fuzz_adaptive.py --programs $(FUZZ_N)
fuzz-fastpath: $(TSTAMP)
	$(VPY) tools/fuzz_fastpath.py --programs 400

# 2 ranks on loopback: DDP and FSDP2 losses next to one CPU process, plus a 64 MB all-reduce row
.PHONY: ddp
ddp: $(STAMP)
	$(VENV)/bin/torchrun --standalone --nproc-per-node 2 tools/distributed_demo.py --bench

# crash hunt: every op of op_db with bad arguments in worker processes (no signal, no hang, no
# write-then-raise); the bounded form runs in tests/test_crashes.py. isa: the ISA-sensitive
# tests under every ATEN_CPU_CAPABILITY this CPU has (also part of `make test`: tests/test_isa.py)
.PHONY: fuzz-crash isa
fuzz: fuzz-crash
fuzz-crash: $(TSTAMP)
	$(VPY) tools/crash_hunt.py -v
isa: $(TSTAMP)
	$(VPY) -m pytest tests/test_isa.py
