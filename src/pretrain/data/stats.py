"""`pretrain inspect-data`: statistics of a cache under the chosen policy (report/inspect_table.py
renders them).

All numbers come from the split's index and the policy's layout (epoch 0 for policies that change per epoch,
one rank); only the leak check reads tokens, block by block. The keys of `inspect_split`:


* `chunks` / `chunk_lengths`: the sequences attention runs over (`segment_lengths`);
* `packs`: padded rows or packs; `pack_utilization`: real tokens / `slots` (packs x max_seq_len;
  a padded row counts its padded width, so it is 1 - padding_waste there);
* `padding_waste`: 1 - real tokens / `computed_rows`;
* `truncated_pairs`: pairs no batch ever holds (the document tails `data.long_docs=truncate` drops);
* `cross_document_visible_fraction`: share of real tokens that attend to another document;
* the composition audit (data/audit.py): `truncated_documents`, `dropped_pairs`,
  `fragmented_documents`, `units_vs_concat`, `attention_cost` and `attention_cost_padded`;
* `tokens_per_step`: real tokens per microbatch (mean over the epoch) x train.accumulation;
  `steps_per_epoch`: microbatches per epoch // train.accumulation;
* `verbatim_leaks`: validation documents sharing a 64-token window with a train document.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..arrays import member_of_sorted, run_positions, sorted_unique
from .audit import audit_plan
from .evaluation import evaluation_batch_count, evaluation_chunks, validation_pairs
from .mixture import Mixture, mixture_statistics
from .policies import PolicySettings
from .samplers import Sampler, build_sampler
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


def _length_summary(lengths: np.ndarray) -> dict:
    if len(lengths) == 0:
        return {"min": 0, "median": 0.0, "p90": 0.0, "max": 0}
    return {
        "min": int(lengths.min()),
        "median": float(np.median(lengths)),
        "p90": float(np.percentile(lengths, 90)),
        "max": int(lengths.max()),
    }


def _audits(train: TokenSplit, validation: TokenSplit) -> dict:
    """The costly checks: ids in both splits (every id) and verbatim leaks (every token)."""
    overlap = len(set(train.ids) & set(validation.ids)) if train.ids and validation.ids else 0
    leaked = leaked_documents(train, validation)
    ids = [validation.ids[i] for i in leaked] if validation.ids else [str(i) for i in leaked]
    return {"train_validation_overlap": overlap, "verbatim_leaks": len(leaked), "verbatim_leak_ids": ids}


def inspect_split(
    settings: PolicySettings,
    train: TokenSplit,
    validation: TokenSplit,
    packs_dir: Path | None = None,
    audits: bool = True,
    sampler: Sampler | None = None,
    mixture: Mixture | None = None,
    validation_parts: Sequence[TokenSplit] | None = None,
) -> dict:
    """Statistics of the train split under the policy of `settings` (the inspect-data keys of the
    README), for one rank and epoch 0 (a policy that packs anew each epoch differs slightly per
    epoch; the keys: the module docstring). The policy says what its batches cost (data/policies/);
    this module only adds them up.
    Also `settings` (the policy's knobs) and `validation` (its size, and the batches and pairs that
    training's val/loss scores: the same for every policy).
    `audits=False` leaves out the two costly checks, `train_validation_overlap` (every id) and
    `verbatim_leaks` with `verbatim_leak_ids` (every token), keys and all: what a training run logs
    at its start.
    With a `mixture` (`train` and `validation` are then its components' splits read as one), the
    statistics are those of the mixed epoch, and `mixture.<name>` holds each component's
    (`mixture.mixture_statistics`); `validation_parts` are the components' validation splits, each
    scored on its own as training's val/loss/<name> does."""
    # A running job passes its own train sampler: its epoch-0 plan is already built (at 10B tokens a
    # plan packed online takes seconds), so the statistics cost no second one.
    if sampler is None:
        sampler = build_sampler(settings, train, packs_dir=packs_dir, mixture=mixture)
    plan, policy = sampler.plan(0), sampler.policy
    real = plan.real_tokens
    segments = policy.segment_lengths(plan)
    computed = policy.computed_rows(plan)
    slots = policy.slots(plan)
    global_batches = plan.global_batches
    accumulation = settings.accumulation
    own = {"long_docs": str(settings.data.long_docs)}  # named always, also where it is the default
    own.update({key.split(".")[-1]: value for key, value in sampler.policy_settings().items()})
    return {
        "policy": str(settings.policy),
        "max_seq_len": settings.max_seq_len,
        "documents": len(train),
        "raw_tokens": train.num_tokens,
        "prediction_pairs": train.num_pairs,
        "chunks": len(segments),
        "chunk_lengths": _length_summary(segments),
        "packs": len(plan.layout),
        "pack_utilization": real / slots if slots else 0.0,
        "padding_waste": 1.0 - real / computed if computed else 0.0,
        "truncated_pairs": policy.truncated_pairs(train, plan),
        "cross_document_visible_fraction": policy.cross_document_visible_fraction(plan),
        **audit_plan(policy, train, plan),
        "tokens_per_step": plan.ordered_tokens / global_batches * accumulation if global_batches else 0.0,
        "steps_per_epoch": global_batches // accumulation,
        **(_audits(train, validation) if audits else {}),
        "settings": {"batch_size": settings.batch_size, "accumulation": accumulation, **own},
        "validation": _validation(settings, validation, validation_parts),
        **(_mixture(sampler, plan) if sampler.mixture_plan is not None else {}),
    }


def _validation(settings: PolicySettings, validation: TokenSplit, parts: Sequence[TokenSplit] | None) -> dict:
    """The validation split's size, and the batches and pairs training's val/loss scores (one rank)."""
    scored = [
        evaluation_chunks(part, settings.max_seq_len, validation_pairs(settings))
        for part in (parts or [validation])
    ]
    return {
        "documents": len(validation),
        "raw_tokens": validation.num_tokens,
        "prediction_pairs": validation.num_pairs,
        "batches": sum(evaluation_batch_count(settings, s) for s in scored),  # val/loss's, one rank
        "scored_pairs": sum(s.total_pairs for s in scored),
    }


def _mixture(sampler: Sampler, plan) -> dict:
    assert sampler.mixture_plan is not None
    return {"mixture": mixture_statistics(sampler.mixture_plan, plan, sampler.update_units)}
