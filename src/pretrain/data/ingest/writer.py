"""Writes one split of the cache: its token file, its JSONL index and the index's binary twin,
hashing the bytes as they are written.

`<split>.bin` holds the documents' tokens back to back in `token_dtype` (uint16 or uint32,
little-endian), `<split>.jsonl` one line `{"id":...,"offset":...,"length":...}` per document, and
`<split>.index.npy` the same offsets and lengths as one int64 array of shape (2, documents), which
training loads with np.load (no JSON parsing, no Python object per document). A task=sft cache adds
`<split>.mask.bin`: one byte per token, its loss-mask bits (ingest/chat.py).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import CacheError
from ..files import sha256_file


class TokenDtype(StrEnum):
    """`cache.token_dtype`: `auto` picks uint16 when every id fits, else uint32 (part of the identity)."""

    auto = "auto"
    uint16 = "uint16"
    uint32 = "uint32"


TOKEN_DTYPES = tuple(str(d) for d in TokenDtype if d is not TokenDtype.auto)  # what a cache stores


def split_files(split: str, masked: bool = False) -> dict[str, str]:
    """The files of one split, by their kind in the manifest (`splits.<split>.files.<kind>`); `masked`:
    with the loss mask of a task=sft cache."""
    names = {"bin": f"{split}.bin", "index": f"{split}.jsonl", "index_npy": f"{split}.index.npy"}
    return {**names, "mask": f"{split}.mask.bin"} if masked else names


def token_dtype(value: Any) -> np.dtype:
    """The little-endian numpy dtype of a cache's tokens: uint16 or uint32 (a name or a numpy type)."""
    dtype = np.dtype(value).newbyteorder("<")
    if dtype.name not in TOKEN_DTYPES:
        raise ValueError(f"token_dtype must be uint16 or uint32, got {dtype}")
    return dtype


def index_lines(doc_ids: list[str], offsets: np.ndarray, lengths: np.ndarray) -> bytes:
    """The JSONL index lines of consecutive documents (compact JSON, one line each)."""
    return "".join(
        f'{{"id":{json.dumps(doc_id)},"offset":{offset},"length":{length}}}\n'
        for doc_id, offset, length in zip(doc_ids, offsets.tolist(), lengths.tolist(), strict=True)
    ).encode()


