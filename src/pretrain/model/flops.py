"""Model FLOPs of a training step, and the peak FLOP/s of common GPUs, for MFU.

Convention (PaLM appendix B, nanoGPT's estimate_mfu): a forward+backward costs 6 FLOPs per parameter
per token (position embeddings excluded: a lookup; the tied embedding counted once: it is the head's
matmul) plus, for attention, 12 * n_layer * d_model * s per token of a segment of s tokens (QK^T and
AV, forward and backward, without halving for causality). s is the *real* segment length: a document
chunk of a packed batch, never the padded width, so padding never counts as useful work.
"""

from __future__ import annotations

import numpy as np

from .config import GPTConfig
from .llama import LlamaConfig

# bf16 dense peak TFLOP/s, matched as substrings of torch.cuda.get_device_name() (first match wins).
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("GB200", 2500.0),
    ("B200", 2250.0),
    ("H200", 989.0),
    ("H100 PCIe", 756.0),
    ("H100", 989.0),
    ("H800", 989.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("L40S", 362.0),
    ("L4", 121.0),
    ("A10G", 70.0),
    ("A10", 125.0),
    ("RTX 4090", 165.0),
    ("V100", 125.0),
)


def parameter_count(config: GPTConfig | LlamaConfig) -> int:
    """Parameters that do matmul work per token: all but the position table (the head is tied)."""
    if isinstance(config, LlamaConfig):
        return config.parameter_count()
    d, layers = config.d_model, config.n_layer
    bias = 1 if config.bias else 0
    block = 12 * d * d + bias * (9 * d) + (4 if config.bias else 2) * d  # qkv, proj, mlp + biases, 2 LNs
    return config.vocab_size * d + layers * block + (2 if config.bias else 1) * d


def training_flops(config: GPTConfig | LlamaConfig, segment_lengths: np.ndarray) -> float:
    """Model FLOPs of one forward+backward over segments of these real lengths."""
    lengths = np.asarray(segment_lengths, dtype=np.float64)
    tokens = float(lengths.sum())
    attention = 12.0 * config.n_layer * config.d_model * float((lengths * lengths).sum())
    return 6.0 * parameter_count(config) * tokens + attention


def peak_flops(device_name: str | None, override_tflops: float | None = None) -> float | None:
    """Peak FLOP/s for MFU: `override_tflops` (trainer.peak_tflops) if set, else the table's, else None."""
    if override_tflops:
        return float(override_tflops) * 1e12
    if not device_name:
        return None
    for key, tflops in PEAK_BF16_TFLOPS:
        if key in device_name:
            return tflops * 1e12
    return None
