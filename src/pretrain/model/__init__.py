"""GPT-2 on padding-free packed batches, with document-isolating attention backends."""

from .attention import BACKENDS, CHOICES, check_backend, resolve_backend
from .config import PRESETS, GPTConfig
from .gpt import GPT, build_model
from .validation import check_batch

__all__ = [
    "BACKENDS",
    "CHOICES",
    "GPT",
    "PRESETS",
    "GPTConfig",
    "build_model",
    "check_backend",
    "check_batch",
    "resolve_backend",
]
