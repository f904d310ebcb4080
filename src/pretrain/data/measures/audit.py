"""The composition audit: what a data policy does to the corpus, from the split's index and the
policy's epoch layout alone (no token is read). `pretrain inspect-data` reports it; a training run
can log the same dict (`composition_audit`) and, per batch, `batch_attention_cost`.

* `truncated_documents`: fraction of documents that lose prediction pairs (data.long_docs=truncate);
* `dropped_pairs`: fraction of the split's prediction pairs no epoch ever trains (Ding et al. 2024,
  "Fewer Truncations Improve Language Modeling": their truncation metric);
* `fragmented_documents`: fraction of documents whose pairs land in more than one unit (their
  chunks in different rows or packs, or a document cut by concat windows);
* `units_vs_concat`: units (rows or packs) per epoch / the concat windows of the whole token stream at
  the same max_seq_len (Ding et al.'s Table 2 compactness: 1.0 is concat's count);
* `attention_cost`: sum over the attention segments the model computes (cu_seqlens: a chunk, a
  pack without the document mask, a padded row at its padded width) of length squared, per real
  token: what attention FLOPs scale with; `attention_cost_padded`: the same units computed as dense
  rows of max_seq_len (units x max_seq_len^2 / real tokens), the padded equivalent beside it.

A task=sft split (a loss mask) adds `trained_targets` and `masked_targets` (targets of the epoch's
units that train, and those its loss mask leaves out), `trained_fraction` (trained / all targets) and
`padding_waste_trained` (1 - trained targets / computed rows: padding and masked-out targets both
waste compute); with data.long_docs=truncate, `dropped_conversations` (first reply does not fit), and
`truncated_documents` / `dropped_pairs` count the conversations cut at whole exchanges.

All of them are of one epoch's layout (epoch 0; a policy that packs anew each epoch differs slightly
per epoch), before the tail that `Sampler.epoch_accounting` drops to keep ranks equal.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ...arrays import sorted_unique
from ..batching.policies import DataPolicy, EpochPlan, PolicySettings

if TYPE_CHECKING:
    from ..batching.batch import PackedBatch
    from ..batching.samplers import Sampler
    from ..tokens import TokenSplit

AUDIT_KEYS = (
    "truncated_documents",
    "dropped_pairs",
    "fragmented_documents",
    "units_vs_concat",
    "attention_cost",
    "attention_cost_padded",
)


def attention_cost(segment_lengths: np.ndarray, real_tokens: int) -> float:
    """Sum of squared attention-segment lengths per real token (0.0 without real tokens)."""
    lengths = np.asarray(segment_lengths, dtype=np.int64)
    return float(np.square(lengths).sum(dtype=np.int64) / real_tokens) if real_tokens else 0.0


def batch_attention_cost(batch: PackedBatch) -> float:
    """`attention_cost` of one batch, from its cu_seqlens (pads of a padded row included, as computed)
    over its real tokens: the per-step `train/attention_cost`."""
    return attention_cost(np.diff(batch.cu_seqlens.numpy().astype(np.int64)), batch.real_tokens)


def concat_window_count(split: TokenSplit, max_seq_len: int) -> int:
    """Windows of max_seq_len the split's whole token stream makes (its N - 1 inputs, N tokens)."""
    return -(-max(split.num_tokens - 1, 0) // max_seq_len)


def fragmented_documents(plan: EpochPlan, documents: int) -> float:
    """Fraction of documents whose prediction pairs lie in more than one unit. An item holds pairs of
    its document unless it is only a concat piece's EOS input (whose target is the next document's).

    Linear passes (np.unique over (document, unit) keys took seconds at 10M chunks): where the
    table's rows ascend by document (a split's chunks, concat's pieces) and no row is laid out twice,
    each row's unit is scattered into row order and a document is fragmented when two of its
    consecutive rows lie in different units; otherwise by each document's first and last unit."""
    layout = plan.layout
    if not documents or not len(layout):
        return 0.0
    kind = np.int32 if len(layout) < 2**31 - 1 else np.int64  # half the memory traffic
    unit = np.repeat(np.arange(len(layout), dtype=kind), np.diff(layout.ptr))
    table = layout.table
    holds = None  # every chunk holds a pair; a concat piece may hold only its EOS input
    if layout.ends_document is not None:
        holds = layout.length.astype(np.int64) - layout.ends_document > 0
    doc = np.asarray(table.doc)
    if len(doc) > 1 and not bool(np.all(doc[1:] >= doc[:-1])):  # e.g. a mixture's planned epoch
        return _fragmented_by_extremes(layout.doc, unit, holds, documents)
    row_unit: np.ndarray  # each table row's unit, -1 where the row is not laid out
    if layout.rows is None:  # the items are the table's rows in order
        row_unit = unit if holds is None else np.where(holds, unit, -1)
        every_row = holds is None
    else:
        rows, laid = layout.rows, unit
        if holds is not None:
            rows, laid = rows[holds], unit[holds]
        row_unit = np.full(len(table), -1, dtype=kind)
        row_unit[rows] = laid
        laid_out = np.count_nonzero(row_unit >= 0)
        if laid_out != len(rows):  # a row laid out twice (a mixture's repeats)
            return _fragmented_by_extremes(layout.doc, unit, holds, documents)
        every_row = laid_out == len(table)
    if not every_row:  # only the rows laid out (data.long_docs=truncate: first chunks only)
        present = np.greater_equal(row_unit, 0)
        doc, row_unit = doc[present], row_unit[present]
    cut = (doc[1:] == doc[:-1]) & (row_unit[1:] != row_unit[:-1])
    return float(len(sorted_unique(doc[1:][cut])) / documents)


def _fragmented_by_extremes(
    doc: np.ndarray, unit: np.ndarray, holds: np.ndarray | None, documents: int
) -> float:
    """`fragmented_documents` for any item order: a document's first and last unit differ."""
    if holds is not None:
        doc, unit = doc[holds], unit[holds]
    first = np.full(documents, np.iinfo(np.int64).max, dtype=np.int64)
    last = np.full(documents, -1, dtype=np.int64)
    np.minimum.at(first, doc, unit)
    np.maximum.at(last, doc, unit)
    return float(np.count_nonzero(last > first) / documents)


def audit_plan(policy: DataPolicy, split: TokenSplit, plan: EpochPlan) -> dict:
    """The composition audit (module doc) of `policy`'s epoch `plan` over `split`."""
    documents = len(split)
    pairs = np.asarray(split.lengths, dtype=np.int64) - 1
    long = int(np.count_nonzero(pairs > policy.max_seq_len))
    real = plan.real_tokens
    windows = concat_window_count(split, policy.max_seq_len)
    return {
        "truncated_documents": long / documents if documents and policy.truncates else 0.0,
        "dropped_pairs": policy.truncated_pairs(split, plan) / split.num_pairs if split.num_pairs else 0.0,
        "fragmented_documents": fragmented_documents(plan, documents),
        "units_vs_concat": len(plan.layout) / windows if windows else 0.0,
        "attention_cost": attention_cost(policy.attention_segments(plan), real),
        "attention_cost_padded": len(plan.layout) * policy.max_seq_len**2 / real if real else 0.0,
    }


def composition_audit(
    settings: PolicySettings,
    split: TokenSplit,
    *,
    packs_dir: Path | None = None,
    sampler: Sampler | None = None,
) -> dict:
    """The composition audit of `split` (a train split) under the policy of `settings`: a dict with
    `AUDIT_KEYS` plus `cross_document_visible_fraction` (share of real tokens that attend to another
    document), all plain floats (JSON, W&B config), and `positions`: how the batches number positions
    (data.positions: restart or continue). `sampler`: a train sampler of the same settings
    and split whose epoch-0 plan is reused (a running job has one); else one is built (rank 0)."""
    if sampler is None:
        from ..batching.samplers import build_sampler

        sampler = build_sampler(settings, split, packs_dir=packs_dir)
    plan = sampler.plan(0)
    return {
        **audit_sampler(sampler, split, plan),
        "cross_document_visible_fraction": sampler.policy.cross_document_visible_fraction(plan),
        "positions": sampler.policy.position_numbering(),
    }


TARGET_BLOCK = 1 << 22  # targets gathered at once when counting trained ones (4M bytes of mask)


def trained_target_count(split: TokenSplit, starts: np.ndarray, lengths: np.ndarray) -> int:
    """Targets of these items (inputs tokens[start : start + length]) whose loss-mask byte says they
    train, counted block by block (no array the size of the epoch)."""
    from ...arrays import run_positions
    from ..batching.batch import trained_targets

    assert split.loss_mask is not None
    ends = np.cumsum(lengths, dtype=np.int64)
    total, first = 0, 0
    while first < len(lengths):
        taken = int(ends[first - 1]) if first else 0
        last = max(first + 1, int(np.searchsorted(ends, taken + TARGET_BLOCK, side="right")))
        block = np.asarray(lengths[first:last], dtype=np.int64)
        index = np.repeat(np.asarray(starts[first:last], dtype=np.int64), block) + run_positions(block) + 1
        total += int(trained_targets(split.loss_mask, index).sum())
        first = last
    return total


def loss_mask_audit(policy: DataPolicy, split: TokenSplit, plan: EpochPlan) -> dict:
    """The task=sft keys (module doc) of `policy`'s epoch `plan` over a split with a loss mask."""
    layout = plan.layout
    starts, lengths = layout.start, layout.length
    trained = trained_target_count(split, starts, lengths)
    if layout.ends_document is not None and layout.ends_document.any():  # concat: never trained there
        ends = layout.ends_document
        trained -= trained_target_count(split, starts[ends] + lengths[ends] - 1, np.ones(int(ends.sum())))
    targets = int(np.asarray(lengths, dtype=np.int64).sum())
    computed = policy.computed_rows(plan)
    return {
        "trained_targets": trained,
        "masked_targets": targets - trained,
        "trained_fraction": trained / targets if targets else 0.0,
        "padding_waste_trained": 1.0 - trained / computed if computed else 0.0,
    }


def audit_sampler(sampler: Sampler, split: TokenSplit, plan: EpochPlan) -> dict:
    """`audit_plan` over what the sampler lays out (a conversation split cut at whole exchanges is a
    view of `split`), with the truncation counted against the whole `split`, and for a split with a
    loss mask its keys (`loss_mask_audit`)."""
    out = audit_plan(sampler.policy, sampler.split, plan)
    cuts = sampler.exchange_cuts
    if cuts is not None:
        out["truncated_documents"] = (cuts.cut + cuts.dropped) / len(split) if len(split) else 0.0
        out["dropped_pairs"] = cuts.dropped_pairs / split.num_pairs if split.num_pairs else 0.0
        out["dropped_conversations"] = cuts.dropped
    if sampler.split.loss_mask is not None:
        out.update(loss_mask_audit(sampler.policy, sampler.split, plan))
    return out
