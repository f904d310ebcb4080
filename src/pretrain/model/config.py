"""GPT-2 shapes: the config dataclass and the named sizes (conf/model/*.yaml mirror these)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace

GPT2_VOCAB_SIZE = 50257

# name -> (n_layer, n_head, d_model)
PRESETS: dict[str, tuple[int, int, int]] = {
    "tiny": (4, 4, 128),  # CPU tests and the demo run
    "gpt2-small": (12, 12, 768),  # 124M with 1024 positions
    "gpt2-medium": (24, 16, 1024),  # 350M with 1024 positions
}


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = GPT2_VOCAB_SIZE
    n_layer: int = 12
    n_head: int = 12
    d_model: int = 768
    max_seq_len: int = 1024  # learned positions (GPT-2's n_positions); follows data.max_seq_len
    dropout: float = 0.0  # embedding and residual dropout (no attention-probability dropout: see gpt.py)
    bias: bool = True

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_layer", "n_head", "d_model", "max_seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"model.{name} must be a positive integer, got {value!r}")
        if self.d_model % self.n_head:
            raise ValueError(
                f"model.d_model ({self.d_model}) must be divisible by model.n_head ({self.n_head})"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"model.dropout must be in [0, 1), got {self.dropout!r}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @classmethod
    def preset(cls, name: str, **overrides) -> GPTConfig:
        """A named size (`tiny`, `gpt2-small`, `gpt2-medium`), with any field overridden."""
        if name not in PRESETS:
            raise ValueError(f"unknown model size {name!r}; choose one of {', '.join(PRESETS)}")
        n_layer, n_head, d_model = PRESETS[name]
        return replace(cls(n_layer=n_layer, n_head=n_head, d_model=d_model), **overrides)

    @classmethod
    def from_mapping(cls, cfg: Mapping) -> GPTConfig:
        """From a conf/model/*.yaml node (DictConfig or dict); `name` picks a preset for missing sizes."""
        cfg = dict(cfg.items())
        known = {f.name for f in fields(cls)}
        unknown = set(cfg) - known - {"name"}
        if unknown:
            raise ValueError(f"unknown model config keys: {sorted(unknown)}")
        values = {k: v for k, v in cfg.items() if k in known and v is not None}
        if "dropout" in values:
            values["dropout"] = float(values["dropout"])
        name = cfg.get("name")
        return cls.preset(name, **values) if name in PRESETS else cls(**values)
