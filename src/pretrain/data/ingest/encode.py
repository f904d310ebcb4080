"""Encoding documents: digest, split and tokenize a batch (what a prepare worker does per part), and
the cross-check of tiktoken against the reference `tokenizers` on a sample of them."""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

import numpy as np

from ...errors import SourceError, TokenizerError
from ..sources import Document
from .split import document_split
from .tokenizer import Encoder, TokenizerFiles, TokenizersEncoder, build_encoder

CROSS_CHECK_DOCUMENTS = 100  # tiktoken builds: documents re-encoded with `tokenizers` (per build)
CROSS_CHECK_RATE = 16  # ... picked among every 16th document by digest, then 1 in 4096 thereafter


@dataclass
class Encoded:
    """One part (or batch) of documents, encoded: what the writer needs and nothing else."""

    rows: int  # rows read, blank ones included
    doc_rows: np.ndarray  # int64, per non-blank document: its row within the part
    digests: bytes  # 32 bytes per document: sha256 of its UTF-8 text
    validation: np.ndarray  # bool per document: its split is validation
    lengths: np.ndarray  # int64 per document: tokens, EOS included
    tokens: np.ndarray  # the documents' ids back to back, EOS after each (uint32, or uint16 if asked)
    mask: np.ndarray | None = None  # task=sft: uint8 per token (ingest/chat.py: TRAINED, CUT bits)
    special_text: int = 0  # conversations left out: a message holds a special token's text


@functools.lru_cache(maxsize=2)
def _reference_encoder(files: TokenizerFiles) -> TokenizersEncoder:
    return TokenizersEncoder(files)


class CrossCheck:
    """Re-encodes a sample of the documents with `tokenizers` (the reference) and compares ids."""

    def __init__(self, files: TokenizerFiles, quota: int = CROSS_CHECK_DOCUMENTS):
        self.files, self.quota, self.checked = files, quota, 0
        self._reference: TokenizersEncoder | None = None

    def wanted(self, digest: bytes) -> bool:
        if self.checked < self.quota:
            return digest[0] % CROSS_CHECK_RATE == 0
        return digest[0] == 0 and digest[1] % 16 == 0  # 1 in 4096: a thin check across the whole build

    def check(self, texts: list[str], origins: list[str], digests: list[bytes], ids, lengths) -> None:
        picked = [j for j, digest in enumerate(digests) if self.wanted(digest)]
        if not picked:
            return
        if self._reference is None:
            self._reference = _reference_encoder(self.files)
        expected, expected_lengths = self._reference.encode([texts[j] for j in picked])
        ends = np.cumsum(lengths)
        position = 0
        for j, n in zip(picked, expected_lengths.tolist(), strict=True):
            got = ids[ends[j] - lengths[j] : ends[j]]
            want = expected[position : position + n]
            position += n
            if len(got) != len(want) or not np.array_equal(got, want):
                raise TokenizerError(
                    f"tiktoken and tokenizers disagree on document {digests[j].hex()} ({origins[j]}): "
                    f"{len(got)} vs {len(want)} ids; rerun with prepare.encoder=tokenizers (and report it)"
                )
        self.checked += len(picked)


def cached_encoder(files: TokenizerFiles, choice: str) -> tuple[Encoder, str | None]:
    """`build_encoder`, memoised per process on the files' stat (building tiktoken's ranks: ~0.5 s)."""
    stats = tuple((p.stat().st_size, p.stat().st_mtime_ns) for p in (files.vocab, files.merges))
    return _cached_encoder(files, choice, stats)


@functools.lru_cache(maxsize=4)
def _cached_encoder(files: TokenizerFiles, choice: str, stats: tuple) -> tuple[Encoder, str | None]:
    return build_encoder(files, choice)


def encode_documents(
    documents: list[Document],
    encoder: Encoder,
    split: dict,
    checker: CrossCheck | None = None,
    dtype: str = "uint32",
) -> Encoded:
    """Digest, split and tokenize a list of documents (blank ones are counted, not encoded)."""
    texts, origins, doc_rows = [], [], []
    for row, doc in enumerate(documents):
        text = doc.text
        if text and not text.isspace():  # == bool(text.strip()), without the copy
            texts.append(text)
            origins.append(doc.origin)
            doc_rows.append(row)
    digests = []
    for text, origin in zip(texts, origins, strict=True):
        try:
            digests.append(hashlib.sha256(text.encode()).digest())
        except UnicodeEncodeError as error:
            raise SourceError(f"{origin}: the text is not valid Unicode ({error})") from error
    seed, fraction = split["seed"], split["validation_fraction"]
    validation = np.fromiter(
        (document_split(d.hex(), seed, fraction) == "validation" for d in digests),
        dtype=bool,
        count=len(texts),
    )
    mask, special_text = None, 0
    if hasattr(encoder, "encode_masked"):  # conversations (ingest/chat.py): ids, mask, EOS included
        tokens, lengths, mask, kept = encoder.encode_masked(texts, origins)
        if not kept.all():
            special_text = int((~kept).sum())
            doc_rows = [row for row, keep in zip(doc_rows, kept.tolist(), strict=True) if keep]
            digests = [digest for digest, keep in zip(digests, kept.tolist(), strict=True) if keep]
            validation = validation[kept]
        lengths = lengths - 1  # as for documents below: lengths + 1 counts the closing EOS
    else:
        ids, lengths = encoder.encode(texts)
        if checker is not None:
            checker.check(texts, origins, digests, ids, lengths)
        tokens = np.insert(ids, np.cumsum(lengths), np.uint32(encoder.eos_token_id))
    if dtype == "uint16" and (tokens.size == 0 or int(tokens.max()) < 1 << 16):
        tokens = tokens.astype(np.uint16)  # else the writer names the id that does not fit
    return Encoded(
        rows=len(documents),
        doc_rows=np.asarray(doc_rows, dtype=np.int64),
        digests=b"".join(digests),
        validation=validation,
        lengths=lengths + 1,
        tokens=tokens,
        mask=mask,
        special_text=special_text,
    )
