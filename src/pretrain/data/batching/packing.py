"""Packing algorithms: which chunks share a pack. Pure index arithmetic; no token is read.

* `best_fit_decreasing`: offline Best-Fit-Decreasing ("Fewer Truncations Improve Language
  Modeling", Ding et al. 2024) in O(N log L) with a segment tree over remaining capacities.
* `best_fit_buffered`: online best fit from a bounded candidate buffer over a given chunk order.
* `first_fit_online`: online first fit with a bounded number of open bins over a given chunk order
  (torchtitan's `FirstFitPackIterDataset`, llm-foundry's `BinPackCollator`).
* `concat_windows`: the split's token stream cut into fixed windows (nanoGPT / Megatron style),
  described as pieces that each lie inside one document.

A packing is returned as `(items, ptr)`: pack p holds items[ptr[p] : ptr[p + 1]] in that order.

The three planners run as numba kernels (packing_kernels.py) when numba is importable: a
10B-token epoch (~13M chunks) plans in about a second, in flat arrays only. Without numba (or with
`PRETRAIN_NO_NUMBA=1`, or for an input under KERNEL_MIN_ITEMS items, where loading the kernels
costs more than they save) the pure-Python reference implementations run instead
(`_best_fit_buffered_reference`, `_best_fit_decreasing_reference`, `_first_fit_online_reference`):
the same packs, exactly, item for item (tests/test_plan_equivalence.py), only slower.
"""

from __future__ import annotations

import heapq
import logging
import os
from bisect import bisect_right, insort
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from ...arrays import prefix_sums

_SEQ_BITS = 32
_SEQ_MASK = (1 << _SEQ_BITS) - 1
_KERNEL_MAX_ITEMS = 2**31 - 2  # the kernels index items with int32
_kernels: ModuleType | None | bool = False  # False: not looked up yet; None: numba unavailable


def _check_lengths(lengths: np.ndarray, capacity: int, keep_dtype: bool = False) -> np.ndarray:
    """`lengths` as int64 (or as they are, when `keep_dtype` and already integers: no copy of an
    int32 chunk table), checked to lie in 1..capacity."""
    lengths = np.asarray(lengths)
    if not keep_dtype or lengths.dtype.kind not in "iu":
        lengths = lengths.astype(np.int64, copy=False)
    if capacity < 1:
        raise ValueError(f"pack capacity must be >= 1, got {capacity}")
    if len(lengths) and (lengths.min() < 1 or lengths.max() > capacity):
        raise ValueError(f"chunk lengths must lie in 1..{capacity}, got {lengths.min()}..{lengths.max()}")
    return lengths


KERNEL_MIN_ITEMS = 32_768
"""Inputs with fewer items than this plan (and chunk) without the kernels: at their first use they
cost their import, numba, llvmlite and scipy.linalg (~0.6 CPU s and ~90 MB here: a smoke run's
start-up, bench/bench_fixed_costs.py), while the references take under ~0.1 s at this size. The
result is the same either way. `PRETRAIN_NUMBA_MIN_ITEMS` sets another threshold (0: always)."""


def _min_items() -> int:
    value = os.environ.get("PRETRAIN_NUMBA_MIN_ITEMS", "")
    try:
        return int(value) if value else KERNEL_MIN_ITEMS
    except ValueError:
        raise ValueError(
            f"PRETRAIN_NUMBA_MIN_ITEMS={value!r} must be a whole number (0: always numba)"
        ) from None


def numba_kernels(items: int | None = None) -> ModuleType | None:
    """The compiled planners (packing_kernels) for an input of `items` items, or None when numba is
    not importable, `PRETRAIN_NO_NUMBA` is set, or `items` is below the threshold (KERNEL_MIN_ITEMS;
    both checked on every call; the import happens once)."""
    global _kernels
    if os.environ.get("PRETRAIN_NO_NUMBA", "") not in ("", "0"):
        return None
    if items is not None and items < _min_items():
        return None
    if _kernels is False:
        try:
            from . import packing_kernels

            _kernels = packing_kernels
        except ImportError:
            _kernels = None
        except Exception as error:  # e.g. numba finds no writable cache directory for cache=True
            logging.getLogger(__name__).warning(
                "numba kernels unavailable (%s: %s); planning with the pure-Python reference "
                "implementations (set NUMBA_CACHE_DIR to a writable directory)",
                type(error).__name__,
                error,
            )
            _kernels = None
    return _kernels if isinstance(_kernels, ModuleType) else None


