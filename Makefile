# The two commands of the README: `make demo` (the main job end to end on CPU) and
# `make test` (the suite). Both build .venv from scratch when it is missing.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
LITDATA_VERSION := 0.2.76
DEMO_DIR ?= runs/demo

.PHONY: install test test-fast demo bench clean

install: $(STAMP)

# litdata declares torchvision, whose PyPI build cannot load beside the CPU torch
# (and then breaks `import lightning`); litdata never needs it for token chunks,
# so it goes in with --no-deps after everything else. deepspeed builds from source
# against the torch already installed, hence --no-build-isolation.
$(STAMP): pyproject.toml constraints-cpu.txt Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel
	$(PIP) install -q -c constraints-cpu.txt torch==2.13.0
	$(PIP) install -q -c constraints-cpu.txt -e '.[eval,dev]'
	$(PIP) install -q --no-deps litdata==$(LITDATA_VERSION)
	$(PIP) install -q -c constraints-cpu.txt --no-build-isolation deepspeed==0.19.8
	$(PY) -c "import torch, lightning, litdata, deepspeed; assert not torch.cuda.is_available() or True"
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q -n 2 --timeout 600 tests

test-fast: $(STAMP)
	$(PY) -m pytest -q -x -m "not slow and not multiprocess" tests

demo: $(STAMP)
	$(VENV)/bin/layerdrop demo --out $(DEMO_DIR)

bench: $(STAMP)
	$(PY) benchmarks/layer_dropout_speed.py

clean:
	rm -rf $(VENV) runs
