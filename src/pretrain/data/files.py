"""File digests shared by the cache, the sources and the tokenizer."""

from __future__ import annotations

import hashlib
from pathlib import Path


def sha256_file(path: Path | str, block_size: int = 1 << 22) -> str:
    """sha256 hex digest of a file, read in blocks (memory does not grow with the file)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(block_size), b""):
            digest.update(block)
    return digest.hexdigest()
