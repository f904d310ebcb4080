"""One optimizer update over several microbatches, weighted by tokens, not by microbatches.

loss = sum of token cross-entropy over the whole update / real targets in the whole update, counted
across all accumulation microbatches and all ranks. Each microbatch's backward uses that global
denominator, so the accumulated gradient is exactly the gradient of the update's loss whatever the
split into microbatches. DDP averages gradients over ranks; multiplying each rank's loss by the
world size turns that average back into the sum the global denominator expects.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ..data.batching.batch import PackedBatch
from ..model import Decoder


@dataclass(frozen=True)
class UpdateResult:
    loss: float  # token-weighted loss of the whole update (all ranks)
    num_targets: int  # real targets in the whole update (all ranks)
    real_tokens: int  # real tokens in the whole update (all ranks)
    computed_tokens: int  # rows the model computed, pads included (all ranks)
    capacity_slots: int  # packs (or padded rows) x their capacity (all ranks)


def _identity_sum(values: torch.Tensor) -> torch.Tensor:
    return values


def run_update(
    model: Decoder,
    microbatches: Sequence[PackedBatch],
    *,
    backward: Callable[[torch.Tensor], None] = torch.Tensor.backward,
    all_reduce_sum: Callable[[torch.Tensor], torch.Tensor] = _identity_sum,
    world_size: int = 1,
) -> UpdateResult:
    """Forward and backward every microbatch of one update (the caller steps the optimizer).

    `all_reduce_sum` sums a float64 tensor over ranks (identity on one process); `backward` is
    Lightning's `manual_backward` in training so precision and strategy hooks apply.
    """
    if not microbatches:
        raise ValueError("an update needs at least one microbatch")
    device = microbatches[0].input_ids.device
    local = torch.tensor(
        [
            sum(mb.num_targets for mb in microbatches),
            sum(mb.real_tokens for mb in microbatches),
            sum(mb.num_tokens for mb in microbatches),
            sum(len(mb.pack_lengths) * mb.capacity for mb in microbatches),
        ],
        dtype=torch.float64,
        device=device,
    )
    totals = all_reduce_sum(local.clone())
    num_targets = int(totals[0].item())
    if num_targets == 0:
        # Only task=sft's loss mask leaves an update nothing to train (every target a prompt token):
        # every rank sees the same total, so all skip alike; no gradient, the optimizer steps over none.
        if int(totals[1].item()) == 0:
            raise ValueError("an update without a single real token cannot be normalised")
        return UpdateResult(
            loss=float("nan"),
            num_targets=0,
            real_tokens=int(totals[1].item()),
            computed_tokens=int(totals[2].item()),
            capacity_slots=int(totals[3].item()),
        )
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    for mb in microbatches:
        loss = model.loss(mb, denominator=num_targets)
        backward(loss * world_size)
        loss_sum += loss.detach().double()
    loss_total = all_reduce_sum(loss_sum)
    return UpdateResult(
        loss=float(loss_total.item()),
        num_targets=num_targets,
        real_tokens=int(totals[1].item()),
        computed_tokens=int(totals[2].item()),
        capacity_slots=int(totals[3].item()),
    )
