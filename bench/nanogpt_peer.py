"""An independent speed reference for scripts/gpu_bench.py: a minimal nanoGPT-style GPT-2 training loop.

Written apart from the package on purpose (torch and numpy only, nothing of `pretrain`), in the style of
karpathy/nanoGPT's model.py and train.py: fused qkv, F.scaled_dot_product_attention(is_causal=True) on
(B, T) rows, a tied head, F.cross_entropy over full logits, torch.compile of the whole model, AdamW
(fused on CUDA) with nanoGPT's decay groups and betas, bf16 autocast on CUDA, gradient clipping at 1,
and nanoGPT's gradient accumulation: a step's rows go through in micro-batches of at most
`micro_tokens` tokens (full logits of a whole 35 x 4096 step would not fit beside the activations).

It reads the token stream as contiguous (B, T) rows and ignores document boundaries: attention
crosses documents and no target is masked. So it is the speed reference a plain loop reaches on these
shapes, not a correctness peer of the product (whose documents never see each other).

   PYTHONPATH=src python3 bench/nanogpt_peer.py TOKENS.bin [--dtype uint16 --context 1024 --rows 8]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

NANOGPT_VOCAB = 50304  # GPT-2's 50257 rounded up to a multiple of 64, as nanoGPT does for speed


@dataclass(frozen=True)
class PeerConfig:
    block_size: int = 1024
    vocab_size: int = NANOGPT_VOCAB
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    bias: bool = True


class CausalSelfAttention(nn.Module):
    def __init__(self, config: PeerConfig):
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.n_head = config.n_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, config: PeerConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, config: PeerConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: PeerConfig):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.h = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight  # tied
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2's scaled init of the residual projections
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def configure_optimizer(model: nn.Module, device: torch.device, lr: float = 6e-4) -> torch.optim.AdamW:
    """nanoGPT's: weight decay 0.1 on matrices and embeddings, none on biases and norms; fused on CUDA."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), fused=device.type == "cuda")


def contiguous_rows(tokens: np.ndarray, rows: int, width: int, device: torch.device):
    """(inputs, targets) of `rows` x `width` contiguous tokens, read in order and wrapping around."""
    span = rows * width
    if len(tokens) < span + 1:
        raise ValueError(f"{len(tokens)} tokens cannot fill {rows} rows of {width} (+1)")
    offset = 0
    while True:
        if offset + span + 1 > len(tokens):
            offset = 0
        chunk = torch.from_numpy(np.asarray(tokens[offset : offset + span + 1], dtype=np.int64))
        offset += span
        x, y = chunk[:-1].view(rows, width), chunk[1:].view(rows, width)
        if device.type == "cuda":
            x, y = x.pin_memory(), y.pin_memory()
        yield x.to(device, non_blocking=True), y.to(device, non_blocking=True)


MICRO_TOKENS = 16 * 1024  # per micro-batch: nanoGPT's 12 x 1024, rounded to a power of two


def micro_batches(rows: int, width: int, micro_tokens: int = MICRO_TOKENS) -> list[int]:
    """Rows of each micro-batch of a step: at most micro_tokens tokens (one row at least) each."""
    size = max(1, min(rows, micro_tokens // width))
    return [min(size, rows - start) for start in range(0, rows, size)]


def train_peer(
    tokens: np.ndarray,
    config: PeerConfig,
    rows: int,
    steps: int,
    device: torch.device,
    compile: bool = True,
    seed: int = 1234,
    micro_tokens: int = MICRO_TOKENS,
) -> dict:
    """`steps` updates of `rows` x `config.block_size` tokens; each step's seconds (from the end of the
    one before: data included) and loss (the mean over the step's tokens). The caller drops the first
    steps (compile, and a recompile for a smaller last micro-batch) as warmup."""
    torch.manual_seed(seed)
    model = GPT(config).to(device)
    optimizer = configure_optimizer(model, device)
    step_model = torch.compile(model) if compile else model
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()
    )
    batches = contiguous_rows(tokens, rows, config.block_size, device)
    sizes = micro_batches(rows, config.block_size, micro_tokens)
    seconds, losses = [], []
    last = time.perf_counter()
    for _ in range(steps):
        x, y = next(batches)
        total = torch.zeros((), device=device)
        for xs, ys in zip(x.split(sizes), y.split(sizes), strict=True):
            with autocast:
                loss = step_model(xs, ys) * (len(xs) / rows)  # the step's mean over its tokens
            loss.backward()
            total += loss.detach().float()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(total.item()))  # syncs once per step, as the product's loss read does
        now = time.perf_counter()
        seconds.append(now - last)
        last = now
    return {
        "step_seconds": seconds,
        "losses": losses,
        "tokens_per_step": rows * config.block_size,
        "micro_batches": sizes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("tokens", help="a flat token file, e.g. a cache's train.bin")
    parser.add_argument("--dtype", default="uint16")
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--no-compile", action="store_true")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tokens = np.memmap(args.tokens, dtype=args.dtype, mode="r")
    config = PeerConfig(block_size=args.context)
    out = train_peer(tokens, config, args.rows, args.steps, device, compile=not args.no_compile)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
