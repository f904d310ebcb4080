"""Per-token cross-entropy through the tied output head, without holding (T, vocab) logits.

At 35 x 4096 tokens and a 50257 vocabulary the fp32 logits alone are ~29 GB, so the head and the
loss run over row chunks. Training (gradients on) uses chunks of `LOSS_CHUNK_ROWS` rows; a batch of
several chunks keeps only each chunk's (rows, d_model) input and recomputes its logits in backward
(about one extra head matmul). Without gradients (validation, `pretrain eval`) nothing is kept for a
backward, so the chunks are sized by elements instead: at most `EVAL_CHUNK_ELEMENTS` logits at a time
(~1,300 rows at GPT-2's vocabulary), and evaluation memory does not grow with the microbatch.
Each row's loss depends only on its own logits: chunking never changes a loss value.

A padded vocabulary (model.vocab_multiple, vocabulary.py) reaches these paths as a weight with more
rows than `real_vocab`: they run on its first `real_vocab` rows (a row slice, no copy), so the extra ids
are never predicted and their rows get a zero gradient, and the arithmetic is exactly that of an
unpadded model. The padded width pays off in the fused CUDA kernel (fused_loss.py), which masks the
extra columns instead.

On CPU the vocabulary-sized buffers (logits, log-probabilities, their gradient) come from a small
workspace kept between calls (`HeadWorkspace`). Allocated afresh at every chunk they are hundreds of
MB each: glibc maps and unmaps them every time and the kernel zero-fills every page again (~1.6 GB of
page faults per tiny-model step, a third of the step's CPU time). The workspace path calls the same
ATen kernels as `F.linear` + `F.cross_entropy` and their autograd formulas (log_softmax in place,
its backward writing over its sparse incoming gradient), so losses and gradients are bitwise those of
the autograd path (tests/test_model.py). CUDA (whose caching allocator already reuses memory),
autocast and other dtypes take the plain autograd path.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable
from torch.utils.checkpoint import checkpoint

from ..data.batching.batch import IGNORE_INDEX

LOSS_CHUNK_ROWS = 8192
EVAL_CHUNK_ELEMENTS = 1 << 26  # logits per chunk without gradients: 256 MiB in fp32


def eval_chunk_rows(vocab_size: int) -> int:
    """Rows per loss chunk without gradients: EVAL_CHUNK_ELEMENTS logits, at least 1 row."""
    return max(1, EVAL_CHUNK_ELEMENTS // max(1, int(vocab_size)))


class HeadWorkspace:
    """Flat buffers lent out as (rows, vocab) views and given back, so that a step reuses the pages of
    the previous one. A chunk needs at most two at once (log-probabilities and their gradient), so at
    most two are kept per dtype; a buffer grows to the largest request seen. A buffer not given back
    (a forward whose backward never ran) is simply garbage collected."""

    KEEP = 2

    def __init__(self) -> None:
        self._free: dict[torch.dtype, list[torch.Tensor]] = {}
        self._lock = threading.Lock()

    def take(self, rows: int, columns: int, dtype: torch.dtype) -> torch.Tensor:
        """A (rows, columns) contiguous tensor of `dtype` on the CPU; its contents are arbitrary."""
        needed = rows * columns
        with self._lock:
            free = self._free.setdefault(dtype, [])
            fitting = [i for i, flat in enumerate(free) if flat.numel() >= needed]
            if fitting:  # the smallest that fits
                flat = free.pop(min(fitting, key=lambda i: free[i].numel()))
            else:  # all too small: drop the smallest before allocating, so that growing never holds three
                if free:
                    free.pop(min(range(len(free)), key=lambda i: free[i].numel()))
                flat = torch.empty(needed, dtype=dtype)
        return flat[:needed].view(rows, columns)

    def give(self, *views: torch.Tensor) -> None:
        """Return views from `take` (their whole underlying buffers) for the next call."""
        with self._lock:
            for view in views:
                flat = view.view(-1)
                base = flat if flat._base is None else flat._base
                free = self._free.setdefault(view.dtype, [])
                if all(base.data_ptr() != f.data_ptr() for f in free):
                    free.append(base)
                    free.sort(key=lambda f: f.numel(), reverse=True)
                    del free[self.KEEP :]  # the largest are kept

    def clear(self) -> None:
        """Drop every kept buffer (their memory goes back to the allocator)."""
        with self._lock:
            self._free.clear()

    def kept_bytes(self) -> int:
        with self._lock:
            return sum(f.numel() * f.element_size() for free in self._free.values() for f in free)


WORKSPACE = HeadWorkspace()
WORKSPACE_DTYPES = (torch.float32, torch.float64)


def uses_workspace(hidden: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `token_cross_entropy` takes the workspace path: CPU, fp32/fp64, no autocast."""
    return (
        hidden.device.type == "cpu"
        and weight.device.type == "cpu"
        and hidden.dtype == weight.dtype
        and hidden.dtype in WORKSPACE_DTYPES
        and not torch.is_autocast_enabled("cpu")
    )


