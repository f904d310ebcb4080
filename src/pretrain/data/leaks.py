"""Verbatim leaks: validation documents that share a run of `window` consecutive tokens (default 64)
with a train document. inspect-data counts them (`verbatim_leaks`); a cache built with
`split.decontaminate=true` drops them from validation (ingest/decontaminate.py).

Every `window`-token run inside a document's body (EOS excluded) is hashed with a 64-bit polynomial
rolling hash; the validation hashes are held sorted, and the train split is read block by block
(about a million tokens each), each block's hashes sorted and binary-searched against them. A hash
collision could only add a leak (never miss one); at 64 bits it is negligible at any corpus size.
"""

from __future__ import annotations

import numpy as np

from ..arrays import member_of_sorted, run_positions, sorted_unique
from .tokens import TokenSplit

LEAK_WINDOW = 64
_HASH_BASE = np.uint64(0x9E3779B97F4A7C15)
_BLOCK_TOKENS = 1 << 20


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: spreads token ids over 64 bits before the polynomial hash."""
    z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _document_blocks(split: TokenSplit, window: int, block_tokens: int):
    """Groups of consecutive documents with at least `window` body tokens (EOS excluded), about
    `block_tokens` tokens each: (document indices, body lengths)."""
    body = np.asarray(split.lengths, dtype=np.int64) - 1
    docs = np.flatnonzero(body >= window)
    if len(docs) == 0:
        return
    ends = np.cumsum(body[docs])
    cut = np.searchsorted(
        ends, np.arange(block_tokens, int(ends[-1]) + block_tokens, block_tokens), side="left"
    )
    first = 0
    for last in sorted_unique(np.minimum(cut + 1, len(docs))):
        if last > first:
            yield docs[first:last], body[docs[first:last]]
            first = last


def window_hashes(split: TokenSplit, window: int = LEAK_WINDOW, block_tokens: int | None = None):
    """Yield (hashes, document) per block: a 64-bit polynomial rolling hash of every `window`
    consecutive tokens that lie inside one document's body, and that document's index."""
    for docs, body in _document_blocks(split, window, block_tokens or _BLOCK_TOKENS):
        pos = run_positions(body)
        x = _mix64(np.asarray(split.tokens[np.repeat(split.offsets[docs], body) + pos]))
        n = len(x) - window + 1
        h = np.zeros(n, dtype=np.uint64)
        for j in range(window):  # Horner: h = sum_j x[i + j] * B^(window - 1 - j) mod 2^64
            h *= _HASH_BASE
            h += x[j : j + n]
        valid = pos[:n] + window <= np.repeat(body, body)[:n]
        yield h[valid], np.repeat(docs, body)[:n][valid]


def verbatim_leaks(train: TokenSplit, validation: TokenSplit, window: int = LEAK_WINDOW) -> int:
    """Validation documents that share at least one `window`-token sequence with a train document."""
    return len(leaked_documents(train, validation, window))


def leaked_documents(train: TokenSplit, validation: TokenSplit, window: int = LEAK_WINDOW) -> np.ndarray:
    """The indices (ascending) of the validation documents `verbatim_leaks` counts.
    Memory: the validation hashes plus one train block at a time."""
    parts = list(window_hashes(validation, window))
    if not parts:
        return np.zeros(0, dtype=np.int64)
    val_hash = np.concatenate([h for h, _ in parts])
    val_doc = np.concatenate([d for _, d in parts])
    # Sorts and binary searches (np.unique and np.isin hash: seconds at millions of values).
    unique = sorted_unique(val_hash)
    found = np.zeros(len(unique), dtype=bool)
    for train_hash, _ in window_hashes(train, window):
        found |= member_of_sorted(unique, np.sort(train_hash))
    leaked = member_of_sorted(val_hash, unique[found])
    return sorted_unique(val_doc[leaked])  # val_doc ascends: one pass
