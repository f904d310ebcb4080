"""The three data policies: their settings (read from the config) and the units they batch.

A policy turns a split into *units* (a padded row or a pack), each a list of *items* (a run of
inputs inside one document), then batches units. `Layout` is that description as flat arrays
(what each policy does with it, and its statistics, live in its sampler: samplers.py):

* `padded`: one unit per document, its first chunk only (truncated to max_seq_len inputs);
* `prepacked`: packs fixed ahead of time and stored beside the cache (`concat` windows or offline
  `bfd` of the chunks), see `load_or_build_packs`;
* `bestfit`: per epoch, online best fit of the shuffled chunks from a bounded candidate buffer.

Nothing here reads a token: only the split's index (offsets, lengths) is used.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import uuid
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from filelock import FileLock

from ..arrays import run_positions
from ..errors import ConfigError
from .chunking import ChunkTable, check_max_seq_len, chunk_table
from .packing import best_fit_buffered, best_fit_decreasing, concat_windows
from .tokens import TokenSplit

if TYPE_CHECKING:
    from ..config import DataConfig, TrainConfig

log = logging.getLogger(__name__)

POLICIES = ("padded", "prepacked", "bestfit")
STRATEGIES = ("concat", "bfd")
PAD_TO = ("max", "longest")
PACKS_FORMAT = 1

_BOTH_SIZES = "set only one of train.batch_size and train.microbatch_tokens (e.g. train.batch_size=null)"


def _positive_int(value, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or int(value) < 1:
        raise ConfigError(f"{key} must be a positive integer, got {value!r}")
    return int(value)


def _choice(value, key: str, choices: tuple[str, ...]) -> str:
    if str(value) not in choices:
        raise ConfigError(f"unknown {key} {str(value)!r}; choose one of {', '.join(choices)}")
    return str(value)


@dataclass(frozen=True)
class PolicySettings:
    """What the samplers need, validated. Each field is the config key of the same name (`data.*`,
    `train.*`, `seed`); `batch_size` is resolved from `train.microbatch_tokens` when that is set."""

    policy: str
    max_seq_len: int
    seed: int
    batch_size: int
    eval_microbatch_tokens: int
    val_batches: int | None
    accumulation: int
    pad_to: str
    strategy: str
    document_mask: bool
    packing_buffer: int

    def __post_init__(self) -> None:
        _choice(self.policy, "data.policy", POLICIES)
        check_max_seq_len(self.max_seq_len)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int | np.integer):
            raise ConfigError(f"seed must be an integer, got {self.seed!r}")
        _positive_int(self.batch_size, "train.batch_size")
        _positive_int(self.eval_microbatch_tokens, "train.eval_microbatch_tokens")
        if self.val_batches is not None:
            _positive_int(self.val_batches, "train.val_batches")
        _positive_int(self.accumulation, "train.accumulation")
        _choice(self.pad_to, "data.pad_to", PAD_TO)
        _choice(self.strategy, "data.strategy", STRATEGIES)
        if not isinstance(self.document_mask, bool):
            raise ConfigError(f"data.document_mask must be true or false, got {self.document_mask!r}")
        _positive_int(self.packing_buffer, "train.packing_buffer")

    @property
    def eval_batch_size(self) -> int:
        """Validation packs (or rows) per microbatch: train.eval_microbatch_tokens // data.max_seq_len."""
        return max(1, self.eval_microbatch_tokens // self.max_seq_len)

    @classmethod
    def from_config(cls, data: DataConfig, train: TrainConfig, seed: int) -> PolicySettings:
        """From the typed `data` and `train` groups and the run seed."""
        max_seq_len = check_max_seq_len(data.max_seq_len)
        batch_size, microbatch_tokens = train.batch_size, train.microbatch_tokens
        if batch_size is not None and microbatch_tokens is not None:
            raise ConfigError(_BOTH_SIZES)
        if batch_size is None and microbatch_tokens is None:
            raise ConfigError(
                "set one of train.batch_size (packs per microbatch) and train.microbatch_tokens"
            )
        if batch_size is None:
            batch_size = max(1, _positive_int(microbatch_tokens, "train.microbatch_tokens") // max_seq_len)
        return cls(
            policy=str(data.policy),
            max_seq_len=max_seq_len,
            seed=seed,
            batch_size=batch_size,
            eval_microbatch_tokens=train.eval_microbatch_tokens,
            val_batches=train.val_batches,
            accumulation=train.accumulation,
            pad_to=str(data.pad_to),
            strategy=str(data.strategy),
            document_mask=data.document_mask,
            packing_buffer=train.packing_buffer,
        )


@dataclass(frozen=True)
class Layout:
    """Units (padded rows or packs) of a split: unit u holds items ptr[u] : ptr[u + 1], item i being
    row `rows[i]` of `table`, i.e. inputs tokens[start : start + length] of document doc (targets one
    token further). `table` is the split's chunk table (padded, bestfit, bfd) or concat's window
    pieces; `rows` is None when the items are the table's rows in order (concat windows).

    Only int64 index arrays are held: 8 bytes per item plus the pointers (the chunk table is the
    sampler's, shared by every epoch), never a copy of the chunks' start, length or doc per plan.
    `start`, `length`, `doc` and `item_id` give whole arrays (materialised: statistics only);
    `starts`, `lengths`, `docs` and `ids` give those of some items (what a batch needs).

    `item_id` names items for bookkeeping: the global chunk id in the split's chunk table, or for
    concat windows the piece index. `ends_document` (concat only) marks items whose last input is
    their document's EOS, so that their last target is the next document's first token."""

    table: ChunkTable
    rows: np.ndarray | None
    ptr: np.ndarray
    ends_document: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.ptr) - 1

    @property
    def num_items(self) -> int:
        return len(self.table) if self.rows is None else len(self.rows)

    def _rows(self, items: np.ndarray) -> np.ndarray:
        return items if self.rows is None else self.rows[items]

    def starts(self, items: np.ndarray) -> np.ndarray:
        return self.table.start[self._rows(items)]

    def lengths(self, items: np.ndarray) -> np.ndarray:
        return self.table.length[self._rows(items)]

    def docs(self, items: np.ndarray) -> np.ndarray:
        return self.table.doc[self._rows(items)]

    def ids(self, items: np.ndarray) -> np.ndarray:
        return np.asarray(self._rows(np.asarray(items, dtype=np.int64)), dtype=np.int64)

    @property
    def item_id(self) -> np.ndarray:
        return np.arange(len(self.table), dtype=np.int64) if self.rows is None else self.rows

    @property
    def start(self) -> np.ndarray:
        return self.table.start if self.rows is None else self.table.start[self.rows]

    @property
    def length(self) -> np.ndarray:
        return self.table.length if self.rows is None else self.table.length[self.rows]

    @property
    def doc(self) -> np.ndarray:
        return self.table.doc if self.rows is None else self.table.doc[self.rows]

    @property
    def real_tokens(self) -> int:
        """Real tokens of all units (summed in blocks: no whole-epoch temporary)."""
        if self.rows is None:
            return int(self.table.length.sum())
        block = 1 << 20
        return sum(
            int(self.table.length[self.rows[i : i + block]].sum()) for i in range(0, len(self.rows), block)
        )

    @property
    def unit_tokens(self) -> np.ndarray:
        """Real tokens per unit."""
        length = self.length
        if len(length) == 0:
            return np.zeros(len(self), dtype=np.int64)
        sums = np.add.reduceat(length, np.minimum(self.ptr[:-1], len(length) - 1))
        return np.where(np.diff(self.ptr) > 0, sums, 0)

    @property
    def nbytes(self) -> int:
        """Bytes this layout holds beyond the chunk table it indexes (concat: its pieces too)."""
        own = self.ptr.nbytes + (0 if self.ends_document is None else self.ends_document.nbytes)
        if self.rows is None:
            table = self.table
            return own + table.doc.nbytes + table.start.nbytes + table.length.nbytes
        return own + self.rows.nbytes

    def items_of(self, units: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Item indices of `units` (in that order) and the number of items of each unit."""
        units = np.asarray(units, dtype=np.int64)
        first = self.ptr[units]
        counts = self.ptr[units + 1] - first
        return np.repeat(first, counts) + run_positions(counts), counts


def _chunk_layout(table: ChunkTable, items: np.ndarray, ptr: np.ndarray) -> Layout:
    """Items are chunk ids (int32 when the table has fewer than 2^31 chunks: 4 bytes per chunk)."""
    return Layout(
        table=table,
        rows=np.asarray(items, dtype=_index_dtype(len(table))),
        ptr=np.asarray(ptr, dtype=np.int64),
    )


def _index_dtype(count: int) -> type[np.signedinteger]:
    return np.int32 if count < 2**31 else np.int64


def shuffled(rng: np.random.Generator, count: int) -> np.ndarray:
    """`rng.permutation(count)`, the same permutation, as int32 when it fits (half the memory and
    a faster shuffle than int64 at 10B-token scale)."""
    order = np.arange(count, dtype=_index_dtype(count))
    rng.shuffle(order)
    return order


def first_chunk_ids(table: ChunkTable) -> np.ndarray:
    """Global chunk id of each document's first chunk."""
    new_doc = np.ones(len(table), dtype=bool)
    new_doc[1:] = table.doc[1:] != table.doc[:-1]
    return np.flatnonzero(new_doc)


def padded_layout(table: ChunkTable) -> Layout:
    """One row per document: its first chunk (max_seq_len inputs at most; the rest is truncated)."""
    items = first_chunk_ids(table)
    return _chunk_layout(table, items, np.arange(len(items) + 1, dtype=np.int64))


def bestfit_layout(table: ChunkTable, order: np.ndarray, buffer: int) -> Layout:
    """Online best fit of the chunks taken in `order` (a permutation of chunk ids)."""
    items, ptr = best_fit_buffered(table.length, table.max_seq_len, buffer, order=np.asarray(order))
    return _chunk_layout(table, items, ptr)


def bfd_layout(table: ChunkTable) -> Layout:
    items, ptr = best_fit_decreasing(table.length, table.max_seq_len)
    return _chunk_layout(table, items, ptr)


def split_fingerprint(split: TokenSplit) -> str:
    """Identity of a split's index (what every layout depends on): document count, offsets, lengths."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(np.int64(len(split)).tobytes())
    digest.update(np.ascontiguousarray(split.offsets, dtype=np.int64).tobytes())
    digest.update(np.ascontiguousarray(split.lengths, dtype=np.int64).tobytes())
    return digest.hexdigest()


def packs_path(packs_dir: Path, split_name: str, strategy: str, max_seq_len: int) -> Path:
    return Path(packs_dir) / f"{split_name}-{strategy}-L{max_seq_len}.npz"


def _write_atomic(path: Path, arrays: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "wb") as handle:
            np.savez(handle, **arrays)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _read_packs(path: Path, header: dict) -> dict | None:
    try:
        with np.load(path, allow_pickle=False) as data:
            if json.loads(str(data["header"])) != header:
                return None
            return {k: data[k] for k in data.files if k != "header"}
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, json.JSONDecodeError):
        return None


def _build_packs(split: TokenSplit, table: ChunkTable, strategy: str) -> dict[str, np.ndarray]:
    if strategy == "bfd":
        items, ptr = best_fit_decreasing(table.length, table.max_seq_len)
        return {"items": items, "ptr": ptr}
    w = concat_windows(split.offsets, split.lengths, table.max_seq_len)
    return {
        "start": w.start,
        "length": w.length,
        "doc": w.doc,
        "ends_document": w.ends_document,
        "ptr": w.ptr,
    }


def load_or_build_packs(
    split: TokenSplit, table: ChunkTable, strategy: str, packs_dir: Path | None = None
) -> Layout:
    """The prepacked layout of a split: read from `packs_dir` when a file with the same header
    (format, strategy, max_seq_len, split name and fingerprint) is there, else built once and written
    atomically (tmp file + os.replace). The build runs under a file lock in `packs_dir`: of ranks
    starting together one builds, the others wait and then load its file (a 10B-token BFD plan is
    built once, not by every rank at once). Without `packs_dir`, or when it cannot be written (a
    warning says so), the packs are only built in memory."""
    _choice(strategy, "data.strategy", STRATEGIES)
    max_seq_len = table.max_seq_len
    header = {
        "format": PACKS_FORMAT,
        "strategy": strategy,
        "max_seq_len": max_seq_len,
        "split": split.name,
        "split_fingerprint": split_fingerprint(split),
    }
    path = packs_path(packs_dir, split.name, strategy, max_seq_len) if packs_dir is not None else None
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
                    stored = _build_packs(split, table, strategy)
                    _write_atomic(path, {"header": np.array(json.dumps(header, sort_keys=True)), **stored})
            finally:
                lock.release()
    if stored is None:
        stored = _build_packs(split, table, strategy)
    if strategy == "bfd":
        return _chunk_layout(table, stored["items"], stored["ptr"])
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


def split_chunks(split: TokenSplit, max_seq_len: int) -> ChunkTable:
    return chunk_table(split.offsets, split.lengths, max_seq_len)
