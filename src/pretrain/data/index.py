"""A cached split's document index on disk, read back: `<split>.jsonl` (one `{"id", "offset",
"length"}` line per document) and `<split>.index.npy` (offsets and lengths as int64, shape (2, N)).

Below both the cache (which verifies the two agree) and the token split (whose document ids are read
from the JSONL only when asked for), so neither imports the other to read it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import CacheError

REBUILD_HINT = "rebuild it with cache.rebuild=true (or delete the directory)"


def read_index(path: Path) -> tuple[tuple[str, ...], np.ndarray, np.ndarray]:
    """(ids, offsets, lengths) of a `.jsonl` index, parsed with pyarrow (fast for millions of lines)."""
    if path.stat().st_size == 0:
        return (), np.zeros(0, np.int64), np.zeros(0, np.int64)
    import pyarrow.json as pajson

    try:
        table = pajson.read_json(path)
    except Exception as error:  # pyarrow's ArrowInvalid: not JSON lines
        raise CacheError(f"{path} is not a valid JSON lines index ({error}); {REBUILD_HINT}") from error
    missing = {"id", "offset", "length"} - set(table.column_names)
    if missing:
        raise CacheError(f"{path} lacks the fields {sorted(missing)}; {REBUILD_HINT}")
    ids = tuple(table.column("id").to_pylist())
    offsets = table.column("offset").to_numpy().astype(np.int64)
    lengths = table.column("length").to_numpy().astype(np.int64)
    return ids, offsets, lengths


def read_index_array(path: Path, documents: int, mmap: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, lengths) from `<split>.index.npy` (int64, shape (2, documents)): no JSON, no Python
    object per document; memory-mapped, so ranks share the pages."""
    try:
        table = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (OSError, ValueError) as error:
        raise CacheError(f"{path} cannot be read as an index array ({error}); {REBUILD_HINT}") from error
    if table.dtype != np.dtype("<i8") or table.shape != (2, documents):
        raise CacheError(
            f"{path} holds {table.dtype} {table.shape}, expected int64 (2, {documents}); {REBUILD_HINT}"
        )
    return np.asarray(table[0]), np.asarray(table[1])
