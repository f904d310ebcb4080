"""split.decontaminate: validation documents sharing a run of split.leak_window tokens with a train
document are dropped at build time (data/ingest/decontaminate.py); inspect-data's verbatim_leaks
then counts 0."""

from __future__ import annotations

import json
import random

import pytest
from helpers import compose, local_overrides, prepare, write_jsonl

from pretrain.config import SplitConfig
from pretrain.data.ingest.split import document_id, document_split
from pretrain.data.leaks import LEAK_WINDOW, leaked_documents, verbatim_leaks
from pretrain.errors import ConfigError

SEED, FRACTION = 11, 0.3
PLANTED = 4
PASSAGE_WORDS = 100


def _words(rng: random.Random, count: int) -> str:
    """`count` made-up words: no two documents share a long run of them by chance."""
    letters = "bcdfghjklmnprstvwz"
    vowels = "aeiou"
    return " ".join(
        "".join(rng.choice(letters) + rng.choice(vowels) for _ in range(rng.randint(1, 3)))
        for _ in range(count)
    )


def _split_of(text: str) -> str:
    return document_split(document_id(text), SEED, FRACTION)


def planted_corpus(seed: int = 0) -> tuple[list[str], set[str]]:
    """Documents of 150-250 made-up words, and the ids of the PLANTED validation documents that quote
    a 100-word passage of a train document (each quoting another train document)."""
    rng = random.Random(seed)
    texts = [_words(rng, rng.randint(150, 250)) for _ in range(60)]
    train = [t for t in texts if _split_of(t) == "train"]
    planted: set[str] = set()
    for source in train[:PLANTED]:
        words = source.split()
        start = rng.randint(0, len(words) - PASSAGE_WORDS)
        passage = " ".join(words[start : start + PASSAGE_WORDS])
        while True:  # a validation document that quotes the passage (the quote changes its hash)
            quoting = f"{_words(rng, 80)} {passage} {_words(rng, 40)}"
            if _split_of(quoting) == "validation":
                break
        texts.append(quoting)
        planted.add(document_id(quoting))
    return texts, planted


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    texts, planted = planted_corpus()
    return write_jsonl(tmp_path_factory.mktemp("planted") / "corpus.jsonl", texts), planted


def _cache(path, **settings):
    overrides = {"split.seed": SEED, "split.validation_fraction": FRACTION, **settings}
    return prepare(compose(*local_overrides([path], **overrides)), progress=False)


def test_planted_overlaps_are_counted_then_dropped(corpus, cache_root):
    path, planted = corpus
    plain = _cache(path)
    train, validation = plain.split("train"), plain.split("validation")
    leaked = leaked_documents(train, validation)
    assert verbatim_leaks(train, validation) == PLANTED
    assert {validation.ids[i] for i in leaked} == planted

    clean = _cache(path, **{"split.decontaminate": True})
    assert clean.directory != plain.directory  # another identity, another cache
    assert verbatim_leaks(clean.split("train"), clean.split("validation")) == 0
    kept = list(clean.split("validation").ids)
    assert kept == [i for i in validation.ids if i not in planted]  # the rest, in order
    for i, doc in enumerate(kept):  # every kept document's tokens unchanged
        assert (
            clean.split("validation").document(i).tolist()
            == validation.document(list(validation.ids).index(doc)).tolist()
        )
    assert clean.split("train").num_tokens == train.num_tokens

    record = clean.manifest["build"]["decontamination"]
    assert record["leak_window"] == LEAK_WINDOW
    assert record["dropped_documents"] == PLANTED
    assert sorted(record["dropped_ids"]) == sorted(planted)
    dropped_tokens = sum(len(validation.document(i)) for i in leaked)
    assert record["dropped_tokens"] == dropped_tokens
    assert clean.manifest["splits"]["validation"]["tokens"] == validation.num_tokens - dropped_tokens
    assert clean.manifest["identity"]["split"]["decontaminate"] == {"leak_window": LEAK_WINDOW}
    assert json.loads((clean.directory / "manifest.json").read_text()) == clean.manifest


def test_identity_without_decontamination_keeps_its_keys(corpus, cache_root):
    path, _ = corpus
    identity = _cache(path).manifest["identity"]["split"]
    assert identity == {"seed": SEED, "validation_fraction": FRACTION}


def test_a_longer_window_than_the_passage_drops_nothing(corpus, cache_root):
    path, _ = corpus
    clean = _cache(path, **{"split.decontaminate": True, "split.leak_window": 400})
    assert clean.manifest["build"]["decontamination"]["dropped_documents"] == 0
    plain = _cache(path)
    assert clean.manifest["splits"]["validation"] == plain.manifest["splits"]["validation"]


def test_the_schema_default_is_what_inspect_data_counts():
    assert SplitConfig().leak_window == LEAK_WINDOW


def test_a_window_below_one_token_is_refused():
    with pytest.raises(ConfigError, match=r"split.leak_window=0 must be a positive"):
        SplitConfig(leak_window=0)
