"""GPT-2 shapes, validated. The named sizes (tiny, gpt2-small, gpt2-medium) are conf/model/*.yaml;
the run's entry builds a GPTConfig from the typed `model` group with `from_settings`."""

from __future__ import annotations

from dataclasses import dataclass, fields

from ..errors import ConfigError


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int
    n_layer: int
    n_head: int
    d_model: int
    max_seq_len: int  # learned positions (GPT-2's n_positions); follows data.max_seq_len
    dropout: float = 0.0  # embedding and residual dropout (no attention-probability dropout: see gpt.py)
    bias: bool = True

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_layer", "n_head", "d_model", "max_seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"model.{name} must be a positive integer, got {value!r}")
        if self.d_model % self.n_head:
            raise ConfigError(
                f"model.d_model ({self.d_model}) must be divisible by model.n_head ({self.n_head})"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout must be in [0, 1), got {self.dropout!r}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @classmethod
    def from_settings(cls, model) -> GPTConfig:
        """From any object with these fields as attributes (the typed `model` config group)."""
        return cls(**{f.name: getattr(model, f.name) for f in fields(cls)})
