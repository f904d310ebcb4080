"""Array helpers shared by the data and model code."""

from __future__ import annotations

import numpy as np


def prefix_sums(lengths) -> np.ndarray:
    """(n + 1,) int64 boundaries [0, l0, l0 + l1, ...] of consecutive runs of `lengths`: run i spans
    out[i] : out[i + 1] (cu_seqlens, offsets of documents, pointers of packs)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def run_positions(lengths) -> np.ndarray:
    """0..len-1 for each run of `lengths`, concatenated (positions that restart in every segment)."""
    bounds = prefix_sums(lengths)
    return np.arange(int(bounds[-1]), dtype=np.int64) - np.repeat(
        bounds[:-1], np.asarray(lengths, dtype=np.int64)
    )
