"""A split of the token cache as the policies see it: one token array plus the document index."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..arrays import prefix_sums
from ..errors import CacheError
from . import index
from .gpt2 import EOS_TOKEN_ID, GPT2_VOCAB_SIZE

# The loss-mask byte of a task=sft split (TokenSplit.loss_mask; written by data/ingest/chat.py):
TRAINED = np.uint8(1)  # bit 0: the token is a trained target (the pair previous token -> it counts)
CUT = np.uint8(2)  # bit 1: whole exchanges end just before this token (truncate cuts only there)

__all__ = ["EOS_TOKEN_ID", "GPT2_VOCAB_SIZE", "DocumentIds", "TokenSplit"]  # the GPT-2 ids: pretrain.gpt2


class DocumentIds(Sequence[str]):
    """The document ids of a cached split, read from its JSONL index only when first asked for
    (statistics, audits): loading a split for training never parses JSON nor holds a string per
    document. Its length is known without reading."""

    def __init__(self, index_path: Path, count: int):
        self.path = Path(index_path)
        self._count = int(count)
        self._ids: tuple[str, ...] | None = None
        self._lock = threading.Lock()

    def _load(self) -> tuple[str, ...]:
        with self._lock:
            if self._ids is None:
                ids = index.read_index(self.path)[0]
                if len(ids) != self._count:
                    raise CacheError(
                        f"{self.path} has {len(ids)} documents, the split has {self._count}; "
                        "rebuild it with cache.rebuild=true"
                    )
                self._ids = ids
            return self._ids

    def __getstate__(self) -> dict:  # picklable (DataLoader workers): the lock stays behind
        return {"path": self.path, "count": self._count, "ids": self._ids}

    def __setstate__(self, state: dict) -> None:
        self.path, self._count, self._ids = state["path"], state["count"], state["ids"]
        self._lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        return self._ids is not None

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, i):
        return self._load()[i]

    def __iter__(self) -> Iterator[str]:
        return iter(self._load())

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and tuple(self) == tuple(other)

    def __hash__(self) -> int:
        return hash((str(self.path), self._count))

    def __repr__(self) -> str:
        return f"DocumentIds({str(self.path)!r}, {self._count})"


class SubsetIds(Sequence[str]):
    """Some of a split's document ids, by index (a view of DocumentIds: nothing read until asked)."""

    def __init__(self, ids: Sequence[str], keep: np.ndarray):
        self._ids, self._keep = ids, np.asarray(keep, dtype=np.int64)

    def __len__(self) -> int:
        return len(self._keep)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._ids[int(j)] for j in self._keep[i]]
        return self._ids[int(self._keep[i])]

    def __iter__(self) -> Iterator[str]:
        return (self._ids[int(j)] for j in self._keep)


@dataclass(frozen=True)
class TokenSplit:
    """Documents back to back in `tokens` (uint16 or uint32, usually an np.memmap: never loaded whole);
    document i is tokens[offsets[i] : offsets[i] + lengths[i]], its EOS included. Gather with numpy
    and cast (`np.asarray(tokens[index], dtype=np.int64)`): torch has little uint16 support.
    `ids` is a sequence of document ids (lazy for a cached split: see DocumentIds)."""

    tokens: np.ndarray
    offsets: np.ndarray  # int64
    lengths: np.ndarray  # int64
    ids: Sequence[str] = ()
    name: str = "train"
    eos_token_id: int = EOS_TOKEN_ID  # the tokenizer's EOS (what padded rows' pad inputs hold)
    # task=sft: a byte per token beside `tokens` (ingest/chat.py): bit 0 the token is a trained target,
    # bit 1 whole exchanges end before it. None: every target trains (pretraining).
    loss_mask: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def num_tokens(self) -> int:
        return int(self.lengths.sum())

    @property
    def num_pairs(self) -> int:
        return int(self.lengths.sum()) - len(self.lengths)

    def view(self, keep: np.ndarray, lengths: np.ndarray) -> TokenSplit:
        """The documents `keep` (indices, in order) with their first `lengths` tokens each: the same
        token file and mask, another index (a conversation cut at its last whole exchange)."""
        keep = np.asarray(keep, dtype=np.int64)
        return TokenSplit(
            tokens=self.tokens,
            offsets=self.offsets[keep],
            lengths=np.asarray(lengths, dtype=np.int64),
            ids=SubsetIds(self.ids, keep),
            name=self.name,
            eos_token_id=self.eos_token_id,
            loss_mask=self.loss_mask,
        )

    def document(self, i: int) -> np.ndarray:
        return np.asarray(self.tokens[self.offsets[i] : self.offsets[i] + self.lengths[i]])

    @classmethod
    def from_lengths(
        cls,
        lengths: Sequence[int] | np.ndarray,
        name: str = "train",
        seed: int = 0,
        vocab: int = EOS_TOKEN_ID,
    ) -> TokenSplit:
        """Random-token documents of the given lengths (EOS included in each length; body tokens < vocab):
        synthetic splits for benchmarks, the GPU check and tests."""
        sizes = np.asarray(lengths, dtype=np.int64)
        rng = np.random.default_rng(seed)
        tokens = rng.integers(0, vocab, size=int(sizes.sum()), dtype=np.uint32)
        bounds = prefix_sums(sizes)
        tokens[bounds[1:] - 1] = EOS_TOKEN_ID
        return cls(tokens=tokens, offsets=bounds[:-1], lengths=sizes, name=name)
