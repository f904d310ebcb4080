"""GPT-2 shapes. The named sizes (tiny, gpt2-small, gpt2-medium) are conf/model/*.yaml; the run's
entry builds a GPTConfig from the typed `model` group with `from_settings`.

The user-facing range checks are the schema's (pretrain.config.ModelConfig); here the same invariants
are asserted as programming errors (ValueError), for a GPTConfig built in code or from a checkpoint."""

from __future__ import annotations

from dataclasses import dataclass, fields

from ..data.gpt2 import GPT2_VOCAB_SIZE
from .vocabulary import padded_vocab_size


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int
    n_layer: int
    n_head: int
    d_model: int
    max_seq_len: int  # learned positions (GPT-2's n_positions); follows data.max_seq_len
    dropout: float = 0.0  # embedding and residual dropout (no attention-probability dropout: see gpt.py)
    bias: bool = True
    vocab_multiple: int = 1  # embedding/head rows rounded up to this (vocabulary.py); 1 in older checkpoints

    def __post_init__(self) -> None:
        sizes = {
            name: getattr(self, name)
            for name in ("vocab_size", "n_layer", "n_head", "d_model", "max_seq_len", "vocab_multiple")
        }
        if not all(isinstance(value, int) and value >= 1 for value in sizes.values()):
            raise ValueError(f"GPTConfig sizes must be positive integers, got {sizes}")
        if self.d_model % self.n_head or not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig: d_model % n_head must be 0 and dropout in [0, 1), got {self}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @property
    def padded_vocab_size(self) -> int:
        """Rows of the embedding and head: vocab_size rounded up to vocab_multiple."""
        return padded_vocab_size(self.vocab_size, self.vocab_multiple)

    @classmethod
    def from_settings(cls, model) -> GPTConfig:
        """From any object with these fields as attributes (the typed `model` config group). A null
        vocab_size (the run's entry sets the tokenizer's: training/run.py) is GPT-2's 50257."""
        values = {f.name: getattr(model, f.name) for f in fields(cls)}
        if values["vocab_size"] is None:
            values["vocab_size"] = GPT2_VOCAB_SIZE
        return cls(**values)
