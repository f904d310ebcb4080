"""The attention backends by name, and `auto`: varlen on CUDA, sdpa elsewhere.

The backends are those of `pretrain.attention_backends.BACKENDS` (the one list, torch-free, that the
schema's choices come from): each entry names its module here, whose AttentionBackend is built once.
An explicit backend is never silently replaced: one that cannot run here is a ConfigError saying what
to change.
"""

from __future__ import annotations

from importlib import import_module

import numpy as np
import torch

from ...attention_backends import AUTO
from ...attention_backends import BACKENDS as CATALOG
from .base import AttentionBackend, AttentionBatch, Compile


def _implementation(path: str) -> AttentionBackend:
    """The backend `<module>.<Class>` of this package names (one stateless instance)."""
    module, name = path.rsplit(".", 1)
    return getattr(import_module(f"{__package__}.{module}"), name)()


REGISTRY: dict[str, AttentionBackend] = {
    choice.name: _implementation(choice.implementation)
    for choice in CATALOG.values()
    if choice.implementation is not None
}
BACKENDS = tuple(REGISTRY)
CHOICES = tuple(CATALOG)


def get_backend(name: str) -> AttentionBackend:
    """The backend called `name` (a concrete one: resolve `auto` first)."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"no attention backend {name!r}: one of {', '.join(REGISTRY)} (resolve attn=auto first)"
        ) from None


def known_backend(name: str) -> str:
    """`name` if it is `auto` or a registered backend. The schema refuses unknown names
    at composition with the user-facing error: one reaching the model is a programming error."""
    if name != AUTO and name not in REGISTRY:
        raise ValueError(f"attn.backend must be one of {', '.join((AUTO, *REGISTRY))}; got {name!r}")
    return name


def resolve_backend(name: str, device: torch.device | str) -> str:
    """The concrete backend for `name` on `device`: only `auto` is resolved (varlen on CUDA, else sdpa)."""
    if known_backend(name) == AUTO:
        return "varlen" if torch.device(device).type == "cuda" else "sdpa"
    return name


def select_backend(
    name: str, device: torch.device | str, dtype: torch.dtype, training: bool
) -> AttentionBackend:
    """The backend `name` resolves to on `device`, after its own check (a ConfigError saying what to
    change if it cannot run here). `dtype` is the compute dtype of q/k/v (the autocast dtype under
    mixed precision)."""
    backend = get_backend(resolve_backend(name, device))
    backend.check(torch.device(device), dtype, training, via_auto=name == AUTO)
    return backend


def check_backend(name: str, device: torch.device | str, dtype: torch.dtype, training: bool) -> str:
    """Fail early, with what to change, if `name` cannot run here; return the resolved backend's name."""
    return select_backend(name, device, dtype, training).name


def prepare_attention(
    backend: str,
    cu_seqlens: torch.Tensor,
    lengths: np.ndarray,
    device: torch.device | str,
    attn_compile: Compile = "auto",
) -> AttentionBatch:
    """This batch's metadata for the concrete `backend` (sdpa bucket plan, flex BlockMask, varlen
    boundaries), on `device`."""
    return get_backend(backend).prepare(cu_seqlens, lengths, torch.device(device), attn_compile)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionBatch) -> torch.Tensor:
    """The batch's backend on q, k, v; all three and the result are (T, H, D)."""
    return meta.attend(q, k, v)
