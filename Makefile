# One-command setup: every target installs into .venv first (idempotent).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

export HF_HUB_DISABLE_TELEMETRY := 1

.PHONY: install test test-all bench lint train sweep gpu-check clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH_SPEC)
	$(PY) -m pip install --quiet -e '.[dev,hf]'
	touch $(STAMP)

install: $(STAMP)

# The suite never touches the network: hub access is switched off for every test process.
test: install
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=offline $(PY) -m pytest -m "not slow" -q

test-all: install
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=offline $(PY) -m pytest -q

bench: install
	$(PY) bench/run.py

# CI runs this before the tests: formatting, lint (line length enforced) and mypy on src/.
lint: install
	$(VENV)/bin/ruff format --check src tests bench scripts train.py
	$(VENV)/bin/ruff check src tests bench scripts train.py
	$(VENV)/bin/mypy

train: install
	$(PY) train.py

sweep: install
	$(PY) train.py --multirun experiment=smoke data=padded,bestfit train.batch_size=2,4 data.max_seq_len=128,256 hydra.sweep.dir=outputs/multirun/sweep
	$(VENV)/bin/pretrain compare outputs/multirun/sweep --output outputs/multirun/sweep/compare.png

gpu-check: install
	$(PY) scripts/gpu_check.py --output bench/results/gpu_check.json

clean:
	rm -rf $(VENV) data-cache outputs/* .pytest_cache
