"""Several splits' token arrays and document ids read as one, without a copy (a mixture's components
as one split: data/batching/mixture.py)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from ...arrays import prefix_sums


class ConcatTokens:
    """Several token arrays (memory maps) read as one, without a copy: integer-array indexing (any
    shape) and contiguous slices, what batches and statistics use."""

    ndim = 1

    def __init__(self, parts: Sequence[np.ndarray]):
        self.parts = list(parts)
        self.bounds = prefix_sums([len(p) for p in self.parts])
        self.dtype = np.result_type(*[p.dtype for p in self.parts]) if self.parts else np.dtype(np.uint32)

    def __len__(self) -> int:
        return int(self.bounds[-1])

    @property
    def shape(self) -> tuple[int]:
        return (len(self),)

    @property
    def size(self) -> int:
        return len(self)

    def __getitem__(self, key):
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step != 1:
                raise IndexError("ConcatTokens slices take every token")
            pieces = []
            for part, low in zip(self.parts, self.bounds[:-1].tolist(), strict=True):
                a, b = max(start - low, 0), min(stop - low, len(part))
                if a < b:
                    pieces.append(np.asarray(part[a:b], dtype=self.dtype))
            return np.concatenate(pieces) if pieces else np.zeros(0, dtype=self.dtype)
        index = np.asarray(key, dtype=np.int64)
        flat = index.reshape(-1)
        which = np.searchsorted(self.bounds, flat, side="right") - 1
        out = np.empty(len(flat), dtype=self.dtype)
        for i, part in enumerate(self.parts):
            mine = which == i
            if mine.any():
                out[mine] = part[flat[mine] - self.bounds[i]]
        return out.reshape(index.shape) if index.ndim else out[0]


class ConcatIds(Sequence[str]):
    """The document ids of several splits as one sequence (each read only when asked for)."""

    def __init__(self, parts: Sequence[Sequence[str]]):
        self.parts = list(parts)
        self.bounds = prefix_sums([len(p) for p in self.parts])

    def __len__(self) -> int:
        return int(self.bounds[-1])

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = int(i) + (len(self) if int(i) < 0 else 0)
        part = int(np.searchsorted(self.bounds, i, side="right")) - 1
        return self.parts[part][i - int(self.bounds[part])]

    def __iter__(self) -> Iterator[str]:
        for part in self.parts:
            yield from part
