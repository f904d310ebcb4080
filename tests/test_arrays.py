"""The sort- and merge-based set helpers (arrays.py) give numpy's set functions' results exactly,
and the planners and audits built on them are unchanged: concat windows, the fragmented-documents
audit and the leak check against their np.union1d / np.unique / np.isin forms."""

from __future__ import annotations

import numpy as np
import pytest

from pretrain.arrays import member_of_sorted, merge_unique, prefix_sums, sorted_unique
from pretrain.data.audit import fragmented_documents
from pretrain.data.chunking import chunk_table
from pretrain.data.packing import concat_windows
from pretrain.data.policies import EpochPlan, bestfit_layout, firstfit_layout, shuffled
from pretrain.data.policies.layout import chunk_layout
from pretrain.data.policies.packs import load_or_build_packs
from pretrain.data.stats import leaked_documents
from pretrain.data.synthetic import fineweb_like_lengths
from pretrain.data.tokens import TokenSplit


@pytest.mark.parametrize("size", [0, 1, 2, 3, 17, 1000, 100_000])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint64])
def test_the_set_helpers_are_numpys_set_functions(size, dtype):
    rng = np.random.default_rng(size)
    values = rng.integers(0, max(size // 3, 1) + 1, size).astype(dtype)  # many repeats
    assert sorted_unique(values).dtype == np.unique(values).dtype
    np.testing.assert_array_equal(sorted_unique(values), np.unique(values))
    a = np.sort(values)
    b = np.sort(rng.integers(0, size + 2, size // 2 + 1).astype(dtype))
    np.testing.assert_array_equal(merge_unique(a, b), np.union1d(a, b))
    np.testing.assert_array_equal(merge_unique(a[:0], b), np.union1d(a[:0], b))
    np.testing.assert_array_equal(member_of_sorted(values, np.unique(b)), np.isin(values, b))
    np.testing.assert_array_equal(member_of_sorted(values, b[:0]), np.zeros(size, dtype=bool))


def _old_concat_bounds(offsets, lengths, capacity):
    """concat_windows' piece starts as np.union1d made them."""
    doc_start = prefix_sums(lengths)
    inputs = int(doc_start[-1]) - 1
    return np.union1d(
        np.arange(0, inputs, capacity, dtype=np.int64), doc_start[(doc_start > 0) & (doc_start < inputs)]
    )


@pytest.mark.parametrize("capacity", [2, 7, 64, 2048])
def test_concat_windows_cut_where_the_union_of_window_and_document_starts_cuts(capacity):
    lengths = fineweb_like_lengths(5000, seed=capacity)
    lengths[::7] = 2  # short documents: several starts in one window
    offsets = prefix_sums(lengths)[:-1] + 11
    windows = concat_windows(offsets, lengths, capacity)
    bounds = _old_concat_bounds(offsets, lengths, capacity)
    doc_start = prefix_sums(lengths)
    np.testing.assert_array_equal(windows.start, offsets[windows.doc] + bounds - doc_start[windows.doc])
    np.testing.assert_array_equal(np.cumsum(windows.length), np.append(bounds[1:], doc_start[-1] - 1))


def _old_fragmented(plan: EpochPlan, documents: int) -> float:
    """The audit's np.unique form: distinct (document, unit) keys counted per document."""
    layout = plan.layout
    unit = np.repeat(np.arange(len(layout), dtype=np.int64), np.diff(layout.ptr))
    pairs = layout.length.astype(np.int64)
    if layout.ends_document is not None:
        pairs = pairs - layout.ends_document
    holds = pairs > 0
    keys = np.unique(layout.doc[holds].astype(np.int64) * len(layout) + unit[holds])
    return float(np.count_nonzero(np.bincount(keys // len(layout), minlength=documents) > 1) / documents)


def test_fragmented_documents_is_the_distinct_units_count_of_every_layout():
    split = TokenSplit.from_lengths(fineweb_like_lengths(3000, seed=5), seed=5)
    for capacity in (64, 512):
        table = chunk_table(split.offsets, split.lengths, capacity)
        order = shuffled(np.random.default_rng(1), len(table))
        layouts = {
            "bestfit": bestfit_layout(table, order, 64),
            "firstfit": firstfit_layout(table, order, 8),
            "one chunk per unit": chunk_layout(table, order, np.arange(len(table) + 1)),
            "concat": load_or_build_packs(split, table, "concat"),
            "bfd": load_or_build_packs(split, table, "bfd"),
        }
        for name, layout in layouts.items():
            plan = EpochPlan(layout, None, 1, 0, 0)
            got = fragmented_documents(plan, len(split))
            assert got == _old_fragmented(plan, len(split)), name
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
