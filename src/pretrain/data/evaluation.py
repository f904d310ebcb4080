"""Evaluation batches: every prediction pair of a split exactly once, whatever the policy.

Each chunk of each document (the same chunks training uses) is its own segment, so no token sees
another chunk or document; the policy only chooses how the chunks share a batch: `padded` puts each
chunk in its own padded row (nothing is truncated), the packed policies pack the chunks, in index
order, by best fit. The pairs and what each token attends to are therefore the same for every policy,
and so is the loss (up to float summation order).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from .batch import PackedBatch, gather_packed, gather_padded
from .packing import best_fit_buffered
from .policies import PolicySettings, split_chunks
from .tokens import TokenSplit


def evaluation_batches(settings: PolicySettings, split: TokenSplit) -> Iterator[PackedBatch]:
    """Batches of `settings.eval_batch_size` rows (padded) or packs holding every chunk of `split`."""
    table = split_chunks(split, settings.max_seq_len)
    if len(table) == 0:
        return
    rows = settings.eval_batch_size
    if settings.policy == "padded":
        for first in range(0, len(table), rows):
            chunk = slice(first, first + rows)
            lengths = table.length[chunk]
            width = settings.max_seq_len if settings.pad_to == "max" else int(lengths.max())
            yield gather_padded(split.tokens, table.start[chunk], lengths, width)
        return
    order, ptr = best_fit_buffered(table.length, settings.max_seq_len, settings.packing_buffer)
    for first in range(0, len(ptr) - 1, rows):
        packs = ptr[first : first + rows + 1]
        items = order[packs[0] : packs[-1]]
        sizes = np.diff(packs)
        yield gather_packed(
            split.tokens, table.start[items], table.length[items], sizes, settings.max_seq_len
        )


def document_bytes(split: TokenSplit, token_bytes: np.ndarray) -> int:
    """UTF-8 bytes of the split's documents' text (their tokens' bytes; EOS counts none)."""
    total, block = 0, 1 << 22
    for start in range(0, split.num_tokens, block):  # memory stays flat on a memory-mapped split
        total += int(token_bytes[np.asarray(split.tokens[start : start + block], dtype=np.int64)].sum())
    return total
