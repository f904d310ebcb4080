"""numba kernels of the packing planners: both best fits and online first fit (packing.py imports this
module only when numba is importable; its pure-Python reference implementations give exactly the
same packs).

Compiled once and cached on disk: beside this file when its folder is writable, else in numba's
per-user cache (`NUMBA_CACHE_DIR` moves it). `make install` compiles them ahead (`python -m
pretrain.data.packing_kernels`: every kernel for the int32/int64 arrays the planners pass), so the first
run does not (~4 s). Where no cache folder is writable at all (a read-only install and home), they are
compiled at every start without caching, with one warning, rather than left to the pure-Python
planners. Every array is numpy; no Python object per item.
"""

from __future__ import annotations

import logging
import time

import numpy as np
from numba import njit


def _probe():  # pragma: no cover - only decorated, never called
    return 0


def _cache_available() -> bool:
    """Whether numba can cache functions of this file: it looks for a writable folder (beside the
    file, then per user) when a function is decorated with cache=True, and raises if none is."""
    try:
        njit(cache=True)(_probe)
    except RuntimeError as error:  # "cannot cache function ...: no locator available for file ..."
        logging.getLogger(__name__).warning(
            "numba cannot cache the packing kernels (%s); they compile at every start (a few seconds): "
            "set NUMBA_CACHE_DIR to a writable directory",
            error,
        )
        return False
    return True


CACHED = _cache_available()
_kernel = njit(cache=CACHED, nogil=True)

# A three-level bitset over keys 0..MAX_KEY (32-bit words held in int64: no sign or overflow
# trouble): level 0 has a bit per key, level 1 a bit per non-empty level-0 word, level 2 (one word)
# a bit per non-empty level-1 word. Finding the nearest set key above or below a point is a few
# word operations (de Bruijn bit scans), whatever the number of keys set.
MAX_KEY = 32**3 - 1
_DEBRUIJN = 0x077CB531
_CTZ = np.array(
    [0, 1, 28, 2, 29, 14, 24, 3, 30, 22, 20, 15, 25, 17, 4, 8, 31, 27, 13, 23, 21, 19, 16, 7, 26, 12, 18, 6]
    + [11, 5, 10, 9],
    dtype=np.int64,
)
_WORD = 0xFFFFFFFF


@_kernel
def _ctz(m):
    """Index of the lowest set bit of a non-zero 32-bit value."""
    return _CTZ[(((m & -m) * _DEBRUIJN) & _WORD) >> 27]


@_kernel
def _msb(v):
    """Index of the highest set bit of a non-zero 32-bit value."""
    v |= v >> 1
    v |= v >> 2
    v |= v >> 4
    v |= v >> 8
    v |= v >> 16
    return _ctz(v ^ (v >> 1))


@_kernel
def new_bitset(max_key):
    """(level 0, level 1, level 2) for keys 0..max_key (<= MAX_KEY)."""
    words = (max_key >> 5) + 1
    return (
        np.zeros(words, dtype=np.int64),
        np.zeros((words >> 5) + 1, dtype=np.int64),
        np.zeros(1, dtype=np.int64),
    )


@_kernel
def bit_set(b0, b1, b2, key):
    w0 = key >> 5
    b0[w0] |= 1 << (key & 31)
    b1[w0 >> 5] |= 1 << (w0 & 31)
    b2[0] |= 1 << (w0 >> 5)


@_kernel
def bit_clear(b0, b1, b2, key):
    w0 = key >> 5
    b0[w0] &= ~(1 << (key & 31))
    if b0[w0] == 0:
        w1 = w0 >> 5
        b1[w1] &= ~(1 << (w0 & 31))
        if b1[w1] == 0:
            b2[0] &= ~(1 << w1)


@_kernel
def bit_at_most(b0, b1, b2, key):
    """The largest set key <= key, or -1."""
    w0 = key >> 5
    m = b0[w0] & ((2 << (key & 31)) - 1)
    if m:
        return (w0 << 5) | _msb(m)
    w1 = w0 >> 5
    m = b1[w1] & ((1 << (w0 & 31)) - 1)
    if m:
        w = (w1 << 5) | _msb(m)
        return (w << 5) | _msb(b0[w])
    m = b2[0] & ((1 << w1) - 1)
    if m:
        v = _msb(m)
        w = (v << 5) | _msb(b1[v])
        return (w << 5) | _msb(b0[w])
    return -1


