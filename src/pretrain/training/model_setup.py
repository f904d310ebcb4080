"""What is done to the model once it sits on its device, before the first step (Lightning's
`configure_model`): activation checkpointing, then compile, then sharding, the order torchtitan uses
(each wraps the blocks the one before left)."""

from __future__ import annotations

import torch

from ..config import TrainConfig
from ..model.activation_checkpointing import apply_activation_checkpointing
from ..model.architectures import Decoder
from ..model.compile import MODEL, compile_blocks, compile_enabled, compile_model, resolve_compile_scope
from ..model.fused_loss import resolve_loss_kernel
from .fsdp import shard_model


def set_up_model(model: Decoder, train: TrainConfig, device: torch.device, mesh=None) -> dict:
    """Apply train.loss_kernel, train.activation_checkpointing, train.compile and (given trainer=fsdp's
    device `mesh`) sharding to `model` in place; return what was done, for run.json."""
    kernel, fell_back = resolve_loss_kernel(train.loss_kernel, device)
    model.loss_kernel = kernel  # GPT and Llama read it in loss()
    done: dict = {"loss_kernel": kernel}
    if fell_back:
        done["loss_kernel_fallback"] = fell_back
    if train.activation_checkpointing:
        done["activation_checkpointing"] = apply_activation_checkpointing(model)  # blocks wrapped
    if compile_enabled(train.compile, device):
        attention = str(getattr(model, "attn_backend", "sdpa"))
        scope = resolve_compile_scope(train.compile_scope, attention, device, sharded=mesh is not None)
        done["compile"] = compile_model(model) if scope == MODEL else compile_blocks(model)
        done["compile_scope"] = scope
    if mesh is not None:
        done["sharding"] = shard_model(model, mesh)
    return done
