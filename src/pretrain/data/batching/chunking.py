"""Cutting documents into independent chunks whose targets look one token ahead.

A document of n tokens (EOS included) holds n - 1 next-token pairs. It becomes ceil((n - 1) / L)
chunks of at most L inputs; chunk k has inputs tokens[kL : kL + len] and targets one further, so
every pair survives exactly once, no EOS is inserted at a cut and positions restart at 0.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from ...arrays import prefix_sums
from ...errors import ConfigError
from .packing import numba_kernels

MIN_SEQ_LEN = 2
MAX_SEQ_LEN = 4096


def check_max_seq_len(max_seq_len: int) -> int:
    if not isinstance(max_seq_len, int | np.integer) or not MIN_SEQ_LEN <= int(max_seq_len) <= MAX_SEQ_LEN:
        raise ConfigError(
            f"data.max_seq_len must be an integer in {MIN_SEQ_LEN}..{MAX_SEQ_LEN}, got {max_seq_len!r}; "
            f"set e.g. data.max_seq_len=1024"
        )
    return int(max_seq_len)


@dataclass(frozen=True)
class Chunk:
    """One independent training sequence: inputs, their next-token targets and restarted positions."""

    name: str
    index: int
    inputs: np.ndarray
    targets: np.ndarray
    positions: np.ndarray

    def __len__(self) -> int:
        return len(self.inputs)


def split_tokens(name: str, tokens: Sequence[int] | np.ndarray, max_seq_len: int) -> Iterator[Chunk]:
    """Yield the chunks of one document (its tokens EOS included): the rows of its `chunk_table`."""
    tokens = np.asarray(tokens, dtype=np.int64)
    if len(tokens) < 2:  # no pair: no chunk (the table refuses such a document)
        check_max_seq_len(max_seq_len)
        return
    table = chunk_table(np.zeros(1, dtype=np.int64), np.array([len(tokens)]), max_seq_len)
    for index, (start, length) in enumerate(zip(table.start.tolist(), table.length.tolist(), strict=True)):
        yield Chunk(
            name=name,
            index=index,
            inputs=tokens[start : start + length],
            targets=tokens[start + 1 : start + length + 1],
            positions=np.arange(length, dtype=np.int64),
        )


@dataclass(frozen=True)
class ChunkTable:
    """All chunks of a split as flat arrays (no token is read): chunk i covers inputs
    tokens[start[i] : start[i] + length[i]] of document doc[i] in the split's token file.
    16 bytes per chunk: int64 start, int32 doc and length (int64 doc past 2^31 documents)."""

    doc: np.ndarray  # int32 (int64 past 2^31 documents) document index in the split's index
    start: np.ndarray  # int64 global token offset of the chunk's first input
    length: np.ndarray  # int32 number of inputs (= targets) in the chunk, 1..max_seq_len
    max_seq_len: int
    # A mixture's epoch (batching/mixture.py): the chunks it trains, already in their planned order, so an
    # online packer takes them as they are and no policy selects among them again.
    planned: bool = False

    def __len__(self) -> int:
        return len(self.length)

    @property
    def total_pairs(self) -> int:
        return int(self.length.sum(dtype=np.int64))


def chunk_table(offsets: np.ndarray, lengths: np.ndarray, max_seq_len: int) -> ChunkTable:
    """Vectorised `split_tokens` over a whole index: the same chunks, as (doc, start, length) arrays.

    Chunk j overall (the k-th of document d, whose first chunk is number first[d]) starts at
    offsets[d] + k L = (offsets[d] - first[d] L) + j L, and holds min(L, pairs[d] - k L) inputs:
    two repeats of per-document values plus j L, no per-chunk gather (with numba: one pass of
    packing_kernels.chunk_table_kernel, the same arrays without the temporaries)."""
    max_seq_len = check_max_seq_len(max_seq_len)
    offsets = np.asarray(offsets, dtype=np.int64)
    pairs = np.asarray(lengths, dtype=np.int64) - 1
    if len(pairs) and pairs.min() < 1:
        raise ValueError("every cached document must have at least one token before its EOS")
    counts = -(-pairs // max_seq_len)
    kernels = numba_kernels(len(pairs))
    if kernels is not None and len(pairs) < 2**31:  # no temporaries: 16 bytes per chunk, written once
        doc, start, length = kernels.chunk_table_kernel(offsets, pairs, max_seq_len, int(counts.sum()))
        return ChunkTable(doc=doc, start=start, length=length, max_seq_len=max_seq_len)
    first = prefix_sums(counts)
    step = np.arange(0, int(first[-1]) * max_seq_len, max_seq_len, dtype=np.int64)  # j L
    base = first[:-1] * max_seq_len
    start = np.repeat(offsets - base, counts)
    start += step
    length = np.repeat(pairs + base, counts)
    length -= step
    del step
    np.minimum(length, max_seq_len, out=length)
    index = np.int32 if len(pairs) < 2**31 else np.int64
    doc = np.repeat(np.arange(len(pairs), dtype=index), counts)
    return ChunkTable(doc=doc, start=start, length=length.astype(np.int32), max_seq_len=max_seq_len)
