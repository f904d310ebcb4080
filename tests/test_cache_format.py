"""The cache's on-disk format and start-up: uint16/uint32 tokens, the binary index, quick (stat)
verification with verified records, read-only caches, `pretrain verify`, and bytes per token.

Expectations come from the files themselves (numpy, json, hashlib) and from real writes: a flipped byte
is written with `write_bytes`, a copy is made with shutil, a read-only cache is chmod'ed and used by a
process without the capabilities that let root ignore permissions.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import threading
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from helpers import (
    POLICY_VARIANTS,
    REPO,
    base_overrides,
    cache_spec,
    compose,
    local_overrides,
    module_cache_root,
    policy_cfg,
    prepare,
    write_parquet,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from pretrain.cli import main as cli_main
from pretrain.data import index as index_module
from pretrain.data.batching.evaluation import evaluation_batches, evaluation_chunks
from pretrain.data.batching.samplers import build_sampler
from pretrain.data.ingest import verify as cache_module
from pretrain.data.ingest.cache import CacheError, disk_bytes, identity_key, manifest_checksum
from pretrain.data.ingest.tokenizer import bundled_files
from pretrain.data.ingest.writer import SplitWriter
from pretrain.errors import ConfigError

cache_root = module_cache_root()
FRACTION = 0.2
CACHE_FILES = [
    f"{split}{suffix}" for split in ("train", "validation") for suffix in (".bin", ".jsonl", ".index.npy")
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, corpus_texts) -> Path:
    return write_parquet(
        tmp_path_factory.mktemp("corpus") / "corpus.parquet", corpus_texts, row_group_size=40
    )


def cfg_of(corpus: Path, *overrides: str):
    return compose(*local_overrides([corpus], **{"split.validation_fraction": FRACTION}), *overrides)


@pytest.fixture(scope="module")
def caches(cache_root, corpus):
    """The fixture corpus cached twice: auto (uint16 for GPT-2) and uint32."""
    return {
        "uint16": prepare(cfg_of(corpus), progress=False),
        "uint32": prepare(cfg_of(corpus, "cache.token_dtype=uint32"), progress=False),
    }


@pytest.fixture
def count_hashes(monkeypatch):
    """The files the cache verification hashes (sha256 of whole files), in order."""
    hashed: list[str] = []
    original = cache_module.sha256_file

    def counting(path, *args, **kwargs):
        hashed.append(Path(path).name)
        return original(path, *args, **kwargs)

    monkeypatch.setattr(cache_module, "sha256_file", counting)
    return hashed


def copy_cache(cache, root: Path) -> Path:
    """A copy of a cache (new inodes, the records of the original included) under a new root."""
    target = root / cache.directory.name
    shutil.copytree(cache.directory, target, ignore=shutil.ignore_patterns("*.lock", "packs"))
    return target


def _rewrite(path: Path, data: bytes) -> None:
    path.write_bytes(data)


# --- token dtype --------------------------------------------------------------------------------


def test_token_dtype_is_in_the_identity_and_the_manifest(caches, corpus):
    small, large = caches["uint16"], caches["uint32"]
    assert small.manifest["token_dtype"] == small.manifest["identity"]["dtype"] == "uint16"
    assert large.manifest["token_dtype"] == large.manifest["identity"]["dtype"] == "uint32"
    assert small.directory != large.directory
    spec = cache_spec(cfg_of(corpus, "cache.token_dtype=uint16"))
    assert spec.key == small.directory.name  # auto = uint16
    # A cache of the previous format (uint32, no binary index) has another key: it is never reused.
    assert identity_key({**spec.identity, "format": 1, "dtype": "uint32"}) not in (
        spec.key,
        large.directory.name,
    )
    for split in ("train", "validation"):
        a, b = small.split(split), large.split(split)
        assert a.tokens.dtype == np.uint16 and b.tokens.dtype == np.uint32
        assert np.array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
        assert (small.directory / f"{split}.bin").stat().st_size * 2 == (
            large.directory / f"{split}.bin"
        ).stat().st_size
        for name in (f"{split}.jsonl", f"{split}.index.npy"):
            assert (small.directory / name).read_bytes() == (large.directory / name).read_bytes()


@pytest.mark.parametrize("case", list(POLICY_VARIANTS))
def test_uint16_and_uint32_caches_give_identical_batches(caches, case, tmp_path):
    # (concat windows without the document mask also gather each next document's first token as a target)
    policy, *extra = POLICY_VARIANTS[case]
    settings_ = policy_cfg(policy, "data.max_seq_len=64", "train.batch_size=3", *extra)
    batches = {}
    for name, cache in caches.items():
        sampler = build_sampler(settings_, cache.split("train"), packs_dir=tmp_path / name)
        train = list(sampler)
        validation = cache.split("validation")
        chunks = evaluation_chunks(validation, settings_.max_seq_len)
        batches[name] = train + list(evaluation_batches(settings_, validation, chunks))
    assert len(batches["uint16"]) == len(batches["uint32"]) > 10
    for a, b in zip(batches["uint16"], batches["uint32"], strict=True):
        for field in ("input_ids", "targets", "position_ids", "cu_seqlens", "pack_lengths"):
            x, y = getattr(a, field), getattr(b, field)
            assert x.dtype == y.dtype and bool((x == y).all()), field
        assert (a.num_targets, a.max_seqlen) == (b.num_targets, b.max_seqlen)


def _large_vocabulary(tmp_path: Path) -> list[str]:
    """GPT-2's files plus one token with id 70,000 (an honest vocabulary the uint16 cannot hold)."""
    files = bundled_files()
    vocab = json.loads(files.vocab.read_text(encoding="utf-8"))
    vocab["Ġzyzzyvaquux"] = 70_000
    (tmp_path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    shutil.copy(files.merges, tmp_path / "merges.txt")
    return [
        "tokenizer.source=files",
        f"tokenizer.vocab_file='{tmp_path / 'vocab.json'}'",
        f"tokenizer.merges_file='{tmp_path / 'merges.txt'}'",
    ]


def test_uint16_with_a_larger_vocabulary_is_refused(tmp_path, corpus):
    tokenizer = _large_vocabulary(tmp_path)
    with pytest.raises(
        ConfigError, match=r"cache\.token_dtype=uint16 .*70,000.*cache\.token_dtype=auto or uint32"
    ):
        cache_spec(cfg_of(corpus, *tokenizer, "cache.token_dtype=uint16"))
    assert cache_spec(cfg_of(corpus, *tokenizer)).identity["dtype"] == "uint32"  # auto
    assert cache_spec(cfg_of(corpus, *tokenizer, "cache.token_dtype=uint32")).token_dtype == np.uint32


def test_writer_never_wraps_a_token_around(tmp_path):
    writer = SplitWriter(tmp_path, "train", None, token_dtype=np.uint16)
    writer.write("a" * 64, np.array([65_535, 50256], dtype=np.uint32))
    with pytest.raises(CacheError, match="uint16.*cache.token_dtype=uint32"):
        writer.write("b" * 64, np.array([65_536, 50256], dtype=np.uint32))
    writer.abort()


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 40), max_size=30),
    cuts=st.lists(st.integers(0, 30), max_size=4),
    dtype=st.sampled_from([np.uint16, np.uint32]),
    seed=st.integers(0, 2**16),
)
def test_write_many_writes_the_bytes_of_write(tmp_path_factory, lengths, cuts, dtype, seed):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 50257, size=sum(lengths)).astype(np.uint32)
    ids = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(len(lengths))]
    one, many = tmp_path_factory.mktemp("one"), tmp_path_factory.mktemp("many")
    a, b = (
        SplitWriter(one, "train", None, token_dtype=dtype),
        SplitWriter(many, "train", None, token_dtype=dtype),
    )
    bounds = np.concatenate([[0], np.cumsum(lengths)]).astype(int)
    for i, doc_id in enumerate(ids):
        a.write(doc_id, tokens[bounds[i] : bounds[i + 1]])
    edges = sorted({0, len(ids), *(c for c in cuts if c <= len(ids))})
    for lo, hi in zip(edges, edges[1:], strict=False):
        b.write_many(ids[lo:hi], tokens[bounds[lo] : bounds[hi]], np.asarray(lengths[lo:hi]))
    assert a.close() == b.close()
    for name in ("train.bin", "train.jsonl", "train.index.npy"):
        assert (one / name).read_bytes() == (many / name).read_bytes()
    lines = [json.loads(line) for line in (one / "train.jsonl").read_text().splitlines()]
    table = np.load(one / "train.index.npy")
    assert [e["id"] for e in lines] == ids
    assert table.tolist() == [[e["offset"] for e in lines], [e["length"] for e in lines]]
    assert np.fromfile(one / "train.bin", dtype=np.dtype(dtype).newbyteorder("<")).tolist() == tokens.tolist()


