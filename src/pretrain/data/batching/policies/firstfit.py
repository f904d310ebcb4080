"""`data=firstfit`: each training epoch, a seeded shuffle of the chunks packed online by first fit
with `data.open_bins` bins open at once (torchtitan's `FirstFitPackIterDataset`, llm-foundry's
`BinPackCollator`): a chunk goes into the first open bin that holds it; when none does and all are
open, the fullest bin is emitted (packing.first_fit_online says why). Packs keep the order they are
emitted in. With `data.long_docs=truncate` the shuffle holds each document's first chunk only."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..chunking import ChunkTable
from ..packing import first_fit_online
from .base import PackingConfig, PackingPolicy, is_set, positive_int
from .layout import Layout, chunk_layout, epoch_chunk_order

if TYPE_CHECKING:
    from ...tokens import TokenSplit


def firstfit_layout(table: ChunkTable, order: np.ndarray, open_bins: int) -> Layout:
    """Online first fit of the chunks taken in `order` (chunk ids) with `open_bins` bins open."""
    items, ptr = first_fit_online(table.length, table.max_seq_len, open_bins, order=np.asarray(order))
    return chunk_layout(table, items, ptr)


@dataclass
class FirstfitConfig(PackingConfig):
    open_bins: int = 8
    """firstfit: bins open at once (a chunk fitting none emits the fullest)"""

    for_policy = "firstfit"

    def __post_init__(self) -> None:
        super().__post_init__()
        if is_set(self.open_bins):
            positive_int(self.open_bins, "data.open_bins")


class FirstfitPolicy(PackingPolicy):
    name = "firstfit"
    test_variants = {
        "firstfit": ("data.open_bins=2",),
        "firstfit-truncate": ("data.open_bins=3", "data.long_docs=truncate"),
        "firstfit-open": ("data.open_bins=2", "data.document_mask=false"),
    }
    config_class = FirstfitConfig
    config: FirstfitConfig
    fixed_layout = False  # packed anew every epoch
    shuffle_units = False  # the chunk order is shuffled before packing; packs keep their order

    def layout(
        self, split: TokenSplit, table: ChunkTable, rng: np.random.Generator, packs_dir: Path | None
    ) -> Layout:
        return firstfit_layout(table, epoch_chunk_order(self, table, rng), self.config.open_bins)

    def resume_key(self) -> dict:
        return {**super().resume_key(), "data.open_bins": int(self.config.open_bins)}
