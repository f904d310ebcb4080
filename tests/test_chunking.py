"""Chunking: every next-token pair of a document survives exactly once, in chunks of <= L inputs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pretrain.data.batching.chunking import MAX_SEQ_LEN, check_max_seq_len, chunk_table, split_tokens
from pretrain.data.tokens import EOS_TOKEN_ID, TokenSplit

# Powers of two plus one (a cut lands one past a round length), the extremes 2 and 4096, anything.
CAPACITIES = st.one_of(
    st.sampled_from([2, 3, 5, 9, 17, 33, 65, 129, 257, 513, 1025, 2049, 4095, 4096]),
    st.integers(min_value=2, max_value=MAX_SEQ_LEN),
)


def _document(n: int, seed: int) -> np.ndarray:
    tokens = np.random.default_rng(seed).integers(0, EOS_TOKEN_ID, size=n)
    tokens[-1] = EOS_TOKEN_ID
    return tokens


@settings(max_examples=150, deadline=None)
@given(n=st.integers(min_value=1, max_value=12_000), max_seq_len=CAPACITIES, seed=st.integers(0, 2**16))
def test_split_tokens_conserves_pairs(n, max_seq_len, seed):
    tokens = _document(n, seed)
    chunks = list(split_tokens("doc", tokens, max_seq_len))
    pairs = n - 1
    assert len(chunks) == -(-pairs // max_seq_len)
    assert sum(len(c) for c in chunks) == pairs
    # One pass over the chunks, whole-array checks after it: linear in the document's length.
    assert [c.index for c in chunks] == list(range(len(chunks)))
    lengths = np.array([len(c) for c in chunks], dtype=np.int64)
    assert all(len(c.targets) == len(c.inputs) == len(c.positions) == len(c) for c in chunks)
    assert ((lengths >= 1) & (lengths <= max_seq_len)).all()
    assert (lengths[:-1] == max_seq_len).all()  # only the last chunk is short
    if chunks:
        # Inputs tile tokens[:-1] and targets tile tokens[1:]: each pair exactly once, in order.
        np.testing.assert_array_equal(np.concatenate([c.inputs for c in chunks]), tokens[:-1])
        np.testing.assert_array_equal(np.concatenate([c.targets for c in chunks]), tokens[1:])
        # Positions restart at 0 in every chunk.
        starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
        np.testing.assert_array_equal(
            np.concatenate([c.positions for c in chunks]), np.arange(pairs) - starts
        )
        assert not any(EOS_TOKEN_ID in c.inputs for c in chunks)  # no EOS inserted at a cut


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(min_value=2, max_value=3000), min_size=1, max_size=25),
    max_seq_len=CAPACITIES,
    seed=st.integers(0, 2**16),
)
def test_chunk_table_agrees_with_split_tokens(lengths, max_seq_len, seed):
    split = TokenSplit.from_lengths(lengths, seed=seed)
    table = chunk_table(split.offsets, split.lengths, max_seq_len)
    expected = [
        (d, c) for d in range(len(split)) for c in split_tokens(str(d), split.document(d), max_seq_len)
    ]
    assert len(table) == len(expected)
    assert table.total_pairs == split.num_pairs
    for i, (doc, chunk) in enumerate(expected):
        assert table.doc[i] == doc
        assert table.length[i] == len(chunk)
        start, length = int(table.start[i]), int(table.length[i])
        np.testing.assert_array_equal(split.tokens[start : start + length], chunk.inputs)
        np.testing.assert_array_equal(split.tokens[start + 1 : start + length + 1], chunk.targets)


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        (9_000 + 1, [4096, 4096, 808]),  # a 9,000-token body plus EOS: 9,000 pairs
        (8_991, [4096, 4096, 798]),  # 8,991 tokens, EOS included: 8,990 pairs
        (4097, [4096]),
        (4098, [4096, 1]),
        (2, [1]),
    ],
)
def test_known_cuts_at_4096(n, expected):
    tokens = _document(n, 0)
    assert [len(c) for c in split_tokens("doc", tokens, 4096)] == expected
    table = chunk_table(np.array([0]), np.array([n]), 4096)
    assert table.length.tolist() == expected


def test_single_token_document_has_no_pairs():
    assert list(split_tokens("doc", [EOS_TOKEN_ID], 8)) == []
    with pytest.raises(ValueError, match="at least one token before its EOS"):
        chunk_table(np.array([0]), np.array([1]), 8)


@pytest.mark.parametrize("bad", [1, 4097, 0, -5, 2.5, "512", None])
def test_bad_max_seq_len_is_a_clear_error(bad):
    with pytest.raises(ValueError, match=r"data\.max_seq_len must be an integer in 2\.\.4096"):
        check_max_seq_len(bad)
    with pytest.raises(ValueError, match=r"data\.max_seq_len"):
        list(split_tokens("doc", [1, 2, 3], bad))
    with pytest.raises(ValueError, match=r"data\.max_seq_len"):
        chunk_table(np.array([0]), np.array([3]), bad)


@settings(max_examples=80, deadline=None)
@given(
    lengths=st.lists(st.integers(min_value=2, max_value=10_000), max_size=60),
    max_seq_len=CAPACITIES,
    gap=st.integers(0, 5),
)
def test_chunk_table_numpy_path_equals_the_kernel(lengths, max_seq_len, gap):
    """The numba pass and the numpy fallback (no numba, or PRETRAIN_NO_NUMBA=1) build the same table:
    16 bytes per chunk, int32 doc and length, int64 start (documents need not be contiguous)."""
    pytest.importorskip("numba")
    lengths = np.array(lengths, dtype=np.int64)
    offsets = np.cumsum(lengths + gap) - lengths  # `gap` junk tokens before every document
    fast = chunk_table(offsets, lengths, max_seq_len)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PRETRAIN_NO_NUMBA", "1")
        slow = chunk_table(offsets, lengths, max_seq_len)
    for name in ("doc", "start", "length"):
        a, b = getattr(fast, name), getattr(slow, name)
        assert a.dtype == b.dtype == (np.int64 if name == "start" else np.int32)
        np.testing.assert_array_equal(a, b)
    assert fast.total_pairs == slow.total_pairs == int((lengths - 1).sum())
