"""Per-token cross-entropy through the tied output head, without holding (T, vocab) logits.

At 35 x 4096 tokens and a 50257 vocabulary the fp32 logits alone are ~29 GB, so the head and the
loss run over row chunks. Training (gradients on) uses chunks of `LOSS_CHUNK_ROWS` rows, each under
activation checkpointing: only (rows, d_model) inputs are kept and one chunk's logits are recomputed
in backward (about one extra head matmul). Without gradients (validation, `pretrain eval`) nothing is
kept for a backward, so the chunks are sized by elements instead: at most `EVAL_CHUNK_ELEMENTS`
logits at a time (~1,300 rows at GPT-2's vocabulary), and evaluation memory no longer grows with
the microbatch (an 8192-token validation microbatch held 8192 x 50257 fp32 logits, twice, ~3.3 GB).
Each row's loss depends only on its own logits: chunking never changes a loss value.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ..data.batch import IGNORE_INDEX

LOSS_CHUNK_ROWS = 8192
EVAL_CHUNK_ELEMENTS = 1 << 26  # logits per chunk without gradients: 256 MiB in fp32


def eval_chunk_rows(vocab_size: int) -> int:
    """Rows per loss chunk without gradients: EVAL_CHUNK_ELEMENTS logits, at least 1 row."""
    return max(1, EVAL_CHUNK_ELEMENTS // max(1, int(vocab_size)))


def _chunk_losses(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = F.linear(hidden, weight)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 -> fp32; fp64 stays
    return F.cross_entropy(logits, targets, ignore_index=IGNORE_INDEX, reduction="none")


def token_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk_rows: int | None = None
) -> torch.Tensor:
    """(T,) cross-entropy (at least fp32) of `hidden @ weight.T` against `targets`; 0 where ignored.
    `chunk_rows` defaults to LOSS_CHUNK_ROWS when a gradient is needed, else `eval_chunk_rows`."""
    checkpointed = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    if chunk_rows is None:
        chunk_rows = LOSS_CHUNK_ROWS if checkpointed else eval_chunk_rows(weight.shape[0])
    if hidden.shape[0] <= chunk_rows:
        return _chunk_losses(hidden, weight, targets)
    losses = []
    for h, t in zip(hidden.split(chunk_rows), targets.split(chunk_rows), strict=True):
        if checkpointed:
            losses.append(checkpoint(_chunk_losses, h, weight, t, use_reentrant=False))
        else:
            losses.append(_chunk_losses(h, weight, t))
    return torch.cat(losses)