# --- loading without JSON -------------------------------------------------------------------------


def test_a_split_loads_without_parsing_json_and_ids_stay_lazy(caches):
    cache = caches["uint16"]
    parsed = AssertionError("parsed the JSONL")
    with (
        mock.patch.object(cache_module, "read_index", side_effect=parsed),
        mock.patch.object(index_module, "read_index", side_effect=parsed),  # what DocumentIds reads with
    ):
        with mock.patch("json.loads", side_effect=AssertionError("parsed JSON")):
            train = cache.split("train")
            sampler = build_sampler(policy_cfg("bestfit", "data.max_seq_len=64"), train)
            next(iter(sampler))
    assert not train.ids.loaded and len(train.ids) == cache.manifest["splits"]["train"]["documents"]
    lines = [json.loads(line) for line in (cache.directory / "train.jsonl").read_text().splitlines()]
    assert list(train.ids) == [e["id"] for e in lines]  # read when asked (statistics, audits)
    assert train.offsets.tolist() == [e["offset"] for e in lines]
    assert train.lengths.tolist() == [e["length"] for e in lines]


# --- quick verification: stats and verified records ------------------------------------------------


def test_reuse_hashes_nothing_and_a_flipped_byte_is_caught(tmp_path, monkeypatch, corpus, count_hashes):
    monkeypatch.setenv("PRETRAIN_CACHE_ROOT", str(tmp_path / "root"))
    cfg = cfg_of(corpus)
    built = prepare(cfg, progress=False)
    assert count_hashes == []  # the build hashed while writing: no file is read back
    prepare(cfg, progress=False)
    assert count_hashes == []  # reuse: manifest, sizes and stats only
    path = built.directory / "train.bin"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    _rewrite(path, bytes(data))  # a real write, same size
    with pytest.raises(CacheError, match=r"train\.bin does not match its sha256.*cache\.rebuild=true"):
        prepare(cfg, progress=False)
    assert count_hashes == ["train.bin"]  # only the file whose stat changed


