"""Attention inside a whole-model graph (train.compile_scope=model).

A whole-model graph must not depend on a batch's document structure, or it recompiles at every new
batch. Its attention therefore may take only tensors whose size is marked dynamic (q/k/v: T rows;
`cu_seqlens`: S+1 boundaries) and static numbers. The flash varlen kernel is such a call
(`torch.nn.attention.varlen.varlen_attn` is a `torch.library` custom op with its own backward op):
its `max_seqlen` is a launch bound, so the model's context (`max_seq_len`) serves every batch (the
kernel skips the tiles past each segment's end) and no batch's longest segment enters a guard.
sdpa and flex build Python plans from the host lengths (buckets, a block mask): they keep
compile_scope=blocks, which leaves attention between two compiled halves.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...errors import ConfigError
from .base import AttentionBackend, AttentionBatch
from .varlen import VarlenBackend

GRAPH_BACKENDS = ("varlen",)


def check_in_graph(backend: str) -> None:
    """Refuse a backend that cannot run inside a whole-model graph, saying what to change."""
    if backend not in GRAPH_BACKENDS:
        raise ConfigError(
            f"train.compile_scope=model needs attn=varlen (attention as one kernel call on dynamic "
            f"tensors); attn={backend} builds a per-batch plan: use train.compile_scope=blocks (or auto)"
        )


@dataclass(frozen=True)
class InGraphAttention(AttentionBatch):
    """The AttentionBatch a whole-model graph builds from its dynamic `cu_seqlens` and static bound."""

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if not isinstance(self.backend, VarlenBackend):
            check_in_graph(self.backend.name)
        return self.backend.attend(q, k, v, self)


def in_graph_batch(backend: AttentionBackend, cu_seqlens: torch.Tensor, max_seq_len: int) -> InGraphAttention:
    return InGraphAttention(backend, cu_seqlens, int(max_seq_len), None)
