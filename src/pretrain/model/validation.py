"""Checks on a PackedBatch before the model spends any compute on it.

A malformed `cu_seqlens` would silently let attention cross documents (or read past T in a kernel),
and a position past the learned table would index out of range on GPU with an unreadable error.
"""

from __future__ import annotations

import numpy as np
import torch

from ..data.batching.batch import PackedBatch


def check_batch(batch: PackedBatch, max_seq_len: int) -> np.ndarray:
    """Validate the batch's layout; return its segment lengths (host int64, one per segment)."""
    cu = batch.cu_seqlens
    if not isinstance(cu, torch.Tensor) or cu.dtype != torch.int32:
        got = cu.dtype if isinstance(cu, torch.Tensor) else type(cu).__name__
        raise ValueError(
            f"batch.cu_seqlens must be an int32 tensor (got {got}); the attention kernels take int32 "
            f"boundaries: build batches with pretrain.data.collate_packed/gather_packed or cast with .int()"
        )
    if cu.dim() != 1 or cu.numel() < 2:
        raise ValueError(f"batch.cu_seqlens must be 1-D with at least 2 entries, got shape {tuple(cu.shape)}")
    num_tokens = batch.input_ids.numel()
    for name in ("input_ids", "targets", "position_ids"):
        shape = tuple(getattr(batch, name).shape)
        if shape != (num_tokens,):
            raise ValueError(f"batch.{name} must have shape ({num_tokens},) like input_ids, got {shape}")
    bounds = cu.detach().cpu().numpy().astype(np.int64)
    if bounds[0] != 0:
        raise ValueError(f"batch.cu_seqlens must start at 0, got {bounds[0]}")
    lengths = np.diff(bounds)
    if (lengths < 0).any():
        at = int(np.argmax(lengths < 0))
        raise ValueError(
            f"batch.cu_seqlens must be monotonic non-decreasing; it drops from {bounds[at]} to "
            f"{bounds[at + 1]} at index {at + 1}"
        )
    if bounds[-1] != num_tokens:
        raise ValueError(
            f"batch.cu_seqlens must end at T = {num_tokens} (the number of input rows), got {bounds[-1]}"
        )
    longest = int(lengths.max())
    if batch.max_seqlen < longest:
        raise ValueError(
            f"batch.max_seqlen is {batch.max_seqlen} but the longest segment has {longest} tokens"
        )
    if num_tokens:
        # One host sync per batch (not per layer): both bounds in a single transfer.
        low, high = (
            int(x) for x in torch.stack([batch.position_ids.min(), batch.position_ids.max()]).tolist()
        )
        if low < 0:
            raise ValueError(f"batch.position_ids must be >= 0, got {low}")
        if high >= max_seq_len:
            raise ValueError(
                f"batch.position_ids reach {high} but the model has max_seq_len={max_seq_len} learned "
                f"positions; raise model.max_seq_len (it follows data.max_seq_len) or lower data.max_seq_len"
            )
    return lengths