def test_a_copied_cache_is_hashed_once_then_remembered(tmp_path, monkeypatch, caches, corpus, count_hashes):
    root = tmp_path / "copy"
    directory = copy_cache(caches["uint16"], root)
    monkeypatch.setenv("PRETRAIN_CACHE_ROOT", str(root))
    cache = prepare(cfg_of(corpus), progress=False)
    assert cache.directory == directory
    assert sorted(count_hashes) == sorted(CACHE_FILES)  # new inodes: every file once
    prepare(cfg_of(corpus), progress=False)
    prepare(cfg_of(corpus), progress=False)
    assert sorted(count_hashes) == sorted(CACHE_FILES)  # then remembered
    record = json.loads((directory / ".verified.json").read_text())
    assert record["directory"] == str(directory) and set(record["files"]) == set(CACHE_FILES)
    # Replaced in place by a copy (same path, same mtimes, its record along): new inodes, hashed again.
    shutil.move(directory, tmp_path / "moved")
    shutil.copytree(tmp_path / "moved", directory)
    count_hashes.clear()
    prepare(cfg_of(corpus), progress=False)
    assert sorted(count_hashes) == sorted(CACHE_FILES)
    prepare(cfg_of(corpus), progress=False)
    assert sorted(count_hashes) == sorted(CACHE_FILES)


def test_ranks_starting_together_hash_once(tmp_path, caches, count_hashes):
    directory = copy_cache(caches["uint16"], tmp_path / "ranks")
    identity = caches["uint16"].manifest["identity"]
    results, errors = [], []

    def rank():
        try:
            results.append(cache_module.check_cache(directory, identity, "quick"))
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=rank) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert sorted(count_hashes) == sorted(CACHE_FILES)
    assert sorted(len(r.hashed) for r in results) == [0, 0, 0, len(CACHE_FILES)]


