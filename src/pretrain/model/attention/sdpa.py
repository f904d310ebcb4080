"""Reference backend: segments regrouped into a few batched `scaled_dot_product_attention` calls.

Runs everywhere (CPU and CUDA, any dtype, training and evaluation); the other backends are checked
against it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ...arrays import prefix_sums
from .base import AttentionBackend, AttentionBatch, Compile


@dataclass(frozen=True)
class SdpaPlan:
    """How the segments of one batch are laid out for batched SDPA calls.

    uniform_width > 0: every non-empty segment has that width, so (T, H, D) is viewed as
    (S, W, H, D) and attended in one call with no copy (always the case for the padded policy).
    Otherwise segments of similar length share a bucket padded to the bucket's longest one; pads go
    after the real tokens, so `is_causal=True` already keeps every real query off them.
    """

    uniform_width: int
    buckets: tuple[tuple[int, int], ...] = ()  # (segments, width) per bucket, in gather order
    gather: torch.Tensor | None = None  # (N,) row of q/k/v each bucket slot reads (pads: any real row)
    scatter: torch.Tensor | None = None  # (T,) slot of each token in the concatenated bucket outputs


def bucket_widths(lengths: np.ndarray, per_octave: int = 4, min_step: int = 16) -> np.ndarray:
    """Round each length up to a grid with `per_octave` steps per power of two (steps >= min_step):
    a bucket pads a segment by < 1/per_octave of its length (beyond min_step), and a batch needs at
    most ~per_octave * log2(max/min_step) calls whatever the number of segments."""
    lengths = np.asarray(lengths, dtype=np.int64)
    octave = np.floor(np.log2(np.maximum(lengths, 1))).astype(np.int64)
    step = np.maximum(min_step, (1 << octave) // per_octave)
    return -(-lengths // step) * step


def plan_sdpa(lengths: np.ndarray, device: torch.device | str, per_octave: int = 4) -> SdpaPlan:
    """Bucket plan for segments of `lengths` (in batch order, zero-length segments allowed)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    num_tokens = int(lengths.sum())
    real = lengths[lengths > 0]
    if num_tokens == 0:
        return SdpaPlan(uniform_width=0)
    if (real == real[0]).all():
        return SdpaPlan(uniform_width=int(real[0]))
    starts = prefix_sums(lengths)[:-1]
    seg = np.flatnonzero(lengths > 0)
    grid = bucket_widths(lengths[seg], per_octave)
    order = seg[np.lexsort((seg, grid))]  # grouped by bucket, batch order inside a bucket
    grid_sorted = np.sort(grid, kind="stable")
    # Shrink each bucket to its longest member: a bucket of equal lengths then needs no padding.
    edges = np.flatnonzero(np.diff(grid_sorted)) + 1
    groups = np.split(np.arange(len(order)), edges)
    width = np.empty(len(order), dtype=np.int64)
    buckets = []
    for group in groups:
        w = int(lengths[order[group]].max())
        width[group] = w
        buckets.append((len(group), w))
    # Slot layout: segment order[i] occupies [base[i], base[i] + width[i]) of the padded buffer.
    base = np.cumsum(width) - width
    total = int(width.sum())
    owner = np.repeat(np.arange(len(order)), width)
    col = np.arange(total, dtype=np.int64) - base[owner]
    seg_len = lengths[order][owner]
    # Pad slots may read any real row: they sit after their segment's real tokens, so causal masking
    # keeps every real query off them, and their own outputs are dropped by `scatter` (zero gradient).
    gather = np.where(col < seg_len, starts[order][owner] + col, 0)
    base_of = np.zeros(len(lengths), dtype=np.int64)
    base_of[order] = base
    token_seg = np.repeat(np.arange(len(lengths)), lengths)
    scatter = base_of[token_seg] + np.arange(num_tokens, dtype=np.int64) - starts[token_seg]
    return SdpaPlan(
        uniform_width=0,
        buckets=tuple(buckets),
        gather=torch.from_numpy(gather).to(device),
        scatter=torch.from_numpy(scatter).to(device),
    )


def _causal_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: int, width: int) -> torch.Tensor:
    """Causal SDPA over `rows` independent sequences of `width` stored flat as (rows*width, H, D)."""
    _, heads, dim = q.shape
    query, key, value = (x.reshape(rows, width, heads, dim).transpose(1, 2) for x in (q, k, v))
    out = F.scaled_dot_product_attention(query, key, value, is_causal=True)
    return out.transpose(1, 2).reshape(rows * width, heads, dim)


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: SdpaPlan) -> torch.Tensor:
    """Causal attention within each segment with `F.scaled_dot_product_attention`; (T,H,D) -> (T,H,D)."""
    num_tokens = q.shape[0]
    if num_tokens == 0:
        return q.new_empty(q.shape)
    if plan.uniform_width:
        return _causal_sdpa(q, k, v, num_tokens // plan.uniform_width, plan.uniform_width)
    assert plan.gather is not None and plan.scatter is not None
    sizes = [n * w for n, w in plan.buckets]
    parts = [x.index_select(0, plan.gather).split(sizes) for x in (q, k, v)]
    outs = [_causal_sdpa(qb, kb, vb, n, w) for (n, w), qb, kb, vb in zip(plan.buckets, *parts, strict=True)]
    return torch.cat(outs).index_select(0, plan.scatter)


class SdpaBackend(AttentionBackend):
    name = "sdpa"

    def check(self, device: torch.device, dtype: torch.dtype, training: bool, via_auto: bool = False) -> None:
        """Runs on every device and dtype, training or not."""

    def prepare(
        self, cu_seqlens: torch.Tensor, lengths: np.ndarray, device: torch.device, compile: Compile
    ) -> AttentionBatch:
        return self.batch(cu_seqlens, lengths, device, plan_sdpa(lengths, device))

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: AttentionBatch
    ) -> torch.Tensor:
        return sdpa_attention(q, k, v, batch.plan)
