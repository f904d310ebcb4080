"""Synthetic FineWeb-like data for the benchmarks (bench/) and the GPU check (scripts/gpu_check.py).

Random-token documents with FineWeb-like lognormal lengths, their chunks, and the same chunks served
two ways: padded rows (one chunk per row) and padding-free packs (best-fit-decreasing), so that both
policies train on the same real tokens. It needs numpy and torch only (the GPU check runs where
nothing else is installed): no config, no cache, no tokenizer.
"""

from __future__ import annotations

import numpy as np

from pretrain.data.batching.batch import PackedBatch, gather_packed, gather_padded
from pretrain.data.batching.chunking import ChunkTable, chunk_table
from pretrain.data.batching.packing import best_fit_decreasing
from pretrain.data.tokens import TokenSplit


def fineweb_like_lengths(count: int, seed: int = 0, mu: float = 6.0, sigma: float = 1.0) -> np.ndarray:
    """Document lengths in tokens (EOS included, >= 2): lognormal like FineWeb's, median ~400."""
    rng = np.random.default_rng(seed)
    return np.maximum(2, np.rint(rng.lognormal(mu, sigma, size=count))).astype(np.int64)


def synthetic_chunks(documents: int, capacity: int, seed: int = 0) -> tuple[TokenSplit, ChunkTable]:
    """A random-token split of FineWeb-like documents and its chunks (<= capacity inputs each)."""
    split = TokenSplit.from_lengths(fineweb_like_lengths(documents, seed), seed=seed)
    return split, chunk_table(split.offsets, split.lengths, capacity)


def padded_batches(split: TokenSplit, table: ChunkTable, capacity: int, rows: int) -> list[PackedBatch]:
    """MiniMind-style rows: one chunk per row of `capacity` columns, pads computed."""
    return [
        gather_padded(split.tokens, table.start[i : i + rows], table.length[i : i + rows], row_width=capacity)
        for i in range(0, len(table), rows)
    ]


def packed_batches(
    split: TokenSplit, table: ChunkTable, capacity: int, packs_per_batch: int
) -> list[PackedBatch]:
    """The same chunks packed best-fit-decreasing, `packs_per_batch` packs per padding-free batch
    (packs in the order they were opened: the first ones hold the longest chunks)."""
    items, ptr = best_fit_decreasing(table.length, capacity)
    sizes = np.diff(ptr)
    batches = []
    for first in range(0, len(sizes), packs_per_batch):
        last = min(first + packs_per_batch, len(sizes))
        order = items[ptr[first] : ptr[last]]
        batches.append(
            gather_packed(split.tokens, table.start[order], table.length[order], sizes[first:last], capacity)
        )
    return batches
