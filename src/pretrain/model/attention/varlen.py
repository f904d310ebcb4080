"""`torch.nn.attention.varlen.varlen_attn`: the flash varlen kernel, CUDA with bf16/fp16 only.

Its call contract (dense int32 boundaries on q's device, Python-int maxima, contiguous (T, H, D)
q/k/v, `window_size=(-1, 0)` for causal) is checked on CPU under FakeTensorMode by
tests/test_cuda_contract.py.
"""

from __future__ import annotations

import numpy as np
import torch

from ...errors import ConfigError
from .base import HALF_DTYPES, AttentionBackend, AttentionBatch, Compile


def varlen_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int
) -> torch.Tensor:
    """Flash varlen attention, causal within each segment; (T,H,D) -> (T,H,D). CUDA, bf16/fp16 only."""
    if q.device.type != "cuda" or q.dtype not in HALF_DTYPES:
        VarlenBackend().check(q.device, q.dtype, training=False)  # raises with what to change
    from torch.nn.attention.varlen import varlen_attn  # looked up per call: the contract test spies on it

    q, k, v = (x.contiguous() for x in (q, k, v))  # the flash kernel wants dense (T, H, D)
    # window_size must be the tuple (-1, 0): that (and only that) selects the causal kernel.
    out = varlen_attn(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, window_size=(-1, 0))
    assert isinstance(out, torch.Tensor)  # no return_aux
    return out


class VarlenBackend(AttentionBackend):
    name = "varlen"

    def check(self, device: torch.device, dtype: torch.dtype, training: bool, via_auto: bool = False) -> None:
        if device.type != "cuda":
            raise ConfigError(
                f"attn=varlen runs only on CUDA (the flash varlen kernel), not on {device.type}; use "
                f"attn=sdpa (or attn=auto, which picks sdpa off CUDA)"
            )
        if dtype not in HALF_DTYPES:
            how = " (attn=auto picks varlen on CUDA)" if via_auto else ""
            raise ConfigError(
                f"attn=varlen needs bf16 or fp16 q/k/v, got {dtype}{how}; train with bf16 mixed precision "
                f"(e.g. trainer.precision=bf16-mixed) or use attn=sdpa"
            )

    def prepare(
        self, cu_seqlens: torch.Tensor, lengths: np.ndarray, device: torch.device, compile: Compile
    ) -> AttentionBatch:
        return self.batch(cu_seqlens, lengths, device)  # the kernel needs only the boundaries

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: AttentionBatch
    ) -> torch.Tensor:
        return varlen_attention(q, k, v, batch.cu_seqlens, batch.max_seqlen)
