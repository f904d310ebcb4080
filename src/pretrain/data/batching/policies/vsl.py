"""`data=vsl`: variable sequence length by dataset decomposition (Pouransari et al. 2024, "Dataset
Decomposition: Faster LLM Training with Variable Sequence Length Curriculum"; OLMo-core's VSL datasets).

Every chunk (at most max_seq_len inputs, a power of two here) is cut into pieces whose lengths are the
binary decomposition of its pair count, longest first: 13 pairs -> 8, 4, 1. Each piece is an isolated
sequence with its lookahead target, so every pair is still trained once and nothing is padded. Pieces
go to buckets by length (1, 2, 4, ..., max_seq_len).

A unit is max_seq_len tokens of one bucket: max_seq_len / 2^k pieces of length 2^k, each its own
cu_seqlens segment; a microbatch of `batch_size` units therefore holds the same tokens at every length
(train.microbatch_tokens = batch_size x max_seq_len; rows = tokens / length). Each epoch the pieces of
a bucket are shuffled and grouped into units; a bucket's last, partial unit is never served. The unit
order (`unit_order`) is a sequence of whole optimizer updates, each update's `update_units` units
(batch_size x train.accumulation x world size) from one bucket, so every rank's microbatch at a step
has the same length and every update the same token count; the bucket of each update is chosen by
`data.curriculum` (curriculum.py). A bucket's units that do not fill a last update are the epoch's
dropped tail (`Sampler.epoch_accounting`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ....errors import ConfigError
from ..chunking import ChunkTable
from ..packing import best_fit_buffered
from .base import DataConfig, DataPolicy, is_set, positive_int
from .curriculum import Curriculum, schedule
from .layout import Layout, index_dtype, shuffled

if TYPE_CHECKING:
    from ...tokens import TokenSplit


def is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def bucket_count(max_seq_len: int) -> int:
    """Possible piece lengths 1, 2, ..., max_seq_len."""
    return int(max_seq_len).bit_length()


@dataclass(frozen=True)
class Pieces:
    """The pieces of a split's trained chunks, bucket after bucket (shortest first), each bucket in
    chunk order: bucket k holds pieces first[k] : first[k + 1] of `table`, all of length 2^k."""

    table: ChunkTable
    first: np.ndarray  # (buckets + 1,) int64

    def bucket(self, k: int) -> tuple[int, int]:
        return int(self.first[k]), int(self.first[k + 1])


def decompose(table: ChunkTable, chunks: np.ndarray | None = None) -> Pieces:
    """Cut `chunks` (ids of `table`; None: every chunk) into power-of-two pieces: chunk of length n
    gives a piece of 2^k for every bit k of n, the longest first (at offset n with bits <= k cleared)."""
    max_seq_len = table.max_seq_len
    if not is_power_of_two(max_seq_len):  # VslConfig refuses it for the user: here a caller's bug
        raise ValueError(f"decompose needs a power-of-two max_seq_len, got {max_seq_len}")
    doc, start, length = table.doc, table.start, table.length
    if chunks is not None:
        doc, start, length = doc[chunks], start[chunks], length[chunks]
    buckets = bucket_count(max_seq_len)
    sizes = [np.count_nonzero(length & (1 << k)) for k in range(buckets)]
    bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    # Filled in place, bucket by bucket: no list of parts to concatenate (half the peak at 10B tokens).
    piece_doc = np.empty(int(bounds[-1]), dtype=doc.dtype)
    piece_start = np.empty(int(bounds[-1]), dtype=np.int64)
    for k in range(buckets):
        has = np.flatnonzero(length & (1 << k))
        piece_doc[bounds[k] : bounds[k + 1]] = doc[has]
        piece_start[bounds[k] : bounds[k + 1]] = start[has] + ((length[has] >> (k + 1)) << (k + 1))
    pieces = ChunkTable(
        doc=piece_doc,
        start=piece_start,
        length=np.repeat((1 << np.arange(buckets)).astype(np.int32), sizes),
        max_seq_len=max_seq_len,
    )
    return Pieces(pieces, bounds)


@dataclass
class VslConfig(DataConfig):
    curriculum: Curriculum = Curriculum.natural
    """vsl: bucket of each update: natural (by tokens left), grow_p2 (short to long per cycle), uniform"""
    curriculum_cycles: int = 8
    """vsl, curriculum=grow_p2: cycles of short-to-long growth per epoch"""

    for_policy = "vsl"

    def __post_init__(self) -> None:
        super().__post_init__()
        if is_set(self.max_seq_len) and not is_power_of_two(int(self.max_seq_len)):
            nearest = 1 << (int(self.max_seq_len) - 1).bit_length()
            raise ConfigError(
                f"data=vsl cuts documents into power-of-two pieces: data.max_seq_len must be a power of "
                f"two, got {self.max_seq_len}; set e.g. data.max_seq_len={min(nearest, 4096)}"
            )
        if is_set(self.curriculum_cycles):
            positive_int(self.curriculum_cycles, "data.curriculum_cycles")

    def microbatch_units(self, batch_size: int | None, microbatch_tokens: int | None) -> int:
        """A unit holds max_seq_len tokens, so microbatch_tokens must be a whole number of them:
        every update then has the same token count whatever its bucket."""
        length = int(self.max_seq_len)
        if microbatch_tokens is not None and int(microbatch_tokens) % length:
            fit = max(1, int(microbatch_tokens) // length) * length
            raise ConfigError(
                f"data=vsl serves the same tokens at every sequence length: train.microbatch_tokens="
                f"{microbatch_tokens} must be a multiple of data.max_seq_len={length}; set e.g. "
                f"train.microbatch_tokens={fit}"
            )
        return super().microbatch_units(batch_size, microbatch_tokens)


class VslPolicy(DataPolicy):
    name = "vsl"
    test_variants = {
        "vsl": (),
        "vsl-grow_p2-truncate": (
            "data.curriculum=grow_p2",
            "data.curriculum_cycles=2",
            "data.long_docs=truncate",
        ),
        "vsl-uniform-accumulation": ("data.curriculum=uniform", "train.accumulation=2"),
    }
    config_class = VslConfig
    config: VslConfig
    unit_name = "units"
    items = "pieces"
    fixed_layout = False  # the pieces of a bucket are grouped anew every epoch
    whole_updates = True

    def __init__(self, config: DataConfig) -> None:
        super().__init__(config)
        self._pieces: tuple[ChunkTable, Pieces] | None = None  # the decomposition of the last table

    def pieces(self, table: ChunkTable) -> Pieces:
        """The decomposition of `table`'s trained chunks (the same every epoch: computed once)."""
        if self._pieces is None or self._pieces[0] is not table:
            self._pieces = (table, decompose(table, self.trained_chunks(table)))
        return self._pieces[1]

    def layout(
        self, split: TokenSplit, table: ChunkTable, rng: np.random.Generator, packs_dir: Path | None
    ) -> Layout:
        """Each bucket's pieces shuffled and grouped max_seq_len / 2^k to a unit, bucket after bucket
        (shortest first); a bucket's last unit may be partial (`unit_order` never serves it)."""
        pieces = self.pieces(table)
        dtype = index_dtype(len(pieces.table))  # int32 below 2^31 pieces: 4 bytes per piece
        rows, ptr = [], [np.zeros(1, dtype=np.int64)]
        for k in range(len(pieces.first) - 1):
            first, stop = pieces.bucket(k)
            rows.append((shuffled(rng, stop - first) + dtype(first)).astype(dtype, copy=False))
            per_unit = self.max_seq_len >> k
            ends = np.append(np.arange(per_unit, stop - first, per_unit), stop - first)
            ptr.append(first + ends[ends > 0])  # the bucket's pieces are items first : stop
        return Layout(table=pieces.table, rows=np.concatenate(rows), ptr=np.concatenate(ptr))

    def unit_order(self, layout: Layout, rng: np.random.Generator, update_units: int) -> np.ndarray | None:
        """Whole updates of `update_units` units of one bucket each, in the curriculum's bucket order;
        units that make no whole update (a partial unit, a bucket's last units) are left out."""
        counts = np.diff(layout.ptr)
        lengths = layout.lengths(layout.ptr[:-1][counts > 0])
        unit_bucket = np.full(len(layout), -1, dtype=np.int64)
        bucket = np.log2(lengths).astype(np.int64)
        full = counts[counts > 0] == self.max_seq_len >> bucket
        unit_bucket[np.flatnonzero(counts > 0)[full]] = bucket[full]
        buckets = bucket_count(self.max_seq_len)
        # Full units of a bucket are consecutive in the layout (it groups bucket after bucket).
        first_unit = np.array([np.argmax(unit_bucket == k) for k in range(buckets)], dtype=np.int64)
        blocks = np.bincount(unit_bucket[unit_bucket >= 0], minlength=buckets) // update_units
        curriculum = schedule(self.config.curriculum, blocks, rng.spawn(1)[0], self.config.curriculum_cycles)
        # The j-th update drawn from bucket b takes that bucket's j-th block of units.
        block_index = np.empty(len(curriculum), dtype=np.int64)
        for k in range(buckets):
            mine = curriculum == k
            block_index[mine] = np.arange(np.count_nonzero(mine))
        heads = first_unit[curriculum] + block_index * update_units
        order = (heads[:, None] + np.arange(update_units, dtype=np.int64)[None, :]).reshape(-1)
        return order.astype(index_dtype(len(layout)))

    def resume_key(self) -> dict:
        key = {**super().resume_key(), "data.curriculum": str(self.config.curriculum)}
        if Curriculum(self.config.curriculum) == Curriculum.grow_p2:
            key["data.curriculum_cycles"] = int(self.config.curriculum_cycles)
        return key

    def evaluation_units(self, table: ChunkTable, buffer: int) -> tuple[np.ndarray, np.ndarray]:
        """Validation chunks best fit in index order, each its own segment (as the packing policies)."""
        return best_fit_buffered(table.length, self.max_seq_len, buffer)
