"""A split of the token cache as the policies see it: one token array plus the document index."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

EOS_TOKEN_ID = 50256


@dataclass(frozen=True)
class TokenSplit:
    """Documents back to back in `tokens` (uint32, usually an np.memmap: never loaded whole);
    document i is tokens[offsets[i] : offsets[i] + lengths[i]], its EOS included."""

    tokens: np.ndarray
    offsets: np.ndarray  # int64
    lengths: np.ndarray  # int64
    ids: tuple[str, ...] = ()
    name: str = "train"

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def num_tokens(self) -> int:
        return int(self.lengths.sum())

    @property
    def num_pairs(self) -> int:
        return int(self.lengths.sum()) - len(self.lengths)

    def document(self, i: int) -> np.ndarray:
        return np.asarray(self.tokens[self.offsets[i] : self.offsets[i] + self.lengths[i]])

    @classmethod
    def from_documents(cls, documents: Sequence[Sequence[int]], name: str = "train", eos: bool = True) -> TokenSplit:
        """An in-memory split (tests, benchmarks); appends EOS to each document unless `eos=False`."""
        docs = [list(d) + ([EOS_TOKEN_ID] if eos else []) for d in documents]
        lengths = np.array([len(d) for d in docs], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if docs else lengths
        tokens = np.array([t for d in docs for t in d], dtype=np.uint32)
        return cls(tokens=tokens, offsets=offsets, lengths=lengths, name=name)

    @classmethod
    def from_lengths(cls, lengths: Sequence[int], name: str = "train", seed: int = 0, vocab: int = 50256) -> TokenSplit:
        """Random-token documents of the given lengths (EOS included in each length)."""
        lengths = np.asarray(lengths, dtype=np.int64)
        rng = np.random.default_rng(seed)
        tokens = rng.integers(0, vocab, size=int(lengths.sum()), dtype=np.uint32)
        ends = np.cumsum(lengths)
        tokens[ends - 1] = EOS_TOKEN_ID
        offsets = (ends - lengths).astype(np.int64)
        return cls(tokens=tokens, offsets=offsets, lengths=lengths, name=name)
