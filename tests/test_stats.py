"""inspect-data statistics on small hand-built splits whose values are worked out by hand."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import DESIGN_KEYS as INSPECT_DATA_KEYS
from helpers import policy_cfg, split_of
from rich.console import Console

from pretrain.data.leaks import verbatim_leaks
from pretrain.data.measures.stats import inspect_split
from pretrain.data.tokens import TokenSplit
from pretrain.report.inspect_table import render_table, stats_warnings

ROOT = Path(__file__).resolve().parents[1]

# DESIGN.md's inspect-data keys, the composition audit's among them.
AUDIT_KEYS = {
    "truncated_documents",
    "dropped_pairs",
    "fragmented_documents",
    "units_vs_concat",
    "attention_cost",
}
DESIGN_KEYS = {*INSPECT_DATA_KEYS, *AUDIT_KEYS, "policy", "max_seq_len"}

# Bodies of 2, 5, 1 and 9 tokens; with EOS 3 + 6 + 2 + 10 = 21 tokens and 2 + 5 + 1 + 9 = 17 pairs.
BODIES = [[1, 2], [10, 11, 12, 13, 14], [20], [30, 31, 32, 33, 34, 35, 36, 37, 38]]
# At max_seq_len 4 the pairs cut into chunks 2 | 4, 1 | 1 | 4, 4, 1.
CHUNKS = [2, 4, 1, 1, 4, 4, 1]
FIRST_CHUNKS = [2, 4, 1, 4]


def make_cfg(policy: str, *overrides: str):
    return policy_cfg(policy, "data.max_seq_len=4", "train.batch_size=2", *overrides)


def splits():
    train = split_of(BODIES)
    train = TokenSplit(train.tokens, train.offsets, train.lengths, ids=("a", "b", "c", "d"), name="train")
    validation = split_of([[5, 6, 7], [8, 9]], name="validation")
    validation = TokenSplit(
        validation.tokens, validation.offsets, validation.lengths, ids=("b", "z"), name="validation"
    )
    return train, validation


def lengths_summary(values):
    return {
        "min": min(values),
        "median": float(np.median(values)),
        "p90": float(np.percentile(values, 90)),
        "max": max(values),
    }


def check_common(stats):
    assert DESIGN_KEYS <= set(stats)
    json.dumps(stats)  # plain JSON types
    assert stats["documents"] == 4
    assert stats["raw_tokens"] == 21
    assert stats["prediction_pairs"] == 17
    assert stats["max_seq_len"] == 4
    assert stats["train_validation_overlap"] == 1  # "b" is in both
    assert stats["verbatim_leaks"] == 0  # no document reaches 64 tokens
    assert stats["validation"]["documents"] == 2
    # Validation [5, 6, 7] and [8, 9] (+ EOS): 3 + 2 pairs, one chunk each, all in one batch.
    assert stats["validation"]["scored_pairs"] == 5 and stats["validation"]["batches"] == 1


@pytest.mark.parametrize("accumulation", [1, 2])
def test_padded_max(accumulation):
    train, validation = splits()
    stats = inspect_split(make_cfg("padded", f"train.accumulation={accumulation}"), train, validation)
    check_common(stats)
    real = sum(FIRST_CHUNKS)  # 11
    assert stats["policy"] == "padded"
    assert stats["chunks"] == stats["packs"] == 4
    assert stats["chunk_lengths"] == lengths_summary(FIRST_CHUNKS)
    assert stats["truncated_pairs"] == 17 - real
    assert stats["pack_utilization"] == pytest.approx(real / 16)
    assert stats["padding_waste"] == pytest.approx(5 / 16)
    assert stats["cross_document_visible_fraction"] == 0.0
    assert stats["steps_per_epoch"] == 2 // accumulation  # 4 rows, 2 per microbatch
    assert stats["tokens_per_step"] == pytest.approx(real / 2 * accumulation)


@pytest.mark.parametrize(("batch_size", "computed"), [(1, 11), (4, 16)])
def test_padded_longest(batch_size, computed):
    # One row per batch pads nothing; all four rows in one batch pad to the longest row, 4.
    train, validation = splits()
    stats = inspect_split(
        make_cfg("padded", "data.pad_to=longest", f"train.batch_size={batch_size}"), train, validation
    )
    assert stats["padding_waste"] == pytest.approx(1 - 11 / computed)
    assert stats["pack_utilization"] == pytest.approx(11 / computed)
    assert stats["truncated_pairs"] == 6


@pytest.mark.parametrize(
    "policy",
    [("bestfit", "data.packing_buffer=64"), ("prepacked", "data.strategy=bfd")],
    ids=["bestfit", "bfd"],
)
def test_best_fit_policies(policy):
    # Longest first into packs of 4: {4} {4} {4} {2, 1, 1} {1} -- for best fit with a buffer that
    # holds every chunk this does not depend on the shuffle.
    train, validation = splits()
    stats = inspect_split(make_cfg(*policy), train, validation)
    check_common(stats)
    assert stats["chunks"] == 7
    assert stats["chunk_lengths"] == lengths_summary(CHUNKS)
    assert stats["packs"] == 5
    assert stats["pack_utilization"] == pytest.approx(17 / 20)
    assert stats["padding_waste"] == 0.0
    assert stats["truncated_pairs"] == 0
    assert stats["cross_document_visible_fraction"] == 0.0
    assert stats["steps_per_epoch"] == 3  # ceil(5 packs / 2)
    assert stats["tokens_per_step"] == pytest.approx(17 / 3)


def cross_document_fraction_by_hand(lengths, capacity):
    """Per stream position: does an earlier document start inside its window before it?"""
    doc_of = [d for d, n in enumerate(lengths) for _ in range(n)]
    inputs = len(doc_of) - 1
    seeing = sum(doc_of[p] > doc_of[p // capacity * capacity] for p in range(inputs))
    return seeing / inputs


@pytest.mark.parametrize("mask", [True, False])
def test_concat(mask):
    train, validation = splits()
    stats = inspect_split(
        make_cfg("prepacked", "data.strategy=concat", f"data.document_mask={str(mask).lower()}"),
        train,
        validation,
    )
    check_common(stats)
    # 21 tokens, 20 inputs: windows [0,4) [4,8) [8,12) [12,16) [16,20); documents start at 3, 9, 11.
    assert stats["packs"] == 5
    assert stats["pack_utilization"] == pytest.approx(1.0)
    assert stats["truncated_pairs"] == 0
    assert stats["steps_per_epoch"] == 3
    assert stats["tokens_per_step"] == pytest.approx(20 / 3)
    if mask:
        pieces = [3, 1, 4, 1, 2, 1, 4, 4]
        assert stats["chunks"] == len(pieces)
        assert stats["chunk_lengths"] == lengths_summary(pieces)
        assert stats["cross_document_visible_fraction"] == 0.0
    else:
        assert stats["chunks"] == 5
        assert stats["chunk_lengths"] == lengths_summary([4] * 5)
        expected = cross_document_fraction_by_hand([3, 6, 2, 10], 4)
        assert expected == pytest.approx(4 / 20)  # 1 token in window 0, 3 in window 2
        assert stats["cross_document_visible_fraction"] == pytest.approx(expected)


def test_no_ids_no_overlap():
    train = split_of(BODIES)
    validation = split_of([[5, 6, 7]], name="validation")
    assert inspect_split(make_cfg("bestfit"), train, validation)["train_validation_overlap"] == 0


# --- verbatim leaks -----------------------------------------------------------------------------


def leak_fixture():
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 50000, 200), rng.integers(0, 50000, 150)
    train = split_of([a, b])
    validation = split_of(
        [
            np.concatenate(
                [rng.integers(0, 50000, 20), a[10:74], rng.integers(0, 50000, 5)]
            ),  # 64 shared: leak
            np.concatenate([a[100:163], rng.integers(0, 50000, 30)]),  # 63 shared: no leak
            rng.integers(0, 50000, 300),  # unrelated
            np.concatenate([a[-32:], b[:32]]),  # 64 consecutive train tokens only across an EOS: no leak
            b.copy(),  # a whole train document: leak
            a[:40],  # too short to hold a window
        ],
        name="validation",
    )
    return train, validation


def test_verbatim_leaks_hand_built():
    train, validation = leak_fixture()
    assert verbatim_leaks(train, validation) == 2


def brute_force_leaks(train: TokenSplit, validation: TokenSplit, window: int) -> int:
    windows = set()
    for d in range(len(train)):
        body = train.document(d)[:-1].tolist()
        windows.update(tuple(body[i : i + window]) for i in range(len(body) - window + 1))
    leaks = 0
    for d in range(len(validation)):
        body = validation.document(d)[:-1].tolist()
        leaks += any(tuple(body[i : i + window]) in windows for i in range(len(body) - window + 1))
    return leaks


@pytest.mark.parametrize("seed", range(3))
def test_verbatim_leaks_match_brute_force(seed):
    rng = np.random.default_rng(seed)
    vocab = 3  # a tiny vocabulary makes accidental shared windows common
    train_docs = [rng.integers(0, vocab, rng.integers(1, 40)) for _ in range(30)]
    val_docs = []
    for _ in range(30):
        doc = rng.integers(0, vocab, rng.integers(1, 40))
        if rng.random() < 0.3:  # plant a copy of a train snippet
            source = train_docs[rng.integers(len(train_docs))]
            doc = np.concatenate([doc[:5], source[rng.integers(0, 4) :], doc[5:]])
        val_docs.append(doc)
    train = split_of(train_docs)
    validation = split_of(val_docs, name="validation")
    for window in (4, 8, 16):
        assert verbatim_leaks(train, validation, window=window) == brute_force_leaks(
            train, validation, window
        )


def test_leak_makes_the_table_loud():
    train, validation = leak_fixture()
    stats = inspect_split(make_cfg("bestfit", "data.max_seq_len=64"), train, validation)
    assert stats["verbatim_leaks"] == 2
    table = render_table(stats)
    assert "WARNING" in str(table.caption) and "verbatim" in str(table.caption)
    console = Console(record=True, width=100)
    console.print(table)
    assert "WARNING" in console.export_text()

    quiet_train, quiet_validation = split_of(BODIES), split_of([[7, 7]], name="validation")
    quiet = inspect_split(make_cfg("bestfit"), quiet_train, quiet_validation)
    assert render_table(quiet).caption is None


def test_overlap_makes_the_table_loud():
    train, validation = splits()
    stats = inspect_split(make_cfg("bestfit"), train, validation)
    assert "document ids are in both" in str(render_table(stats).caption)


def test_leak_blocks_do_not_change_the_answer(monkeypatch):
    from pretrain.data import leaks as leaks_module

    train, validation = leak_fixture()
    monkeypatch.setattr(leaks_module, "_BLOCK_TOKENS", 70)  # about one document per block
    assert len(list(leaks_module._document_blocks(validation, 64, 70))) == 5
    assert verbatim_leaks(train, validation) == 2


def test_empty_validation_split():
    train = split_of(BODIES)
    stats = inspect_split(make_cfg("bestfit"), train, TokenSplit.from_lengths([], name="validation"))
    assert stats["validation"] == {
        "documents": 0,
        "raw_tokens": 0,
        "prediction_pairs": 0,
        "batches": 0,
        "scored_pairs": 0,
    }
    assert stats["verbatim_leaks"] == 0 and stats["train_validation_overlap"] == 0


# --- the composition audit (data/measures/audit.py), on the same four documents ---------------------
# Pairs 2, 5, 1, 9 at max_seq_len 4: documents 1 and 3 are longer than a chunk. The whole stream of
# 21 tokens makes ceil(20 / 4) = 5 concat windows.


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (  # one row per document's first chunk: 6 of 17 pairs lost, 4 rows of 4
            ("padded",),
            dict(
                truncated=2 / 4,
                dropped=6 / 17,
                fragmented=0.0,
                units=4 / 5,
                cost=4 * 16 / 11,
                padded=4 * 16 / 11,
            ),
        ),
        (  # every chunk its own row: nothing lost, documents 1 and 3 in several rows
            ("padded", "data.long_docs=chunk"),
            dict(
                truncated=0.0,
                dropped=0.0,
                fragmented=2 / 4,
                units=7 / 5,
                cost=7 * 16 / 17,
                padded=7 * 16 / 17,
            ),
        ),
        (  # chunks {4} {4} {4} {2, 1, 1} {1}, each its own segment
            ("bestfit",),
            dict(truncated=0.0, dropped=0.0, fragmented=2 / 4, units=5 / 5, cost=55 / 17, padded=5 * 16 / 17),
        ),
        (  # pieces 3 | 1, 4 | 1, 2, 1 | 4 | 4; document 1's EOS-only piece holds none of its pairs
            ("prepacked", "data.strategy=concat"),
            dict(truncated=0.0, dropped=0.0, fragmented=2 / 4, units=5 / 5, cost=64 / 20, padded=5 * 16 / 20),
        ),
        (  # each window one segment
            ("prepacked", "data.strategy=concat", "data.document_mask=false"),
            dict(truncated=0.0, dropped=0.0, fragmented=2 / 4, units=5 / 5, cost=80 / 20, padded=80 / 20),
        ),
        (  # the stream of the first chunks, 3 + 4 + 2 + 4 = 13 inputs: windows [0,4) [4,8) [8,12) [12,13)
            ("prepacked", "data.strategy=concat", "data.long_docs=truncate"),
            dict(
                truncated=2 / 4,
                dropped=6 / 17,
                fragmented=2 / 4,  # document 1 in windows 0 and 1, document 3 in 2 and 3
                units=4 / 5,
                cost=(9 + 1 + 9 + 1 + 1 + 9 + 1) / 13,  # pieces 3, 1 | 3, 1 | 1, 3 | 1
                padded=4 * 16 / 13,
            ),
        ),
        (  # first chunks 2, 4, 1, 4 by first fit: {4} {4} {2, 1} whatever the shuffle, one segment each
            ("firstfit", "data.long_docs=truncate", "data.document_mask=false"),
            dict(
                truncated=2 / 4, dropped=6 / 17, fragmented=0.0, units=3 / 5, cost=41 / 11, padded=3 * 16 / 11
            ),
        ),
    ],
    ids=[
        "padded",
        "padded-chunk",
        "bestfit",
        "concat",
        "concat-open",
        "concat-truncate",
        "firstfit-truncate-open",
    ],
)
def test_composition_audit_by_hand(policy, expected):
    train, validation = splits()
    stats = inspect_split(make_cfg(*policy), train, validation, audits=False)
    assert stats["truncated_documents"] == pytest.approx(expected["truncated"])
    assert stats["dropped_pairs"] == pytest.approx(expected["dropped"])
    assert stats["fragmented_documents"] == pytest.approx(expected["fragmented"])
    assert stats["units_vs_concat"] == pytest.approx(expected["units"])
    assert stats["attention_cost"] == pytest.approx(expected["cost"])
    assert stats["attention_cost_padded"] == pytest.approx(expected["padded"])
    assert stats["truncated_pairs"] == round(expected["dropped"] * 17)


def test_cross_document_fraction_of_packs_without_the_mask():
    """Only the tokens after a pack's leading run of one document see another: {4} {4} {2, 1} -> 1 of 11."""
    train, validation = splits()
    stats = inspect_split(
        make_cfg("firstfit", "data.long_docs=truncate", "data.document_mask=false"), train, validation
    )
    assert stats["cross_document_visible_fraction"] == pytest.approx(1 / 11)
    assert stats["settings"]["long_docs"] == "truncate" and stats["settings"]["document_mask"] is False


