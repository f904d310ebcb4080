"""The packs of the prepacked policy, fixed ahead of time and stored beside the cache.

One file per (split, strategy, max_seq_len, long_docs): `<packs_dir>/<split>-<strategy>-L<max_seq_len>.npz`
(`...-truncate.npz` for data.long_docs=truncate), its header naming the split's fingerprint, so a file
of another split under the same name is rebuilt.
"""

from __future__ import annotations

import json
import logging
import zipfile
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np
from filelock import FileLock

from ....fileio import atomic_write
from ...tokens import TokenSplit
from ..chunking import ChunkTable
from ..packing import best_fit_decreasing, concat_windows
from .layout import Layout, chunk_layout, first_chunk_ids, split_fingerprint

log = logging.getLogger(__name__)

PACKS_FORMAT = 1


class Strategy(StrEnum):
    """`data.strategy`: how the prepacked policy's packs are made."""

    concat = "concat"  # fixed windows over the token stream (nanoGPT / Megatron)
    bfd = "bfd"  # offline best-fit-decreasing of the chunks


def packs_path(
    packs_dir: Path, split_name: str, strategy: str, max_seq_len: int, truncate: bool = False
) -> Path:
    return Path(packs_dir) / f"{split_name}-{strategy}-L{max_seq_len}{'-truncate' if truncate else ''}.npz"


def _read_packs(path: Path, header: dict) -> dict | None:
    try:
        with np.load(path, allow_pickle=False) as data:
            if json.loads(str(data["header"])) != header:
                return None
            return {k: data[k] for k in data.files if k != "header"}
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, json.JSONDecodeError):
        return None


def _build_packs(
    split: TokenSplit, table: ChunkTable, strategy: str, truncate: bool
) -> dict[str, np.ndarray]:
    if strategy == Strategy.bfd:
        if not truncate:
            items, ptr = best_fit_decreasing(table.length, table.max_seq_len)
            return {"items": items, "ptr": ptr}
        first = first_chunk_ids(table)  # each document's first chunk, packed alone
        items, ptr = best_fit_decreasing(table.length[first], table.max_seq_len)
        return {"items": first[items], "ptr": ptr}
    w = concat_windows(
        split.offsets, split.lengths, table.max_seq_len, table.max_seq_len if truncate else None
    )
    return {
        "start": w.start,
        "length": w.length,
        "doc": w.doc,
        "ends_document": w.ends_document,
        "ptr": w.ptr,
    }


def load_or_build_packs(
    split: TokenSplit, table: ChunkTable, strategy: str, packs_dir: Path | None = None, truncate: bool = False
) -> Layout:
    """The prepacked layout of a split: read from `packs_dir` when a file with the same header
    (format, strategy, max_seq_len, split name and fingerprint) is there, else built once and written
    atomically (fileio.atomic_write). The build runs under a file lock in `packs_dir`: of ranks
    starting together one builds, the others wait and then load its file (a 10B-token BFD plan is
    built once, not by every rank at once). Without `packs_dir`, or when it cannot be written (a
    warning says so), the packs are only built in memory."""
    strategy = Strategy(strategy)
    max_seq_len = table.max_seq_len
    header = {
        "format": PACKS_FORMAT,
        "strategy": strategy,
        "max_seq_len": max_seq_len,
        "split": split.name,
        "split_fingerprint": split_fingerprint(split),
        **({"long_docs": "truncate"} if truncate else {}),  # chunk: the header files had before
    }
    path = (
        packs_path(packs_dir, split.name, strategy, max_seq_len, truncate) if packs_dir is not None else None
    )
    stored = _read_packs(path, header) if path is not None and path.exists() else None
    if stored is None and path is not None:
        lock = FileLock(str(path.with_name(f"{path.name}.lock")))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            lock.acquire()
        except OSError as error:
            log.warning("cannot write packs under %s (%s): building them in memory", path.parent, error)
        else:
            try:
                stored = _read_packs(path, header) if path.exists() else None  # another rank's
                if stored is None:
                    if path.exists():
                        log.warning("rebuilding stale or unreadable packs %s", path)
                    stored = _build_packs(split, table, strategy, truncate)
                    arrays: dict[str, Any] = {
                        "header": np.array(json.dumps(header, sort_keys=True)),
                        **stored,
                    }
                    with atomic_write(path) as handle:
                        np.savez(handle, **arrays)
            finally:
                lock.release()
    if stored is None:
        stored = _build_packs(split, table, strategy, truncate)
    return _packs_layout(table, strategy, stored)


def _packs_layout(table: ChunkTable, strategy: Strategy, stored: dict) -> Layout:
    """The layout of stored packs: BFD's index the chunk table, concat's hold their window pieces."""
    max_seq_len = table.max_seq_len
    if strategy == Strategy.bfd:
        return chunk_layout(table, stored["items"], stored["ptr"])
    pieces = ChunkTable(
        doc=np.asarray(stored["doc"], dtype=np.int64),
        start=np.asarray(stored["start"], dtype=np.int64),
        length=np.asarray(stored["length"], dtype=np.int64),
        max_seq_len=max_seq_len,
    )
    return Layout(
        table=pieces,
        rows=None,
        ptr=np.asarray(stored["ptr"], dtype=np.int64),
        ends_document=np.asarray(stored["ends_document"], dtype=bool),
    )