def test_full_mode_hashes_every_file_and_checks_the_indexes(
    tmp_path, monkeypatch, caches, corpus, count_hashes
):
    directory = copy_cache(caches["uint16"], tmp_path / "full")
    monkeypatch.setenv("PRETRAIN_CACHE_ROOT", str(tmp_path / "full"))
    prepare(cfg_of(corpus), progress=False)
    count_hashes.clear()
    prepare(cfg_of(corpus, "cache.verify=full"), progress=False)
    assert sorted(count_hashes) == sorted(CACHE_FILES)
    # A binary index that disagrees with the JSONL (manifest re-signed) is caught by the full check.
    table = np.load(directory / "train.index.npy")
    table[1, [0, 1]] = table[1, [1, 0]]
    np.save(directory / "train.index.npy", table)
    manifest = json.loads((directory / "manifest.json").read_text())
    entry = manifest["splits"]["train"]["files"]["index_npy"]
    entry["sha256"] = hashlib.sha256((directory / "train.index.npy").read_bytes()).hexdigest()
    manifest["checksum"] = manifest_checksum(manifest)
    (directory / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CacheError, match=r"train\.index\.npy does not agree with the JSONL index"):
        prepare(cfg_of(corpus, "cache.verify=quick"), progress=False)  # a new manifest: no record applies


def test_an_older_format_is_a_one_line_cache_error(tmp_path, monkeypatch, caches, corpus):
    directory = copy_cache(caches["uint16"], tmp_path / "old")
    monkeypatch.setenv("PRETRAIN_CACHE_ROOT", str(tmp_path / "old"))
    manifest = json.loads((directory / "manifest.json").read_text())
    manifest["format"] = 1
    del manifest["token_dtype"]
    manifest["checksum"] = manifest_checksum(manifest)
    (directory / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CacheError) as info:
        prepare(cfg_of(corpus), progress=False)
    message = str(info.value)
    assert "format 1" in message and "cache.rebuild=true" in message and "\n" not in message


def test_local_source_files_are_hashed_once_per_change(tmp_path, corpus_texts, monkeypatch):
    from pretrain.data import files as files_module

    hashed: list[str] = []
    original = files_module.sha256_file
    monkeypatch.setattr(
        files_module, "sha256_file", lambda p, *a: hashed.append(Path(p).name) or original(p, *a)
    )
    path = write_parquet(tmp_path / "src" / "own.parquet", corpus_texts[:20])
    first = cache_spec(cfg_of(path)).key
    assert cache_spec(cfg_of(path)).key == first and hashed == ["own.parquet"]
    write_parquet(path, corpus_texts[1:21])  # rewritten in place
    assert cache_spec(cfg_of(path)).key != first and hashed == ["own.parquet"] * 2


# --- read-only caches ------------------------------------------------------------------------------

_READ_ONLY_CHILD = """
import json, os, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from helpers import cache_spec, compose, policy_cfg
os.environ.update({env!r})  # helpers.env points these at its own temporary directories
from pretrain.data.ingest.prepare import prepare_cache, verify_existing
from pretrain.data.batching.samplers import build_sampler
from pretrain.errors import CacheError

directory = Path({directory!r})
assert not os.access(directory, os.W_OK), "the cache is still writable: the test would prove nothing"
spec = cache_spec(compose(*{overrides!r}))
cache = prepare_cache(spec, progress=False)                  # quick: every file hashed, record per user
again = prepare_cache(spec, progress=False)                  # remembered
full = verify_existing(spec, "full")                         # pretrain verify
split = cache.split("train")
settings = policy_cfg("prepacked", "data.max_seq_len=64")
batches = list(build_sampler(settings, split, packs_dir=cache.packs_dir))
missing = compose(*{overrides!r}, "split.seed=7")
try:
    prepare_cache(cache_spec(missing), progress=False)
    error = None
except CacheError as e:
    error = str(e)
from pretrain.training.run import train                     # and a real (short) training run on it
run = train(compose(*{overrides!r}, "experiment=smoke", "data=prepacked", "data.max_seq_len=64",
    "train.max_steps=2", "train.val_every_n_steps=2", "output_dir={output!r}"))
print(json.dumps({{"hashed": full.hashed, "record": str(full.record), "packs": str(cache.packs_dir),
    "pack_files": sorted(p.name for p in cache.packs_dir.iterdir()), "batches": len(batches),
    "missing": error, "trained": run["steps"], "status": run["status"]}}))
"""


