"""GPT-2 over a flat, padding-free PackedBatch.

Every layer runs on the T rows of the batch, no (batch, seq) grid: embeddings, QKV, MLP and head see
only real tokens for packed policies (the padded policy brings its pads in T itself). Attention is
the only place segments matter; it gets q/k/v in THD layout plus per-batch metadata built once.

No attention-probability dropout: the varlen and flex kernels have none, and the backends must be
interchangeable; `dropout` applies to embeddings and residual branches as in GPT-2.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..data.batching.batch import PackedBatch
from .attention import AttentionBackend, AttentionBatch, known_backend, select_backend
from .attention.in_graph import in_graph_batch
from .config import GPTConfig
from .fused_loss import CHUNKED, summed_cross_entropy
from .loss import token_cross_entropy
from .validation import check_batch
from .vocabulary import padded_embedding


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head = config.n_head
        self.c_attn = nn.Linear(config.d_model, 3 * config.d_model, bias=config.bias)
        self.c_proj = nn.Linear(config.d_model, config.d_model, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor, meta: AttentionBatch) -> torch.Tensor:
        return self.project(meta.attend(*self.qkv(x)))

    def qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(T, d_model) -> q, k, v, each (T, H, D)."""
        rows, width = x.shape
        q, k, v = self.c_attn(x).view(rows, 3, self.n_head, width // self.n_head).unbind(1)
        return q, k, v

    def project(self, y: torch.Tensor) -> torch.Tensor:
        """The attention output (T, H, D) -> (T, d_model) through the output projection."""
        return self.resid_dropout(self.c_proj(y.reshape(y.shape[0], -1)))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.d_model, 4 * config.d_model, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.d_model, config.d_model, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))  # GPT-2's gelu


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.d_model, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.d_model, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, meta: AttentionBatch) -> torch.Tensor:
        return self.after_attention(x, meta.attend(*self.before_attention(x)))

    # The block in two halves around attention: train.compile compiles each half and leaves the
    # attention call (whose per-batch metadata would specialize a graph) to its backend's own kernels.
    def before_attention(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.attn.qkv(self.ln_1(x))

    def after_attention(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x = x + self.attn.project(y)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2 on PackedBatch. `attn` is `attn.backend`: `auto` or a backend of the registry (`sdpa`,
    `flex`, `varlen`: model/attention/); `attn_compile` is `attn.compile`: `auto` (compile flex_attention
    on CUDA only), True or False. (Not `compile`: that is nn.Module's own method.) The schema checks
    both; an unknown backend name here is a programming error (ValueError)."""

    def __init__(self, config: GPTConfig, attn: str = "sdpa", attn_compile: bool | str = "auto"):
        super().__init__()
        self.config = config
        self.attn_backend = known_backend(str(attn))
        self.attn_compile = attn_compile
        self.loss_kernel = CHUNKED  # train.loss_kernel, resolved by training/model_setup.py
        self.compiled_trunk: Callable[..., torch.Tensor] | None = None  # set by compile.compile_model
        self.wte = padded_embedding(config.vocab_size, config.padded_vocab_size, config.d_model)
        self.wpe = nn.Embedding(config.max_seq_len, config.d_model)
        self.drop = nn.Dropout(config.dropout)
        self.h = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.d_model, bias=config.bias)
        self.apply(self._init_weights)
        # GPT-2: residual projections scaled so the residual stream's variance does not grow with depth.
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            weight = module.weight
            if module is self.wte:  # padded ids: never used, kept at 0; the real rows drawn as unpadded
                nn.init.zeros_(weight[self.config.vocab_size :])
                weight = weight[: self.config.vocab_size]
            nn.init.normal_(weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    @property
    def blocks(self) -> nn.ModuleList:
        """The transformer blocks, in order (what compile and activation checkpointing wrap)."""
        return self.h

    def num_parameters(self, exclude_position_embeddings: bool = False) -> int:
        """Distinct parameters (the tied head counts once; padded vocabulary rows do not count)."""
        padding = (self.config.padded_vocab_size - self.config.vocab_size) * self.config.d_model
        total = sum(p.numel() for p in self.parameters()) - padding
        return total - self.wpe.weight.numel() if exclude_position_embeddings else total

    def backend(self, device: torch.device | None = None) -> str:
        """The concrete backend's name on `device` (default: where the model lives)."""
        return self._select_backend(device).name

    def _select_backend(self, device: torch.device | None = None) -> AttentionBackend:
        """The backend for this step, checked against the device, compute dtype and training mode."""
        device = self.wte.weight.device if device is None else torch.device(device)
        return select_backend(self.attn_backend, device, self._compute_dtype(device), self._training_step())

    def _compute_dtype(self, device: torch.device) -> torch.dtype:
        if device.type in ("cuda", "cpu") and torch.is_autocast_enabled(device.type):
            return torch.get_autocast_dtype(device.type)
        return self.wte.weight.dtype

    def _training_step(self) -> bool:
        return torch.is_grad_enabled() and self.wte.weight.requires_grad

    def hidden_states(self, batch: PackedBatch) -> torch.Tensor:
        """(T, d_model) output of the final LayerNorm, one row per input row."""
        device = self.wte.weight.device
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
        """Embeddings, blocks and the final LayerNorm: what train.compile_scope=model compiles."""
        x = self.drop(self.wte(input_ids) + self.wpe(position_ids))
        for block in self.h:
            x = block(x, meta)
        return self.ln_f(x)

    def graph_trunk(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        cu_seqlens: torch.Tensor,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        """`trunk` with attention built from tensors alone (attention/in_graph.py): one graph for
        every batch structure."""
        meta = in_graph_batch(backend, cu_seqlens, self.config.max_seq_len)
        return self.trunk(input_ids, position_ids, meta)

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        """(T, vocab) logits of the real ids through the tied embedding."""
        return F.linear(self.hidden_states(batch), self.wte.weight[: self.config.vocab_size])

    def token_losses(self, batch: PackedBatch) -> torch.Tensor:
        """(T,) next-token cross-entropy; 0 where the target is IGNORE_INDEX."""
        targets = batch.targets.to(self.wte.weight.device, non_blocking=True)
        return token_cross_entropy(
            self.hidden_states(batch), self.wte.weight, targets, real_vocab=self.config.vocab_size
        )

    def loss(self, batch: PackedBatch, denominator: int | float | torch.Tensor) -> torch.Tensor:
        """Sum of token cross-entropy over counted targets divided by the caller's `denominator`
        (e.g. the real targets of a whole accumulated step), never a per-batch mean."""
        if not isinstance(denominator, torch.Tensor) and not denominator > 0:
            raise ValueError(
                f"loss denominator must be > 0 (e.g. the step's real targets), got {denominator!r}"
            )
        targets = batch.targets.to(self.wte.weight.device, non_blocking=True)
        summed = summed_cross_entropy(
            self.hidden_states(batch), self.wte.weight, targets, self.config.vocab_size, self.loss_kernel
        )
        return summed / denominator
