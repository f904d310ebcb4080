"""Writes one split of the cache: its token file and index, hashing the bytes as they are written."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .cache import split_files


@dataclass
class SplitWriter:
    """Appends documents to one split's `.bin` and `.jsonl`, hashing the bytes as they are written."""

    directory: Path
    split: str
    budget: int | None
    documents: int = 0
    tokens: int = 0
    _bin_hash: Any = field(default_factory=hashlib.sha256)
    _index_hash: Any = field(default_factory=hashlib.sha256)

    def __post_init__(self):
        bin_name, index_name = split_files(self.split)
        self._bin = open(self.directory / bin_name, "wb")
        self._index = open(self.directory / index_name, "wb")

    @property
    def full(self) -> bool:
        return self.budget is not None and self.tokens >= self.budget

    def write(self, doc_id: str, ids: np.ndarray) -> None:
        data = ids.tobytes()
        line = json.dumps({"id": doc_id, "offset": self.tokens, "length": len(ids)}).encode() + b"\n"
        self._bin.write(data)
        self._index.write(line)
        self._bin_hash.update(data)
        self._index_hash.update(line)
        self.documents += 1
        self.tokens += len(ids)

    def close(self) -> dict:
        for handle in (self._bin, self._index):
            handle.flush()
            os.fsync(handle.fileno())
            handle.close()
        bin_name, index_name = split_files(self.split)
        return {
            "documents": self.documents,
            "tokens": self.tokens,
            "prediction_pairs": self.tokens - self.documents,
            "files": {
                "bin": {"name": bin_name, "bytes": self.tokens * 4, "sha256": self._bin_hash.hexdigest()},
                "index": {
                    "name": index_name,
                    "bytes": (self.directory / index_name).stat().st_size,
                    "sha256": self._index_hash.hexdigest(),
                },
            },
        }

    def abort(self) -> None:
        self._bin.close()
        self._index.close()