@_kernel
def bit_at_least(b0, b1, b2, key):
    """The smallest set key >= key, or -1 (key <= the bitset's max_key)."""
    w0 = key >> 5
    m = (b0[w0] >> (key & 31)) << (key & 31)
    if m:
        return (w0 << 5) | _ctz(m)
    w1 = w0 >> 5
    shift = (w0 & 31) + 1
    m = (b1[w1] >> shift) << shift
    if m:
        w = (w1 << 5) | _ctz(m)
        return (w << 5) | _ctz(b0[w])
    shift = w1 + 1
    m = (b2[0] >> shift) << shift
    if m:
        v = _ctz(m)
        w = (v << 5) | _ctz(b1[v])
        return (w << 5) | _ctz(b0[w])
    return -1


@_kernel
def gather_block(lengths, order, block, first):
    """block[k] = lengths[order[first + k]], the block ending at the returned position; a short last
    block is right-aligned (block[size - count:]), so position p is always block[p - end + size]."""
    size = block.shape[0]
    end = min(first + size, order.shape[0])
    offset = size - (end - first)
    for k in range(end - first):
        block[offset + k] = lengths[order[first + k]]
    return end


@_kernel
def best_fit_buffered_kernel(lengths, order, capacity, buffer):
    """Best fit over the items order[0], order[1], ... (item i has length lengths[i]); returns the
    items pack by pack (order's dtype) and the int64 pack pointers.

    Per-length FIFO queues of the buffered positions (a position enters its queue in order, so the
    head is the earliest of its length) and a bitset of the lengths whose queue is not empty: the
    longest buffered item that fits `space` is the largest set length <= space."""
    n = order.shape[0]
    b0, b1, b2 = new_bitset(capacity)
    head = np.full(capacity + 1, -1, dtype=np.int32)
    tail = np.full(capacity + 1, -1, dtype=np.int32)
    after = np.full(n, -1, dtype=np.int32)  # next position in the same length's queue
    out = np.empty(n, dtype=order.dtype)
    sizes = np.empty(n, dtype=np.int32)  # items per pack
    # The lengths of the order are gathered a block at a time ahead of use: a tight gather loop
    # overlaps its cache misses, a lookup inside the packing loop would wait for each one.
    block = np.empty(min(n, 1 << 14), dtype=lengths.dtype)
    block_end = 0
    queued = 0
    nxt = 0
    while nxt < n and nxt < buffer:
        if nxt >= block_end:
            block_end = gather_block(lengths, order, block, nxt)
        length = block[nxt - block_end + block.shape[0]]
        if head[length] < 0:
            head[length] = nxt
            bit_set(b0, b1, b2, length)
        else:
            after[tail[length]] = nxt
        tail[length] = nxt
        nxt += 1
        queued += 1
    taken = 0
    packs = 0
    while queued > 0:
        space = capacity
        count = 0
        while True:
            length = bit_at_most(b0, b1, b2, space)
            if length <= 0:
                break
            position = head[length]
            head[length] = after[position]
            if head[length] < 0:
                bit_clear(b0, b1, b2, length)
            out[taken] = order[position]
            taken += 1
            count += 1
            queued -= 1
            space -= length
            if nxt < n:
                if nxt >= block_end:
                    block_end = gather_block(lengths, order, block, nxt)
                length = block[nxt - block_end + block.shape[0]]
                if head[length] < 0:
                    head[length] = nxt
                    bit_set(b0, b1, b2, length)
                else:
                    after[tail[length]] = nxt
                tail[length] = nxt
                nxt += 1
                queued += 1
            if space == 0:
                break
        sizes[packs] = count
        packs += 1
    ptr = np.zeros(packs + 1, dtype=np.int64)
    for p in range(packs):
        ptr[p + 1] = ptr[p] + sizes[p]
    return out, ptr


@_kernel
def emit_bin(slot, opened, space, head, tail, count, after, order, out, taken, sizes, packs):
    """Write open bin `slot`'s items (a linked list of positions from head[slot]) to `out` from
    `taken`, record its size as pack `packs`, and close the gap it leaves in the slots (oldest
    first, so slot order stays opening order). Returns the new `taken`."""
    position = head[slot]
    while position >= 0:
        out[taken] = order[position]
        taken += 1
        position = after[position]
    sizes[packs] = count[slot]
    for k in range(slot, opened - 1):
        space[k] = space[k + 1]
        head[k] = head[k + 1]
        tail[k] = tail[k + 1]
        count[k] = count[k + 1]
    return taken


