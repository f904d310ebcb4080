"""Evaluation batches: every prediction pair of a split (or of its first documents) exactly once,
whatever the policy: `pretrain eval` scores a whole split, training's `val/loss` its first documents.

Each chunk of each document (the same chunks training uses) is its own segment, so no token sees
another chunk or document; the policy only chooses how the chunks share a batch (its
`evaluation_units` and `evaluation_batch`: a padded row per chunk, nothing truncated, or packs best fit
in index order). The pairs and what each token attends to are therefore the same for every policy,
and so is the loss (up to float summation order).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ...arrays import run_positions
from ..tokens import TokenSplit
from .batch import PackedBatch, gather_packed, trained_targets
from .chunking import ChunkTable
from .policies import PolicySettings, split_chunks


def evaluation_chunks(
    split: TokenSplit, max_seq_len: int, max_pairs: int | None = None, rank: int = 0, world_size: int = 1
) -> ChunkTable:
    """The chunks evaluation scores: every chunk of the split's first documents (index order) whose
    prediction pairs add up to at most `max_pairs` (at least one document; all when None), and of
    those this rank's share (every `world_size`-th chunk), so ranks score disjoint pairs."""
    table = split_chunks(split, max_seq_len)
    keep = np.arange(len(table))
    if max_pairs is not None and len(split):
        keep = keep[table.doc < scored_documents(split, max_pairs)]
    keep = keep[rank::world_size]
    return ChunkTable(
        doc=table.doc[keep], start=table.start[keep], length=table.length[keep], max_seq_len=max_seq_len
    )


def scored_documents(split: TokenSplit, max_pairs: int | None) -> int:
    """How many of the split's first documents evaluation scores under a budget of `max_pairs` pairs:
    those whose pairs add up to at most it (at least one; all when None). The floors of the scored
    pairs are those of these documents (data/measures/floors.py)."""
    if max_pairs is None or not len(split):
        return len(split)
    return max(1, int(np.searchsorted(np.cumsum(split.lengths - 1), max_pairs, side="right")))


def validation_pairs(settings: PolicySettings) -> int | None:
    """Training's validation budget: train.val_batches x train.eval_microbatch_tokens pairs (None: all)."""
    if settings.val_batches is None:
        return None
    return settings.val_batches * settings.eval_microbatch_tokens


def evaluation_units(settings: PolicySettings, table: ChunkTable) -> tuple[np.ndarray, np.ndarray]:
    """(chunk order, unit pointers) of `table`'s chunks as the policy batches validation chunks."""
    return settings.data_policy.evaluation_units(table, settings.eval_packing_buffer)


def evaluation_batch_count(settings: PolicySettings, table: ChunkTable) -> int:
    return -(-(len(evaluation_units(settings, table)[1]) - 1) // settings.eval_batch_size)


def evaluation_batches(
    settings: PolicySettings,
    split: TokenSplit,
    table: ChunkTable | None = None,
    units: tuple[np.ndarray, np.ndarray] | None = None,
) -> Iterator[PackedBatch]:
    """Batches of `settings.eval_batch_size` units (rows or packs) holding every chunk of `table`
    (default: all chunks of `split`), each chunk its own segment. `units`: `evaluation_units` of
    the same table, when the caller keeps them (training validates many times on the same pairs)."""
    table = split_chunks(split, settings.max_seq_len) if table is None else table
    policy = settings.data_policy
    for items, counts in _batch_chunks(settings, table, units):
        yield policy.evaluation_batch(split, table.start[items], table.length[items], counts)


def evaluation_positions(
    settings: PolicySettings,
    split: TokenSplit,
    table: ChunkTable,
    units: tuple[np.ndarray, np.ndarray] | None = None,
) -> Iterator[np.ndarray]:
    """Beside `evaluation_batches` (same arguments), per batch: the position in its document of each
    counted target's input token (0-based: a document's first pair is at 0), in the batch's row order
    (its chunks in order, each chunk's pairs in order)."""
    for items, _ in _batch_chunks(settings, table, units):
        first = (
            table.start[items] - split.offsets[table.doc[items]]
        )  # the chunk's first input in its document
        lengths = table.length[items].astype(np.int64)
        positions = np.repeat(first, lengths) + run_positions(lengths)
        if split.loss_mask is not None:  # task=sft: only the trained targets count
            index = np.repeat(table.start[items], lengths) + run_positions(lengths) + 1
            positions = positions[trained_targets(split.loss_mask, index)]
        yield positions


def _batch_chunks(
    settings: PolicySettings, table: ChunkTable, units: tuple[np.ndarray, np.ndarray] | None
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(chunks in batch order, chunks per unit) of each evaluation batch."""
    order, ptr = evaluation_units(settings, table) if units is None else units
    for first in range(0, len(ptr) - 1, settings.eval_batch_size):
        bounds = ptr[first : first + settings.eval_batch_size + 1]
        yield order[bounds[0] : bounds[-1]], np.diff(bounds)


def context_blocks(table: ChunkTable, context: int) -> ChunkTable:
    """`table`'s chunks cut into blocks of at most `context` inputs, each its own segment from
    position 0: the same prediction pairs, each target now predicted from the 1..`context` tokens of
    its own document just before it (`context` 1: from its previous token alone)."""
    if context < 1:
        raise ValueError(f"context must be >= 1, not {context}")
    counts = -(-table.length.astype(np.int64) // context)
    step = run_positions(counts) * context  # each block's first input within its chunk
    length = np.minimum(np.repeat(table.length.astype(np.int64), counts) - step, context)
    return ChunkTable(
        doc=np.repeat(table.doc, counts),
        start=np.repeat(table.start, counts) + step,
        length=length.astype(table.length.dtype),
        max_seq_len=min(context, table.max_seq_len),
    )


def block_batches(split: TokenSplit, table: ChunkTable, tokens_per_batch: int) -> Iterator[PackedBatch]:
    """`table`'s chunks in index order, as many per batch as fit in `tokens_per_batch` tokens (at least
    one), every chunk its own segment and pack: no policy's layout, so the same for every run."""
    ends = np.cumsum(table.length, dtype=np.int64)
    first = 0
    while first < len(table):
        taken = int(ends[first - 1]) if first else 0
        last = max(first + 1, int(np.searchsorted(ends, taken + tokens_per_batch, side="right")))
        lengths = table.length[first:last]
        yield gather_packed(
            split.tokens,
            table.start[first:last],
            lengths,
            np.ones(len(lengths)),
            table.max_seq_len,
            loss_mask=split.loss_mask,
        )
        first = last


def document_bytes(split: TokenSplit, token_bytes: np.ndarray, documents: int | None = None) -> int:
    """UTF-8 bytes of the text of the split's first `documents` documents (all: None), by their
    tokens' bytes (EOS counts none)."""
    count = len(split) if documents is None else min(documents, len(split))
    begin = int(split.offsets[0]) if count else 0
    end = int(split.offsets[count - 1] + split.lengths[count - 1]) if count else 0
    total, block = 0, 1 << 22
    for start in range(begin, end, block):  # memory stays flat on a memory-mapped split
        chunk = split.tokens[start : min(start + block, end)]
        total += int(token_bytes[np.asarray(chunk, dtype=np.int64)].sum())
    return total
