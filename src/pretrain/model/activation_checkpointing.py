"""train.activation_checkpointing: each transformer block keeps only its input for the backward and
recomputes its own activations there (torch.utils.checkpoint, non-reentrant), so activation memory
holds one block's worth at a time instead of every block's, for about one more forward of compute.

The checkpointed call replaces `forward` on each block instance: parameter names, state dicts and
checkpoints stay those of the plain model (a wrapper module would rename every parameter), and what
else wraps the block later (train.compile's halves, FSDP's hooks around `__call__`) runs inside or
around it unchanged. Dropout draws the same masks in the recomputation (the RNG state is replayed).
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from .architectures import blocks_of

MARK = "_recomputes_in_backward"  # set on each block this module wrapped


def _checkpointed(forward):
    def call(*args, **kwargs):
        if not torch.is_grad_enabled():  # validation and eval: nothing is kept, nothing to recompute
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return call


def apply_activation_checkpointing(model: torch.nn.Module) -> int:
    """Make every block of `model.blocks` recompute in the backward; returns how many blocks were
    wrapped (a second call wraps nothing again)."""
    wrapped = 0
    for block in blocks_of(model):
        if getattr(block, MARK, False):
            continue
        block.forward = _checkpointed(block.forward)
        setattr(block, MARK, True)
        wrapped += 1
    return wrapped


def checkpointed_blocks(model: torch.nn.Module) -> int:
    """How many of `model`'s blocks recompute in the backward."""
    return sum(bool(getattr(block, MARK, False)) for block in blocks_of(model))