@pytest.mark.parametrize(
    "policy",
    [
        ("padded", "data.pad_to=longest", "data.long_docs=chunk"),
        ("bestfit", "data.document_mask=false"),
        ("prepacked", "data.strategy=concat"),
        ("firstfit", "data.long_docs=truncate"),
    ],
    ids=["padded-longest", "bestfit-open", "concat", "firstfit-truncate"],
)
def test_the_audits_attention_cost_is_that_of_the_batches(policy):
    """`batch_attention_cost` (from cu_seqlens) x real tokens, over an epoch's batches, is the audit's."""
    from pretrain.data.batching.samplers import build_sampler
    from pretrain.data.measures.audit import batch_attention_cost, composition_audit

    train = TokenSplit.from_lengths(np.random.default_rng(8).integers(2, 40, size=50), seed=8)
    cfg = policy_cfg(policy[0], "data.max_seq_len=8", "train.batch_size=1", *policy[1:])
    sampler = build_sampler(cfg, train)
    audit = composition_audit(cfg, train, sampler=sampler)
    batches = list(sampler)
    real = sum(b.real_tokens for b in batches)
    assert sum(batch_attention_cost(b) * b.real_tokens for b in batches) == pytest.approx(
        audit["attention_cost"] * real
    )
    assert set(audit) == {
        "truncated_documents",
        "dropped_pairs",
        "fragmented_documents",
        "units_vs_concat",
        "attention_cost",
        "attention_cost_padded",
        "cross_document_visible_fraction",
        "positions",
    }


