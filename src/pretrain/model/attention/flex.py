"""FlexAttention with a document-causal BlockMask built once per batch.

CPU: evaluation only (torch has no FlexAttention backward on CPU). `attn.compile`: auto compiles
flex_attention on CUDA and runs it eagerly on CPU.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
import torch

from ...errors import ConfigError
from .base import AttentionBackend, AttentionBatch, Compile

FLEX_BLOCK = 128

FLEX_CPU_TRAINING = (
    "attn=flex cannot train on CPU: torch has no FlexAttention backward on CPU. Use attn=sdpa for CPU "
    "training (attn=flex evaluation on CPU works under torch.no_grad/inference_mode), or train on CUDA."
)


def _ordered(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense (nq, nkv) bool block table -> (counts, indices) with each row's blocks first, ascending."""
    counts = blocks.sum(-1, dtype=torch.int32)
    indices = torch.argsort((~blocks).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return counts[None, None], indices[None, None]


def document_block_mask(lengths: np.ndarray, device: torch.device | str, block: int = FLEX_BLOCK):
    """Document-causal BlockMask over the flat batch: token i sees token j iff same segment and j <= i.

    Built straight from the segment boundaries, O((T/block)^2) on `device`: create_block_mask would
    evaluate the mask on the full T x T grid (20 G entries at 35 x 4096 tokens) or need a compile per
    shape. Block classes follow create_block_mask: a block is full when every pair in it is allowed.
    """
    from torch.nn.attention.flex_attention import BlockMask

    num_tokens = int(np.asarray(lengths, dtype=np.int64).sum())
    seg_lengths = torch.as_tensor(np.asarray(lengths, dtype=np.int64), device=device)
    blocks = max(1, -(-num_tokens // block))
    # Rows past T (the last tile's padding) get document -1: no real token ever matches them.
    doc = torch.full((blocks * block,), -1, dtype=torch.int64, device=device)
    doc[:num_tokens] = torch.repeat_interleave(
        torch.arange(len(seg_lengths), device=device), seg_lengths, output_size=num_tokens
    )
    seg_start = torch.cumsum(seg_lengths, 0) - seg_lengths
    tile = torch.arange(blocks, device=device)
    first_row = tile * block
    last_row = torch.clamp((tile + 1) * block - 1, max=max(num_tokens - 1, 0))
    if num_tokens:
        lowest = seg_start[doc[first_row]] // block  # first kv tile the tile's first row can see
        # kv tiles at/after the last row's document start are fully visible (strictly below the diagonal),
        # provided the q tile has no padding rows.
        full_from = -(-seg_start[doc[last_row]] // block)
        full_from = torch.where((tile + 1) * block <= num_tokens, full_from, tile)
    else:
        lowest = full_from = tile
    full_from = torch.minimum(full_from, tile)
    kv = tile[None, :]
    q = tile[:, None]
    full = (kv >= full_from[:, None]) & (kv < q)
    partial = ((kv >= lowest[:, None]) & (kv < full_from[:, None])) | (kv == q)

    def document_causal(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)

    return BlockMask.from_kv_blocks(
        *_ordered(partial),
        *_ordered(full),
        BLOCK_SIZE=block,
        mask_mod=document_causal,
        seq_lengths=(num_tokens, num_tokens),
    )


@cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)


def flex_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask, compiled: bool
) -> torch.Tensor:
    """FlexAttention with the batch's document-causal BlockMask; (T,H,D) -> (T,H,D)."""
    from torch.nn.attention.flex_attention import flex_attention as eager_flex

    if q.device.type == "cpu":
        if torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)):
            raise ConfigError(FLEX_CPU_TRAINING)
        # Torch refuses CPU flex whenever an input requires grad, even under no_grad.
        q, k, v = q.detach(), k.detach(), v.detach()
    query, key, value = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))  # (1, H, T, D)
    if compiled:
        out = _compiled_flex()(query, key, value, block_mask=block_mask)
    else:
        with warnings.catch_warnings():  # eager is deliberate here (CPU evaluation, debugging)
            warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
            out = eager_flex(query, key, value, block_mask=block_mask)
    assert isinstance(out, torch.Tensor)  # no return_lse / return_aux
    return out.squeeze(0).transpose(0, 1)


@dataclass(frozen=True)
class FlexPlan:
    block_mask: Any  # torch's BlockMask (imported lazily: flex_attention is a heavy import)
    compiled: bool  # torch.compile(flex_attention) rather than eager


class FlexBackend(AttentionBackend):
    name = "flex"

    def check(self, device: torch.device, dtype: torch.dtype, training: bool, via_auto: bool = False) -> None:
        if training and device.type == "cpu":
            raise ConfigError(FLEX_CPU_TRAINING)

    def prepare(
        self, cu_seqlens: torch.Tensor, lengths: np.ndarray, device: torch.device, compile: Compile
    ) -> AttentionBatch:
        compiled = device.type == "cuda" if compile == "auto" else bool(compile)
        plan = FlexPlan(document_block_mask(lengths, device), compiled)
        return self.batch(cu_seqlens, lengths, device, plan)

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: AttentionBatch
    ) -> torch.Tensor:
        return flex_attention(q, k, v, batch.plan.block_mask, batch.plan.compiled)
