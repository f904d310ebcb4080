"""Floors (data/measures/floors.py): the unigram, Jelinek-Mercer and Kneser-Ney bigram cross-entropy of a
hand-made cache's validation pairs, recomputed here with plain loops and Counter; the first N
validation documents (what val/loss scores under train.val_batches); the sample above the cap; a mixture's
pooled floors; and floors.json: reused, recomputed for a rebuilt cache, written atomically under a lock."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from filelock import FileLock, Timeout

from pretrain.data.ingest.cache import Cache
from pretrain.data.ingest.writer import SplitWriter
from pretrain.data.measures import floors as floors_module
from pretrain.data.measures.floors import FLOORS, cache_floors, combined_floors, split_floors
from pretrain.data.tokens import TokenSplit

VOCAB = 7
EOS = 6
BYTES = np.array([1, 2, 1, 3, 1, 2, 0])  # id -> UTF-8 bytes; EOS none
# Ten train documents (the last held out for λ) and three validation ones, EOS after each.
TRAIN = [
    [0, 1, 2, 1, 2],
    [1, 2, 3],
    [0, 0, 1, 2, 2, 4],
    [3, 4, 3, 4],
    [1, 2],
    [2, 3, 1, 2, 3],
    [0, 1],
    [4, 4, 4, 1],
    [1, 2, 1, 2, 1],
    [0, 1, 2, 3, 4],
]
VALIDATION = [[0, 1, 2, 5], [3, 4, 1], [2]]
TRAIN_DOCS = [d + [EOS] for d in TRAIN]
VALIDATION_DOCS = [d + [EOS] for d in VALIDATION]


def token_split(documents: list[list[int]], name: str) -> TokenSplit:
    lengths = np.array([len(d) for d in documents], dtype=np.int64)
    tokens = np.array([t for d in documents for t in d], dtype=np.uint16)
    return TokenSplit(tokens=tokens, offsets=np.cumsum(lengths) - lengths, lengths=lengths, name=name)


def pairs_of(documents):
    return [(d[i], d[i + 1]) for d in documents for i in range(len(d) - 1)]


def models_by_hand(documents):
    """(unigram(b), bigram(a, b, λ)) counted on `documents` with Counter, as the module docstring says."""
    pairs = pairs_of(documents)
    joint, context, target = Counter(pairs), Counter(a for a, _ in pairs), Counter(b for _, b in pairs)

    def unigram(b):
        return (target[b] + 1) / (len(pairs) + VOCAB)

    def bigram(a, b, lam):
        if not context[a]:
            return unigram(b)
        return lam * joint[(a, b)] / context[a] + (1 - lam) * unigram(b)

    return unigram, bigram


def kneser_ney_by_hand(documents):
    """P_KN(b | a) counted on `documents` with Counter and loops over the vocabulary (interpolated,
    absolute discounting D = n1 / (n1 + 2 n2), the continuation interpolated with the uniform)."""
    joint = Counter(pairs_of(documents))
    n1 = sum(1 for c in joint.values() if c == 1)
    n2 = sum(1 for c in joint.values() if c == 2)
    discount = n1 / (n1 + 2 * n2)
    types = len(joint)
    ending = Counter(b for _, b in joint)
    starting = Counter(a for a, _ in joint)
    context = Counter()
    for (a, _), c in joint.items():
        context[a] += c

    def continuation(b):
        return max(ending[b] - discount, 0) / types + discount * len(ending) / types / VOCAB

    def kn(a, b):
        if not context[a]:
            return continuation(b)
        own = max(joint[(a, b)] - discount, 0) / context[a]
        return own + discount * starting[a] / context[a] * continuation(b)

    return kn, discount


def cross_entropy(documents, probability) -> float:
    pairs = pairs_of(documents)
    return -math.fsum(math.log(probability(a, b)) for a, b in pairs) / len(pairs)


def check_by_hand(result: dict, counted: list[list[int]]):
    """`result` against the same floors computed by loops on the `counted` train documents."""
    unigram, bigram = models_by_hand(counted)
    lam = result["bigram"]["lambda"]
    pairs = pairs_of(VALIDATION_DOCS)
    size = sum(int(BYTES[t]) for d in VALIDATION_DOCS for t in d)
    assert result["validation_pairs"] == len(pairs) == sum(len(d) - 1 for d in VALIDATION_DOCS)
    assert result["validation_bytes"] == size
    assert result["train_tokens_counted"] == sum(len(d) for d in counted)
    uni = cross_entropy(VALIDATION_DOCS, lambda a, b: unigram(b))
    bi = cross_entropy(VALIDATION_DOCS, lambda a, b: bigram(a, b, lam))
    assert result["unigram"]["nats"] == pytest.approx(uni, rel=1e-9, abs=1e-12)
    assert result["bigram"]["nats"] == pytest.approx(bi, rel=1e-9, abs=1e-12)
    bits = len(pairs) / math.log(2) / size
    assert result["unigram"]["bits_per_byte"] == pytest.approx(uni * bits, rel=1e-9)
    assert result["bigram"]["bits_per_byte"] == pytest.approx(bi * bits, rel=1e-9)
    assert result["bigram"]["method"] == "jelinek-mercer"
    kn, discount = kneser_ney_by_hand(counted)
    assert result["bigram_kn"]["method"] == "kneser-ney"
    assert result["bigram_kn"]["discount"] == pytest.approx(discount, rel=1e-12)
    kn_nats = cross_entropy(VALIDATION_DOCS, kn)
    assert result["bigram_kn"]["nats"] == pytest.approx(kn_nats, rel=1e-9, abs=1e-12)
    assert result["bigram_kn"]["bits_per_byte"] == pytest.approx(kn_nats * bits, rel=1e-9)
    # λ: the minimum of the held-out cross-entropy (the last tenth of the counted documents,
    # counted on the rest), checked on a fine grid.
    held = max(1, round(0.1 * len(counted)))
    _, fit_bigram = models_by_hand(counted[:-held])
    held_out = counted[-held:]
    best = min(
        (cross_entropy(held_out, lambda a, b, g=g: fit_bigram(a, b, g)), g)
        for g in np.linspace(0.001, 0.999, 999)
    )
    assert 0 < lam < 1 and abs(lam - best[1]) < 2e-3
    assert cross_entropy(held_out, lambda a, b: fit_bigram(a, b, lam)) <= best[0] + 1e-9


def test_floors_of_a_hand_made_corpus_match_plain_loops():
    result = split_floors(token_split(TRAIN_DOCS, "train"), token_split(VALIDATION_DOCS, "validation"), BYTES)
    assert result["version"] == 2 and result["sample"] is None
    assert result["validation_documents"] == len(VALIDATION_DOCS)
    check_by_hand(result, TRAIN_DOCS)


def test_kneser_ney_is_a_distribution_for_every_context():
    counts = floors_module.PairCounts.of(
        *floors_module.distinct_pairs(
            floors_module.pair_codes(token_split(TRAIN_DOCS, "train"), np.arange(len(TRAIN_DOCS)), VOCAB)
        ),
        VOCAB,
    )
    grid = np.arange(VOCAB * VOCAB, dtype=np.int64)  # every (a, b): contexts seen, unseen, EOS
    probabilities, _ = floors_module.kneser_ney(counts, grid)
    assert (probabilities > 0).all()
    np.testing.assert_allclose(probabilities.reshape(VOCAB, VOCAB).sum(axis=1), 1.0, rtol=1e-12)


def test_the_first_documents_floors_are_those_of_a_split_of_them_alone():
    train = token_split(TRAIN_DOCS, "train")
    first = split_floors(train, token_split(VALIDATION_DOCS, "validation"), BYTES, validation_documents=2)
    alone = split_floors(train, token_split(VALIDATION_DOCS[:2], "validation"), BYTES)
    assert first == alone
    assert first["validation_documents"] == 2
    assert first["validation_pairs"] == sum(len(d) - 1 for d in VALIDATION_DOCS[:2])


def test_blocks_do_not_change_the_counts(monkeypatch):
    whole = split_floors(token_split(TRAIN_DOCS, "train"), token_split(VALIDATION_DOCS, "validation"), BYTES)
    monkeypatch.setattr(floors_module, "_BLOCK_TOKENS", 3)  # a few documents per block, merged after
    monkeypatch.setattr(floors_module, "_MERGE_EVERY", 2)  # and merged as they come
    blocks = split_floors(token_split(TRAIN_DOCS, "train"), token_split(VALIDATION_DOCS, "validation"), BYTES)
    assert blocks["unigram"] == whole["unigram"]
    assert blocks["bigram"]["nats"] == pytest.approx(whole["bigram"]["nats"], rel=1e-12)


def test_above_the_cap_every_kth_train_document_is_counted():
    tokens = sum(len(d) for d in TRAIN_DOCS)  # 47
    result = split_floors(
        token_split(TRAIN_DOCS, "train"), token_split(VALIDATION_DOCS, "validation"), BYTES, cap=20
    )
    step = -(-tokens // 20)  # 3: documents 0, 3, 6, 9
    counted = TRAIN_DOCS[::step]
    check_by_hand(result, counted)
    assert result["sample"] == (
        f"every {step}th train document: {len(counted)} of {len(TRAIN_DOCS)} documents, "
        f"{sum(len(d) for d in counted)} of {tokens} tokens"
    )


def test_one_train_document_and_no_validation_pairs():
    result = split_floors(token_split(TRAIN_DOCS[:1], "train"), token_split([], "validation"), BYTES)
    assert result["bigram"]["lambda"] == 0.5  # nothing held out
    assert result["validation_pairs"] == 0 and result["unigram"]["nats"] is None
    assert result["bigram"]["bits_per_byte"] is None


def test_a_mixtures_floors_pool_the_components_pairs():
    train = token_split(TRAIN_DOCS, "train")
    one = split_floors(train, token_split(VALIDATION_DOCS, "validation"), BYTES)
    other = split_floors(train, token_split(VALIDATION_DOCS[:1], "validation"), BYTES)
    mixed = combined_floors({"one": one, "other": other})
    assert mixed["components"] == {"one": one, "other": other}
    pairs = one["validation_pairs"] + other["validation_pairs"]
    size = one["validation_bytes"] + other["validation_bytes"]
    assert mixed["validation_pairs"] == pairs and mixed["validation_bytes"] == size
    assert mixed["validation_documents"] == len(VALIDATION_DOCS) + 1
    for model in ("unigram", "bigram", "bigram_kn"):
        # Pooled as val/loss pools a mixture: total nats over total pairs, total bits over total bytes.
        nats = one[model]["nats"] * one["validation_pairs"] + other[model]["nats"] * other["validation_pairs"]
        assert mixed[model]["nats"] == pytest.approx(nats / pairs, rel=1e-12)
        assert mixed[model]["bits_per_byte"] == pytest.approx(nats / math.log(2) / size, rel=1e-12)
    # The same pairs scored as one validation split give the same floors (same train counts).
    joined = split_floors(train, token_split(VALIDATION_DOCS + VALIDATION_DOCS[:1], "validation"), BYTES)
    assert mixed["unigram"]["nats"] == pytest.approx(joined["unigram"]["nats"], rel=1e-12)


# --- floors.json -----------------------------------------------------------------------------------


def hand_cache(directory: Path, train=TRAIN_DOCS, validation=VALIDATION_DOCS, key: str = "k") -> Cache:
    """A cache directory written by the cache's own SplitWriter, with the manifest fields reading it needs."""
    directory.mkdir(parents=True, exist_ok=True)
    splits = {}
    for name, documents in (("train", train), ("validation", validation)):
        writer = SplitWriter(directory, name, None, np.uint16)
        for i, document in enumerate(documents):
            writer.write(f"{name}{i}", np.array(document))
        splits[name] = writer.close()
    manifest = {"key": key, "token_dtype": "uint16", "splits": splits}
    (directory / "manifest.json").write_text(json.dumps(manifest))
    return Cache(directory=directory, manifest=manifest)


