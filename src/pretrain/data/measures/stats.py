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
* the composition audit (data/measures/audit.py): `truncated_documents`, `dropped_pairs`,
  `fragmented_documents`, `units_vs_concat`, `attention_cost` and `attention_cost_padded`;
* `tokens_per_step`: real tokens per microbatch (mean over the epoch) x train.accumulation;
  `steps_per_epoch`: microbatches per epoch // train.accumulation;
* `verbatim_leaks`: validation documents sharing a 64-token window with a train document (data/leaks.py;
  0 in a cache built with `split.decontaminate=true`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..batching.evaluation import evaluation_batch_count, evaluation_chunks, validation_pairs
from ..batching.mixture import Mixture, mixture_statistics
from ..batching.policies import PolicySettings
from ..batching.samplers import Sampler, build_sampler
from ..leaks import leaked_documents
from ..tokens import TokenSplit
from .audit import audit_sampler


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
    epoch; the keys: the module docstring). The policy says what its batches cost (data/batching/policies/);
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
        "truncated_pairs": _truncated_pairs(sampler, train, plan),
        "cross_document_visible_fraction": policy.cross_document_visible_fraction(plan),
        **audit_sampler(sampler, train, plan),
        "tokens_per_step": plan.ordered_tokens / global_batches * accumulation if global_batches else 0.0,
        "steps_per_epoch": global_batches // accumulation,
        **(_audits(train, validation) if audits else {}),
        "settings": {"batch_size": settings.batch_size, "accumulation": accumulation, **own},
        "validation": _validation(settings, validation, validation_parts),
        **(_mixture(sampler, plan) if sampler.mixture_plan is not None else {}),
    }


def _truncated_pairs(sampler: Sampler, train: TokenSplit, plan) -> int:
    """Pairs of `train` no batch holds: truncated tails, or conversations' beyond their whole exchanges."""
    cuts = sampler.exchange_cuts
    return sampler.policy.truncated_pairs(train, plan) if cuts is None else cuts.dropped_pairs


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
