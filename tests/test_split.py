"""document_id / document_split: the per-document split, recomputed independently with hashlib."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pretrain.config import DEFAULT_SPLIT_SEED, DEFAULT_VALIDATION_FRACTION
from pretrain.data import document_id, document_split
from pretrain.data.ingest import split as split_module

SEED = 20261003
FRACTION = 0.05


def u_of(doc_id: str, seed: int) -> float:
    """The uniform number the contract derives from (seed, id): sha256 of "seed:id", first 64 bits."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{doc_id}".encode()).digest()[:8], "big") / 2**64


def ids(n: int, prefix: str = "doc") -> list[str]:
    return [hashlib.sha256(f"{prefix}-{i}".encode()).hexdigest() for i in range(n)]


@pytest.mark.parametrize("text", ["Hello world", "", "café ☕ 日本語", "a\nb\tc", "<|endoftext|>"])
def test_document_id_is_sha256_of_utf8(text):
    assert document_id(text) == hashlib.sha256(text.encode("utf-8")).hexdigest()


def test_exact_duplicates_collide_and_near_duplicates_do_not():
    assert document_id("The same text.") == document_id("The same text.")
    assert document_id("The same text.") != document_id("The same text. ")
    assert document_id("The same text.") != document_id("the same text.")


def test_split_example():
    """The worked example: the split of "Hello world" under the default seed and fraction."""
    doc = document_id("Hello world")
    expected = "validation" if u_of(doc, SEED) < FRACTION else "train"
    assert (DEFAULT_SPLIT_SEED, DEFAULT_VALIDATION_FRACTION) == (SEED, FRACTION)  # the schema's defaults
    assert document_split(doc, SEED, FRACTION) == expected


def test_split_matches_the_hashlib_recomputation_exactly():
    """Thresholds just below and above each id's own number pin the exact hash and comparison."""
    for doc in ids(300, "exact"):
        u = u_of(doc, SEED)
        assert document_split(doc, SEED, FRACTION) == ("validation" if u < FRACTION else "train")
        assert document_split(doc, SEED, min(1.0, u + 1e-12)) == "validation"
        assert document_split(doc, SEED, max(0.0, u - 1e-12)) == "train"


# The child loads split.py by itself (it needs only hashlib): no torch import, so each child is quick.
_CHILD = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("split_under_test", {path!r})
split = importlib.util.module_from_spec(spec)
spec.loader.exec_module(split)
ids = json.loads(sys.stdin.read())
print(json.dumps([split.document_split(i, seed, fraction) for i in ids for seed, fraction in {params}]))
"""
_PARAMS = [(SEED, FRACTION), (1, 0.5), (987654321, 0.2)]


def test_split_is_identical_across_processes_and_hash_seeds():
    docs = ids(500, "proc")
    here = [document_split(i, seed, fraction) for i in docs for seed, fraction in _PARAMS]
    code = _CHILD.format(path=split_module.__file__, params=_PARAMS)
    for hashseed in ("0", "1", "12345", "random"):
        result = subprocess.run(
            [sys.executable, "-c", code],
            input=json.dumps(docs),
            capture_output=True,
            text=True,
            env={"PYTHONHASHSEED": hashseed, "PATH": "/usr/bin:/bin"},
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout) == here, f"PYTHONHASHSEED={hashseed} changed the split"


@pytest.mark.parametrize("fraction", [0.05, 0.2, 0.5])
def test_fraction_is_respected_on_20k_ids(fraction):
    docs = ids(20_000, f"frac{fraction}")
    n = sum(document_split(d, SEED, fraction) == "validation" for d in docs)
    expected = 20_000 * fraction
    sigma = (20_000 * fraction * (1 - fraction)) ** 0.5
    assert abs(n - expected) < 5 * sigma, (n, expected)


def test_fraction_bounds():
    docs = ids(1000, "bounds")
    assert all(document_split(d, SEED, 0.0) == "train" for d in docs)
    assert all(document_split(d, SEED, 1.0) == "validation" for d in docs)
    for bad in (-0.01, 1.01):
        with pytest.raises(ValueError, match="validation_fraction"):
            document_split(docs[0], SEED, bad)


def test_seed_changes_the_split_independently():
    docs = ids(20_000, "seed")
    a = {d for d in docs if document_split(d, 1, FRACTION) == "validation"}
    b = {d for d in docs if document_split(d, 2, FRACTION) == "validation"}
    assert a != b
    # Independent splits share about fraction^2 of the ids (~50 here); the same split would share ~1000.
    overlap = len(a & b)
    assert overlap < 150, overlap
    assert 30 < overlap


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(max_size=200),
    seed=st.integers(min_value=0, max_value=2**63),
    f1=st.floats(min_value=0.0, max_value=1.0),
    f2=st.floats(min_value=0.0, max_value=1.0),
)
def test_split_invariants(text, seed, f1, f2):
    doc = document_id(text)
    lo, hi = sorted((f1, f2))
    first = document_split(doc, seed, lo)
    assert first in ("train", "validation")
    assert document_split(doc, seed, lo) == first  # pure function
    if first == "validation":  # monotone: a larger fraction keeps every validation document
        assert document_split(doc, seed, hi) == "validation"
    assert first == ("validation" if u_of(doc, seed) < lo else "train")
