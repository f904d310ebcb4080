"""GPT-2 on padding-free packed batches, with document-isolating attention backends."""

from .architectures import (
    ARCHITECTURES,
    Decoder,
    ModelSettings,
    build_model,
    config_from_dict,
    config_from_settings,
)
from .attention import BACKENDS, CHOICES, check_backend, resolve_backend
from .config import GPTConfig
from .gpt import GPT
from .llama import Llama, LlamaConfig
from .validation import check_batch

__all__ = [
    "ARCHITECTURES",
    "BACKENDS",
    "CHOICES",
    "GPT",
    "Decoder",
    "GPTConfig",
    "Llama",
    "LlamaConfig",
    "ModelSettings",
    "build_model",
    "check_backend",
    "check_batch",
    "config_from_dict",
    "config_from_settings",
    "resolve_backend",
]
