"""Context use: the validation loss of the same targets when each sees only a little of its document.

Composition (packing, masking, truncation) can only change what a model does with its context. A model
that predicts as well from the previous token alone as from the whole chunk has nothing for
composition to act on, so a study must first show that its models use context. For each k in
`eval.context`, every validation chunk is cut into blocks of k inputs, each its own segment from
position 0 (data/batching/evaluation.py's `context_blocks`): the same prediction pairs, each target predicted
from the 1..k tokens of its own document just before it (k=1: from its previous token alone; larger k:
k/2 on average). `context_gain` is the loss at k=1 minus the loss with the whole chunk (val/loss):
above 0, the model uses context.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from ..data.batching.chunking import ChunkTable
from ..data.batching.evaluation import block_batches, context_blocks
from ..data.tokens import TokenSplit
from ..model import Decoder
from .scoring import ScoreSums, ScoringProgress, score_batches

FULL = "full"  # the key of the whole chunk's loss (val/loss itself)


def context_lengths(contexts: Iterable[int], max_seq_len: int) -> list[int]:
    """The distinct context lengths that differ from the whole chunk (k < max_seq_len), ascending."""
    return sorted({int(k) for k in contexts if 0 < int(k) < max_seq_len})


def context_sums(
    model: Decoder,
    sets: Sequence[tuple[TokenSplit, ChunkTable]],
    context: int,
    tokens_per_batch: int,
    device: torch.device,
    progress: ScoringProgress | None = None,
) -> ScoreSums:
    """The summed loss and target count of every chunk of `sets` (split, chunks) at `context`."""
    total: ScoreSums | None = None
    for split, chunks in sets:
        blocks = context_blocks(chunks, context)
        sums = score_batches(model, block_batches(split, blocks, tokens_per_batch), device, progress)
        total = sums if total is None else ScoreSums.from_stacked(total.stacked() + sums.stacked())
    if total is None:
        raise ValueError("context_sums needs at least one validation set")
    return total


def context_metrics(losses: dict[int, float], full: float, prefix: str = "") -> dict[str, float]:
    """`<prefix>loss_by_context/<k>` for each k, `.../full` (the whole chunk's loss) and
    `<prefix>context_gain` (k=1 minus full) when k=1 was scored."""
    out = {f"{prefix}loss_by_context/{k}": loss for k, loss in sorted(losses.items())}
    out[f"{prefix}loss_by_context/{FULL}"] = full
    if 1 in losses:
        out[f"{prefix}context_gain"] = losses[1] - full
    return out
