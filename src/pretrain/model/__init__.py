"""GPT-2 on padding-free packed batches, with document-isolating attention backends."""

from .attention import BACKENDS, CHOICES, check_backend, resolve_backend
from .config import GPTConfig
from .gpt import GPT
from .validation import check_batch

__all__ = ["BACKENDS", "CHOICES", "GPT", "GPTConfig", "check_backend", "check_batch", "resolve_backend"]
