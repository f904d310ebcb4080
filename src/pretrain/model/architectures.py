"""The model architectures by name (`model.arch`): GPT-2 (`gpt2`, the default) and Llama (`llama`).

One entry per architecture: its config dataclass and its module. A checkpoint's hyper-parameters hold
the config as a dict; GPT-2's carries no `arch` key (so GPT-2 checkpoints keep their exact contents),
every other architecture's names itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from torch import nn

from .config import GPTConfig
from .gpt import GPT
from .llama import Llama, LlamaConfig

DEFAULT_ARCH = "gpt2"

ModelSettings = GPTConfig | LlamaConfig
"""A built model's config: what `build_model` takes."""
Decoder = GPT | Llama
"""A built model: both take a PackedBatch (forward, hidden_states, token_losses, loss, backend)."""


@dataclass(frozen=True)
class Architecture:
    name: str
    config_class: type
    model_class: type[nn.Module]


ARCHITECTURES: dict[str, Architecture] = {
    "gpt2": Architecture("gpt2", GPTConfig, GPT),
    "llama": Architecture("llama", LlamaConfig, Llama),
}


def architecture(name: str) -> Architecture:
    found = ARCHITECTURES.get(name)
    if found is None:
        raise ValueError(f"unknown model architecture {name!r}; known: {', '.join(ARCHITECTURES)}")
    return found


def arch_of(config: ModelSettings) -> str:
    return getattr(config, "arch", DEFAULT_ARCH)


def config_from_settings(model: Any) -> ModelSettings:
    """The model config from the typed `model` group (its `arch` picks the dataclass)."""
    name = architecture(getattr(model, "arch", DEFAULT_ARCH)).name
    return LlamaConfig.from_settings(model) if name == "llama" else GPTConfig.from_settings(model)


def config_from_dict(saved: Mapping) -> ModelSettings:
    """The model config from a checkpoint's `hyper_parameters["model"]` (TypeError/ValueError if it
    is not one)."""
    values = dict(saved)
    name = values.get("arch", DEFAULT_ARCH)
    if name == DEFAULT_ARCH:
        values.pop("arch", None)
    return architecture(name).config_class(**values)


def build_model(config: ModelSettings, attn: str = "sdpa", attn_compile: bool | str = "auto") -> Decoder:
    """The architecture's module for `config` (GPT or Llama: the same PackedBatch interface)."""
    if isinstance(config, LlamaConfig):
        return Llama(config, attn=attn, attn_compile=attn_compile)
    return GPT(config, attn=attn, attn_compile=attn_compile)


def blocks_of(model: nn.Module) -> nn.ModuleList:
    """`model.blocks` (GPT's `h`, Llama's `layers`): what compile, activation checkpointing and FSDP
    wrap, typed (nn.Module's attribute type is a union)."""
    return cast(nn.ModuleList, model.blocks)
