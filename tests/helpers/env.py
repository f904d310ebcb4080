"""The offline test environment (set when this module is imported, before anything imports the hub
libraries) and the constants the suite shares: the repository root, GPT-2's EOS, DESIGN's
inspect-data keys."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

# Hub libraries read these when they are imported, so they are set before anything imports them: no
# test may reach the network or read (or write) the user's Hugging Face cache.
_HF_HOME = tempfile.mkdtemp(prefix="pretrain-tests-hf-")
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "HF_HOME": _HF_HOME,
    "HF_DATASETS_CACHE": os.path.join(_HF_HOME, "datasets"),
    "HF_HUB_CACHE": os.path.join(_HF_HOME, "hub"),
}
os.environ.update(OFFLINE_ENV)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
# Triton kernels (liger-kernel's fused loss, train.loss_kernel=liger) run through Triton's CPU interpreter:
# the suite has no GPU. Triton reads it when a kernel is defined, so before liger-kernel is imported.
os.environ["TRITON_INTERPRET"] = "1"
# The planners' numba kernels for inputs of every size (a run skips them below KERNEL_MIN_ITEMS), so
# that the suite's small inputs test the kernels against the references; test_plan_equivalence.py
# tests the threshold itself.
os.environ["PRETRAIN_NUMBA_MIN_ITEMS"] = "0"
# Never the user's cache: a session root, replaced per test by `offline` unless a module set its own.
_SESSION_CACHE_ROOT = tempfile.mkdtemp(prefix="pretrain-tests-cache-")
os.environ["PRETRAIN_CACHE_ROOT"] = _SESSION_CACHE_ROOT
# Verified records and remembered file digests: never the user's ~/.cache/pretrain.
_STATE_DIR = tempfile.mkdtemp(prefix="pretrain-tests-state-")
os.environ["PRETRAIN_STATE_DIR"] = _STATE_DIR
atexit.register(shutil.rmtree, _STATE_DIR, ignore_errors=True)
atexit.register(shutil.rmtree, _HF_HOME, ignore_errors=True)
atexit.register(shutil.rmtree, _SESSION_CACHE_ROOT, ignore_errors=True)

REPO = Path(__file__).resolve().parents[2]
# bench/synthetic.py (the benchmarks' synthetic lengths and batches) is imported by some tests too.
if str(REPO / "bench") not in sys.path:
    sys.path.insert(0, str(REPO / "bench"))
EOS = 50256
# The inspect-data JSON keys the README promises.
DESIGN_KEYS = frozenset(
    {
        "documents",
        "raw_tokens",
        "prediction_pairs",
        "chunks",
        "chunk_lengths",
        "packs",
        "pack_utilization",
        "padding_waste",
        "truncated_pairs",
        "cross_document_visible_fraction",
        "tokens_per_step",
        "steps_per_epoch",
        "train_validation_overlap",
        "verbatim_leaks",
    }
)