@dataclass
class SplitWriter:
    """Appends documents to one split's files, hashing the bytes as they are written.

    `write(doc_id, ids)` takes one document (its EOS included); `write_many(doc_ids, tokens, lengths)`
    takes several back to back and writes exactly the bytes of the same `write` calls. Tokens are stored
    as `token_dtype`; a token that does not fit it is an error, never a silent wrap-around.
    """

    directory: Path
    split: str
    budget: int | None
    token_dtype: Any = np.uint32
    masked: bool = False  # task=sft: a loss-mask byte per token (`<split>.mask.bin`)
    documents: int = 0
    tokens: int = 0
    _bin_hash: Any = field(default_factory=hashlib.sha256)
    _index_hash: Any = field(default_factory=hashlib.sha256)
    _mask_hash: Any = field(default_factory=hashlib.sha256)

    def __post_init__(self):
        self.directory = Path(self.directory)
        self.token_dtype = token_dtype(self.token_dtype)
        self._limit = int(np.iinfo(self.token_dtype).max)
        self._lengths = np.zeros(1024, dtype=np.int64)  # grows by doubling: no object per document
        names = split_files(self.split, self.masked)
        self._bin = open(self.directory / names["bin"], "wb")
        self._index = open(self.directory / names["index"], "wb")
        self._mask = open(self.directory / names["mask"], "wb") if self.masked else None

    @property
    def full(self) -> bool:
        return self.budget is not None and self.tokens >= self.budget

    def write(self, doc_id: str, ids: np.ndarray, mask: np.ndarray | None = None) -> None:
        ids = np.asarray(ids)
        self.write_many([doc_id], ids, np.array([len(ids)], dtype=np.int64), mask=mask)

    def write_many(
        self, doc_ids: list[str], tokens: np.ndarray, lengths: np.ndarray, mask: np.ndarray | None = None
    ) -> None:
        """Several documents at once: `tokens` back to back, `lengths[i]` tokens (EOS included) each;
        `mask` their loss-mask bytes (a masked writer needs them, another refuses them)."""
        tokens = np.asarray(tokens)
        lengths = np.asarray(lengths, dtype=np.int64)
        if len(doc_ids) != len(lengths) or int(lengths.sum()) != len(tokens) or lengths.ndim != 1:
            raise ValueError(
                f"write_many: {len(doc_ids)} ids, {len(lengths)} lengths summing to {int(lengths.sum())} "
                f"and {len(tokens)} tokens do not describe the same documents"
            )
        if len(lengths) and int(lengths.min()) < 1:
            raise ValueError("write_many: every document has at least its EOS token")
        if (mask is not None) != self.masked or (mask is not None and len(mask) != len(tokens)):
            raise ValueError(
                f"write_many: a {'masked' if self.masked else 'plain'} split got "
                f"{'no mask' if mask is None else f'{len(mask)} mask bytes for {len(tokens)} tokens'}"
            )
        data = self._encode(tokens)
        offsets = self.tokens + np.cumsum(lengths) - lengths
        lines = index_lines(doc_ids, offsets, lengths)
        self._bin.write(data)
        self._index.write(lines)
        self._bin_hash.update(data)
        self._index_hash.update(lines)
        if self._mask is not None and mask is not None:
            mask_bytes = np.asarray(mask, dtype=np.uint8).tobytes()
            self._mask.write(mask_bytes)
            self._mask_hash.update(mask_bytes)
        self._remember(lengths)
        self.documents += len(lengths)
        self.tokens += len(tokens)

    def _encode(self, tokens: np.ndarray) -> bytes:
        if tokens.dtype == self.token_dtype:
            return tokens.tobytes()
        if tokens.size and (
            tokens.dtype.kind not in "ui" or int(tokens.min()) < 0 or int(tokens.max()) > self._limit
        ):
            raise CacheError(
                f"a token id of {self.split} does not fit the cache's {self.token_dtype.name} tokens "
                f"(ids {int(tokens.min())}..{int(tokens.max())}); set cache.token_dtype=uint32"
            )
        return tokens.astype(self.token_dtype).tobytes()

    def _remember(self, lengths: np.ndarray) -> None:
        need = self.documents + len(lengths)
        if need > len(self._lengths):
            grown = np.zeros(max(need, 2 * len(self._lengths)), dtype=np.int64)
            grown[: self.documents] = self._lengths[: self.documents]
            self._lengths = grown
        self._lengths[self.documents : need] = lengths

    def close(self) -> dict:
        for handle in (self._bin, self._index, self._mask):
            if handle is None:
                continue
            handle.flush()
            os.fsync(handle.fileno())
            handle.close()
        names = split_files(self.split, self.masked)
        lengths = self._lengths[: self.documents]
        table = np.stack([np.cumsum(lengths) - lengths, lengths]).astype("<i8")
        npy = self.directory / names["index_npy"]
        with open(npy, "wb") as handle:
            np.save(handle, table, allow_pickle=False)
            handle.flush()
            os.fsync(handle.fileno())
        masked = {}
        if self.masked:
            masked = {
                "mask": {"name": names["mask"], "bytes": self.tokens, "sha256": self._mask_hash.hexdigest()}
            }
        return {
            "documents": self.documents,
            "tokens": self.tokens,
            "prediction_pairs": self.tokens - self.documents,
            "token_dtype": self.token_dtype.name,
            "files": {
                **masked,
                "bin": {
                    "name": names["bin"],
                    "bytes": self.tokens * self.token_dtype.itemsize,
                    "sha256": self._bin_hash.hexdigest(),
                },
                "index": {
                    "name": names["index"],
                    "bytes": (self.directory / names["index"]).stat().st_size,
                    "sha256": self._index_hash.hexdigest(),
                },
                "index_npy": {
                    "name": names["index_npy"],
                    "bytes": npy.stat().st_size,
                    "sha256": sha256_file(npy),
                },
            },
        }

    def abort(self) -> None:
        self._bin.close()
        self._index.close()
        if self._mask is not None:
            self._mask.close()
