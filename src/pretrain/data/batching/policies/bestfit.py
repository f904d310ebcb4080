"""`data=bestfit`: each training epoch, a seeded shuffle of the chunks packed online by best fit
from a bounded candidate buffer (`data.packing_buffer`); the packs keep the order they close in.
With `data.long_docs=truncate` the shuffle holds each document's first chunk only."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..chunking import ChunkTable
from ..packing import best_fit_buffered
from .base import PackingConfig, PackingPolicy, is_set, positive_int
from .layout import Layout, chunk_layout, epoch_chunk_order

if TYPE_CHECKING:
    from ...tokens import TokenSplit


def bestfit_layout(table: ChunkTable, order: np.ndarray, buffer: int) -> Layout:
    """Online best fit of the chunks taken in `order` (a permutation of chunk ids)."""
    items, ptr = best_fit_buffered(table.length, table.max_seq_len, buffer, order=np.asarray(order))
    return chunk_layout(table, items, ptr)


@dataclass
class BestfitConfig(PackingConfig):
    packing_buffer: int = 64
    """bestfit: chunks in the best-fit candidate buffer its packs are built from"""

    for_policy = "bestfit"

    def __post_init__(self) -> None:
        super().__post_init__()
        if is_set(self.packing_buffer):
            positive_int(self.packing_buffer, "data.packing_buffer")


class BestfitPolicy(PackingPolicy):
    name = "bestfit"
    test_variants = {
        "bestfit": ("data.packing_buffer=6",),
        "bestfit-truncate": ("data.packing_buffer=6", "data.long_docs=truncate"),
        "bestfit-open": ("data.packing_buffer=6", "data.document_mask=false"),
    }
    golden_variants = {"bestfit": (), "bestfit_accumulation": ("train.accumulation=2", "train.batch_size=2")}
    config_class = BestfitConfig
    config: BestfitConfig
    fixed_layout = False  # packed anew every epoch
    shuffle_units = False  # the chunk order is shuffled before packing; packs keep their order

    def layout(
        self, split: TokenSplit, table: ChunkTable, rng: np.random.Generator, packs_dir: Path | None
    ) -> Layout:
        return bestfit_layout(table, epoch_chunk_order(self, table, rng), self.config.packing_buffer)

    def resume_key(self) -> dict:
        return {**super().resume_key(), "data.packing_buffer": int(self.config.packing_buffer)}
