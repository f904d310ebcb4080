"""A split of the token cache as the policies see it: one token array plus the document index."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..arrays import prefix_sums

# GPT-2's facts, defined once: `<|endoftext|>` closes every cached document, and the vocabulary size.
EOS_TOKEN_ID = 50256
GPT2_VOCAB_SIZE = 50257


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
