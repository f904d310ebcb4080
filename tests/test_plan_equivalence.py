"""The fast planners (numba kernels) give exactly the packs of the pure-Python reference
implementations: the same items, in the same order, in the same packs, ties included."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from synthetic import fineweb_like_lengths

from pretrain.data.batching import packing
from pretrain.data.batching.packing import (
    _best_fit_buffered_reference,
    _best_fit_decreasing_reference,
    _first_fit_online_reference,
    best_fit_buffered,
    best_fit_decreasing,
    first_fit_online,
)

pytest.importorskip("numba")

# Capacities around the kernels' bitset word boundaries (32 keys a word, 32 words a block) and
# the real context lengths.
EDGE_CAPACITIES = [1, 2, 31, 32, 33, 63, 64, 65, 1023, 1024, 1025, 2048, 4096, 32767]


def assert_same(fast, reference):
    (items, ptr), (want_items, want_ptr) = fast, reference
    assert items.dtype == ptr.dtype == np.int64
    np.testing.assert_array_equal(ptr, want_ptr)
    np.testing.assert_array_equal(items, want_items)


@st.composite
def lengths_and_capacity(draw, max_size=300):
    capacity = draw(st.one_of(st.sampled_from(EDGE_CAPACITIES), st.integers(1, 200)))
    if draw(st.booleans()):  # few distinct values: many ties
        values = draw(st.lists(st.integers(1, capacity), min_size=1, max_size=4))
        lengths = draw(st.lists(st.sampled_from(values), max_size=max_size))
    else:
        lengths = draw(st.lists(st.integers(1, capacity), max_size=max_size))
    return np.array(lengths, dtype=np.int64), capacity


@settings(max_examples=200, deadline=None)
@given(case=lengths_and_capacity(), buffer=st.one_of(st.integers(1, 80), st.sampled_from([1000, 10**9])))
def test_best_fit_buffered_matches_the_reference(case, buffer):
    lengths, capacity = case
    assert_same(
        best_fit_buffered(lengths, capacity, buffer), _best_fit_buffered_reference(lengths, capacity, buffer)
    )


@settings(max_examples=200, deadline=None)
@given(case=lengths_and_capacity())
def test_best_fit_decreasing_matches_the_reference(case):
    lengths, capacity = case
    assert_same(best_fit_decreasing(lengths, capacity), _best_fit_decreasing_reference(lengths, capacity))


@pytest.mark.parametrize("capacity", [1024, 4096])
def test_fineweb_like_epoch_matches_the_reference(capacity):
    """~60k chunks of FineWeb-like documents (most lengths distinct, full chunks tied), shuffled."""
    from pretrain.data.batching.chunking import chunk_table

    lengths = fineweb_like_lengths(50_000, seed=capacity)
    table = chunk_table(np.zeros(len(lengths), dtype=np.int64), lengths, capacity)
    shuffled = table.length[np.random.default_rng(0).permutation(len(table))]
    for buffer in (1, 64, 512):
        assert_same(
            best_fit_buffered(shuffled, capacity, buffer),
            _best_fit_buffered_reference(shuffled, capacity, buffer),
        )
    assert_same(
        best_fit_decreasing(table.length, capacity), _best_fit_decreasing_reference(table.length, capacity)
    )


def test_without_numba_the_reference_runs(monkeypatch):
    lengths = np.array([5, 3, 8, 1, 1, 4, 7], dtype=np.int64)
    assert packing.numba_kernels() is not None
    monkeypatch.setenv("PRETRAIN_NO_NUMBA", "1")
    assert packing.numba_kernels() is None
    calls = []

    def spy(reference):
        def wrapped(*args):
            calls.append(reference.__name__)
            return reference(*args)

        return wrapped

    monkeypatch.setattr(packing, "_best_fit_buffered_reference", spy(_best_fit_buffered_reference))
    monkeypatch.setattr(packing, "_best_fit_decreasing_reference", spy(_best_fit_decreasing_reference))
    monkeypatch.setattr(packing, "_first_fit_online_reference", spy(_first_fit_online_reference))
    assert_same(best_fit_buffered(lengths, 8, 3), _best_fit_buffered_reference(lengths, 8, 3))
    assert_same(best_fit_decreasing(lengths, 8), _best_fit_decreasing_reference(lengths, 8))
    assert_same(first_fit_online(lengths, 8, 2), _first_fit_online_reference(lengths, 8, 2))
    assert calls == [
        "_best_fit_buffered_reference",
        "_best_fit_decreasing_reference",
        "_first_fit_online_reference",
    ]


def test_capacity_beyond_the_kernels_bitset_uses_the_reference():
    lengths = np.array([40_000, 1, 39_999, 2], dtype=np.int64)
    assert_same(best_fit_decreasing(lengths, 40_000), _best_fit_decreasing_reference(lengths, 40_000))
    assert_same(best_fit_buffered(lengths, 40_000, 2), _best_fit_buffered_reference(lengths, 40_000, 2))


# --- the samplers plan exactly what they planned before the kernels -------------------------------


def _split(documents: int, seed: int):
    from pretrain.data.tokens import TokenSplit

    return TokenSplit.from_lengths(fineweb_like_lengths(documents, seed=seed), seed=seed)


def test_bestfit_sampler_epochs_are_the_reference_plans():
    from helpers import policy_cfg

    from pretrain.data.batching.samplers import build_sampler

    cfg = policy_cfg("bestfit", "data.max_seq_len=256", "train.batch_size=4", "data.packing_buffer=16")
    sampler = build_sampler(cfg, _split(3000, seed=5))
    lengths = sampler.table.length
    for epoch in (0, 1, 7):
        plan = sampler.plan(epoch)
        order = np.random.default_rng([cfg.seed, epoch]).permutation(len(lengths))  # as before
        seq, ptr = _best_fit_buffered_reference(lengths[order], 256, 16)
        np.testing.assert_array_equal(plan.layout.ptr, ptr)
        np.testing.assert_array_equal(plan.layout.item_id, order[seq])
        assert plan.order is None  # packs are served in the order they were made
        np.testing.assert_array_equal(plan.ordered(), np.arange(len(ptr) - 1))


def test_prepacked_bfd_sampler_is_the_reference_plan(tmp_path):
    from helpers import policy_cfg

    from pretrain.data.batching.samplers import build_sampler

    cfg = policy_cfg("prepacked", "data.strategy=bfd", "data.max_seq_len=256", "train.batch_size=4")
    sampler = build_sampler(cfg, _split(3000, seed=6), packs_dir=tmp_path)
    items, ptr = _best_fit_decreasing_reference(sampler.table.length, 256)
    for epoch in (0, 3):
        plan = sampler.plan(epoch)
        np.testing.assert_array_equal(plan.layout.item_id, items)
        np.testing.assert_array_equal(plan.layout.ptr, ptr)
        units = np.random.default_rng([cfg.seed, epoch]).permutation(len(ptr) - 1)  # as before
        np.testing.assert_array_equal(plan.ordered(), units)


@settings(max_examples=150, deadline=None)
@given(case=lengths_and_capacity(), buffer=st.integers(1, 40), seed=st.integers(0, 2**32 - 1))
def test_best_fit_buffered_through_an_order_is_the_gathered_plan(case, buffer, seed):
    lengths, capacity = case
    for dtype in (np.int32, np.int64):
        order = np.random.default_rng(seed).permutation(len(lengths)).astype(dtype)
        items, ptr = best_fit_buffered(lengths.astype(np.int32), capacity, buffer, order=order)
        seq, want_ptr = _best_fit_buffered_reference(lengths[order], capacity, buffer)
        assert items.dtype == dtype
        np.testing.assert_array_equal(ptr, want_ptr)
        np.testing.assert_array_equal(items, order[seq])


# --- online first fit ------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(case=lengths_and_capacity(), open_bins=st.one_of(st.integers(1, 12), st.sampled_from([64, 10**4])))
def test_first_fit_online_matches_the_reference(case, open_bins):
    """Ties included: equal lengths (the many-ties draws) and equally full bins (the oldest emitted)."""
    lengths, capacity = case
    assert_same(
        first_fit_online(lengths, capacity, open_bins),
        _first_fit_online_reference(lengths, capacity, open_bins),
    )


@settings(max_examples=150, deadline=None)
@given(case=lengths_and_capacity(), open_bins=st.integers(1, 10), seed=st.integers(0, 2**32 - 1))
def test_first_fit_online_through_an_order_is_the_gathered_plan(case, open_bins, seed):
    lengths, capacity = case
    for dtype in (np.int32, np.int64):
        order = np.random.default_rng(seed).permutation(len(lengths)).astype(dtype)
        items, ptr = first_fit_online(lengths.astype(np.int32), capacity, open_bins, order=order)
        seq, want_ptr = _first_fit_online_reference(lengths[order], capacity, open_bins)
        assert items.dtype == dtype
        np.testing.assert_array_equal(ptr, want_ptr)
        np.testing.assert_array_equal(items, order[seq])


@pytest.mark.parametrize("capacity", [1024, 4096])
def test_fineweb_like_first_fit_epoch_matches_the_reference(capacity):
    lengths = np.minimum(fineweb_like_lengths(20_000, seed=4), capacity)
    assert_same(first_fit_online(lengths, capacity, 8), _first_fit_online_reference(lengths, capacity, 8))


def test_firstfit_sampler_epochs_are_the_reference_plans():
    from helpers import policy_cfg

    from pretrain.data.batching.samplers import build_sampler

    cfg = policy_cfg("firstfit", "data.max_seq_len=256", "train.batch_size=4", "data.open_bins=5")
    sampler = build_sampler(cfg, _split(3000, seed=7))
    lengths = sampler.table.length
    for epoch in (0, 1, 7):
        plan = sampler.plan(epoch)
        order = np.random.default_rng([cfg.seed, epoch]).permutation(len(lengths))
        seq, ptr = _first_fit_online_reference(lengths[order], 256, 5)
        np.testing.assert_array_equal(plan.layout.ptr, ptr)
        np.testing.assert_array_equal(plan.layout.item_id, order[seq])
        assert plan.order is None  # packs are served in the order they were emitted


def test_small_inputs_plan_without_the_kernels_and_a_run_does_not_import_numba(monkeypatch):
    """Below KERNEL_MIN_ITEMS the references plan (the same packs); in a fresh process a smoke-sized
    chunk table and its three plans leave numba (and the scipy.linalg it loads) unimported."""
    import json
    import os
    import subprocess
    import sys

    from helpers.env import REPO

    monkeypatch.delenv("PRETRAIN_NUMBA_MIN_ITEMS")
    lengths = fineweb_like_lengths(500, seed=3).clip(max=512)
    assert packing.numba_kernels(len(lengths)) is None
    assert packing.numba_kernels(packing.KERNEL_MIN_ITEMS) is not None
    monkeypatch.setenv("PRETRAIN_NUMBA_MIN_ITEMS", "0")
    kernels = (best_fit_buffered(lengths, 512, 64), best_fit_decreasing(lengths, 512))
    monkeypatch.setenv("PRETRAIN_NUMBA_MIN_ITEMS", "1000")
    assert packing.numba_kernels(len(lengths)) is None
    assert_same(best_fit_buffered(lengths, 512, 64), kernels[0])
    assert_same(best_fit_decreasing(lengths, 512), kernels[1])
    monkeypatch.setenv("PRETRAIN_NUMBA_MIN_ITEMS", "many")
    with pytest.raises(ValueError, match="PRETRAIN_NUMBA_MIN_ITEMS='many' must be a whole number"):
        packing.numba_kernels(10)
    code = (
        "import json, sys\n"
        "import numpy as np\n"
        "from pretrain.data.batching.chunking import chunk_table\n"
        "from pretrain.data.batching.packing import best_fit_buffered, best_fit_decreasing\n"
        "from pretrain.data.batching.packing import first_fit_online\n"
        "from synthetic import fineweb_like_lengths\n"
        "lengths = fineweb_like_lengths(600)\n"
        "table = chunk_table(np.zeros(len(lengths), dtype=np.int64), lengths, 128)\n"
        "best_fit_buffered(table.length, 128, 64); best_fit_decreasing(table.length, 128)\n"
        "first_fit_online(table.length, 128, 8)\n"
        "print(json.dumps([m in sys.modules for m in ('numba', 'scipy')]))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PRETRAIN_NUMBA_MIN_ITEMS"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), str(REPO / "bench")])
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [False, False]