@_kernel
def first_fit_online_kernel(lengths, order, capacity, open_bins):
    """First fit over the items order[0], order[1], ... (item i has length lengths[i]) with at most
    `open_bins` bins open (packing.first_fit_online says the rule); returns the items pack by pack
    (order's dtype) and the int64 pack pointers.

    The open bins sit in slots 0..opened-1, oldest first, each a linked list of positions (`after`):
    a scan of the few slots finds the first that fits (O(open_bins) per item)."""
    n = order.shape[0]
    space = np.zeros(open_bins, dtype=np.int64)
    head = np.full(open_bins, -1, dtype=np.int64)
    tail = np.full(open_bins, -1, dtype=np.int64)
    count = np.zeros(open_bins, dtype=np.int64)
    after = np.full(n, -1, dtype=np.int32)  # the next position in the same bin
    out = np.empty(n, dtype=order.dtype)
    sizes = np.empty(n, dtype=np.int64)  # items per pack
    block = np.empty(min(n, 1 << 14), dtype=lengths.dtype)  # lengths gathered ahead (see best fit)
    block_end = 0
    opened = 0
    taken = 0
    packs = 0
    for position in range(n):
        if position >= block_end:
            block_end = gather_block(lengths, order, block, position)
        length = block[position - block_end + block.shape[0]]
        slot = -1
        for k in range(opened):
            if space[k] >= length:
                slot = k
                break
        if slot >= 0:
            after[tail[slot]] = position
            count[slot] += 1
        else:
            if opened == open_bins:  # emit the fullest (the oldest of equals)
                fullest = 0
                for k in range(1, opened):
                    if space[k] < space[fullest]:
                        fullest = k
                taken = emit_bin(
                    fullest, opened, space, head, tail, count, after, order, out, taken, sizes, packs
                )
                opened -= 1
                packs += 1
            slot = opened
            opened += 1
            space[slot] = capacity
            head[slot] = position
            count[slot] = 1
        tail[slot] = position
        space[slot] -= length
        if space[slot] == 0:  # exactly full: nothing fits it any more
            taken = emit_bin(slot, opened, space, head, tail, count, after, order, out, taken, sizes, packs)
            opened -= 1
            packs += 1
    while opened > 0:  # the bins still open, oldest first
        taken = emit_bin(0, opened, space, head, tail, count, after, order, out, taken, sizes, packs)
        opened -= 1
        packs += 1
    ptr = np.zeros(packs + 1, dtype=np.int64)
    for p in range(packs):
        ptr[p + 1] = ptr[p] + sizes[p]
    return out, ptr


@_kernel
def heap_meld(a, b, child, sibling):
    """Pairing heap (min by pack id): the root with the larger id becomes the other's first child."""
    if b < a:
        a, b = b, a
    sibling[b] = child[a]
    child[a] = b
    return a


@_kernel
def heap_pop(root, space, child, sibling, stack):
    """Pop the smallest pack id of the heap at `space` (two-pass pairing of the root's children)."""
    top = root[space]
    c = child[top]
    m = 0
    while c >= 0:
        a = c
        b = sibling[a]
        if b < 0:
            sibling[a] = -1
            stack[m] = a
            m += 1
            break
        c = sibling[b]
        sibling[a] = -1
        sibling[b] = -1
        stack[m] = heap_meld(a, b, child, sibling)
        m += 1
    if m == 0:
        root[space] = -1
    else:
        merged = stack[m - 1]
        for k in range(m - 2, -1, -1):
            merged = heap_meld(stack[k], merged, child, sibling)
        root[space] = merged
    child[top] = -1
    return top


