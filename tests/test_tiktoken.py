"""tiktoken, built from the local GPT-2 files, gives exactly `tokenizers`' ids (the reference), and a
build that would disagree fails instead of writing other ids."""

from __future__ import annotations

import dataclasses
import json
import sys

import numpy as np
import pytest
from helpers import cache_spec, reference_encode
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pretrain.data.ingest.tokenizer import (
    EOS_TEXT,
    EOS_TOKEN_ID,
    TiktokenEncoder,
    TokenizerError,
    TokenizerFiles,
    TokenizersEncoder,
    build_encoder,
    bundled_files,
)


@pytest.fixture(scope="module")
def encoders():
    files = bundled_files()
    fast, notice = build_encoder(files, "auto")
    assert notice is None and isinstance(fast, TiktokenEncoder)
    return fast, TokenizersEncoder(files)


def ids_of(encoder, text: str) -> list[int]:
    ids, lengths = encoder.encode([text])
    assert lengths.tolist() == [len(ids)]
    return ids.tolist()


# Pieces GPT-2's pre-tokenizer treats differently: whitespace runs before words, contractions, digits,
# emoji (with joiners and variation selectors), CJK, combining marks, the EOS text and pieces of it.
_PIECES = st.sampled_from(
    [
        " ",
        "  ",
        "   ",
        "\t",
        "\n",
        "\n\n",
        "\r\n",
        "\u00a0",
        "\u3000",
        "\u2028",
        "\x0b",
        "\x85",
        "'s",
        "'ll",
        "'VE",
        "don't",
        "0",
        "42",
        "3.14159",
        "١٢٣",
        "½",
        "🎉",
        "👩‍💻",
        "🏳️‍🌈",
        "\ufe0f",
        "日本語",
        "한국어",
        "é",
        "e\u0301",
        "Ελληνικά",
        "<|endoftext|>",
        "<|endoftext",
        "|>",
        "<|",
        "endoftext",
        "the",
        " the",
        "Hello",
        "!!!",
        "...",
        "$",
        "\\",
    ]
)
_TEXT = st.lists(
    st.one_of(_PIECES, st.text(max_size=12), st.text(alphabet=st.characters(codec="utf-8"), max_size=6)),
    max_size=24,
).map("".join)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=_TEXT)
def test_tiktoken_gives_the_ids_of_tokenizers(encoders, text):
    fast, reference = encoders
    assert ids_of(fast, text) == ids_of(reference, text)


@settings(max_examples=60, deadline=None)
@given(texts=st.lists(_TEXT, max_size=12))
def test_batches_keep_document_boundaries(encoders, texts):
    fast, reference = encoders
    ids, lengths = fast.encode(texts)
    want, want_lengths = reference.encode(texts)
    assert lengths.tolist() == want_lengths.tolist() and ids.tolist() == want.tolist()
    assert ids.dtype == np.uint32 and lengths.dtype == np.int64


def test_known_ids_and_the_literal_eos_text_stays_text(encoders):
    fast, _ = encoders
    assert ids_of(fast, "Hello world") == [15496, 995] == reference_encode("Hello world")
    text = f"a {EOS_TEXT} b{EOS_TEXT}"
    ids = ids_of(fast, text)
    assert EOS_TOKEN_ID not in ids and ids == reference_encode(text)
    assert ids_of(fast, "") == []