def test_floors_json_is_written_beside_the_manifest_and_reused(tmp_path, monkeypatch):
    cache = hand_cache(tmp_path / "cache")
    first = cache_floors(cache, BYTES)
    check_by_hand(first, TRAIN_DOCS)  # read through the memory-mapped split
    stored = json.loads((tmp_path / "cache" / FLOORS).read_text())
    assert {k: v for k, v in stored.items() if k != "computed_from"} == first
    assert (
        stored["computed_from"]["files"]["train.bin"]
        == cache.manifest["splits"]["train"]["files"]["bin"]["sha256"]
    )

    def never(*args, **kwargs):
        raise AssertionError("recomputed")

    monkeypatch.setattr(floors_module, "split_floors", never)
    assert cache_floors(cache, BYTES) == first


def test_the_first_documents_floors_are_stored_beside_the_whole_splits(tmp_path):
    cache = hand_cache(tmp_path / "cache")
    whole = cache_floors(cache, BYTES)
    first = cache_floors(cache, BYTES, documents=2)
    assert first["validation_documents"] == 2 and first["validation_pairs"] < whole["validation_pairs"]
    assert (
        json.loads((tmp_path / "cache" / "floors.first-2.json").read_text())["validation_pairs"]
        == (first["validation_pairs"])
    )
    # Asking for as many documents as the split holds (or more) is the whole split's floors.json.
    assert cache_floors(cache, BYTES, documents=len(VALIDATION_DOCS)) == whole
    assert cache_floors(cache, BYTES, documents=99) == whole
    assert json.loads((tmp_path / "cache" / FLOORS).read_text())["validation_documents"] == 3