def test_a_read_only_cache_is_usable(tmp_path, caches, corpus):
    root = tmp_path / "ro-root"
    directory = copy_cache(caches["uint16"], root)
    (directory / ".verified.json").unlink()
    before = {p.name: p.read_bytes() for p in directory.iterdir()}
    state = tmp_path / "state"
    state.mkdir()
    overrides = [*base_overrides(), *local_overrides([corpus], **{"split.validation_fraction": FRACTION})]
    env = {"PRETRAIN_CACHE_ROOT": str(root), "PRETRAIN_STATE_DIR": str(state)}
    output = tmp_path / "run"  # writable: only the cache is read-only
    code = _READ_ONLY_CHILD.format(
        tests=str(REPO / "tests"), directory=str(directory), overrides=overrides, env=env, output=str(output)
    )
    command = [sys.executable, "-c", code]
    if os.geteuid() == 0:  # root ignores permissions: drop the capabilities that let it
        if not shutil.which("setpriv"):
            pytest.skip("running as root without setpriv: a read-only cache cannot be made")
        caps = "-dac_override,-dac_read_search,-fowner"
        command = ["setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}", *command]
    for path in [root, *root.rglob("*")]:
        path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    try:
        child = subprocess.run(
            command, env={**os.environ, **env}, capture_output=True, text=True, timeout=120, cwd=REPO
        )
    finally:
        for path in [root, *root.rglob("*")]:
            path.chmod(path.stat().st_mode | stat.S_IWUSR)
    assert child.returncode == 0, child.stderr[-3000:]
    result = json.loads(child.stdout.strip().splitlines()[-1])
    assert sorted(result["hashed"]) == sorted(CACHE_FILES)
    assert Path(result["record"]).parent == state / "verified"
    assert Path(result["packs"]).is_relative_to(state / "packs") and result["pack_files"]
    assert result["batches"] > 0
    assert (result["trained"], result["status"]) == (2, "completed")
    assert (output / "checkpoints" / "last.ckpt").is_file()
    assert "is not writable" in result["missing"] and "cache_root" in result["missing"]
    assert {p.name: p.read_bytes() for p in directory.iterdir()} == before  # nothing written there
    assert sorted(p.name for p in root.iterdir()) == [directory.name]  # no lock, no temp dir


@pytest.mark.parametrize("via", ["config", "env"])
def test_cache_root_that_is_a_file_is_a_config_error(tmp_path, monkeypatch, corpus, via):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    if via == "env":
        monkeypatch.setenv("PRETRAIN_CACHE_ROOT", str(blocker))
        cfg, name = cfg_of(corpus), "PRETRAIN_CACHE_ROOT"
    else:
        monkeypatch.delenv("PRETRAIN_CACHE_ROOT")
        cfg, name = cfg_of(corpus, f"cache_root='{blocker}'"), "cache_root"
    with pytest.raises(ConfigError, match=f"{name}={blocker} is a file; point it at a directory"):
        prepare(cfg, progress=False)


# --- pretrain verify, sizes ----------------------------------------------------------------------


def test_pretrain_verify(caches, corpus, capsys, tmp_path, monkeypatch):
    overrides = [*base_overrides(), *local_overrides([corpus], **{"split.validation_fraction": FRACTION})]
    assert cli_main(["verify", *overrides]) == 0
    out = capsys.readouterr().out
    assert out.strip().splitlines()[-1] == str(caches["uint16"].directory)
    assert out.count("sha256 matches") == len(CACHE_FILES) and "indexes agree" in out
    monkeypatch.setenv("PRETRAIN_CACHE_ROOT", str(tmp_path / "empty"))
    with pytest.raises(SystemExit) as info:
        cli_main(["verify", *overrides])
    assert info.value.code == 2
    assert "no cache at" in capsys.readouterr().err


def test_disk_bytes_per_token_of_the_pydocs_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PRETRAIN_CACHE_ROOT", str(tmp_path / "pydocs"))
    cache = prepare(compose(), progress=False)
    tokens = sum(cache.counts()[split]["tokens"] for split in ("train", "validation"))
    assert tokens > 500_000
    files = {p.name for p in cache.directory.iterdir()}
    assert {*CACHE_FILES, "manifest.json"} <= files
    assert disk_bytes(cache.directory) == sum(p.stat().st_size for p in cache.directory.iterdir())
    assert disk_bytes(cache.directory) / tokens <= 2.3
