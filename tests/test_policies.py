"""Packing algorithms and the batches of every policy: no chunk twice, none lost, packs in capacity."""

from __future__ import annotations

import multiprocessing
import os
import time

import numpy as np
import pytest
import torch
from helpers import POLICY_VARIANTS, policy_cfg
from hypothesis import given, settings
from hypothesis import strategies as st

from pretrain.data.batching.batch import IGNORE_INDEX, PAD_TOKEN_ID
from pretrain.data.batching.chunking import chunk_table
from pretrain.data.batching.evaluation import evaluation_batches
from pretrain.data.batching.packing import (
    best_fit_buffered,
    best_fit_decreasing,
    concat_windows,
    first_fit_online,
)
from pretrain.data.batching.policies import REGISTRY, load_or_build_packs, packs_path
from pretrain.data.batching.policies import packs as stored_packs
from pretrain.data.batching.samplers import build_sampler
from pretrain.data.tokens import EOS_TOKEN_ID, TokenSplit

make_cfg = policy_cfg


# --- reference implementations, written independently of the code under test -------------------


def best_fit_decreasing_naive(lengths: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """O(N^2) reference of `best_fit_decreasing` with the same tie-breaking (independent of the code)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    order = np.argsort(-lengths, kind="stable")
    spaces: list[int] = []
    contents: list[list[int]] = []
    for item in order.tolist():
        length = int(lengths[item])
        best = -1
        for pack, space in enumerate(spaces):
            if length <= space and (best < 0 or space < spaces[best]):
                best = pack
        if best < 0:
            spaces.append(capacity)
            contents.append([])
            best = len(spaces) - 1
        spaces[best] -= length
        contents[best].append(item)
    items = np.array([i for pack in contents for i in pack], dtype=np.int64)
    return items, np.concatenate([[0], np.cumsum([len(pack) for pack in contents], dtype=np.int64)]).astype(
        np.int64
    )


def online_best_fit_reference(lengths, capacity, buffer):
    """Packs (lists of positions in the order) by the textbook rule, with a plain list buffer."""
    pending = list(range(len(lengths)))
    buf = pending[:buffer]
    rest = pending[buffer:]
    packs = []
    while buf:
        space, pack = capacity, []
        while True:
            fits = [i for i in buf if lengths[i] <= space]
            if not fits:
                break
            best = max(fits, key=lambda i: (lengths[i], -i))  # longest, then earliest
            buf.remove(best)
            pack.append(best)
            space -= lengths[best]
            if rest:
                buf.append(rest.pop(0))
        packs.append(pack)
    return packs


def as_packs(items, ptr):
    return [items[ptr[p] : ptr[p + 1]].tolist() for p in range(len(ptr) - 1)]


# --- packing algorithms -----------------------------------------------------------------------


@pytest.mark.parametrize("buffer", [4, 5, 64])
def test_seed_pack_example(buffer):
    lengths = np.array([6, 4, 3, 2])
    seq, ptr = best_fit_buffered(lengths, 8, buffer)
    assert [lengths[p].tolist() for p in as_packs(seq, ptr)] == [[6, 2], [4, 3]]


def test_seed_pack_example_batch():
    # Documents of 7, 5, 4, 3 tokens (EOS included) are chunks of 6, 4, 3, 2 inputs at capacity 8.
    split = TokenSplit.from_lengths([7, 5, 4, 3], seed=3)
    cfg = make_cfg(
        "bestfit", "data.max_seq_len=8", "train.eval_packing_buffer=4", "train.eval_microbatch_tokens=16"
    )
    (batch,) = list(evaluation_batches(cfg, split))  # chunks best fit in index order
    assert batch.cu_seqlens.tolist() == [0, 6, 8, 12, 15]
    assert batch.pack_lengths.tolist() == [8, 7]
    assert batch.position_ids.tolist() == [0, 1, 2, 3, 4, 5, 0, 1, 0, 1, 2, 3, 0, 1, 2]
    expected = np.concatenate([split.document(d)[:-1] for d in (0, 3, 1, 2)])
    np.testing.assert_array_equal(batch.input_ids.numpy(), expected)
    expected_targets = np.concatenate([split.document(d)[1:] for d in (0, 3, 1, 2)])
    np.testing.assert_array_equal(batch.targets.numpy(), expected_targets)
    assert batch.num_targets == 15


@settings(max_examples=150, deadline=None)
@given(
    capacity=st.integers(1, 40),
    data=st.data(),
)
def test_bfd_matches_naive(capacity, data):
    lengths = data.draw(st.lists(st.integers(1, capacity), max_size=80))
    fast = best_fit_decreasing(np.array(lengths, dtype=np.int64), capacity)
    slow = best_fit_decreasing_naive(np.array(lengths, dtype=np.int64), capacity)
    assert as_packs(*fast) == as_packs(*slow)


def test_bfd_random_large_is_valid_and_tight():
    rng = np.random.default_rng(0)
    for capacity in (2, 7, 513, 4096):
        lengths = rng.integers(1, capacity + 1, size=3000)
        items, ptr = best_fit_decreasing(lengths, capacity)
        assert sorted(items.tolist()) == list(range(len(lengths)))
        fill = np.array([lengths[p].sum() for p in as_packs(items, ptr)])
        assert fill.max() <= capacity and fill.min() >= 1
        lower = -(-lengths.sum() // capacity)
        # First-fit/best-fit-decreasing use at most 11/9 OPT + 6/9 packs (Dosa 2007).
        assert lower <= len(fill) <= 11 / 9 * lower + 1
        # No two packs could be merged: BFD leaves at most one pack at most half full.
        assert (fill <= capacity / 2).sum() <= 1


@settings(max_examples=150, deadline=None)
@given(capacity=st.integers(1, 30), buffer=st.integers(1, 12), data=st.data())
def test_online_best_fit_matches_reference(capacity, buffer, data):
    lengths = data.draw(st.lists(st.integers(1, capacity), max_size=60))
    seq, ptr = best_fit_buffered(np.array(lengths, dtype=np.int64), capacity, buffer)
    assert as_packs(seq, ptr) == online_best_fit_reference(lengths, capacity, buffer)


def test_online_best_fit_buffer_one_is_next_fit():
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 33, size=500)
    seq, ptr = best_fit_buffered(lengths, 33, 1)
    assert seq.tolist() == list(range(500))  # order kept
    packs = as_packs(seq, ptr)
    for pack, following in zip(packs, packs[1:], strict=False):
        assert lengths[pack].sum() + lengths[following[0]] > 33  # closed only when the next one does not fit


@pytest.mark.parametrize(
    ("lengths", "open_bins", "packs"),
    [
        ([3, 3, 2, 4, 1], 2, [[0, 2], [1, 4], [3]]),  # 2 fills bin 0 exactly: emitted at once
        ([3, 4, 3, 1], 2, [[1], [0, 3], [2]]),  # 3 fits no bin: the fullest (4 of 5) goes, not the oldest
        ([3, 3, 3], 2, [[0], [1], [2]]),  # equally full: the oldest goes
        ([3, 4, 3, 1], 1, [[0], [1], [2, 3]]),  # one bin: next fit
        ([1, 1, 1, 1, 1, 1], 8, [[0, 1, 2, 3, 4], [5]]),
    ],
)
def test_first_fit_online_by_hand(lengths, open_bins, packs):
    """Capacity 5: the first open bin that holds a chunk takes it; when none does, the fullest goes."""
    items, ptr = first_fit_online(np.array(lengths), 5, open_bins)
    assert as_packs(items, ptr) == packs


def test_packing_rejects_bad_lengths():
    with pytest.raises(ValueError, match="1..8"):
        best_fit_buffered(np.array([9]), 8, 4)
    with pytest.raises(ValueError, match="1..8"):
        best_fit_decreasing(np.array([0, 3]), 8)
    with pytest.raises(ValueError, match="packing_buffer"):
        best_fit_buffered(np.array([3]), 8, 0)


@settings(max_examples=80, deadline=None)
@given(lengths=st.lists(st.integers(2, 40), min_size=1, max_size=20), capacity=st.integers(2, 33))
def test_concat_windows_tile_the_stream(lengths, capacity):
    split = TokenSplit.from_lengths(lengths, seed=len(lengths))
    w = concat_windows(split.offsets, split.lengths, capacity)
    stream = np.asarray(split.tokens)
    inputs = len(stream) - 1
    assert len(w) == -(-inputs // capacity)
    window_sizes = np.diff(np.append(np.arange(0, inputs, capacity), inputs))
    pieces = [(int(s), int(n)) for s, n in zip(w.start, w.length, strict=True)]
    got = np.concatenate([stream[s : s + n] for s, n in pieces])
    np.testing.assert_array_equal(got, stream[:-1])  # every input once, in stream order
    for p in range(len(w)):
        assert w.length[w.ptr[p] : w.ptr[p + 1]].sum() == window_sizes[p]
    doc_end = split.offsets + split.lengths
    for s, n, d, ends in zip(w.start, w.length, w.doc, w.ends_document, strict=True):
        assert split.offsets[d] <= s and s + n <= doc_end[d]  # inside one document
        assert ends == (s + n == doc_end[d])
        if ends:
            assert stream[s + n - 1] == EOS_TOKEN_ID


# --- every policy's batches ---------------------------------------------------------------------

# Every variant of the policies whose items are the chunk table's chunks (vsl's pieces: test_vsl.py).
POLICY_CASES = {
    case: variant for case, variant in POLICY_VARIANTS.items() if REGISTRY[variant[0]].items == "chunks"
}


def traits(cfg) -> dict[str, bool]:
    """What the reference below needs of a case, read from its options (never from the code under test)."""
    data = cfg.data
    concat = getattr(data, "strategy", None) == "concat"
    return {
        "pads": hasattr(data, "pad_to"),  # a row per chunk, padded
        "longest": getattr(data, "pad_to", None) == "longest",
        "truncate": str(data.long_docs) == "truncate",
        "concat": concat,  # windows over the token stream, cut at documents
        "open": getattr(data, "document_mask", True) is False,  # one segment per pack
    }


def random_split(seed: int, documents: int = 60, high: int = 90) -> TokenSplit:
    rng = np.random.default_rng(seed)
    return TokenSplit.from_lengths(rng.integers(2, high, size=documents), seed=seed)


def stream_runs(split: TokenSplit, capacity: int, truncate: bool) -> list[np.ndarray]:
    """File offsets of each document's inputs in the concat stream: all its tokens, or with truncate
    its first `capacity` inputs when it has more pairs (the last document's EOS is no input)."""
    runs = []
    for d, (offset, n) in enumerate(zip(split.offsets.tolist(), split.lengths.tolist(), strict=True)):
        kept = capacity if truncate and n - 1 > capacity else n - (d == len(split) - 1)
        runs.append(np.arange(offset, offset + kept))
    return runs


def stream_positions(split: TokenSplit, capacity: int, truncate: bool) -> np.ndarray:
    return np.concatenate(stream_runs(split, capacity, truncate))


def piece_bounds(split: TokenSplit, capacity: int, truncate: bool = False) -> np.ndarray:
    """Stream positions where concat pieces start: window starts and document starts."""
    runs = stream_runs(split, capacity, truncate)
    inputs = sum(map(len, runs))
    bounds = set(range(0, inputs, capacity)) | set(np.cumsum([len(r) for r in runs])[:-1].tolist())
    return np.array(sorted(b for b in bounds if b < inputs) + [inputs])


def first_chunks(split: TokenSplit, capacity: int) -> np.ndarray:
    chunks_per_doc = -(-(split.lengths - 1) // capacity)
    return np.concatenate([[0], np.cumsum(chunks_per_doc)[:-1]])


def universe(case: dict, split: TokenSplit, capacity: int) -> np.ndarray:
    """Every item a policy must serve once per epoch, computed without the code under test."""
    pairs = split.lengths - 1
    chunks_per_doc = -(-pairs // capacity)
    if case["concat"]:  # pieces of windows x documents
        return np.arange(len(piece_bounds(split, capacity, case["truncate"])) - 1)
    if case["truncate"]:  # first chunks
        return first_chunks(split, capacity)
    return np.arange(int(chunks_per_doc.sum()))


def expected_runs(batch, split: TokenSplit, capacity: int, case: dict) -> list[tuple[int, int]]:
    """(file offset, inputs) of each item of the batch, from its item ids (concat, open: each window)."""
    if case["concat"] and case["open"]:  # one segment per window
        inputs = split.num_tokens - 1
        return [(w * capacity, min(capacity, inputs - w * capacity)) for w in np.asarray(batch.meta["packs"])]
    if case["concat"]:
        truncate = case["truncate"]
        bounds, position = (
            piece_bounds(split, capacity, truncate),
            stream_positions(split, capacity, truncate),
        )
        return [
            (int(position[bounds[i]]), int(bounds[i + 1] - bounds[i]))
            for i in np.asarray(batch.meta["chunks"])
        ]
    table = chunk_table(split.offsets, split.lengths, capacity)
    return [(int(table.start[i]), int(table.length[i])) for i in np.asarray(batch.meta["chunks"])]


def check_batch(batch, split: TokenSplit, capacity: int, case: dict) -> None:
    """Structure and content of one batch against the split's tokens."""
    stream = np.asarray(split.tokens, dtype=np.int64)
    T = batch.num_tokens
    cu = batch.cu_seqlens.numpy().astype(np.int64)
    seg = np.diff(cu)
    assert batch.cu_seqlens.dtype == torch.int32
    assert cu[0] == 0 and cu[-1] == T and (seg >= 1).all()
    assert batch.max_seqlen == seg.max()
    positions = batch.position_ids.numpy()
    np.testing.assert_array_equal(positions, np.concatenate([np.arange(n) for n in seg]))
    inputs, targets = batch.input_ids.numpy(), batch.targets.numpy()
    assert batch.num_targets == int((targets != IGNORE_INDEX).sum())
    packs = batch.pack_lengths.numpy()
    assert (packs >= 1).all() and (packs <= capacity).all()
    if not case["longest"]:
        assert batch.capacity == capacity
    runs = expected_runs(batch, split, capacity, case)
    if case["pads"]:
        width = packs.max() if case["longest"] else capacity
        assert batch.capacity == width  # a padded row holds its width
        assert batch.padded and T == len(packs) * width and (seg == width).all()
        assert packs.tolist() == [n for _, n in runs]
        for row, (s, n) in enumerate(runs):
            row_in, row_tg = inputs[row * width : (row + 1) * width], targets[row * width : (row + 1) * width]
            np.testing.assert_array_equal(row_in[:n], stream[s : s + n])
            np.testing.assert_array_equal(row_tg[:n], stream[s + 1 : s + n + 1])
            assert (row_in[n:] == PAD_TOKEN_ID).all() and (row_tg[n:] == IGNORE_INDEX).all()
        return
    assert not batch.padded and packs.sum() == T
    assert set(np.cumsum(packs).tolist()) <= set(cu.tolist())  # packs end at segment boundaries
    if case["open"]:  # data.document_mask=false: one segment per pack
        assert seg.tolist() == packs.tolist()
    else:
        assert seg.tolist() == [n for _, n in runs]
    begins = np.cumsum([0] + [n for _, n in runs])[:-1]
    for (s, n), begin in zip(runs, begins, strict=True):
        np.testing.assert_array_equal(inputs[begin : begin + n], stream[s : s + n])
        expected = stream[s + 1 : s + n + 1].copy()
        if not (case["concat"] and case["open"]):
            assert not (stream[s : s + n - 1] == EOS_TOKEN_ID).any()  # no document boundary inside
        if case["concat"] and not case["open"]:  # the pair EOS -> next document is no real pair
            expected[stream[s : s + n] == EOS_TOKEN_ID] = IGNORE_INDEX
        np.testing.assert_array_equal(targets[begin : begin + n], expected)


@pytest.mark.parametrize("case", list(POLICY_CASES))
@pytest.mark.parametrize("capacity", [2, 7, 33])
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_every_item_once_per_epoch(case, capacity, world_size, tmp_path):
    policy, *overrides = POLICY_CASES[case]
    split = random_split(capacity + world_size)
    cfg = make_cfg(policy, f"data.max_seq_len={capacity}", "train.batch_size=3", *overrides)
    samplers = [
        build_sampler(cfg, split, rank=r, world_size=world_size, packs_dir=tmp_path)
        for r in range(world_size)
    ]
    case = traits(cfg)
    counts = {len(s) for s in samplers}
    assert len(counts) == 1  # every rank the same number of batches
    served = []
    for sampler in samplers:
        expected = len(sampler)  # this epoch's (a policy packing anew may make another count next epoch)
        batches = list(sampler)
        assert len(batches) == expected > 0
        for batch in batches:
            check_batch(batch, split, capacity, case)
            served.extend(np.asarray(batch.meta["chunks"]).tolist())
    accounting = samplers[0].epoch_accounting(0)
    dropped = accounting["dropped_items"].tolist()
    assert accounting["global_batches"] - accounting["batches_per_rank"] * world_size < world_size
    assert len(served) == len(set(served))  # nothing twice
    assert not set(served) & set(dropped)
    assert sorted(served + dropped) == universe(case, split, capacity).tolist()  # nothing lost


@pytest.mark.parametrize("case", list(POLICY_CASES))
def test_tokens_are_conserved(case, tmp_path):
    """Real tokens of an epoch: every pair for packed policies, the first chunks for padded."""
    capacity = 9
    policy, *overrides = POLICY_CASES[case]
    split = random_split(5, documents=40)
    cfg = make_cfg(policy, f"data.max_seq_len={capacity}", "train.batch_size=1", *overrides)
    sampler = build_sampler(cfg, split, packs_dir=tmp_path)
    batches = list(sampler)
    real = sum(b.real_tokens for b in batches)
    targets = sum(b.num_targets for b in batches)
    pairs = split.lengths - 1
    case = traits(cfg)
    if case["truncate"]:
        kept = np.minimum(pairs, capacity).sum()  # each document's first chunk
        assert targets == kept
        if case["concat"]:  # and the EOS inputs of the documents it keeps whole
            assert real == kept + (pairs[:-1] <= capacity).sum()
        else:
            assert real == kept
    elif case["concat"]:
        assert real == split.num_tokens - 1  # the stream's pairs
        assert targets == (split.num_tokens - 1 if case["open"] else split.num_pairs)
    else:
        assert real == targets == split.num_pairs


def test_padded_rows_are_first_chunks(tmp_path):
    split = random_split(2, documents=30, high=40)
    cfg = make_cfg("padded", "data.max_seq_len=16", "train.batch_size=4")
    for batch in build_sampler(cfg, split):
        inputs = batch.input_ids.view(-1, 16).numpy()
        for row, n in zip(inputs, batch.pack_lengths.tolist(), strict=True):
            doc = next(d for d in range(len(split)) if np.array_equal(split.document(d)[:n], row[:n]))
            assert n == min(split.lengths[doc] - 1, 16)


# --- prepacked storage ----------------------------------------------------------------------------


def test_prepacked_written_once_and_reused(tmp_path, monkeypatch):
    split = random_split(7)
    table = chunk_table(split.offsets, split.lengths, 16)
    first = load_or_build_packs(split, table, "bfd", tmp_path)
    path = packs_path(tmp_path, "train", "bfd", 16)
    assert path.is_file()
    # No temporary file left behind; the build's lock file stays (removing it would race other ranks).
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name, f"{path.name}.lock"]
    stamp = path.stat().st_mtime_ns

    def fail(*args, **kwargs):
        raise AssertionError("packs were rebuilt instead of reused")

    monkeypatch.setattr(stored_packs, "best_fit_decreasing", fail)
    monkeypatch.setattr(stored_packs, "concat_windows", fail)
    again = load_or_build_packs(split, table, "bfd", tmp_path)
    assert path.stat().st_mtime_ns == stamp
    np.testing.assert_array_equal(first.item_id, again.item_id)
    np.testing.assert_array_equal(first.ptr, again.ptr)


def test_prepacked_keys_and_stale_files(tmp_path):
    split = random_split(8)
    for strategy in ("bfd", "concat"):
        for capacity in (8, 16):
            load_or_build_packs(
                split, chunk_table(split.offsets, split.lengths, capacity), strategy, tmp_path
            )
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".npz") == [
        "train-bfd-L16.npz",
        "train-bfd-L8.npz",
        "train-concat-L16.npz",
        "train-concat-L8.npz",
    ]
    # Another split under the same name: the stored packs do not match it and are rebuilt.
    other = random_split(9)
    table = chunk_table(other.offsets, other.lengths, 8)
    layout = load_or_build_packs(other, table, "bfd", tmp_path)
    assert sorted(layout.item_id.tolist()) == list(range(len(table)))
    # A torn or foreign file is rebuilt too.
    path = packs_path(tmp_path, "train", "bfd", 8)
    path.write_bytes(b"not a zip")
    layout = load_or_build_packs(other, table, "bfd", tmp_path)
    assert sorted(layout.item_id.tolist()) == list(range(len(table)))
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_prepacked_sampler_uses_packs_dir(tmp_path):
    split = random_split(10)
    cfg = make_cfg("prepacked", "data.max_seq_len=16", "data.strategy=bfd", "train.batch_size=2")
    build_sampler(cfg, split, packs_dir=tmp_path / "packs")
    assert (tmp_path / "packs" / "train-bfd-L16.npz").is_file()


def test_bfd_layout_in_module_matches_algorithm():
    split = random_split(11)
    table = chunk_table(split.offsets, split.lengths, 16)
    layout = load_or_build_packs(split, table, "bfd", None)
    items, ptr = best_fit_decreasing_naive(table.length, 16)
    assert as_packs(layout.item_id, layout.ptr) == as_packs(items, ptr)


@pytest.mark.parametrize("case", list(POLICY_CASES))
def test_documents_need_not_be_contiguous(case, tmp_path):
    """Offsets with junk between documents: no junk token is ever read, and the concat stream's
    cross-document target is the next document's first token."""
    docs = [[1, 2, 3, EOS_TOKEN_ID], [4, 5, EOS_TOKEN_ID], [6, 7, 8, 9, 10, EOS_TOKEN_ID]]
    junk = 999
    tokens, offsets = [], []
    for doc in docs:
        tokens += [junk, junk]
        offsets.append(len(tokens))
        tokens += doc
    split = TokenSplit(
        tokens=np.array(tokens + [junk], dtype=np.uint32),
        offsets=np.array(offsets, dtype=np.int64),
        lengths=np.array([len(d) for d in docs], dtype=np.int64),
    )
    policy, *overrides = POLICY_CASES[case]
    cfg = make_cfg(policy, "data.max_seq_len=4", "train.batch_size=1", *overrides)
    batches = list(build_sampler(cfg, split, packs_dir=tmp_path))
    inputs = np.concatenate([b.input_ids.numpy() for b in batches])
    targets = np.concatenate([b.targets.numpy() for b in batches])
    assert junk not in inputs and junk not in targets
    if traits(cfg)["concat"] and traits(cfg)["open"]:
        stream = [t for d in docs for t in d]
        pairs = sorted(zip(stream[:-1], stream[1:], strict=True))
        assert sorted(zip(inputs.tolist(), targets.tolist(), strict=True)) == pairs


def _build_in_child(split, table, packs_dir, log_path, result_path):
    def slow_bfd(lengths, capacity):
        with open(log_path, "a") as log:
            log.write("built\n")
        time.sleep(0.5)  # long enough for every other rank to arrive while the build runs
        return best_fit_decreasing(lengths, capacity)

    stored_packs.best_fit_decreasing = slow_bfd
    layout = load_or_build_packs(split, table, "bfd", packs_dir)
    np.save(result_path, np.concatenate([layout.ptr, layout.item_id]))


def test_ranks_starting_together_build_the_packs_once_and_all_load_them(tmp_path):
    split = random_split(12)
    table = chunk_table(split.offsets, split.lengths, 16)
    log_path = tmp_path / "builds.log"
    context = multiprocessing.get_context("fork")
    ranks = [
        context.Process(
            target=_build_in_child, args=(split, table, tmp_path / "packs", log_path, tmp_path / f"r{r}.npy")
        )
        for r in range(4)
    ]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(60)
        assert process.exitcode == 0
    assert log_path.read_text() == "built\n"  # one rank built, three loaded its file
    items, ptr = best_fit_decreasing(table.length, 16)
    for r in range(4):
        np.testing.assert_array_equal(np.load(tmp_path / f"r{r}.npy"), np.concatenate([ptr, items]))


def test_unwritable_packs_dir_builds_in_memory_with_a_warning(tmp_path, monkeypatch, caplog):
    split = random_split(13)
    table = chunk_table(split.offsets, split.lengths, 16)

    def refuse(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", self.lock_file)

    monkeypatch.setattr(stored_packs.FileLock, "acquire", refuse)
    with caplog.at_level("WARNING"):
        layout = load_or_build_packs(split, table, "bfd", tmp_path / "packs")
    assert "building them in memory" in caplog.text and "Permission denied" in caplog.text
    items, ptr = best_fit_decreasing(table.length, 16)
    np.testing.assert_array_equal(layout.item_id, items)
    assert not list((tmp_path / "packs").glob("*.npz"))