def test_a_rebuilt_cache_or_another_version_recomputes_the_floors(tmp_path):
    directory = tmp_path / "cache"
    cache_floors(hand_cache(directory), BYTES)
    # Rebuilt in place with other validation documents: other file hashes, so new floors.
    rebuilt = hand_cache(directory, validation=VALIDATION_DOCS[:2])
    again = cache_floors(rebuilt, BYTES)
    assert again["validation_pairs"] == sum(len(d) - 1 for d in VALIDATION_DOCS[:2])
    stored = json.loads((directory / FLOORS).read_text())
    assert (
        stored["computed_from"]["files"]["validation.bin"]
        == (rebuilt.manifest["splits"]["validation"]["files"]["bin"]["sha256"])
    )
    # A floors.json of another version (or edited) is not trusted either.
    stored.update(version=0, unigram={"nats": 123.0, "bits_per_byte": 1.0})
    (directory / FLOORS).write_text(json.dumps(stored))
    assert cache_floors(rebuilt, BYTES)["unigram"] == again["unigram"]
    assert json.loads((directory / FLOORS).read_text())["version"] == floors_module.FLOORS_VERSION
    # So is one computed under another sample cap.
    assert cache_floors(rebuilt, BYTES, cap=20)["sample"] is not None


def test_floors_json_is_written_atomically_under_the_lock(tmp_path, monkeypatch):
    cache = hand_cache(tmp_path / "cache")
    path = tmp_path / "cache" / FLOORS
    written = []
    real_write = floors_module.write_json_atomic

    def write_while_locked(target, value):
        with pytest.raises(Timeout):  # another process (or rank) would wait here
            FileLock(str(path) + ".lock").acquire(timeout=0)
        written.append(target)
        return real_write(target, value)

    monkeypatch.setattr(floors_module, "write_json_atomic", write_while_locked)
    cache_floors(cache, BYTES)
    assert written == [path]
    # A write that fails midway (a full disk at fsync) leaves no floors.json and no temporary behind,
    # and the floors are still returned.
    path.unlink()

    def full_disk(fd):
        raise OSError(28, "No space left on device")

    import pretrain.fileio

    monkeypatch.setattr(pretrain.fileio.os, "fsync", full_disk)
    result = cache_floors(cache, BYTES)
    check_by_hand(result, TRAIN_DOCS)
    assert not path.exists()
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


