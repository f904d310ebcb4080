"""The sort-based set helpers (arrays.py) give numpy's set functions' results exactly, and the
planners and audits rewritten in linear or sort time (issue 33) are unchanged: concat windows, the
fragmented-documents audit and the leak check against their np.union1d / np.unique / np.isin forms."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import pytest
from helpers.reference import union1d_concat_windows, unique_fragmented
from synthetic import fineweb_like_lengths

from pretrain.arrays import member_of_sorted, prefix_sums, sorted_unique
from pretrain.data.batching.chunking import ChunkTable, chunk_table
from pretrain.data.batching.packing import concat_windows
from pretrain.data.batching.policies import EpochPlan, bestfit_layout, firstfit_layout, shuffled
from pretrain.data.batching.policies.layout import chunk_layout
from pretrain.data.batching.policies.packs import load_or_build_packs
from pretrain.data.leaks import leaked_documents
from pretrain.data.measures.audit import fragmented_documents
from pretrain.data.tokens import TokenSplit


@pytest.mark.parametrize("size", [0, 1, 2, 3, 17, 1000, 100_000])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint64])
def test_the_set_helpers_are_numpys_set_functions(size, dtype):
    rng = np.random.default_rng(size)
    values = rng.integers(0, max(size // 3, 1) + 1, size).astype(dtype)  # many repeats
    assert sorted_unique(values).dtype == np.unique(values).dtype
    np.testing.assert_array_equal(sorted_unique(values), np.unique(values))
    b = np.sort(rng.integers(0, size + 2, size // 2 + 1).astype(dtype))
    np.testing.assert_array_equal(member_of_sorted(values, np.unique(b)), np.isin(values, b))
    np.testing.assert_array_equal(member_of_sorted(values, b[:0]), np.zeros(size, dtype=bool))


@pytest.mark.parametrize("capacity", [2, 3, 7, 64, 2048])
@pytest.mark.parametrize("max_inputs", [None, 5, 300])
def test_concat_windows_are_the_union1d_windows(capacity, max_inputs):
    """The linear construction cuts exactly where np.union1d's did, every field bit for bit, also
    where document starts fall on window starts (EOS-only and two-token documents, capacity 2)."""
    rng = np.random.default_rng(capacity)
    for lengths in (
        fineweb_like_lengths(5000, seed=capacity),
        rng.integers(1, 4, 3000),  # many starts per window, many on window starts
        np.array([1]),
        np.array([2]),
        np.array([capacity + 1, capacity, 1, 2 * capacity + 1]),
        np.array([3000]),
    ):
        lengths = np.asarray(lengths, dtype=np.int64)
        offsets = prefix_sums(lengths)[:-1] + 11
        got = concat_windows(offsets, lengths, capacity, max_inputs)
        want = union1d_concat_windows(offsets, lengths, capacity, max_inputs)
        if not want.length.size:
            assert len(got) == 0
            continue
        for field in fields(want):
            array = getattr(want, field.name)
            np.testing.assert_array_equal(getattr(got, field.name), array, err_msg=field.name)
            assert getattr(got, field.name).dtype == array.dtype, field.name


def test_fragmented_documents_is_the_distinct_units_count_of_every_layout():
    split = TokenSplit.from_lengths(fineweb_like_lengths(3000, seed=5), seed=5)
    for capacity in (64, 512):
        table = chunk_table(split.offsets, split.lengths, capacity)
        order = shuffled(np.random.default_rng(1), len(table))
        layouts = {
            "bestfit": bestfit_layout(table, order, 64),
            "firstfit": firstfit_layout(table, order, 8),
            "half the chunks": bestfit_layout(table, order[: len(order) // 2], 64),  # as truncate lays out
            "one chunk per unit": chunk_layout(table, order, np.arange(len(table) + 1)),
            "concat": load_or_build_packs(split, table, "concat"),
            "bfd": load_or_build_packs(split, table, "bfd"),
            # rows laid out twice (a mixture's repeats): some single-chunk documents in two units
            "repeats": chunk_layout(
                table,
                np.concatenate([order, order[:500]]),
                np.append(np.arange(0, len(order) + 500, 4), len(order) + 500),
            ),
            # a table whose rows do not ascend by document (a mixture's planned epoch)
            "planned table": bestfit_layout(
                ChunkTable(
                    doc=table.doc[order],
                    start=table.start[order],
                    length=table.length[order],
                    max_seq_len=capacity,
                    planned=True,
                ),
                np.arange(len(table), dtype=np.int32),
                64,
            ),
        }
        for name, layout in layouts.items():
            plan = EpochPlan(layout, None, 1, 0, 0)
            got = fragmented_documents(plan, len(split))
            assert got == unique_fragmented(plan, len(split)), name
            if name != "one chunk per unit":  # a chunk of a long document per unit: some
                assert 0.0 < got < 1.0, name


def test_leaked_documents_are_the_isin_of_the_validation_windows():
    rng = np.random.default_rng(3)
    train = TokenSplit.from_lengths(rng.integers(70, 400, 200), seed=1, vocab=50)
    validation = TokenSplit.from_lengths(rng.integers(70, 400, 60), seed=2, vocab=50)
    tokens = validation.tokens.copy()
    for doc in (3, 17, 41):  # copy 64 train tokens into three validation documents
        start = validation.offsets[doc] + 2
        tokens[start : start + 64] = train.tokens[train.offsets[doc] : train.offsets[doc] + 64]
    validation = TokenSplit(tokens, validation.offsets, validation.lengths, name="validation")
    assert leaked_documents(train, validation).tolist() == [3, 17, 41]
