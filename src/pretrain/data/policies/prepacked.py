"""`data=prepacked`: packs fixed ahead of time and stored beside the cache (packs.py), the same every
epoch, their order shuffled per epoch. `data.strategy=concat` cuts the token stream into windows of
max_seq_len (nanoGPT / Megatron); `bfd` packs the chunks offline by best-fit-decreasing.

concat windows cross documents: with `data.document_mask=true` (the default) every piece of a window
is its own segment and the pair EOS -> next document's first token is no target; with false a window
is one segment (MiniMind): later documents attend to earlier ones and that pair is trained.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ...arrays import prefix_sums, run_positions
from ..chunking import ChunkTable
from .base import PackingConfig, PackingPolicy, Policy
from .layout import EpochPlan, Layout
from .packs import Strategy, load_or_build_packs

if TYPE_CHECKING:
    from ..batch import PackedBatch
    from ..tokens import TokenSplit

__all__ = ["PrepackedConfig", "PrepackedPolicy", "Strategy"]


@dataclass
class PrepackedConfig(PackingConfig):
    strategy: Strategy = Strategy.concat
    """prepacked: concat (fixed windows over the token stream) or bfd (offline best-fit-decreasing)"""
    document_mask: bool = True
    """prepacked concat: false lets a window's later documents attend to earlier ones (MiniMind)"""

    for_policy = Policy.prepacked


class PrepackedPolicy(PackingPolicy):
    name = Policy.prepacked
    config_class = PrepackedConfig
    config: PrepackedConfig

    def layout(
        self, split: TokenSplit, table: ChunkTable, rng: np.random.Generator, packs_dir: Path | None
    ) -> Layout:
        return load_or_build_packs(split, table, self.config.strategy, packs_dir)

    @property
    def _windows_unmasked(self) -> bool:
        return self.config.strategy == Strategy.concat and not self.config.document_mask

    def gather(self, split: TokenSplit, layout: Layout, items: np.ndarray, counts: np.ndarray) -> PackedBatch:
        import torch

        from ..batch import IGNORE_INDEX

        out = super().gather(split, layout, items, counts)
        if self.config.strategy != Strategy.concat:
            return out
        lengths = layout.lengths(items)
        assert layout.ends_document is not None  # concat windows mark them
        ends = layout.ends_document[items]
        if ends.any():  # the pair EOS -> next document's first token
            rows = torch.from_numpy((np.cumsum(lengths) - 1)[ends])
            if self.config.document_mask:
                out.targets[rows] = IGNORE_INDEX
                out = replace(out, num_targets=out.num_targets - int(ends.sum()))
            else:
                first = split.offsets[layout.docs(items[ends]) + 1]
                out.targets[rows] = torch.from_numpy(np.asarray(split.tokens[first], dtype=np.int64))
        if not self.config.document_mask:  # one segment per window: later documents see earlier ones
            windows = out.pack_lengths.numpy()
            out = replace(
                out,
                cu_seqlens=torch.from_numpy(prefix_sums(windows).astype(np.int32)),
                position_ids=torch.from_numpy(run_positions(windows)),
                max_seqlen=int(windows.max()) if len(windows) else 0,
            )
        return out

    def resume_key(self) -> dict:
        key: dict[str, str | bool] = {"data.strategy": str(self.config.strategy)}
        if self.config.strategy == Strategy.concat:
            key["data.document_mask"] = bool(self.config.document_mask)
        return key

    def segment_lengths(self, plan: EpochPlan) -> np.ndarray:
        """concat windows without the document mask are one segment each; otherwise their pieces."""
        return plan.layout.unit_tokens if self._windows_unmasked else plan.layout.length

    def cross_document_visible_fraction(self, plan: EpochPlan) -> float:
        """Without the document mask, every token of a window after its first piece sees another document."""
        layout = plan.layout
        unit_tokens = layout.unit_tokens
        real = int(unit_tokens.sum())
        if not self._windows_unmasked or not real:
            return 0.0
        first_piece = layout.lengths(layout.ptr[:-1][np.diff(layout.ptr) > 0])
        return float((unit_tokens[unit_tokens > 0] - first_piece).sum() / real)
