"""Per-token cross-entropy through the tied output head, without holding (T, vocab) logits.

At 35 x 4096 tokens and a 50257 vocabulary the fp32 logits alone are ~29 GB, so the head and the
loss run over row chunks, each under activation checkpointing: only (rows, d_model) inputs are kept
and one chunk's logits are recomputed in backward (about one extra head matmul).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ..data.batch import IGNORE_INDEX

LOSS_CHUNK_ROWS = 8192


def _chunk_losses(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = F.linear(hidden, weight)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 -> fp32; fp64 stays
    return F.cross_entropy(logits, targets, ignore_index=IGNORE_INDEX, reduction="none")


def token_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk_rows: int = LOSS_CHUNK_ROWS
) -> torch.Tensor:
    """(T,) cross-entropy (at least fp32) of `hidden @ weight.T` against `targets`; 0 where ignored."""
    if hidden.shape[0] <= chunk_rows:
        return _chunk_losses(hidden, weight, targets)
    checkpointed = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    losses = []
    for h, t in zip(hidden.split(chunk_rows), targets.split(chunk_rows), strict=True):
        if checkpointed:
            losses.append(checkpoint(_chunk_losses, h, weight, t, use_reentrant=False))
        else:
            losses.append(_chunk_losses(h, weight, t))
    return torch.cat(losses)