def test_the_audit_is_in_the_table():
    train, validation = splits()
    console = Console(width=120, record=True)
    console.print(render_table(inspect_split(make_cfg("padded"), train, validation, audits=False)))
    text = console.export_text()
    assert "truncated_documents" in text and "50.00 %" in text  # 2 of 4 documents
    assert "units_vs_concat" in text and "0.80000" in text


def test_the_leak_warning_names_the_documents_and_where_every_id_is():
    train, plain = leak_fixture()
    ids = [f"{d:02d}" + "ab" * 31 for d in range(len(plain))]  # sha256-like: 64 hex characters
    validation = TokenSplit(plain.tokens, plain.offsets, plain.lengths, name="validation", ids=ids)
    stats = inspect_split(make_cfg("bestfit", "data.max_seq_len=64"), train, validation)
    assert stats["verbatim_leak_ids"] == [ids[0], ids[4]]  # the planted window and the whole copy
    (warning,) = stats_warnings(stats)
    assert f"ids {ids[0][:12]}, {ids[4][:12]} (every id" in warning
    assert "verbatim_leak_ids in the JSON of inspect-data output=FILE" in warning


def test_the_leak_warning_says_what_it_means_and_how_to_act():
    (one,) = stats_warnings({"verbatim_leaks": 1, "verbatim_leak_ids": ["ab" * 32]})
    assert one.startswith("WARNING: 1 validation document shares a 64-token passage with a train document")
    assert "memorisation" in one and "split.decontaminate=true" in one
    assert "abababababab" in one and "\n" not in one
    (two,) = stats_warnings({"verbatim_leaks": 2, "verbatim_leak_ids": ["a" * 64, "b" * 64]})
    assert two.startswith("WARNING: 2 validation documents share")
