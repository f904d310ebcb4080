"""Any Hugging Face fast tokenizer from a tokenizer.json (data/ingest/tokenizer_json.py), with tokenizers
trained here offline: its EOS (from the file, from tokenizer_config.json, explicit, or refused), the
cache identity (the file's sha256; GPT-2's identity keeps its keys), token_dtype=auto past 65,535 ids
with a real cache build, the token byte table bits per byte rests on, and model.vocab_size."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import compose, local_overrides, write_jsonl
from helpers.trained_tokenizers import EOS, LARGE_VOCAB, large_bpe, small_bpe

from pretrain.config import to_config
from pretrain.data.ingest.cache import CacheSpec, cache_identity, resolve_token_dtype
from pretrain.data.ingest.prepare import prepare_cache
from pretrain.data.ingest.tokenizer import token_byte_lengths
from pretrain.data.ingest.tokenizer_json import TokenizerJson, resolve_tokenizer, tokenizer_vocab_size
from pretrain.errors import ConfigError, TokenizerError
from pretrain.training.startup import with_tokenizer_vocab


@pytest.fixture(scope="module")
def bpe(tmp_path_factory) -> Path:
    return small_bpe(tmp_path_factory.mktemp("tok") / "tokenizer.json")


@pytest.fixture(scope="module")
def large(tmp_path_factory) -> tuple[Path, list[str]]:
    return large_bpe(tmp_path_factory.mktemp("large") / "tokenizer.json")


def tokenizer_cfg(path: Path, *overrides: str):
    return to_config(compose("tokenizer=json", f"tokenizer.file={path}", *overrides)).tokenizer


def test_eos_from_the_file(bpe):
    files = resolve_tokenizer(tokenizer_cfg(bpe))
    assert isinstance(files, TokenizerJson)
    assert files.eos_text == EOS and files.eos_token_id == files.build().token_to_id(EOS) == 0
    assert tokenizer_vocab_size(tokenizer_cfg(bpe)) == 700


def test_eos_from_tokenizer_config_beside_and_explicit(tmp_path):
    path = small_bpe(tmp_path / "tokenizer.json", special_tokens=("<pad>", "<stop>"))
    with pytest.raises(TokenizerError, match=r"names no EOS token .*set tokenizer.eos_token=<its EOS text>"):
        resolve_tokenizer(tokenizer_cfg(path))
    explicit = resolve_tokenizer(tokenizer_cfg(path, "tokenizer.eos_token='<stop>'"))
    assert (explicit.eos_text, explicit.eos_token_id) == ("<stop>", 1)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<stop>"}))
    assert resolve_tokenizer(tokenizer_cfg(path)).eos_token_id == 1
    with pytest.raises(TokenizerError, match="tokenizer.eos_token='<nope>' is not a token of"):
        resolve_tokenizer(tokenizer_cfg(path, "tokenizer.eos_token='<nope>'"))
    for not_settings in ("[]", '"<stop>"', "3"):  # JSON, but not an object: one line (was AttributeError)
        (tmp_path / "tokenizer_config.json").write_text(not_settings)
        with pytest.raises(TokenizerError, match=r"tokenizer_config.json holds a JSON \w+, not an object"):
            resolve_tokenizer(tokenizer_cfg(path))


def test_missing_or_malformed_file_refused(tmp_path):
    with pytest.raises(TokenizerError, match="is not a file; give the path of a tokenizer.json"):
        resolve_tokenizer(tokenizer_cfg(tmp_path / "absent.json"))
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"model": 3}')
    with pytest.raises(TokenizerError, match="is not a tokenizer.json the tokenizers library can load"):
        resolve_tokenizer(tokenizer_cfg(bad))


def test_identity_records_the_file_sha256_and_gpt2_keeps_its_keys(bpe, tmp_path):
    import hashlib

    config = to_config(compose("tokenizer=json", f"tokenizer.file={bpe}"))
    files = resolve_tokenizer(config.tokenizer)
    identity = cache_identity(config.source, config.tokenizer, files, config.split, config.budget)
    assert identity["tokenizer"]["content_sha256"] == hashlib.sha256(bpe.read_bytes()).hexdigest()
    assert identity["tokenizer"]["eos_token"] == EOS and identity["eos_token_id"] == 0
    # Another file with the same vocabulary but other bytes is another cache.
    copy = tmp_path / "tokenizer.json"
    copy.write_text(json.dumps(json.loads(bpe.read_text()), indent=1))
    other = to_config(compose("tokenizer=json", f"tokenizer.file={copy}"))
    assert CacheSpec.from_config(other).key != CacheSpec.from_config(config).key
    gpt2 = to_config(compose())
    gpt2_identity = CacheSpec.from_config(gpt2).identity
    assert set(gpt2_identity["tokenizer"]) == {"name", "revision", "content_sha256"}
    assert gpt2_identity["eos_token_id"] == 50256


def test_token_bytes_sum_to_the_text_bytes(bpe):
    """Byte-level BPE is lossless: a text's UTF-8 bytes are the sum of its tokens' (bits per byte)."""
    files = resolve_tokenizer(tokenizer_cfg(bpe))
    table = token_byte_lengths(files, 700)
    assert table[files.eos_token_id] == 0
    for text in ["Plain words, and numbers 12345.", "naïve café — ünïcödé ✓ 漢字", "  spaces\n\ttabs "]:
        ids = files.build().encode(text, add_special_tokens=False).ids
        assert int(table[ids].sum()) == len(text.encode("utf-8"))


def test_a_literal_eos_in_a_document_is_text(bpe):
    files = resolve_tokenizer(tokenizer_cfg(bpe))
    ids, lengths = files.encoder().encode([f"before {EOS} after"])
    assert files.eos_token_id not in ids.tolist() and lengths.tolist() == [len(ids)]


def test_token_dtype_auto_past_65535_ids(bpe, large):
    path, _ = large
    assert resolve_token_dtype("auto", resolve_tokenizer(tokenizer_cfg(bpe))) == "uint16"
    big = resolve_tokenizer(tokenizer_cfg(path))
    assert big.max_token_id() == LARGE_VOCAB - 1 > 65_535
    assert resolve_token_dtype("auto", big) == "uint32"
    with pytest.raises(ConfigError, match="uint16 cannot hold this tokenizer's ids"):
        resolve_token_dtype("uint16", big)


def test_a_cache_of_ids_past_65535(large, tmp_path, monkeypatch):
    """A real build with the large tokenizer: uint32 tokens, ids past 65,535 in them, EOS (its id in
    this file) closing every document."""
    path, words = large
    monkeypatch.setenv("PRETRAIN_CACHE_ROOT", str(tmp_path / "cache"))
    texts = [" ".join(words[-(i + 1) * 40 : -i * 40 or None]) for i in range(30)]  # the last-merged words
    corpus = write_jsonl(tmp_path / "corpus.jsonl", texts)
    cfg = compose(
        *local_overrides([corpus]), "tokenizer=json", f"tokenizer.file={path}", "budget.validation_tokens=0"
    )
    spec = CacheSpec.from_config(to_config(cfg))
    assert spec.identity["dtype"] == "uint32"
    cache = prepare_cache(spec)
    split = cache.split("train")
    assert split.tokens.dtype == np.dtype("<u4") and int(split.tokens.max()) > 65_535
    eos = spec.tokenizer_files.eos_token_id
    ends = split.offsets + split.lengths - 1
    assert np.all(split.tokens[ends] == eos) and int((split.tokens == eos).sum()) == len(ends)


def test_model_vocab_size_follows_the_tokenizer(bpe):
    config = with_tokenizer_vocab(to_config(compose("tokenizer=json", f"tokenizer.file={bpe}")))
    assert config.model.vocab_size == 700
    assert with_tokenizer_vocab(to_config(compose())).model.vocab_size == 50257  # GPT-2, files unread
    padded = with_tokenizer_vocab(
        to_config(compose("tokenizer=json", f"tokenizer.file={bpe}", "model.vocab_size=768"))
    )
    assert padded.model.vocab_size == 768
    with pytest.raises(ConfigError, match="model.vocab_size=600 must be >= 700"):
        with_tokenizer_vocab(
            to_config(compose("tokenizer=json", f"tokenizer.file={bpe}", "model.vocab_size=600"))
        )
