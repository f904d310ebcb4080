"""`data=prepacked`: packs fixed ahead of time and stored beside the cache (packs.py), the same every
epoch, their order shuffled per epoch. `data.strategy=concat` cuts the token stream into windows of
max_seq_len (nanoGPT / Megatron); `bfd` packs the chunks offline by best-fit-decreasing.

concat windows cross documents: with `data.document_mask=true` (the default) every piece of a window
is its own segment and the pair EOS -> next document's first token is no target; with false a window
is one segment (MiniMind): later documents attend to earlier ones and that pair is trained.
With `data.long_docs=truncate` the stream (concat) or the chunks (bfd) hold each document's first
max_seq_len inputs only.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..chunking import ChunkTable
from .base import PackingConfig, PackingPolicy
from .layout import Layout
from .packs import Strategy, load_or_build_packs

if TYPE_CHECKING:
    from ...tokens import TokenSplit
    from ..batch import PackedBatch

__all__ = ["PrepackedConfig", "PrepackedPolicy", "Strategy"]


@dataclass
class PrepackedConfig(PackingConfig):
    strategy: Strategy = Strategy.concat
    """prepacked: concat (fixed windows over the token stream) or bfd (offline best-fit-decreasing)"""

    for_policy = "prepacked"


class PrepackedPolicy(PackingPolicy):
    name = "prepacked"
    test_variants = {
        "concat-masked": ("data.strategy=concat", "data.document_mask=true"),
        "concat-open": ("data.strategy=concat", "data.document_mask=false"),
        "bfd": ("data.strategy=bfd",),
        "concat-truncate": ("data.strategy=concat", "data.long_docs=truncate"),
        "bfd-truncate": ("data.strategy=bfd", "data.long_docs=truncate"),
        "bfd-open": ("data.strategy=bfd", "data.document_mask=false"),
    }
    golden_variants = {  # windows of 256, so that the served ones cross documents (the mask matters)
        "prepacked_concat": ("data.strategy=concat", "data.max_seq_len=256"),
        "prepacked_bfd": ("data.strategy=bfd",),
        "prepacked_concat_nomask": (
            "data.strategy=concat",
            "data.document_mask=false",
            "data.max_seq_len=256",
        ),
    }
    config_class = PrepackedConfig
    mixes = False  # one stream packed offline, not a table planned per epoch
    config: PrepackedConfig

    def layout(
        self, split: TokenSplit, table: ChunkTable, rng: np.random.Generator, packs_dir: Path | None
    ) -> Layout:
        return load_or_build_packs(split, table, self.config.strategy, packs_dir, truncate=self.truncates)

    def gather_segments(
        self, split: TokenSplit, layout: Layout, items: np.ndarray, counts: np.ndarray
    ) -> PackedBatch:
        """concat: a piece ending on its document's EOS has the next document's first token as its
        last target; it is trained only without the document mask (MiniMind's windows)."""
        import torch

        from ..batch import IGNORE_INDEX

        out = super().gather_segments(split, layout, items, counts)
        if self.config.strategy != Strategy.concat:
            return out
        lengths = layout.lengths(items)
        assert layout.ends_document is not None  # concat windows mark them
        ends = layout.ends_document[items]
        if ends.any():  # the pair EOS -> next document's first token
            rows = torch.from_numpy((np.cumsum(lengths) - 1)[ends])
            if self.config.document_mask or split.loss_mask is not None:  # a loss mask never trains it
                counted = int((out.targets[rows] != IGNORE_INDEX).sum())
                out.targets[rows] = IGNORE_INDEX
                out = replace(out, num_targets=out.num_targets - counted)
            else:
                first = split.offsets[layout.docs(items[ends]) + 1]
                out.targets[rows] = torch.from_numpy(np.asarray(split.tokens[first], dtype=np.int64))
        return out

    def resume_key(self) -> dict:
        key: dict[str, str | bool] = {**super().resume_key(), "data.strategy": str(self.config.strategy)}
        if (
            self.config.strategy == Strategy.concat
        ):  # always named for concat (as before the other policies had it)
            key["data.document_mask"] = bool(self.config.document_mask)
        return key
