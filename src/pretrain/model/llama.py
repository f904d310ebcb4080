"""A Llama-style decoder over the same flat, padding-free PackedBatch as GPT-2.

RoPE (rotary positions from the batch's per-token `position_ids`, a configurable theta), RMSNorm,
a SwiGLU MLP, grouped-query attention and an optionally tied head: transformers' LlamaForCausalLM
layer for layer, with its parameter names (`embed_tokens`, `layers.N.self_attn.q_proj`, ...), so that
the Hugging Face round trip (hf/llama.py) only adds the `model.` prefix.

Attention goes through the same backends and per-batch `cu_seqlens` plan as GPT-2: the document
boundaries come from the batch, the positions RoPE rotates by come from the batch too (they restart
at 0 in every segment or continue across a pack, as `data.positions` says). Grouped-query attention
keeps n_kv_head key/value projections and repeats each for its n_head / n_kv_head query heads before
the backend (as transformers' `repeat_kv` does), so every backend sees plain (T, H, D) q/k/v.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn

from ..data.batching.batch import PackedBatch
from ..data.gpt2 import GPT2_VOCAB_SIZE
from .attention import AttentionBackend, AttentionBatch, known_backend, select_backend
from .attention.in_graph import in_graph_batch
from .fused_loss import CHUNKED, summed_cross_entropy
from .loss import token_cross_entropy
from .validation import check_batch
from .vocabulary import padded_embedding, padded_head, padded_vocab_size

ARCH = "llama"


def default_d_ff(d_model: int) -> int:
    """Llama's SwiGLU width: 8/3 x d_model (the parameters of a 4 x d_model GELU MLP), rounded up to a
    multiple of 64."""
    return -(-(8 * d_model) // (3 * 64)) * 64


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    n_layer: int
    n_head: int
    d_model: int
    max_seq_len: int  # the longest position the batches may hold (RoPE has no table; checked per batch)
    n_kv_head: int  # key/value heads (grouped-query attention when < n_head)
    d_ff: int  # SwiGLU hidden width (transformers' intermediate_size)
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = True
    dropout: float = 0.0  # residual dropout only (no attention-probability dropout: see gpt.py)
    vocab_multiple: int = 1  # embedding/head rows rounded up to this (vocabulary.py); 1 in older checkpoints
    arch: str = ARCH  # what names this config in a checkpoint's hyper-parameters (GPT-2's has none)

    def __post_init__(self) -> None:
        sizes = {
            name: getattr(self, name)
            for name in (
                "vocab_size",
                "n_layer",
                "n_head",
                "d_model",
                "max_seq_len",
                "n_kv_head",
                "d_ff",
                "vocab_multiple",
            )
        }
        if not all(isinstance(value, int) and value >= 1 for value in sizes.values()):
            raise ValueError(f"LlamaConfig sizes must be positive integers, got {sizes}")
        if self.d_model % self.n_head or self.n_head % self.n_kv_head or self.head_dim % 2:
            raise ValueError(
                f"LlamaConfig: d_model % n_head, n_head % n_kv_head and head_dim % 2 must be 0, got {self}"
            )
        if not self.rope_theta > 0 or not self.norm_eps > 0 or not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"LlamaConfig: rope_theta, norm_eps > 0 and dropout in [0, 1), got {self}")
        if self.arch != ARCH:
            raise ValueError(f"LlamaConfig.arch must be {ARCH!r}, got {self.arch!r}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @property
    def padded_vocab_size(self) -> int:
        """Rows of the embedding and head: vocab_size rounded up to vocab_multiple."""
        return padded_vocab_size(self.vocab_size, self.vocab_multiple)

    @classmethod
    def from_settings(cls, model) -> LlamaConfig:
        """From the typed `model` config group; its null n_kv_head / d_ff take their defaults."""
        values = {f.name: getattr(model, f.name) for f in fields(cls) if f.name != "arch"}
        if values["n_kv_head"] is None:
            values["n_kv_head"] = values["n_head"]
        if values["d_ff"] is None:
            values["d_ff"] = default_d_ff(values["d_model"])
        if values["vocab_size"] is None:  # the run's entry sets the tokenizer's (training/run.py)
            values["vocab_size"] = GPT2_VOCAB_SIZE
        return cls(**values)

    def parameter_count(self) -> int:
        """Parameters that do matmul work per token, for MFU (flops.py): the head's vocab x d_model
        once (an untied embedding is a lookup, as GPT-2's position table), the blocks, the norms."""
        d, kv = self.d_model, self.n_kv_head * self.head_dim
        block = 2 * d * d + 2 * d * kv + 3 * d * self.d_ff + 2 * d  # q, o, k, v, MLP, 2 norms
        return self.vocab_size * d + self.n_layer * block + d

    def as_dict(self) -> dict:
        return asdict(self)


def rope_cos_sin(
    position_ids: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """(T, 1, head_dim) cos and sin of each token's rotation, computed in fp32 as transformers'
    LlamaRotaryEmbedding (default rope type) does, then cast to the compute dtype."""
    device = position_ids.device
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
    inv_freq = 1.0 / (theta**exponents)
    freqs = torch.outer(position_ids.float(), inv_freq)  # each entry one fp32 product, as transformers'
    angles = torch.cat((freqs, freqs), dim=-1).unsqueeze(1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (T, H, D) queries or keys (transformers' rotate_half layout: halves, not interleaved)."""
    return x * cos + _rotate_half(x) * sin


class LlamaAttention(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.n_kv_head, config.head_dim
        kv_width = config.n_kv_head * config.head_dim
        self.q_proj = nn.Linear(config.d_model, config.d_model, bias=False)
        self.k_proj = nn.Linear(config.d_model, kv_width, bias=False)
        self.v_proj = nn.Linear(config.d_model, kv_width, bias=False)
        self.o_proj = nn.Linear(config.d_model, config.d_model, bias=False)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: AttentionBatch
    ) -> torch.Tensor:
        return self.project(meta.attend(*self.qkv(x, cos, sin)))

    def qkv(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(T, d_model) -> rotated q, k and v, each (T, n_head, head_dim)."""
        rows = x.shape[0]
        q = apply_rope(self.q_proj(x).view(rows, self.n_head, self.head_dim), cos, sin)
        k = apply_rope(self.k_proj(x).view(rows, self.n_kv_head, self.head_dim), cos, sin)
        v = self.v_proj(x).view(rows, self.n_kv_head, self.head_dim)
        if self.n_kv_head != self.n_head:  # each kv head serves n_head / n_kv_head consecutive q heads
            repeats = self.n_head // self.n_kv_head
            k, v = k.repeat_interleave(repeats, dim=1), v.repeat_interleave(repeats, dim=1)
        return q, k, v

    def project(self, y: torch.Tensor) -> torch.Tensor:
        """The attention output (T, H, D) -> (T, d_model)."""
        return self.o_proj(y.reshape(y.shape[0], -1))


class LlamaMLP(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.up_proj = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.down_proj = nn.Linear(config.d_ff, config.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))  # SwiGLU


class RMSNorm(nn.Module):
    """transformers' LlamaRMSNorm: normalised in fp32, scaled in the input dtype."""

    def __init__(self, width: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class LlamaBlock(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(config.d_model, config.norm_eps)
        self.self_attn = LlamaAttention(config)
        self.post_attention_layernorm = RMSNorm(config.d_model, config.norm_eps)
        self.mlp = LlamaMLP(config)
        self.dropout = nn.Dropout(config.dropout)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: AttentionBatch
    ) -> torch.Tensor:
        return self.after_attention(x, meta.attend(*self.before_attention(x, cos, sin)))

    # Two halves around attention, as GPT's Block: what train.compile compiles.
    def before_attention(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.self_attn.qkv(self.input_layernorm(x), cos, sin)

    def after_attention(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x = x + self.dropout(self.self_attn.project(y))
        return x + self.dropout(self.mlp(self.post_attention_layernorm(x)))


class Llama(nn.Module):
    """A Llama-style decoder on PackedBatch; `attn` and `attn_compile` as GPT's (gpt.py)."""

    def __init__(self, config: LlamaConfig, attn: str = "sdpa", attn_compile: bool | str = "auto"):
        super().__init__()
        self.config = config
        self.attn_backend = known_backend(str(attn))
        self.attn_compile = attn_compile
        self.loss_kernel = CHUNKED  # train.loss_kernel, resolved by training/model_setup.py
        self.compiled_trunk: Callable[..., torch.Tensor] | None = None  # set by compile.compile_model
        rows = config.padded_vocab_size
        self.embed_tokens = padded_embedding(config.vocab_size, rows, config.d_model)
        self.layers = nn.ModuleList(LlamaBlock(config) for _ in range(config.n_layer))
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self.lm_head = None if config.tie_embeddings else padded_head(config.vocab_size, rows, config.d_model)
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                weight = module.weight
                if weight.shape[0] == rows and module in (self.embed_tokens, self.lm_head):
                    nn.init.zeros_(weight[config.vocab_size :])  # padded ids: never used, kept at 0
                    weight = weight[: config.vocab_size]  # the same draws as an unpadded model
                nn.init.normal_(weight, mean=0.0, std=0.02)
        # As GPT-2: the residual projections scaled so the residual stream does not grow with depth.
        for name, p in self.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @property
    def head_weight(self) -> torch.Tensor:
        """The (vocab, d_model) output projection: the embedding when tied."""
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    @property
    def blocks(self) -> nn.ModuleList:
        """The decoder layers, in order (what compile and activation checkpointing wrap)."""
        return self.layers

    def num_parameters(self, exclude_position_embeddings: bool = False) -> int:
        """Distinct parameters (a tied head counts once; RoPE has no position table to exclude; the
        padded vocabulary rows are not parameters of the model, only of its storage)."""
        heads = 1 if self.lm_head is None else 2
        padding = heads * (self.config.padded_vocab_size - self.config.vocab_size) * self.config.d_model
        return sum(p.numel() for p in self.parameters()) - padding

    def backend(self, device: torch.device | None = None) -> str:
        return self._select_backend(device).name

    def _select_backend(self, device: torch.device | None = None) -> AttentionBackend:
        weight = self.embed_tokens.weight
        device = weight.device if device is None else torch.device(device)
        if device.type in ("cuda", "cpu") and torch.is_autocast_enabled(device.type):
            dtype = torch.get_autocast_dtype(device.type)
        else:
            dtype = weight.dtype
        training = torch.is_grad_enabled() and weight.requires_grad
        return select_backend(self.attn_backend, device, dtype, training)

    def hidden_states(self, batch: PackedBatch) -> torch.Tensor:
        """(T, d_model) output of the final RMSNorm, one row per input row."""
        device = self.embed_tokens.weight.device
        backend = self._select_backend(device)  # before any compute: a backend that cannot run fails here
        lengths = check_batch(batch, self.config.max_seq_len)
        input_ids = batch.input_ids.to(device, non_blocking=True)
        position_ids = batch.position_ids.to(device, non_blocking=True)
        if self.compiled_trunk is not None:  # train.compile_scope=model (compile.py)
            cu_seqlens = batch.cu_seqlens.to(device=device, dtype=torch.int32, non_blocking=True)
            return self.compiled_trunk(input_ids, position_ids, cu_seqlens, backend)
        meta = backend.prepare(batch.cu_seqlens, lengths, device, self.attn_compile)
        return self.trunk(input_ids, position_ids, meta)

    def trunk(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, meta: AttentionBatch
    ) -> torch.Tensor:
        """Embedding, RoPE angles, layers and the final RMSNorm: what train.compile_scope=model compiles."""
        x = self.embed_tokens(input_ids)
        device = x.device
        dtype = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else x.dtype
        cos, sin = rope_cos_sin(position_ids, self.config.head_dim, self.config.rope_theta, dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, meta)
        return self.norm(x)

    def graph_trunk(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        cu_seqlens: torch.Tensor,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        """`trunk` with attention built from tensors alone (attention/in_graph.py), as GPT's."""
        meta = in_graph_batch(backend, cu_seqlens, self.config.max_seq_len)
        return self.trunk(input_ids, position_ids, meta)

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        """(T, vocab) logits of the real ids."""
        return F.linear(self.hidden_states(batch), self.head_weight[: self.config.vocab_size])

    def token_losses(self, batch: PackedBatch) -> torch.Tensor:
        """(T,) next-token cross-entropy; 0 where the target is IGNORE_INDEX."""
        targets = batch.targets.to(self.embed_tokens.weight.device, non_blocking=True)
        return token_cross_entropy(
            self.hidden_states(batch), self.head_weight, targets, real_vocab=self.config.vocab_size
        )

    def loss(self, batch: PackedBatch, denominator: int | float | torch.Tensor) -> torch.Tensor:
        """Sum of token cross-entropy over counted targets divided by the caller's `denominator`."""
        if not isinstance(denominator, torch.Tensor) and not denominator > 0:
            raise ValueError(
                f"loss denominator must be > 0 (e.g. the step's real targets), got {denominator!r}"
            )
        targets = batch.targets.to(self.embed_tokens.weight.device, non_blocking=True)
        summed = summed_cross_entropy(
            self.hidden_states(batch), self.head_weight, targets, self.config.vocab_size, self.loss_kernel
        )
        return summed / denominator
