"""The embedded offline corpus (source=pydocs, the default): size, long documents, determinism."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
from unittest import mock

import pytest
from helpers import EOS, cache_spec, compose, expected_split, prepare, reference_encode

from pretrain.data import sources
from pretrain.data.ingest.cache import identity_key

# A child process (another hash seed) reads the corpus on its own; pretrain.data imports lazily,
# so this pulls in the source module only (no torch).
_CHILD = """
import json, sys
from pretrain.data import sources
json.dump([[d.origin, d.text] for d in sources.pydocs_documents()], sys.stdout)
"""


@pytest.fixture(scope="module")
def pydocs(tmp_path_factory):
    """The default cache, built in this process while another process (another hash seed) reads the
    corpus on its own: {"cache": Cache, "documents": [[origin, text], ...] of the other run}."""
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD.format(path=sources.__file__)],
        stdout=subprocess.PIPE,
        text=True,
        env={"PYTHONHASHSEED": "4242", "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )
    root = tmp_path_factory.mktemp("pydocs-root")
    with mock.patch.dict(os.environ, {"PRETRAIN_CACHE_ROOT": str(root)}):
        cache = prepare(compose(), progress=False)
    out, _ = child.communicate(timeout=300)
    assert child.returncode == 0
    return {"cache": cache, "documents": json.loads(out)}


def test_pydocs_is_the_default_source():
    assert compose().source.kind == "pydocs"


def test_at_least_500k_tokens(pydocs):
    counts = pydocs["cache"].counts()
    tokens = sum(c["tokens"] for c in counts.values())
    documents = sum(c["documents"] for c in counts.values())
    assert tokens - documents >= 500_000  # GPT-2 tokens of text, EOS not counted
    assert counts["validation"]["documents"] > 0 and counts["train"]["documents"] > 0


def test_long_documents_are_whole(pydocs):
    cache = pydocs["cache"]
    texts = {hashlib.sha256(text.encode()).hexdigest(): text for _, text in pydocs["documents"]}
    longest = []
    for split in ("train", "validation"):
        view = cache.split(split)
        longest += [(int(view.lengths[i]), split, i) for i in range(len(view))]
    longest.sort(reverse=True)
    length, split, i = longest[0]
    assert length - 1 > 4096  # a document longer than the largest context, kept whole
    assert sum(n - 1 > 4096 for n, _, _ in longest) >= 2
    view = cache.split(split)
    assert view.document(i).tolist() == reference_encode(texts[view.ids[i]]) + [EOS]


def test_origins_are_unique(pydocs):
    origins = [origin for origin, _ in pydocs["documents"]]
    assert len(origins) > 500
    assert len(set(origins)) == len(origins)


def test_order_is_deterministic_across_runs_and_processes(pydocs):
    """The cache built here holds, in order, the documents another process (another PYTHONHASHSEED)
    read: deduplicated, each in the split the recomputed hash gives it."""
    cache = pydocs["cache"]
    seen, expected = set(), {"train": [], "validation": []}
    for _, text in pydocs["documents"]:
        doc_id = hashlib.sha256(text.encode()).hexdigest()
        if not text.strip() or doc_id in seen:
            continue
        seen.add(doc_id)
        expected[expected_split(text)].append(doc_id)
    for split in ("train", "validation"):
        assert list(cache.split(split).ids) == expected[split]
    build = cache.manifest["build"]
    assert build["documents_read"] == len(pydocs["documents"])
    assert build["duplicates_skipped"] == len(pydocs["documents"]) - len(seen) - build["empty_skipped"]


def test_identity_contains_the_python_version(pydocs, monkeypatch):
    identity = pydocs["cache"].manifest["identity"]
    assert identity["source"]["kind"] == "pydocs"
    assert identity["source"]["python"] == platform.python_version()
    key = cache_spec(compose()).key
    assert key == pydocs["cache"].directory.name
    monkeypatch.setattr(sys, "version", "3.99.1 (main, Jan 1 2030) [a future compiler]")
    other = cache_spec(compose()).identity
    assert other["source"]["python"] == "3.99.1"
    assert identity_key(other) != key  # another Python's docs are another corpus