@_kernel
def best_fit_decreasing_kernel(lengths, capacity):
    """Longest first (a counting sort: ties keep the lower index first); a bitset of the remaining
    spaces that some open pack has finds the smallest sufficient space, and per space the packs
    with that much left give the one opened first: a FIFO of the packs that arrived in increasing
    id order (nearly all of them: new packs have the largest id) plus a pairing heap of the few that
    arrived out of order; the smaller of the FIFO's head and the heap's root is the pack."""
    n = lengths.shape[0]
    counts = np.zeros(capacity + 1, dtype=np.int64)
    for i in range(n):
        counts[lengths[i]] += 1
    first = np.zeros(capacity + 1, dtype=np.int64)
    acc = 0
    for length in range(capacity, 0, -1):
        first[length] = acc
        acc += counts[length]
    order = np.empty(n, dtype=np.int32)
    for i in range(n):
        length = lengths[i]
        order[first[length]] = i
        first[length] += 1
    b0, b1, b2 = new_bitset(capacity)
    head = np.full(capacity + 1, -1, dtype=np.int32)  # FIFO per space: ascending pack ids
    tail = np.full(capacity + 1, -1, dtype=np.int32)
    root = np.full(capacity + 1, -1, dtype=np.int32)  # pairing heap per space: the others
    child = np.full(n, -1, dtype=np.int32)
    sibling = np.full(n, -1, dtype=np.int32)  # a pack is in one FIFO or one heap: its link either way
    stack = np.empty(n, dtype=np.int32)
    pack_of = np.empty(n, dtype=np.int32)  # pack of the j-th item taken
    packs = 0
    length = capacity + 1
    left_in_run = 0
    for j in range(n):
        while left_in_run == 0:  # the items come in runs of one length: no lookup of lengths[order[j]]
            length -= 1
            left_in_run = counts[length]
        left_in_run -= 1
        space = bit_at_least(b0, b1, b2, length)  # the smallest sufficient space
        if space > 0:
            front = head[space]
            top = root[space]
            if top < 0 or (0 <= front < top):
                pack = front
                head[space] = sibling[front]
                sibling[front] = -1
            else:
                pack = heap_pop(root, space, child, sibling, stack)
            if head[space] < 0 and root[space] < 0:
                bit_clear(b0, b1, b2, space)
        else:
            space = capacity
            pack = packs
            packs += 1
        pack_of[j] = pack
        left = space - length
        if left:
            if head[left] < 0:
                if root[left] < 0:
                    bit_set(b0, b1, b2, left)
                head[left] = pack
                tail[left] = pack
            elif pack > tail[left]:
                sibling[tail[left]] = pack
                tail[left] = pack
            elif root[left] < 0:
                root[left] = pack
            else:
                root[left] = heap_meld(root[left], pack, child, sibling)
    ptr = np.zeros(packs + 1, dtype=np.int64)
    for j in range(n):
        ptr[pack_of[j] + 1] += 1
    for p in range(packs):
        ptr[p + 1] += ptr[p]
    fill = ptr[:-1].copy()
    items = np.empty(n, dtype=np.int64)
    for j in range(n):  # items of a pack in the order they went in
        p = pack_of[j]
        items[fill[p]] = order[j]
        fill[p] += 1
    return items, ptr


@_kernel
def chunk_table_kernel(offsets, pairs, max_seq_len, total):
    """chunking.chunk_table in one pass, writing only its three arrays (int32 doc and length, int64
    start; fewer than 2^31 documents)."""
    doc = np.empty(total, dtype=np.int32)
    start = np.empty(total, dtype=np.int64)
    length = np.empty(total, dtype=np.int32)
    j = 0
    for d in range(pairs.shape[0]):
        count = pairs[d]
        first = offsets[d]
        k = 0
        while k < count:
            doc[j] = d
            start[j] = first + k
            length[j] = min(max_seq_len, count - k)
            j += 1
            k += max_seq_len
    return doc, start, length


def warm_up() -> float:
    """Compile (or load from the cache) every kernel for the arrays the planners pass: int32 (a chunk
    table's lengths) or int64 lengths, int32 or int64 orders, writable or read-only offsets. Returns
    the seconds taken."""
    started = time.perf_counter()
    offsets = np.array([0, 5, 12], dtype=np.int64)
    chunk_table_kernel(offsets, np.array([4, 6], dtype=np.int64), 3, 4)
    offsets.flags.writeable = False  # a cached split's offsets are a read-only memmap: another type
    chunk_table_kernel(offsets, np.array([4, 6], dtype=np.int64), 3, 4)
    for lengths_dtype in (np.int32, np.int64):
        lengths = np.array([3, 1, 2, 3, 2], dtype=lengths_dtype)
        best_fit_decreasing_kernel(lengths, 4)
        for order_dtype in (np.int32, np.int64):
            order = np.arange(len(lengths), dtype=order_dtype)
            best_fit_buffered_kernel(lengths, order, 4, 2)
            first_fit_online_kernel(lengths, order, 4, 2)
    return time.perf_counter() - started


if __name__ == "__main__":
    print(f"numba packing kernels ready in {warm_up():.1f} s (cached: {CACHED})")
