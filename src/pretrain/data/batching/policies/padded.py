"""`data=padded`: the MiniMind baseline. One document per row (its first chunk, max_seq_len inputs at
most: the rest is truncated, `data.long_docs=truncate`, the default here), rows padded with targets
-100 to max_seq_len (`data.pad_to=max`) or to the batch's longest row (`longest`). With
`data.long_docs=chunk` every chunk of a document is its own padded row (nothing is truncated). Pad
rows are really computed, so they count in its cost."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..chunking import ChunkTable
from .base import DataConfig, DataPolicy, LongDocs
from .layout import EpochPlan, Layout, chunk_layout

if TYPE_CHECKING:
    from ...tokens import TokenSplit
    from ..batch import PackedBatch


class PadTo(StrEnum):
    """`data.pad_to`: the width of a padded row."""

    max = "max"  # max_seq_len
    longest = "longest"  # the batch's longest row


@dataclass
class PaddedConfig(DataConfig):
    pad_to: PadTo = PadTo.max
    """padded: pad rows to max_seq_len (max) or to the batch's longest row (longest)"""
    long_docs: LongDocs = LongDocs.truncate  # the MiniMind baseline keeps each document's first chunk

    for_policy = "padded"


class PaddedPolicy(DataPolicy):
    name = "padded"
    test_variants = {
        "padded-max": ("data.pad_to=max",),
        "padded-longest": ("data.pad_to=longest",),
        "padded-chunk": ("data.long_docs=chunk",),
    }
    golden_variants = {"padded_max": (), "padded_longest": ("data.pad_to=longest",)}
    config_class = PaddedConfig
    unit_name = "rows"
    baseline = True  # one document per row, padded: what packing is measured against
    config: PaddedConfig

    def layout(
        self, split: TokenSplit, table: ChunkTable, rng: np.random.Generator, packs_dir: Path | None
    ) -> Layout:
        """One row per chunk trained: each document's first (truncate), or every chunk (chunk)."""
        first = self.trained_chunks(table)
        items = np.arange(len(table), dtype=np.int64) if first is None else first
        return chunk_layout(table, items, np.arange(len(items) + 1, dtype=np.int64))

    def _width(self, lengths: np.ndarray) -> int:
        return self.max_seq_len if self.config.pad_to == PadTo.max else int(lengths.max())

    def gather(self, split: TokenSplit, layout: Layout, items: np.ndarray, counts: np.ndarray) -> PackedBatch:
        from ..batch import gather_padded

        lengths = layout.lengths(items)
        return gather_padded(
            split.tokens,
            layout.starts(items),
            lengths,
            self._width(lengths),
            pad_token_id=split.eos_token_id,
            loss_mask=split.loss_mask,
        )

    def resume_key(self) -> dict:
        return {**super().resume_key(), "data.pad_to": str(self.config.pad_to)}

    def attention_segments(self, plan: EpochPlan) -> np.ndarray:
        """Each row's padded width, in epoch order: max_seq_len, or its batch's longest row."""
        rows = len(plan.layout)
        if self.config.pad_to == PadTo.max:
            return np.full(rows, self.max_seq_len, dtype=np.int64)
        if not rows:
            return np.zeros(0, dtype=np.int64)
        ordered = plan.layout.unit_tokens[plan.ordered()]
        heads = np.arange(0, rows, plan.batch_size)
        return np.repeat(np.maximum.reduceat(ordered, heads), np.diff(np.append(heads, rows)))

    def computed_rows(self, plan: EpochPlan) -> int:
        """Every row is computed at its padded width: max_seq_len, or its batch's longest row."""
        return int(self.attention_segments(plan).sum())

    def slots(self, plan: EpochPlan) -> int:
        return self.computed_rows(plan)  # a padded row holds its padded width

    def evaluation_units(self, table: ChunkTable, buffer: int) -> tuple[np.ndarray, np.ndarray]:
        """Each chunk its own row (nothing is truncated in evaluation)."""
        return np.arange(len(table), dtype=np.int64), np.arange(len(table) + 1, dtype=np.int64)

    def evaluation_batch(
        self, split: TokenSplit, starts: np.ndarray, lengths: np.ndarray, counts: np.ndarray
    ) -> PackedBatch:
        from ..batch import gather_padded

        return gather_padded(
            split.tokens,
            starts,
            lengths,
            self._width(lengths),
            pad_token_id=split.eos_token_id,
            loss_mask=split.loss_mask,
        )