def best_fit_decreasing(lengths: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """Offline Best-Fit-Decreasing of items `lengths` (indices 0..N-1) into packs of `capacity`.

    Items are taken longest first (ties: lower index first); each goes into the open pack whose
    remaining space is the smallest that still holds it (ties: the pack opened first), else opens
    a new pack. Returns (items, ptr) with packs in the order they were opened, items in insertion
    order (int64 both). numba kernel when available, else `_best_fit_decreasing_reference`.
    """
    lengths = _check_lengths(lengths, capacity, keep_dtype=True)
    kernels = numba_kernels(len(lengths))
    if kernels is None or len(lengths) > _KERNEL_MAX_ITEMS or capacity > kernels.MAX_KEY:
        return _best_fit_decreasing_reference(lengths, capacity)
    return kernels.best_fit_decreasing_kernel(lengths, int(capacity))


def best_fit_buffered(
    lengths: np.ndarray, capacity: int, buffer: int, order: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Online best fit over the items in the given order (item i has length lengths[i]).

    A candidate buffer holds the next `buffer` items of the order. A pack is filled by repeatedly
    taking the longest buffered item that fits the space left (ties: the earliest in the order),
    refilling the buffer from the order after each take; the pack closes when nothing buffered fits.
    Without `order` the items come in index order and (positions, ptr) is returned, int64 both.
    With `order` (a permutation of some item indices, e.g. an epoch's chunk order) the items come
    as order[0], order[1], ... and (order[positions], ptr) is returned, in order's dtype: the same
    as `best_fit_buffered(lengths[order], ...)` mapped through `order`, without the gathered copy.
    numba kernel when available, else `_best_fit_buffered_reference`.
    """
    if buffer < 1:
        raise ValueError(f"data.packing_buffer must be >= 1, got {buffer}")
    kernels = numba_kernels(len(lengths) if order is None else len(order))
    fast = kernels is not None and capacity <= kernels.MAX_KEY
    if order is not None:
        order = np.asarray(order)
        if not fast or len(order) > _KERNEL_MAX_ITEMS:
            seq, ptr = _best_fit_buffered_reference(np.asarray(lengths)[order], capacity, buffer)
            return order[seq], ptr
        _check_lengths(lengths, capacity, keep_dtype=True)  # every item, whether in order or not
    else:
        lengths = _check_lengths(lengths, capacity, keep_dtype=True)
        if not fast or len(lengths) > _KERNEL_MAX_ITEMS:
            return _best_fit_buffered_reference(lengths, capacity, buffer)
        order = np.arange(len(lengths), dtype=np.int64)
    assert kernels is not None
    return kernels.best_fit_buffered_kernel(
        lengths, order, int(capacity), int(min(buffer, max(len(order), 1)))
    )


def first_fit_online(
    lengths: np.ndarray, capacity: int, open_bins: int, order: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Online first fit over the items in the given order (item i has length lengths[i]), with at
    most `open_bins` bins open at once.

    An item goes into the first open bin (oldest first) whose space left holds it; a bin left exactly
    full is emitted at once (nothing fits it any more). When no open bin holds the item, it opens a new
    bin; if `open_bins` are already open, the fullest one (least space left; ties: the oldest) is
    emitted first. The fullest, because it is the bin least likely to take a later item: emitting it
    wastes the fewest slots of all the open bins (llm-foundry's `BinPackCollator` emits its fullest
    bins too; torchtitan's `FirstFitPackIterDataset` keeps 8 bins open). At the end the bins still open
    are emitted oldest first. Packs come in the order they are emitted.
    Without `order` the items come in index order and (positions, ptr) is returned, int64 both; with
    `order` (a permutation of some item indices) (order[positions], ptr), in order's dtype.
    numba kernel when available, else `_first_fit_online_reference`.
    """
    if open_bins < 1:
        raise ValueError(f"data.open_bins must be >= 1, got {open_bins}")
    # More bins than items never all fill: capping changes nothing but the kernels' allocations.
    open_bins = max(1, min(int(open_bins), len(lengths) if order is None else len(order)))
    kernels = numba_kernels(len(lengths) if order is None else len(order))
    if order is not None:
        order = np.asarray(order)
        _check_lengths(lengths, capacity, keep_dtype=True)
        if kernels is None or len(order) > _KERNEL_MAX_ITEMS:
            seq, ptr = _first_fit_online_reference(np.asarray(lengths)[order], capacity, open_bins)
            return order[seq], ptr
    else:
        lengths = _check_lengths(lengths, capacity, keep_dtype=True)
        if kernels is None or len(lengths) > _KERNEL_MAX_ITEMS:
            return _first_fit_online_reference(lengths, capacity, open_bins)
        order = np.arange(len(lengths), dtype=np.int64)
    return kernels.first_fit_online_kernel(lengths, order, int(capacity), int(open_bins))


# --- the pure-Python reference implementations (the fallback without numba) -----------------------


def _best_fit_decreasing_reference(lengths: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """Reference (pure Python) of `best_fit_decreasing`: offline Best-Fit-Decreasing of items
    `lengths` (indices 0..N-1) into packs of `capacity`.

    Items are taken longest first (ties: lower index first); each goes into the open pack whose
    remaining space is the smallest that still holds it (ties: the pack opened first), else opens
    a new pack. A max segment tree over remaining capacities 1..capacity (leaf r holds r while some
    pack has exactly r left) finds that pack in O(log L); a heap per remaining capacity breaks ties.
    Returns (items, ptr) with packs in the order they were opened, items in insertion order.
    """
    lengths = _check_lengths(lengths, capacity)
    order = np.argsort(-lengths, kind="stable")
    size = 1
    while size < capacity + 1:
        size *= 2
    tree = [0] * (2 * size)  # tree[size + r] = r if some open pack has r left, else 0
    bins_at: list[list[int]] = [[] for _ in range(capacity + 1)]  # heaps of pack ids by space left
    contents: list[list[int]] = []

    def set_leaf(r: int, value: int) -> None:
        node = size + r
        tree[node] = value
        node >>= 1
        while node:
            best = tree[2 * node] if tree[2 * node] > tree[2 * node + 1] else tree[2 * node + 1]
            if tree[node] == best:
                break
            tree[node] = best
            node >>= 1

    for item, length in zip(order.tolist(), lengths[order].tolist(), strict=True):
        if tree[1] >= length:
            node = 1
            while node < size:  # leftmost leaf >= length: the smallest sufficient space
                node = 2 * node if tree[2 * node] >= length else 2 * node + 1
            space = node - size
            heap = bins_at[space]
            pack = heapq.heappop(heap)
            if not heap:
                set_leaf(space, 0)
            contents[pack].append(item)
        else:
            space = capacity
            pack = len(contents)
            contents.append([item])
        left = space - length
        if left:
            if not bins_at[left]:
                set_leaf(left, left)
            heapq.heappush(bins_at[left], pack)
    items = np.fromiter((i for pack in contents for i in pack), dtype=np.int64, count=len(lengths))
    return items, prefix_sums([len(pack) for pack in contents])


def _best_fit_buffered_reference(
    lengths: np.ndarray, capacity: int, buffer: int
) -> tuple[np.ndarray, np.ndarray]:
    """Reference (pure Python) of `best_fit_buffered`: online best fit over the items in the given
    order (item i has length lengths[i]).

    A candidate buffer holds the next `buffer` items of the order. A pack is filled by repeatedly
    taking the longest buffered item that fits the space left (ties: the earliest in the order),
    refilling the buffer from the order after each take; the pack closes when nothing buffered fits.
    The buffer is a sorted list of keys length << 32 | (mask - seq): one bisect finds the item.
    """
    lengths = _check_lengths(lengths, capacity)
    if buffer < 1:
        raise ValueError(f"data.packing_buffer must be >= 1, got {buffer}")
    n = len(lengths)
    if n >= _SEQ_MASK:
        raise ValueError(f"too many chunks for one packing pass: {n}")
    keys_in = ((lengths << _SEQ_BITS) | (_SEQ_MASK - np.arange(n, dtype=np.int64))).tolist()
    keys = sorted(keys_in[:buffer])
    nxt = min(buffer, n)
    taken: list[int] = []
    sizes: list[int] = []
    append = taken.append
    while keys:
        space = capacity
        count = 0
        while True:
            i = bisect_right(keys, (space << _SEQ_BITS) | _SEQ_MASK) - 1
            if i < 0:
                break
            key = keys.pop(i)
            append(key)
            count += 1
            space -= key >> _SEQ_BITS
            if nxt < n:
                insort(keys, keys_in[nxt])
                nxt += 1
            if not space:
                break
        sizes.append(count)
    seq = _SEQ_MASK - (np.array(taken, dtype=np.int64) & _SEQ_MASK)
    return seq, prefix_sums(sizes)


def _first_fit_online_reference(
    lengths: np.ndarray, capacity: int, open_bins: int
) -> tuple[np.ndarray, np.ndarray]:
    """Reference (pure Python) of `first_fit_online`: online first fit over the items in the given
    order with at most `open_bins` bins open; the fullest open bin (ties: the oldest) is emitted when
    an item fits none of them and no bin may open, a bin left exactly full at once, the rest at the end.
    """
    lengths = _check_lengths(lengths, capacity)
    if open_bins < 1:
        raise ValueError(f"data.open_bins must be >= 1, got {open_bins}")
    bins: list[list[int]] = []  # the open bins, oldest first: item positions
    spaces: list[int] = []
    packs: list[list[int]] = []
    for position, length in enumerate(lengths.tolist()):
        target = next((b for b, space in enumerate(spaces) if length <= space), -1)
        if target < 0:
            if len(bins) == open_bins:
                fullest = spaces.index(min(spaces))  # index() finds the oldest of equals
                packs.append(bins.pop(fullest))
                spaces.pop(fullest)
            bins.append([])
            spaces.append(capacity)
            target = len(bins) - 1
        bins[target].append(position)
        spaces[target] -= length
        if spaces[target] == 0:
            packs.append(bins.pop(target))
            spaces.pop(target)
    packs.extend(bins)
    items = np.fromiter((i for pack in packs for i in pack), dtype=np.int64, count=len(lengths))
    return items, prefix_sums([len(pack) for pack in packs])


@dataclass(frozen=True)
class Windows:
    """Fixed windows over the split's token stream (documents in index order, EOS included).

    Window w has inputs stream[wL : wL + L] (the last one shorter) and targets one further; it is
    described by pieces ptr[w] : ptr[w + 1], each inside one document: inputs tokens[start : start +
    length] of document doc. `ends_document` marks pieces whose last input is their document's EOS:
    its target is the next document's first token (a cross-document pair, not a real one).
    """

    start: np.ndarray  # int64 token offset of the piece's first input in the token file
    length: np.ndarray  # int64
    doc: np.ndarray  # int64
    ends_document: np.ndarray  # bool
    ptr: np.ndarray  # int64, len = windows + 1

    def __len__(self) -> int:
        return len(self.ptr) - 1


def concat_windows(
    offsets: np.ndarray, lengths: np.ndarray, capacity: int, max_inputs: int | None = None
) -> Windows:
    """Cut the stream of all documents (N tokens, N - 1 pairs) into ceil((N - 1) / capacity) windows.

    With `max_inputs` (data.long_docs=truncate) a document of more than `max_inputs` pairs puts only
    its first `max_inputs` inputs in the stream (their targets one token further, inside it): it ends
    on no EOS, so its last piece is no `ends_document` and the rest of it is never served."""
    offsets = np.asarray(offsets, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    truncated = np.zeros(len(lengths), dtype=bool)
    if max_inputs is not None:
        truncated = lengths - 1 > max_inputs
        lengths = np.where(truncated, max_inputs, lengths)  # the inputs each document puts in the stream
    doc_start = prefix_sums(lengths)
    # The last EOS has no target; a truncated last document keeps every input's target.
    inputs = max(int(doc_start[-1]) - (0 if len(lengths) and truncated[-1] else 1), 0)
    empty = np.zeros(0, dtype=np.int64)
    if inputs == 0:
        return Windows(empty, empty, empty, np.zeros(0, dtype=bool), np.zeros(1, dtype=np.int64))
    # The pieces start at the union of the window starts (multiples of capacity) and the document
    # starts inside the stream, built in linear time (np.union1d hashes, searchsorted is n log n:
    # seconds at 10M documents). Every document puts a token in the stream, so its starts ascend
    # strictly, and an inner start's place in the union is the window starts below it plus the
    # inner starts before it that are no window start; the window starts fill the other places.
    if len(lengths) and int(lengths.min()) < 1:
        raise ValueError("every document must have at least one token (its EOS)")
    windows = -(-inputs // capacity)
    inner = doc_start[1 : int(np.searchsorted(doc_start, inputs, side="left"))]  # in (0, inputs)
    below, into = np.divmod(inner, capacity)
    on_window = into == 0
    # window starts below (ceil(inner / capacity)) + the inner starts before that are no window start
    place = below + ~on_window + np.arange(len(inner)) - (np.cumsum(on_window) - on_window)
    bounds = np.empty(windows + len(inner) - int(np.count_nonzero(on_window)), dtype=np.int64)
    is_window = np.ones(len(bounds), dtype=bool)
    is_window[place] = False
    bounds[place] = inner
    kept = np.ones(windows, dtype=bool)
    kept[below[on_window]] = False
    bounds[is_window] = np.arange(0, inputs, capacity, dtype=np.int64)[kept]
    doc = np.cumsum(~is_window, dtype=np.int64)  # document starts at or before each piece
    is_window[place[on_window]] = True  # a document start on a window start begins that window
    ptr = np.append(np.flatnonzero(is_window), len(bounds)).astype(np.int64)
    piece_end = np.append(bounds[1:], inputs)
    ends_document = piece_end == doc_start[doc + 1]
    if max_inputs is not None:
        ends_document &= ~truncated[doc]
    return Windows(
        start=offsets[doc] + (bounds - doc_start[doc]),
        length=piece_end - bounds,
        doc=doc,
        ends_document=ends_document,
        ptr=ptr,
    )
