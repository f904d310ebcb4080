"""The flat, padding-free batch the model consumes, and the collates that build it.

Packed policies materialise only real tokens: chunks are laid back to back and `cu_seqlens` marks
every chunk boundary, so attention never crosses a document or a chunk cut. The padded policy uses
the same fields with its pad columns present in T (each row one segment, pads after real tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from ...arrays import prefix_sums, run_positions
from ..tokens import EOS_TOKEN_ID, TRAINED
from .chunking import Chunk

IGNORE_INDEX = -100
PAD_TOKEN_ID = EOS_TOKEN_ID  # what a pad row's inputs hold (their targets are IGNORE_INDEX)


@dataclass
class PackedBatch:
    input_ids: torch.Tensor  # (T,) int64
    targets: torch.Tensor  # (T,) int64, IGNORE_INDEX where no target counts
    position_ids: torch.Tensor  # (T,) int64, restarting at 0 in every segment
    cu_seqlens: torch.Tensor  # (S+1,) int32 segment boundaries
    max_seqlen: int
    num_targets: int  # real targets in this batch
    pack_lengths: torch.Tensor  # (P,) int64 real tokens per logical pack (or padded row)
    capacity: int = 0  # tokens a pack (or padded row) could hold; 0 if unknown
    padded: bool = False  # True when pad columns are materialised in T
    meta: dict = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        """Rows the model computes (real tokens, plus pads for the padded policy)."""
        return int(self.input_ids.numel())

    @property
    def real_tokens(self) -> int:
        return int(self.pack_lengths.sum())

    def to(self, device, non_blocking: bool = False) -> PackedBatch:
        """Token tensors move; `cu_seqlens` stays on the host, where the model validates it and plans
        attention without a device sync, then copies it to the device once per batch."""
        move = lambda t: t.to(device, non_blocking=non_blocking)  # noqa: E731
        return replace(
            self,
            input_ids=move(self.input_ids),
            targets=move(self.targets),
            position_ids=move(self.position_ids),
        )


def trained_targets(loss_mask: np.ndarray, target_index: np.ndarray) -> np.ndarray:
    """Whether each target (a global token index) trains: bit 0 of its loss-mask byte (task=sft)."""
    return (np.asarray(loss_mask[target_index]) & TRAINED).astype(bool)


def _cu_seqlens(lengths: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(prefix_sums(lengths).astype(np.int32))


def gather_packed(
    tokens: np.ndarray,
    starts: np.ndarray,
    lengths: np.ndarray,
    pack_sizes: Sequence[int] | np.ndarray,
    capacity: int,
    targets: np.ndarray | None = None,
    loss_mask: np.ndarray | None = None,
) -> PackedBatch:
    """Build a packed batch straight from the token file.

    `starts`/`lengths` are the chunks in batch order (global token offsets of their first input);
    `pack_sizes` says how many consecutive chunks form each logical pack. The targets are the
    tokens one further, or, when `targets` is given (chunks held apart: `collate_packed`), the
    entries of `targets` at the inputs' offsets. With `loss_mask` (task=sft: the split's mask bytes),
    a target whose token is not marked trained is IGNORE_INDEX and not counted.
    """
    starts = np.asarray(starts, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    positions = run_positions(lengths)
    index = np.repeat(starts, lengths) + positions
    input_ids = np.asarray(tokens[index], dtype=np.int64)
    target_ids = np.asarray(tokens[index + 1] if targets is None else targets[index], dtype=np.int64)
    num_targets = int(lengths.sum())
    if loss_mask is not None:
        trained = trained_targets(loss_mask, index + 1)
        target_ids[~trained] = IGNORE_INDEX
        num_targets = int(trained.sum())
    pack_lengths = np.diff(prefix_sums(lengths)[prefix_sums(pack_sizes)])
    return PackedBatch(
        input_ids=torch.from_numpy(input_ids),
        targets=torch.from_numpy(target_ids),
        position_ids=torch.from_numpy(positions),
        cu_seqlens=_cu_seqlens(lengths),
        max_seqlen=int(lengths.max()) if len(lengths) else 0,
        num_targets=num_targets,
        pack_lengths=torch.from_numpy(pack_lengths.astype(np.int64)),
        capacity=int(capacity),
    )


def collate_packed(chunks: Sequence[Chunk] | Sequence[Sequence[Chunk]], capacity: int = 0) -> PackedBatch:
    """One flat, padding-free batch from chunks (each its own pack) or from packs (lists of chunks):
    `gather_packed` over the chunks laid back to back (capacity 0: the longest pack's length)."""
    packs = [list(c) if not isinstance(c, Chunk) else [c] for c in chunks]
    flat = [c for pack in packs for c in pack]
    if not flat:
        raise ValueError("collate_packed needs at least one chunk")
    lengths = np.array([len(c) for c in flat], dtype=np.int64)
    inputs = np.concatenate([np.asarray(c.inputs, dtype=np.int64) for c in flat])
    targets = np.concatenate([np.asarray(c.targets, dtype=np.int64) for c in flat])
    sizes = np.array([len(pack) for pack in packs], dtype=np.int64)
    widest = max(sum(len(c) for c in pack) for pack in packs)
    return gather_packed(
        inputs, prefix_sums(lengths)[:-1], lengths, sizes, capacity or widest, targets=targets
    )


def one_segment_per_pack(batch: PackedBatch) -> PackedBatch:
    """The batch with each pack one attention segment (data.document_mask=false): its later
    documents attend to the earlier ones, and positions run on across them as in one window of the
    concat baseline. Inputs and targets are unchanged."""
    packs = batch.pack_lengths.numpy()
    return replace(
        batch,
        cu_seqlens=_cu_seqlens(packs),
        position_ids=torch.from_numpy(run_positions(packs)),
        max_seqlen=int(packs.max()) if len(packs) else 0,
    )


def continue_positions(batch: PackedBatch) -> PackedBatch:
    """The batch with positions numbered across each whole pack (data.positions=continue), whatever
    its attention segments: as one window of a concat-then-chunk pipeline numbers them."""
    return replace(batch, position_ids=torch.from_numpy(run_positions(batch.pack_lengths.numpy())))


def gather_padded(
    tokens: np.ndarray,
    starts: np.ndarray,
    lengths: np.ndarray,
    row_width: int,
    pad_token_id: int = PAD_TOKEN_ID,
    loss_mask: np.ndarray | None = None,
) -> PackedBatch:
    """Padded rows (MiniMind style): row r holds `lengths[r]` real inputs from `starts[r]`, then pads
    (input `pad_token_id`, the tokenizer's EOS; target IGNORE_INDEX) up to `row_width`. Pads are
    computed, so they stay in T."""
    starts = np.asarray(starts, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    rows = len(lengths)
    if rows and lengths.max() > row_width:
        raise ValueError(f"a row of {lengths.max()} tokens does not fit a padded width of {row_width}")
    col = np.arange(row_width, dtype=np.int64)
    real = col[None, :] < lengths[:, None]
    index = np.where(real, starts[:, None] + col[None, :], 0)
    # Cast before np.where: mixing uint32 tokens with -100 would wrap around.
    input_ids = np.where(real, np.asarray(tokens[index], dtype=np.int64), pad_token_id)
    targets = np.where(real, np.asarray(tokens[index + 1], dtype=np.int64), IGNORE_INDEX)
    num_targets = int(lengths.sum())
    if loss_mask is not None:  # task=sft: only the marked targets train
        trained = real & trained_targets(loss_mask, index + 1)
        targets = np.where(trained, targets, IGNORE_INDEX)
        num_targets = int(trained.sum())
    seg = np.full(rows, row_width, dtype=np.int64)
    return PackedBatch(
        input_ids=torch.from_numpy(input_ids.reshape(-1)),
        targets=torch.from_numpy(targets.reshape(-1)),
        position_ids=torch.from_numpy(np.tile(col, rows)),
        cu_seqlens=_cu_seqlens(seg),
        max_seqlen=int(row_width),
        num_targets=num_targets,
        pack_lengths=torch.from_numpy(lengths.copy()),
        capacity=int(row_width),
        padded=True,
    )
