"""The vocabulary padded inside the model (`model.vocab_multiple`): the embedding and head have
`padded_vocab_size` rows so that the head's matmul runs on a tile-friendly width (50,257 -> 50,304 at
64, as nanoGPT and llm.c pad GPT-2), while the model never predicts an extra id.

The extra rows are never looked up (no token has their ids), their logits are masked to -inf before
the softmax (loss.py), so their gradient is exactly 0 and, initialised at 0, they stay 0 through AdamW
(weight decay of 0 is 0). A checkpoint holds the padded tensors (its optimizer state has the same
shapes); what leaves the project (an export) or enters it from outside (`model.init_from`) has the real
`vocab_size` rows, cut or zero-padded here, at the state-dict boundary.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

VOCAB_TENSORS = ("wte.weight", "embed_tokens.weight", "lm_head.weight")
"""The state-dict entries with one row per token id (GPT-2's tied embedding, Llama's embedding and head)."""


def padded_vocab_size(vocab_size: int, multiple: int) -> int:
    """`vocab_size` rounded up to a multiple of `multiple` (1 = no padding)."""
    return -(-int(vocab_size) // int(multiple)) * int(multiple)


def real_vocab_rows(state: Mapping[str, torch.Tensor], vocab_size: int) -> dict[str, torch.Tensor]:
    """`state` with every per-token-id tensor cut to its first `vocab_size` rows (an export's shape)."""
    return {
        key: value[:vocab_size] if key in VOCAB_TENSORS and value.shape[0] > vocab_size else value
        for key, value in state.items()
    }


def padded_vocab_rows(state: Mapping[str, torch.Tensor], padded_size: int) -> dict[str, torch.Tensor]:
    """`state` with every per-token-id tensor given zero rows up to `padded_size` (a padded model's
    shape); the added rows are what a fresh padded model holds there."""
    out = {}
    for key, value in state.items():
        if key in VOCAB_TENSORS and value.shape[0] < padded_size:
            extra = value.new_zeros((padded_size - value.shape[0], *value.shape[1:]))
            value = torch.cat([value, extra])
        out[key] = value
    return out


def _grown(weight: torch.Tensor, rows: int) -> torch.nn.Parameter:
    extra = weight.new_zeros((rows - weight.shape[0], *weight.shape[1:]))
    return torch.nn.Parameter(torch.cat([weight.detach(), extra]))


def padded_embedding(vocab_size: int, rows: int, width: int) -> torch.nn.Embedding:
    """nn.Embedding with `rows` rows of which the first `vocab_size` are drawn as an unpadded one's
    (the same random numbers consumed, so every later parameter's initialisation is unchanged too);
    the rest are 0."""
    embedding = torch.nn.Embedding(vocab_size, width)
    if rows > vocab_size:
        embedding.weight = _grown(embedding.weight, rows)
        embedding.num_embeddings = rows
    return embedding


def padded_head(vocab_size: int, rows: int, width: int) -> torch.nn.Linear:
    """A bias-free (rows, width) head drawn as padded_embedding is."""
    head = torch.nn.Linear(width, vocab_size, bias=False)
    if rows > vocab_size:
        head.weight = _grown(head.weight, rows)
        head.out_features = rows
    return head
