"""A policy's units as flat index arrays (`Layout`), and an epoch of them in order (`EpochPlan`).

Nothing here reads a token: only the split's chunk table (offsets, lengths) is indexed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ....arrays import run_positions
from ...tokens import TokenSplit
from ..chunking import ChunkTable, chunk_table

if TYPE_CHECKING:
    from .base import DataPolicy


def split_chunks(split: TokenSplit, max_seq_len: int) -> ChunkTable:
    """Every chunk of a split (the table samplers and evaluation index)."""
    return chunk_table(split.offsets, split.lengths, max_seq_len)


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


def chunk_layout(table: ChunkTable, items: np.ndarray, ptr: np.ndarray) -> Layout:
    """Units of chunks of `table`: unit u holds chunk ids items[ptr[u] : ptr[u + 1]], stored as int32
    when the table has fewer than 2^31 chunks (4 bytes per chunk)."""
    return Layout(
        table=table,
        rows=np.asarray(items, dtype=index_dtype(len(table))),
        ptr=np.asarray(ptr, dtype=np.int64),
    )


def index_dtype(count: int) -> type[np.signedinteger]:
    return np.int32 if count < 2**31 else np.int64


def shuffled(rng: np.random.Generator, count: int) -> np.ndarray:
    """`rng.permutation(count)`, the same permutation, as int32 when it fits (half the memory and
    a faster shuffle than int64 at 10B-token scale)."""
    order = np.arange(count, dtype=index_dtype(count))
    rng.shuffle(order)
    return order


def epoch_chunk_order(policy: DataPolicy, table: ChunkTable, rng: np.random.Generator) -> np.ndarray:
    """The chunk ids an online packer takes this epoch, in the epoch's seeded shuffle: every chunk,
    or with data.long_docs=truncate each document's first chunk."""
    if table.planned:  # a mixture's epoch: its order interleaves the components' shares
        return np.arange(len(table), dtype=index_dtype(len(table)))
    trained = policy.trained_chunks(table)
    if trained is None:
        return shuffled(rng, len(table))
    return trained.astype(index_dtype(len(table)))[shuffled(rng, len(trained))]


def first_chunk_ids(table: ChunkTable) -> np.ndarray:
    """Global chunk id of each document's first chunk."""
    new_doc = np.ones(len(table), dtype=bool)
    new_doc[1:] = table.doc[1:] != table.doc[:-1]
    return np.flatnonzero(new_doc)


@dataclass(frozen=True)
class EpochPlan:
    """An epoch as arrays only: the layout (index arrays into the sampler's chunk table) and the
    unit order (None: the units in layout order, as bestfit serves them). The order may leave units
    of the layout out (vsl: those that make no whole update): they are dropped like the tail."""

    layout: Layout
    order: np.ndarray | None  # unit ids in epoch order (int32 when they fit); None: 0, 1, 2, ...
    batch_size: int  # units per batch
    global_batches: int  # batches the whole order makes (the last may be partial)
    batches: int  # batches per rank

    @property
    def ordered_units(self) -> int:
        """Units the order holds (every unit of the layout unless the policy left some out)."""
        return len(self.layout) if self.order is None else len(self.order)

    def unordered(self) -> np.ndarray:
        """Unit ids of the layout the order leaves out (int64; empty for a full order)."""
        if self.ordered_units == len(self.layout):
            return np.zeros(0, dtype=np.int64)
        kept = np.zeros(len(self.layout), dtype=bool)
        kept[self.ordered()] = True
        return np.flatnonzero(~kept).astype(np.int64)

    def ordered(self, first: int = 0, stop: int | None = None) -> np.ndarray:
        """Unit ids at epoch positions first..stop-1 (int64)."""
        stop = self.ordered_units if stop is None else min(stop, self.ordered_units)
        if self.order is None:
            return np.arange(first, max(first, stop), dtype=np.int64)
        return self.order[first:stop].astype(np.int64)

    def units_of(self, global_index: int) -> np.ndarray:
        return self.ordered(global_index * self.batch_size, (global_index + 1) * self.batch_size)

    @property
    def real_tokens(self) -> int:
        return self.layout.real_tokens

    @property
    def ordered_tokens(self) -> int:
        """Real tokens of the units the order holds (= real_tokens for a full order)."""
        if self.ordered_units == len(self.layout):
            return self.real_tokens
        return int(self.layout.unit_tokens[self.ordered()].sum())

    @property
    def nbytes(self) -> int:
        """Bytes of this plan's own arrays (layout and order; the chunk table is the sampler's)."""
        return self.layout.nbytes + (0 if self.order is None else self.order.nbytes)


def split_fingerprint(split: TokenSplit) -> str:
    """Identity of a split's index (what every layout depends on): document count, offsets, lengths."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(np.int64(len(split)).tobytes())
    digest.update(np.ascontiguousarray(split.offsets, dtype=np.int64).tobytes())
    digest.update(np.ascontiguousarray(split.lengths, dtype=np.int64).tobytes())
    return digest.hexdigest()
