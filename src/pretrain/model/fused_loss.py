"""train.loss_kernel: the training loss's head and cross-entropy in one fused CUDA kernel.

The chunked path (loss.py) materialises each chunk's logits, keeps them in fp32 and, with several
chunks, recomputes them in the backward: at 35 x 4096 tokens and GPT-2's vocabulary that is hundreds of
GB of memory traffic per step. liger-kernel's fused linear cross-entropy (a maintained library, the one
torchtitan and TRL offer) computes the head, the softmax and the gradient chunk by chunk in the forward
(logits in bf16, never the whole (T, vocab) matrix, no second head matmul) and returns the summed loss.

- `auto`: liger on CUDA when liger-kernel imports, else the chunked path (the reason is in run.json);
- `liger`: liger or a ConfigError saying why not (off CUDA it runs only under Triton's CPU interpreter,
  `TRITON_INTERPRET=1`, which is how the CPU tests check it against the chunked path);
- `chunked`: the chunked path everywhere (CPU runs always take it under `auto`).

A padded vocabulary (vocabulary.py) enters liger at its full, tile-friendly width with a bias of -inf
on the extra columns: their softmax is exactly 0, so they are never predicted and get no gradient.
Per-token losses (validation, `pretrain eval`) stay on the chunked path; only the summed training loss
is fused.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import torch

from ..attention_backends import AUTO
from ..data.batching.batch import IGNORE_INDEX
from ..errors import ConfigError
from .loss import token_cross_entropy

LIGER = "liger"
CHUNKED = "chunked"
LOSS_KERNELS = (AUTO, LIGER, CHUNKED)


def triton_interpreted() -> bool:
    """Triton kernels run on the CPU through its interpreter (set before triton is imported)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def liger_missing() -> str | None:
    """Why liger-kernel cannot be used in this environment (None: it can)."""
    if importlib.util.find_spec("liger_kernel") is None:
        return "liger-kernel is not installed (pip install -e '.[gpu]')"
    try:
        _liger_function()
    except Exception as error:  # an import error of triton or of liger itself, whatever its type
        return f"liger-kernel does not import here ({type(error).__name__}: {str(error)[:160]})"
    return None


def resolve_loss_kernel(setting: str, device: torch.device | str) -> tuple[str, str | None]:
    """The kernel train.loss_kernel picks on `device`, and why `auto` fell back (None otherwise)."""
    if setting not in LOSS_KERNELS:
        raise ConfigError(f"train.loss_kernel={setting!r}: use one of {', '.join(LOSS_KERNELS)}")
    device = torch.device(device)
    if setting == CHUNKED:
        return CHUNKED, None
    if setting == AUTO:
        if device.type != "cuda":
            return CHUNKED, None  # the CPU's path (the interpreter is for tests asking for liger)
        missing = liger_missing()
        return (CHUNKED, missing) if missing else (LIGER, None)
    runs_here = device.type == "cuda" or triton_interpreted()
    missing = liger_missing() if runs_here else None
    if not runs_here:
        raise ConfigError(
            f"train.loss_kernel=liger runs on CUDA, not on {device.type}; use train.loss_kernel=auto "
            "(the chunked loss off CUDA)"
        )
    if missing:
        raise ConfigError(f"train.loss_kernel=liger: {missing}; or use train.loss_kernel=chunked")
    return LIGER, None


def _liger_function() -> Any:
    from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction

    return LigerFusedLinearCrossEntropyFunction


_MASKS: dict[tuple, torch.Tensor] = {}


def padding_bias(width: int, real_vocab: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """(width,) zeros on the real ids, -inf on the padded ones; one per shape, dtype and device."""
    key = (width, real_vocab, dtype, device)
    bias = _MASKS.get(key)
    if bias is None:
        bias = torch.zeros(width, dtype=dtype, device=device)
        bias[real_vocab:] = float("-inf")
        _MASKS[key] = bias
    return bias


def _logits_dtype(hidden: torch.Tensor) -> torch.dtype:
    kind = hidden.device.type
    if kind in ("cuda", "cpu") and torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return hidden.dtype


def liger_cross_entropy_sum(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, real_vocab: int
) -> torch.Tensor:
    """Sum over the counted targets of -log softmax(hidden @ weight.T)[target], fp32, through liger;
    `weight` may have padded rows past `real_vocab` (masked out)."""
    bias = None
    if real_vocab < weight.shape[0]:
        bias = padding_bias(weight.shape[0], real_vocab, _logits_dtype(hidden), hidden.device)
    # Positional: autograd Functions take no keywords. (input, weight, target, bias, ce_weight,
    # ignore_index, lse_square_scale, label_smoothing, reduction): the same order since liger 0.5.
    out = _liger_function().apply(hidden, weight, targets, bias, None, IGNORE_INDEX, 0.0, 0.0, "sum")
    loss = out[0] if isinstance(out, tuple) else out
    return loss.float()


def summed_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, real_vocab: int, kernel: str = CHUNKED
) -> torch.Tensor:
    """The training loss's numerator: token cross-entropy summed over the counted targets, through
    the resolved `kernel` (liger when a gradient is wanted, else the chunked path)."""
    wants_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    if kernel == LIGER and wants_grad:
        return liger_cross_entropy_sum(hidden, weight, targets, real_vocab)
    return token_cross_entropy(hidden, weight, targets, real_vocab=real_vocab).sum()
