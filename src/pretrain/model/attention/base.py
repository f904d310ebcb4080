"""What every attention backend is: a device/dtype check, a per-batch preparation and a call.

A backend attends causally *within* each segment of the batch's `cu_seqlens` and never across one,
on a flat (T, H, D) layout. `prepare` runs once per batch (in GPT.hidden_states) and its
`AttentionBatch` is shared by every layer; `attend` runs once per layer.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

HALF_DTYPES = (torch.bfloat16, torch.float16)

Compile = bool | str
"""`attn.compile`: `auto`, True or False (only flex compiles anything)."""


class AttentionBackend(ABC):
    """One attention implementation. Stateless: one instance per backend lives in the registry."""

    name: ClassVar[str]

    @abstractmethod
    def check(self, device: torch.device, dtype: torch.dtype, training: bool, via_auto: bool = False) -> None:
        """Raise a ConfigError saying what to change if this backend cannot run here. `dtype` is the
        compute dtype of q/k/v (the autocast dtype under mixed precision); `via_auto`: attn=auto chose
        this backend, so the message says so."""

    @abstractmethod
    def prepare(
        self, cu_seqlens: torch.Tensor, lengths: np.ndarray, device: torch.device, compile: Compile
    ) -> AttentionBatch:
        """This batch's metadata, from its segment boundaries (host `lengths`, one per segment)."""

    @abstractmethod
    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: AttentionBatch
    ) -> torch.Tensor:
        """Causal attention within each segment; q, k, v and the result are (T, H, D)."""

    def batch(
        self, cu_seqlens: torch.Tensor, lengths: np.ndarray, device: torch.device, plan: Any = None
    ) -> AttentionBatch:
        """The metadata every backend shares (int32 boundaries on `device`, the longest segment as an
        int), with this backend's own per-batch `plan`."""
        cu = cu_seqlens.to(device=device, dtype=torch.int32, non_blocking=True)
        max_seqlen = int(lengths.max()) if len(lengths) else 0
        return AttentionBatch(self, cu, max_seqlen, plan)

    def __repr__(self) -> str:
        return f"<attention backend {self.name}>"


@dataclass(frozen=True)
class AttentionBatch:
    """Per-batch attention metadata, built once by the backend and passed to every layer."""

    backend: AttentionBackend
    cu_seqlens: torch.Tensor  # (S+1,) int32 on the compute device
    max_seqlen: int  # a Python int: kernels take it as a launch parameter, not a tensor
    plan: Any = None  # the backend's own per-batch state (sdpa bucket plan, flex block mask)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.backend.attend(q, k, v, self)