def _copy_files(tmp_path, vocab_edit=None, merges_edit=None) -> TokenizerFiles:
    bundled = bundled_files()
    vocab = json.loads(bundled.vocab.read_text(encoding="utf-8"))
    merges = bundled.merges.read_text(encoding="utf-8")
    if vocab_edit:
        vocab = vocab_edit(vocab)
    if merges_edit:
        merges = merges_edit(merges)
    (tmp_path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (tmp_path / "merges.txt").write_text(merges, encoding="utf-8")
    return TokenizerFiles(vocab=tmp_path / "vocab.json", merges=tmp_path / "merges.txt", origin="files")


def test_other_files_fall_back_to_tokenizers_with_a_notice(tmp_path):
    def swap(vocab):  # two ranks exchanged: not the merges in rank order, tiktoken would differ
        a, b = "Ġthe", "Ġand"
        vocab[a], vocab[b] = vocab[b], vocab[a]
        return vocab

    files = _copy_files(tmp_path, vocab_edit=swap)
    encoder, notice = build_encoder(files, "auto")
    assert isinstance(encoder, TokenizersEncoder)
    assert notice is not None and "tokenizers" in notice and "rank order" in notice
    with pytest.raises(TokenizerError, match="prepare.encoder=tiktoken cannot encode"):
        build_encoder(files, "tiktoken")
    (tmp_path / "same").mkdir()
    same = _copy_files(tmp_path / "same")  # GPT-2's files unchanged, under other names: tiktoken
    assert build_encoder(same, "auto")[0].name == "tiktoken"


def test_without_tiktoken_auto_uses_tokenizers(monkeypatch):
    monkeypatch.setitem(sys.modules, "tiktoken", None)  # import tiktoken -> ImportError
    encoder, notice = build_encoder(bundled_files(), "auto")
    assert encoder.name == "tokenizers" and notice is not None and "not installed" in notice


def test_unknown_encoder_is_refused():
    with pytest.raises(TokenizerError, match="prepare.encoder='fast'"):
        build_encoder(bundled_files(), "fast")


def test_the_encoder_choice_is_not_in_the_cache(make_cfg):
    from pretrain.data.ingest.prepare import prepare_cache

    def build(encoder: str, root):
        spec = cache_spec(make_cfg(**{"prepare.encoder": encoder, "prepare.num_proc": 1}))
        spec = dataclasses.replace(spec, root=root)
        return spec, prepare_cache(spec, progress=False)

    root = cache_spec(make_cfg()).root
    spec_a, a = build("tiktoken", root / "a")
    spec_b, b = build("tokenizers", root / "b")
    assert spec_a.key == spec_b.key and a.directory.name == b.directory.name
    assert a.manifest["build"]["encoder"] == "tiktoken" and b.manifest["build"]["encoder"] == "tokenizers"
    assert a.manifest["build"]["cross_checked_documents"] > 0
    for name in ("train.bin", "train.jsonl", "validation.bin", "validation.jsonl"):
        assert (a.directory / name).read_bytes() == (b.directory / name).read_bytes(), name


def test_a_disagreement_fails_the_build(make_cfg, monkeypatch, cache_root):
    original = TiktokenEncoder.encode

    def off_by_one(self, texts):  # a broken fast encoder: one id of every document changed
        ids, lengths = original(self, texts)
        ids = ids.copy()
        ids[np.cumsum(lengths)[lengths > 0] - 1] += 1
        return ids, lengths

    monkeypatch.setattr(TiktokenEncoder, "encode", off_by_one)
    spec = cache_spec(make_cfg(**{"prepare.num_proc": 1}))
    from pretrain.data.ingest.prepare import prepare_cache

    with pytest.raises(TokenizerError, match="tiktoken and tokenizers disagree on document [0-9a-f]{64}"):
        prepare_cache(spec, progress=False)
    assert not spec.directory.exists()


def test_the_ranks_are_tiktokens_own_conversion_of_the_files(monkeypatch):
    """Our reader of encoder.json/vocab.bpe gives exactly what tiktoken.load makes of them (with its
    download cache switched off, since it keys local paths by name)."""
    import tiktoken.load

    from pretrain.data.ingest.tokenizer import _gpt2_mergeable_ranks

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")
    files = bundled_files()
    expected = tiktoken.load.data_gym_to_mergeable_bpe_ranks(str(files.merges), str(files.vocab))
    assert _gpt2_mergeable_ranks(files) == expected
