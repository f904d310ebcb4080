"""Document-isolating causal attention over a flat (T, H, D) batch, three interchangeable backends.

Every backend attends causally *within* each segment of `cu_seqlens` and never across one:
  sdpa    reference: segments regrouped into a few batched `scaled_dot_product_attention` calls
  flex    FlexAttention with a document-causal BlockMask built once per batch
  varlen  `torch.nn.attention.varlen.varlen_attn` (flash varlen kernel: CUDA, bf16/fp16 only)
  auto    varlen on CUDA, sdpa elsewhere; an explicit backend is never silently replaced.

The per-batch work (bucket plan, block mask, device copy of the boundaries) is done once by
`prepare_attention` in GPT.forward and shared by all layers.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import cache

import numpy as np
import torch
import torch.nn.functional as F

from ..arrays import prefix_sums
from ..errors import ConfigError

BACKENDS = ("sdpa", "flex", "varlen")
CHOICES = ("auto", *BACKENDS)
HALF_DTYPES = (torch.bfloat16, torch.float16)

FLEX_CPU_TRAINING = (
    "attn=flex cannot train on CPU: torch has no FlexAttention backward on CPU. Use attn=sdpa for CPU "
    "training (attn=flex evaluation on CPU works under torch.no_grad/inference_mode), or train on CUDA."
)


def resolve_backend(name: str, device: torch.device | str) -> str:
    """The concrete backend for `name` on `device`: only `auto` is resolved (varlen on CUDA, else sdpa)."""
    if name not in CHOICES:
        raise ConfigError(f"attn.backend must be one of {', '.join(CHOICES)}; got {name!r}")
    if name == "auto":
        return "varlen" if torch.device(device).type == "cuda" else "sdpa"
    return name


def check_backend(name: str, device: torch.device | str, dtype: torch.dtype, training: bool) -> str:
    """Fail early, with what to change, if `name` cannot run here; return the resolved backend.

    `dtype` is the compute dtype of q/k/v (the autocast dtype under mixed precision).
    """
    backend = resolve_backend(name, device)
    kind = torch.device(device).type
    how = " (attn=auto picks varlen on CUDA)" if name == "auto" else ""
    if backend == "varlen":
        if kind != "cuda":
            raise ConfigError(
                f"attn=varlen runs only on CUDA (the flash varlen kernel), not on {kind}; use attn=sdpa "
                f"(or attn=auto, which picks sdpa off CUDA)"
            )
        if dtype not in HALF_DTYPES:
            raise ConfigError(
                f"attn=varlen needs bf16 or fp16 q/k/v, got {dtype}{how}; train with bf16 mixed precision "
                f"(e.g. trainer.precision=bf16-mixed) or use attn=sdpa"
            )
    if backend == "flex" and training and kind == "cpu":
        raise ConfigError(FLEX_CPU_TRAINING)
    return backend


# ---------------------------------------------------------------------------------------------- sdpa


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


# ---------------------------------------------------------------------------------------------- flex


FLEX_BLOCK = 128


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


# -------------------------------------------------------------------------------------------- varlen


def varlen_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int
) -> torch.Tensor:
    """Flash varlen attention, causal within each segment; (T,H,D) -> (T,H,D). CUDA, bf16/fp16 only."""
    if q.device.type != "cuda" or q.dtype not in HALF_DTYPES:
        check_backend("varlen", q.device, q.dtype, training=False)  # raises with what to change
    from torch.nn.attention.varlen import varlen_attn

    q, k, v = (x.contiguous() for x in (q, k, v))  # the flash kernel wants dense (T, H, D)
    # window_size must be the tuple (-1, 0): that (and only that) selects the causal kernel.
    out = varlen_attn(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, window_size=(-1, 0))
    assert isinstance(out, torch.Tensor)  # no return_aux
    return out


# --------------------------------------------------------------------------------------------- batch


@dataclass(frozen=True)
class AttentionBatch:
    """Per-batch attention metadata, built once and passed to every layer."""

    backend: str
    cu_seqlens: torch.Tensor  # (S+1,) int32 on the compute device
    max_seqlen: int
    sdpa_plan: SdpaPlan | None = None
    block_mask: object = None  # flex BlockMask
    compiled: bool = False  # flex: use torch.compile(flex_attention)


def prepare_attention(
    backend: str,
    cu_seqlens: torch.Tensor,
    lengths: np.ndarray,
    device: torch.device,
    attn_compile: bool | str = "auto",
) -> AttentionBatch:
    """Build what `backend` needs for this batch: sdpa bucket plan, flex BlockMask, varlen boundaries."""
    device = torch.device(device)
    cu = cu_seqlens.to(device=device, dtype=torch.int32, non_blocking=True)
    max_seqlen = int(lengths.max()) if len(lengths) else 0
    if backend == "sdpa":
        return AttentionBatch(backend, cu, max_seqlen, sdpa_plan=plan_sdpa(lengths, device))
    if backend == "flex":
        compiled = device.type == "cuda" if attn_compile == "auto" else bool(attn_compile)
        mask = document_block_mask(lengths, device)
        return AttentionBatch(backend, cu, max_seqlen, block_mask=mask, compiled=compiled)
    if backend == "varlen":
        return AttentionBatch(backend, cu, max_seqlen)
    raise ValueError(f"prepare_attention needs a concrete backend ({', '.join(BACKENDS)}), got {backend!r}")


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionBatch) -> torch.Tensor:
    """Dispatch to the batch's backend; q, k, v and the result are (T, H, D)."""
    if meta.backend == "sdpa":
        assert meta.sdpa_plan is not None
        return sdpa_attention(q, k, v, meta.sdpa_plan)
    if meta.backend == "flex":
        return flex_attention(q, k, v, meta.block_mask, meta.compiled)
    return varlen_attention(q, k, v, meta.cu_seqlens, meta.max_seqlen)
