"""Document-isolating causal attention over a flat (T, H, D) batch, backends as plug-ins.

Every backend attends causally *within* each segment of `cu_seqlens` and never across one:
  sdpa    reference: segments regrouped into a few batched `scaled_dot_product_attention` calls
  flex    FlexAttention with a document-causal BlockMask built once per batch
  varlen  `torch.nn.attention.varlen.varlen_attn` (flash varlen kernel: CUDA, bf16/fp16 only)
  auto    varlen on CUDA, sdpa elsewhere; an explicit backend is never silently replaced.

One module per backend (an `AttentionBackend`: its check, its per-batch `prepare`, its `attend`),
and the registry (registry.py) that names them. The per-batch work (bucket plan, block mask, device
copy of the boundaries) is done once in GPT.hidden_states and shared by all layers.
"""

from .base import HALF_DTYPES, AttentionBackend, AttentionBatch
from .flex import FLEX_CPU_TRAINING, FlexBackend, document_block_mask, flex_attention
from .registry import (
    AUTO,
    BACKENDS,
    CHOICES,
    REGISTRY,
    attention,
    check_backend,
    get_backend,
    known_backend,
    prepare_attention,
    resolve_backend,
    select_backend,
)
from .sdpa import SdpaBackend, SdpaPlan, bucket_widths, plan_sdpa, sdpa_attention
from .varlen import VarlenBackend, varlen_attention

__all__ = [
    "AUTO",
    "BACKENDS",
    "CHOICES",
    "FLEX_CPU_TRAINING",
    "HALF_DTYPES",
    "REGISTRY",
    "AttentionBackend",
    "AttentionBatch",
    "FlexBackend",
    "SdpaBackend",
    "SdpaPlan",
    "VarlenBackend",
    "attention",
    "bucket_widths",
    "check_backend",
    "document_block_mask",
    "flex_attention",
    "get_backend",
    "known_backend",
    "plan_sdpa",
    "prepare_attention",
    "resolve_backend",
    "sdpa_attention",
    "select_backend",
    "varlen_attention",
]