def _log_probs_into(out: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """log_softmax(hidden @ weight.T) written into `out` (the logits are computed there first)."""
    torch.mm(hidden, weight.t(), out=out)  # what F.linear runs for a 2-D input without bias
    return torch._log_softmax(out, 1, False, out=out)  # row-wise: each element read, then written


def _picked_losses(log_probs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """nll_loss(reduction='none'): -log p(target), 0 where the target is IGNORE_INDEX."""
    ignored = targets == IGNORE_INDEX
    picked = log_probs.gather(1, targets.masked_fill(ignored, 0).unsqueeze(1)).squeeze(1)
    return torch.where(ignored, 0.0, -picked)


class _WorkspaceHeadLoss(torch.autograd.Function):
    """One chunk's per-row cross-entropy of `hidden @ weight.T`, its buffers from WORKSPACE.
    `keep`: hold the log-probabilities from forward to backward (one chunk per batch); otherwise
    recompute them in backward (several chunks: only one chunk's buffers exist at a time)."""

    @staticmethod
    def forward(
        ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, keep: bool
    ) -> torch.Tensor:
        log_probs = _log_probs_into(
            WORKSPACE.take(hidden.shape[0], weight.shape[0], hidden.dtype), hidden, weight
        )
        losses = _picked_losses(log_probs, targets)
        if keep:
            ctx.log_probs = log_probs
        else:
            WORKSPACE.give(log_probs)
            ctx.log_probs = None
        ctx.save_for_backward(hidden, weight, targets)
        return losses

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_losses: torch.Tensor):
        hidden, weight, targets = ctx.saved_tensors
        log_probs = ctx.log_probs
        ctx.log_probs = None
        rows, vocab = hidden.shape[0], weight.shape[0]
        if log_probs is None:
            log_probs = _log_probs_into(WORKSPACE.take(rows, vocab, hidden.dtype), hidden, weight)
        # nll_loss's backward: -grad at each row's target, 0 elsewhere and on ignored rows.
        ignored = targets == IGNORE_INDEX
        grad = WORKSPACE.take(rows, vocab, hidden.dtype).zero_()
        grad.scatter_(
            1,
            targets.masked_fill(ignored, 0).unsqueeze(1),
            torch.where(ignored, 0.0, -grad_losses).unsqueeze(1),
        )
        # log_softmax's backward over its own input (each row's sum is read before the row is written).
        torch._log_softmax_backward_data(grad, log_probs, 1, hidden.dtype, out=grad)
        grad_hidden = grad_weight = None
        if ctx.needs_input_grad[0]:
            grad_hidden = grad.mm(weight)  # mm's backward, as autograd computes it for F.linear
        if ctx.needs_input_grad[1]:
            grad_weight = grad.t().mm(hidden)
        WORKSPACE.give(grad, log_probs)
        return grad_hidden, grad_weight, None, None


def _chunk_losses(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The plain autograd path (CUDA, autocast, other dtypes)."""
    logits = F.linear(hidden, weight)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 -> fp32; fp64 stays
    return F.cross_entropy(logits, targets, ignore_index=IGNORE_INDEX, reduction="none")


def _workspace_losses_no_grad(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    log_probs = _log_probs_into(
        WORKSPACE.take(hidden.shape[0], weight.shape[0], hidden.dtype), hidden, weight
    )
    try:
        return _picked_losses(log_probs, targets)
    finally:
        WORKSPACE.give(log_probs)


def token_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    chunk_rows: int | None = None,
    workspace: bool = True,
    real_vocab: int | None = None,
) -> torch.Tensor:
    """(T,) cross-entropy (at least fp32) of `hidden @ weight.T` against `targets`; 0 where ignored.
    `chunk_rows` defaults to LOSS_CHUNK_ROWS when a gradient is needed, else `eval_chunk_rows`.
    `workspace=False` forces the plain autograd path (the reference the workspace path equals).
    `real_vocab`: the ids that exist when `weight` has padded rows past them (null = every row)."""
    if real_vocab is not None and real_vocab < weight.shape[0]:
        weight = weight[:real_vocab]  # a view: the padded rows get a zero gradient through it
    needs_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    if chunk_rows is None:
        chunk_rows = LOSS_CHUNK_ROWS if needs_grad else eval_chunk_rows(weight.shape[0])
    single = hidden.shape[0] <= chunk_rows
    pieces = (
        [(hidden, targets)]
        if single
        else zip(hidden.split(chunk_rows), targets.split(chunk_rows), strict=True)
    )
    losses = []
    for h, t in pieces:
        if workspace and uses_workspace(h, weight):
            if needs_grad:
                losses.append(_WorkspaceHeadLoss.apply(h, weight, t, single))
            else:
                losses.append(_workspace_losses_no_grad(h, weight, t))
        elif needs_grad and not single:
            losses.append(checkpoint(_chunk_losses, h, weight, t, use_reentrant=False))
        else:
            losses.append(_chunk_losses(h, weight, t))
    return losses[0] if single else torch.cat(losses)