def test_a_read_only_cache_keeps_its_floors_in_the_state_directory(tmp_path, monkeypatch):
    cache = hand_cache(tmp_path / "cache")
    monkeypatch.setenv("PRETRAIN_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(floors_module, "writable_dir", lambda path: False)
    result = cache_floors(cache, BYTES)
    assert not (tmp_path / "cache" / FLOORS).exists()
    [stored] = (tmp_path / "state" / "floors").glob("k-*.json")
    assert json.loads(stored.read_text())["unigram"] == result["unigram"]


# --- where the floors appear ----------------------------------------------------------------------


def test_the_wandb_summary_row_names_the_floors():
    from pretrain.training.loggers import summary_row

    floors = split_floors(token_split(TRAIN_DOCS, "train"), token_split(VALIDATION_DOCS, "validation"), BYTES)
    row = summary_row({"floors": floors, "steps": 1})
    for model in ("unigram", "bigram"):
        assert row[f"summary/floor/{model}_nats"] == floors[model]["nats"]
        assert row[f"summary/floor/{model}_bits_per_byte"] == floors[model]["bits_per_byte"]
    assert not [key for key in summary_row({"floors": None, "steps": 1}) if "floor" in key]


def test_inspect_data_reports_the_caches_floors(parquet_file, cache_root, tmp_path, capsys):
    from helpers.configs import files_override

    from pretrain.cli import main
    from pretrain.config import load_config, to_config
    from pretrain.data.ingest.cache import CacheSpec, max_token_id
    from pretrain.data.ingest.prepare import prepare_cache
    from pretrain.data.ingest.tokenizer import token_byte_lengths

    overrides = ["source=local", files_override([parquet_file]), "split.validation_fraction=0.2"]
    output = tmp_path / "stats.json"
    assert main(["inspect-data", *overrides, f"output={output}"]) == 0
    stats = json.loads(output.read_text())
    # The same numbers as the floors of the cache's splits computed here (GPT-2's whole vocabulary).
    spec = CacheSpec.from_config(to_config(load_config(overrides)))
    cache = prepare_cache(spec)
    files = spec.tokenizer_files
    token_bytes = token_byte_lengths(files, max_token_id(files) + 1)
    assert len(token_bytes) == 50257
    expected = split_floors(cache.split("train"), cache.split("validation"), token_bytes)
    assert stats["floors"] == expected
    assert expected["validation_pairs"] == cache.counts()["validation"]["prediction_pairs"] > 0
    assert expected["bigram"]["nats"] < expected["unigram"]["nats"] < math.log(50257)
    table = capsys.readouterr().out
    assert "floors.bigram.nats" in table and f"{expected['bigram']['lambda']:.4f}" in table
    assert (spec.directory / FLOORS).is_file()


def test_recorded_floors_are_read_without_computing_and_only_for_the_same_files(tmp_path):
    from pretrain.data.measures.floors import recorded_floors

    directory = tmp_path / "cache"
    cache = hand_cache(directory)
    assert recorded_floors(cache) is None  # none stored yet: nothing is computed
    assert not (directory / FLOORS).exists()
    stored = cache_floors(cache, BYTES)
    assert recorded_floors(cache) == stored
    rebuilt = hand_cache(directory, validation=VALIDATION_DOCS[:2])  # other files: not these floors
    assert recorded_floors(rebuilt) is None


def test_compare_reads_the_caches_floors_for_a_run_json_without_them(tmp_path):
    """A run from before floors (run.json without them): compare takes those stored beside its cache."""
    from pretrain.report.table import cache_floors_of
    from pretrain.training.run_record import load_run

    cache = hand_cache(tmp_path / "cache")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.csv").write_text("step,train/loss,train/tokens,val/loss\n1,3.0,100,3.1\n")
    (run_dir / "run.json").write_text(json.dumps({"cache_dir": str(cache.directory)}))
    run = load_run(run_dir)
    assert run.floors == {} and cache_floors_of(run) == {}  # none stored: none invented
    stored = cache_floors(cache, BYTES)
    assert cache_floors_of(run) == stored


def test_a_runs_floors_once_stored_need_no_table_of_the_vocabularys_bytes(tmp_path, monkeypatch):
    """spec_floors (a run's set-up) reads stored floors without building token_byte_lengths."""
    from types import SimpleNamespace

    from pretrain.data.ingest.tokenizer import bundled_files, token_byte_lengths

    spec = SimpleNamespace(tokenizer_files=bundled_files())
    cache = hand_cache(tmp_path / "cache")
    first = floors_module.spec_floors(spec, cache)  # none stored: computed over GPT-2's vocabulary
    assert first == cache_floors(cache, token_byte_lengths(spec.tokenizer_files, 50257))
    assert first["validation_bytes"] > 0 and first["unigram"] is not None

    def never(*args, **kwargs):
        raise AssertionError("built the vocabulary's byte table")

    monkeypatch.setattr(floors_module, "token_byte_lengths", never)
    assert floors_module.spec_floors(spec, cache) == first


# --- a run's floors are on the pairs its val/loss scored -------------------------------------------


def test_a_run_with_val_batches_2_has_the_floors_of_exactly_the_pairs_it_scored(cache_root, tmp_path):
    """experiment=smoke validates on train.val_batches=2 x 1,024 pairs: its first validation documents,
    not the whole split (28k pairs): run.json's floors count the same targets val/loss did."""
    from pretrain.config import load_config
    from pretrain.training.run import train

    out = tmp_path / "run"
    overrides = ["experiment=smoke", f"output_dir={out}", "progress_bar=false", "train.max_steps=2"]
    train(load_config([*overrides, "train.val_every_n_steps=2", "train.val_batches=2"]))
    record = json.loads((out / "run.json").read_text())
    metrics = record["metrics"]
    scored = sum(v for k, v in metrics.items() if k.startswith("val/targets_by_position/"))
    floors = record["floors"]
    assert floors["validation_pairs"] == scored <= 2 * 1024
    manifest = json.loads((Path(record["cache_dir"]) / "manifest.json").read_text())
    assert manifest["splits"]["validation"]["prediction_pairs"] > 10 * scored  # not the whole split's
    assert floors["validation_documents"] < manifest["splits"]["validation"]["documents"]
    assert (Path(record["cache_dir"]) / f"floors.first-{floors['validation_documents']}.json").is_file()
    assert floors["bigram_kn"]["nats"] < floors["bigram"]["nats"] < floors["unigram"]["nats"]
