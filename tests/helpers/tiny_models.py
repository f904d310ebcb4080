"""Tiny GPT and Llama models and one packed batch of several documents, built the same way each time
(the model-transform tests: activation checkpointing, FSDP): `gpt()`, `llama()`, `batch()`, and
`loss_and_grads(model)` of that batch with a fixed dropout seed."""

from __future__ import annotations

import numpy as np
import torch

from pretrain.data import gather_packed
from pretrain.model import GPT, GPTConfig
from pretrain.model.llama import Llama, LlamaConfig

VOCAB = 211


def gpt(n_layer: int = 3, dropout: float = 0.0) -> GPT:
    torch.manual_seed(0)
    config = GPTConfig(
        vocab_size=VOCAB, n_layer=n_layer, n_head=2, d_model=32, max_seq_len=128, dropout=dropout
    )
    return GPT(config, attn="sdpa")


def llama(n_layer: int = 3) -> Llama:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB, n_layer=n_layer, n_head=4, n_kv_head=2, d_model=32, d_ff=64, max_seq_len=128
    )
    return Llama(config, attn="sdpa")


def batch(lengths=(50, 7, 1, 90, 33, 64), packs=(3, 3)):
    """Two packs of three documents each: the document mask matters."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, VOCAB, size=4000).astype(np.uint32)
    lengths = np.array(lengths)
    starts = np.concatenate([[0], np.cumsum(lengths + 5)])[:-1]
    return gather_packed(tokens, starts, lengths, list(packs), capacity=int(lengths.sum()))


def loss_and_grads(model, seed: int = 7) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)  # the dropout masks of the forward
    loss = model.loss(batch(), denominator=100.0)
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}
