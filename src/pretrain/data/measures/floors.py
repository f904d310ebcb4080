"""Floors a run must beat: the cross-entropy of a cache's validation pairs under two context-free
models counted on its train split, stored as `floors.json` beside the manifest.

The pairs are those val/loss scores: every (t_i, t_i+1) inside one document's token run, its closing
EOS the last target, of the validation split's first documents that train.val_batches lets validation
score (`evaluation.scored_documents`; all of them without it: the manifest's `prediction_pairs`, what
`pretrain eval` scores). `validation_pairs` is their count.
The models are counted on the train split's pairs (a document's first token is never a target):

* unigram, add-one over the whole vocabulary of V ids: P(b) = (c(b) + 1) / (N + V), c(b) the train
  pairs whose target is b, N all train pairs;
* bigram, Jelinek-Mercer: P(b | a) = λ c(a, b) / c(a) + (1 - λ) P(b), just P(b) for an `a` no train
  pair starts with. λ is chosen on held-out train data: the last HELD_OUT_FRACTION of the counted
  train documents are held out, the rest counted, and λ minimises the held-out cross-entropy
  (a sum of -log of functions affine in λ, so convex: a golden-section search on (0, 1) to 1e-6
  finds it; scipy.optimize's import alone would cost 0.4-0.6 s, a tenth of building the embedded
  corpus's cache); the floor then uses that λ with the counts of every counted train document.
  Without held-out pairs (a one-document train split) λ = 0.5;
* bigram_kn, interpolated Kneser-Ney (absolute discounting): P(b | a) = max(c(a, b) - D, 0) / c(a)
  + D N1+(a •) / c(a) P_cont(b), where P_cont(b) = max(N1+(• b) - D, 0) / N1+(• •) + D T / N1+(• •) / V
  (N1+(a •): distinct pairs starting with a; N1+(• b): distinct pairs ending in b; N1+(• •) all
  distinct pairs; T the ids ending any), P_cont(b) for an `a` no train pair starts with. The
  discount is Ney's estimate D = n1 / (n1 + 2 n2) from the counts of pairs seen once and twice.
  It sits 0.07-0.08 nats below Jelinek-Mercer on the embedded corpora: a run is judged against the
  lower of the two (`gate_floor` in report/floors.py).

Each in nats per pair and in bits per byte: total nats / ln 2 / the UTF-8 bytes of the validation
documents, counted by `evaluation.document_bytes` as `pretrain eval`'s bits_per_byte is. With no
validation pair (or byte) a number is None.

Counting sorts every train pair code (a * V + b, int64), so above TRAIN_TOKEN_CAP train tokens a
deterministic sample is counted, every k-th document (k the smallest that brings the tokens to about
the cap), and `sample` says what was counted. The floors are derived data, not part of the cache's
identity: `floors.json` records the version, the cache key, every file's sha256 and the cap they
were computed from; any difference (a rebuilt cache) recomputes them, under a lock, written
atomically. A read-only cache keeps its floors in the per-user state directory. The floors of the first N
validation documents (train.val_batches) are stored as `floors.first-<N>.json` beside them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...arrays import run_positions
from ...errors import CacheError
from ..batching.evaluation import document_bytes
from ..files import ensure_dir, read_json, state_dir, writable_dir, write_json_atomic
from ..ingest.cache import Cache, CacheSpec, _place_name, manifest_files, max_token_id
from ..ingest.tokenizer import token_byte_lengths
from ..ingest.verify import _lock
from ..tokens import TokenSplit

FLOORS = "floors.json"
FLOORS_VERSION = 2  # 2: bigram_kn, validation_documents
TRAIN_TOKEN_CAP = 200_000_000
"""Above this many train tokens, every k-th train document is counted (a sort of ~1.6 GB of codes)."""
HELD_OUT_FRACTION = 0.1
"""The last tenth of the counted train documents chooses λ."""
DEFAULT_LAMBDA = 0.5
METHOD = "jelinek-mercer"
KN_METHOD = "kneser-ney"
MODELS = ("unigram", "bigram", "bigram_kn")
_BLOCK_TOKENS = 1 << 22  # tokens gathered at once: memory stays flat on a memory-mapped split
_MERGE_EVERY = 8  # blocks' runs merged at once


# --- counting --------------------------------------------------------------------------------------


def _runs(sorted_keys: np.ndarray, weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(distinct keys, their counts) of sorted keys: run starts by np.flatnonzero(np.diff), counts
    by run lengths (or by summed `weights`)."""
    if len(sorted_keys) == 0:
        return sorted_keys.astype(np.int64), np.zeros(0, np.int64)
    starts = np.concatenate([[0], np.flatnonzero(np.diff(sorted_keys)) + 1])
    if weights is None:
        counts = np.diff(np.append(starts, len(sorted_keys)))
    else:
        counts = np.add.reduceat(weights, starts)
    return sorted_keys[starts], counts.astype(np.int64)


def pair_codes(
    split: TokenSplit, documents: np.ndarray, vocab: int, block_tokens: int = _BLOCK_TOKENS
) -> Iterator[np.ndarray]:
    """The prediction pairs of `documents` (indices into `split`) as codes a * vocab + b (int64), a
    block of documents at a time: every consecutive pair inside a document, none across two."""
    documents = np.asarray(documents, dtype=np.int64)
    documents = documents[split.lengths[documents] > 0]
    if len(documents) == 0:
        return
    ends = np.cumsum(split.lengths[documents])
    cuts = np.searchsorted(ends, np.arange(block_tokens, int(ends[-1]), block_tokens), side="right")
    for block in np.split(documents, np.unique(cuts)):
        if len(block) == 0:
            continue
        lengths = split.lengths[block].astype(np.int64)
        where = np.repeat(split.offsets[block].astype(np.int64), lengths) + run_positions(lengths)
        tokens = np.asarray(split.tokens[where], dtype=np.int64)
        if len(tokens) and int(tokens.max()) >= vocab:
            raise CacheError(
                f"the {split.name} split holds token id {int(tokens.max())}, beyond the tokenizer's "
                f"{vocab} ids; rebuild it with cache.rebuild=true"
            )
        inside = np.ones(len(tokens) - 1, dtype=bool)
        inside[np.cumsum(lengths)[:-1] - 1] = False  # a document's last token starts no pair
        yield tokens[:-1][inside] * vocab + tokens[1:][inside]


def distinct_pairs(blocks) -> tuple[np.ndarray, np.ndarray]:
    """(sorted distinct codes, counts) over blocks of codes: each block sorted and run-length counted,
    then the blocks' runs merged (sort again, counts summed)."""
    keys, counts = [], []
    for codes in blocks:
        k, c = _runs(np.sort(codes))
        keys.append(k)
        counts.append(c)
        if len(keys) == _MERGE_EVERY:  # memory: the distinct pairs so far plus a few blocks' runs
            merged = _merge(keys, counts)
            keys, counts = [merged[0]], [merged[1]]
    if not keys:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    if len(keys) == 1:
        return keys[0], counts[0]
    return _merge(keys, counts)


def _merge(keys: list[np.ndarray], counts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    all_keys = np.concatenate(keys)
    order = np.argsort(all_keys, kind="stable")
    return _runs(all_keys[order], np.concatenate(counts)[order])


@dataclass(frozen=True)
class PairCounts:
    """Train pair counts: distinct codes (sorted) and their counts, with the per-id counts as the
    pairs' input (`sources`, c(a)) and as their target (`targets`, c(b)), by np.bincount."""

    vocab: int
    keys: np.ndarray
    counts: np.ndarray
    sources: np.ndarray
    targets: np.ndarray

    @classmethod
    def of(cls, keys: np.ndarray, counts: np.ndarray, vocab: int) -> PairCounts:
        def per_id(ids: np.ndarray) -> np.ndarray:
            return np.bincount(ids, weights=counts, minlength=vocab).astype(np.int64)

        return cls(vocab, keys, counts, per_id(keys // vocab), per_id(keys % vocab))

    @property
    def pairs(self) -> int:
        return int(self.counts.sum())

    def merged(self, other: PairCounts) -> PairCounts:
        keys, counts = _merge([self.keys, other.keys], [self.counts, other.counts])
        return PairCounts.of(keys, counts, self.vocab)

    def probabilities(self, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(P_unigram(b), P_ML(b | a)) of each code; P_ML is P_unigram where `a` starts no train pair,
        so any mixture of the two is then the unigram."""
        a, b = codes // self.vocab, codes % self.vocab
        unigram = (self.targets[b] + 1.0) / (self.pairs + self.vocab)
        at = np.minimum(np.searchsorted(self.keys, codes), max(len(self.keys) - 1, 0))
        seen = self.counts[at] * (self.keys[at] == codes) if len(self.keys) else np.zeros(len(codes))
        context = self.sources[a]
        bigram = np.where(context > 0, seen / np.maximum(context, 1), unigram)
        return unigram, bigram


def kneser_ney(counts: PairCounts, codes: np.ndarray) -> tuple[np.ndarray, float]:
    """(P_KN(b | a) of each code, the discount D): interpolated Kneser-Ney over `counts` (module
    docstring). Every probability is positive and each context's sum over the vocabulary is 1."""
    vocab = counts.vocab
    once, twice = int((counts.counts == 1).sum()), int((counts.counts == 2).sum())
    discount = once / (once + 2 * twice) if once else DEFAULT_LAMBDA
    types = max(len(counts.keys), 1)
    ending = np.bincount(counts.keys % vocab, minlength=vocab).astype(np.float64)  # N1+(• b)
    starting = np.bincount(counts.keys // vocab, minlength=vocab).astype(np.float64)  # N1+(a •)
    a, b = codes // vocab, codes % vocab
    targets_seen = int((ending > 0).sum())
    continuation = (np.maximum(ending[b] - discount, 0.0) + discount * targets_seen / vocab) / types
    if not len(counts.keys):
        return np.full(len(codes), 1.0 / vocab), discount
    at = np.minimum(np.searchsorted(counts.keys, codes), len(counts.keys) - 1)
    seen = (counts.counts[at] * (counts.keys[at] == codes)).astype(np.float64)
    context = counts.sources[a].astype(np.float64)
    safe = np.maximum(context, 1.0)
    interpolated = np.maximum(seen - discount, 0.0) / safe + discount * starting[a] / safe * continuation
    return np.where(context > 0, interpolated, continuation), discount


def _nats(unigram: np.ndarray, bigram: np.ndarray, weights: np.ndarray, lam: float) -> float:
    """Total nats of the weighted codes under the interpolation λ·P_ML + (1 - λ)·P_unigram."""
    return float(-(weights * np.log(lam * bigram + (1.0 - lam) * unigram)).sum())


def golden_minimum(f, low: float = 0.0, high: float = 1.0, tolerance: float = 1e-6) -> float:
    """The minimiser of a unimodal `f` on (low, high) by golden-section search (never at an end)."""
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    c, d = high - ratio * (high - low), low + ratio * (high - low)
    fc, fd = f(c), f(d)
    while high - low > tolerance:
        if fc < fd:
            high, d, fd = d, c, fc
            c = high - ratio * (high - low)
            fc = f(c)
        else:
            low, c, fc = c, d, fd
            d = low + ratio * (high - low)
            fd = f(d)
    return (low + high) / 2.0


def choose_lambda(counts: PairCounts, held_keys: np.ndarray, held_counts: np.ndarray) -> float:
    """λ in (0, 1) minimising the cross-entropy of the held-out pairs under `counts` (convex in λ)."""
    if not held_counts.sum():
        return DEFAULT_LAMBDA
    unigram, bigram = counts.probabilities(held_keys)
    weights = held_counts.astype(np.float64)
    return golden_minimum(lambda lam: _nats(unigram, bigram, weights, lam))


# --- the floors of two splits ----------------------------------------------------------------------


def counted_documents(train: TokenSplit, cap: int) -> tuple[np.ndarray, str | None]:
    """The train documents counted: all, or every k-th above `cap` tokens (and what that counts)."""
    everything = np.arange(len(train), dtype=np.int64)
    total = train.num_tokens
    if total <= cap:
        return everything, None
    step = -(-total // max(cap, 1))
    documents = everything[::step]
    tokens = int(train.lengths[documents].sum())
    return documents, (
        f"every {step}th train document: {len(documents):,} of {len(train):,} documents, "
        f"{tokens:,} of {total:,} tokens"
    )


def split_floors(
    train: TokenSplit,
    validation: TokenSplit,
    token_bytes: np.ndarray,
    cap: int = TRAIN_TOKEN_CAP,
    validation_documents: int | None = None,
) -> dict:
    """The floors of the pairs of `validation`'s first `validation_documents` documents (all: None)
    under models counted on `train` (the module docstring); `token_bytes`: UTF-8 bytes of each id
    (its length is the vocabulary, V)."""
    vocab = len(token_bytes)
    scored = len(validation) if validation_documents is None else min(validation_documents, len(validation))
    documents, sample = counted_documents(train, cap)
    held = max(1, round(HELD_OUT_FRACTION * len(documents))) if len(documents) > 1 else 0
    fit = PairCounts.of(*distinct_pairs(pair_codes(train, documents[: len(documents) - held], vocab)), vocab)
    held_keys, held_counts = distinct_pairs(pair_codes(train, documents[len(documents) - held :], vocab))
    lam = choose_lambda(fit, held_keys, held_counts)
    counts = fit.merged(PairCounts.of(held_keys, held_counts, vocab))  # every counted document
    keys, weights = distinct_pairs(pair_codes(validation, np.arange(scored), vocab))
    pairs = int(weights.sum())
    size = document_bytes(validation, token_bytes, scored)
    unigram, bigram = counts.probabilities(keys)
    kn, discount = kneser_ney(counts, keys)
    weights_f = weights.astype(np.float64)

    def floor(nats: float) -> dict:
        return {
            "nats": nats / pairs if pairs else None,
            "bits_per_byte": nats / math.log(2) / size if pairs and size else None,
        }

    return {
        "version": FLOORS_VERSION,
        "unigram": floor(_nats(unigram, bigram, weights_f, 0.0)),
        "bigram": {**floor(_nats(unigram, bigram, weights_f, lam)), "method": METHOD, "lambda": lam},
        "bigram_kn": {**floor(_nats(unigram, kn, weights_f, 1.0)), "method": KN_METHOD, "discount": discount},
        "validation_documents": scored,
        "validation_pairs": pairs,
        "validation_bytes": size,
        "train_tokens_counted": int(train.lengths[documents].sum()),
        "sample": sample,
    }


def combined_floors(parts: dict[str, dict]) -> dict:
    """A mixture's floors: each component's under `components`, and over all of their validation
    pairs together as a mixture's val/loss pools them (total nats / total pairs, total bits / total
    bytes)."""
    pairs = sum(p["validation_pairs"] for p in parts.values())
    size = sum(p["validation_bytes"] for p in parts.values())
    out: dict = {"components": parts}
    for model in MODELS:
        nats = sum(p[model]["nats"] * p["validation_pairs"] for p in parts.values() if p["validation_pairs"])
        out[model] = {
            "nats": nats / pairs if pairs else None,
            "bits_per_byte": nats / math.log(2) / size if pairs and size else None,
        }
    out["bigram"]["method"], out["bigram_kn"]["method"] = METHOD, KN_METHOD
    out["validation_pairs"], out["validation_bytes"] = pairs, size
    out["validation_documents"] = sum(p["validation_documents"] for p in parts.values())
    return out


# --- floors.json -----------------------------------------------------------------------------------


def _whole(cache: Cache, documents: int | None) -> int | None:
    """None when the first `documents` validation documents are all of them (one floors.json)."""
    total = int(cache.manifest["splits"]["validation"]["documents"])
    return None if documents is None or documents >= total else int(documents)


def floors_path(cache: Cache, documents: int | None = None) -> Path | None:
    """Beside the manifest when the cache directory is writable, else in the per-user state (keyed
    like the verified record); None if neither can be written. `documents`: the floors of the first
    that many validation documents (`floors.first-<N>.json`)."""
    directory = Path(cache.directory).resolve()
    suffix = "" if _whole(cache, documents) is None else f".first-{documents}"
    if writable_dir(directory):
        return directory / (FLOORS if not suffix else f"floors{suffix}.json")
    place = state_dir() / "floors"
    name = f"{_place_name(directory, cache.manifest.get('key', ''))}{suffix}.json"
    return place / name if ensure_dir(place) else None


def _computed_from(cache: Cache, vocab: int, cap: int, documents: int | None = None) -> dict:
    """What the floors depend on: the cache's key and files, the vocabulary, the sample cap and the
    validation documents scored (null: all)."""
    files = {entry["name"]: entry["sha256"] for _, _, entry in manifest_files(cache.manifest)}
    return {
        "key": cache.manifest.get("key"),
        "files": files,
        "vocab": vocab,
        "train_token_cap": cap,
        "validation_documents": _whole(cache, documents),
    }


def recorded_floors(cache: Cache) -> dict | None:
    """The floors stored for this cache's very files (by `cache_floors`, whatever vocabulary and cap
    they were computed with), without computing any: what `pretrain compare` reads for a run whose
    run.json predates floors. None when none are stored."""
    path = floors_path(cache)
    record = read_json(path) if path is not None and path.is_file() else None
    if not record or record.get("version") != FLOORS_VERSION:
        return None
    source = _computed_from(cache, 0, 0)
    computed_from = record.get("computed_from") or {}
    if (computed_from.get("key"), computed_from.get("files")) != (source["key"], source["files"]):
        return None
    return {k: v for k, v in record.items() if k != "computed_from"}


def _stored(path: Path | None, source: dict) -> dict | None:
    record = read_json(path) if path is not None else None
    if not record or record.get("version") != FLOORS_VERSION or record.get("computed_from") != source:
        return None
    return {k: v for k, v in record.items() if k != "computed_from"}


def cache_floors(
    cache: Cache, token_bytes: np.ndarray, cap: int = TRAIN_TOKEN_CAP, documents: int | None = None
) -> dict:
    """The floors of a verified cache's first `documents` validation documents (all: None): stored
    ones when computed from these very files, else computed (one process per place, under a lock)
    and stored atomically (best effort)."""
    path = floors_path(cache, documents)
    source = _computed_from(cache, len(token_bytes), cap, documents)
    if (found := _stored(path, source)) is not None:
        return found
    with _lock(path):
        if (found := _stored(path, source)) is not None:  # another rank computed it meanwhile
            return found
        floors = split_floors(
            cache.split("train"), cache.split("validation"), token_bytes, cap, _whole(cache, documents)
        )
        if path is not None:
            write_json_atomic(path, {**floors, "computed_from": source})
    return floors


def spec_floors(spec: CacheSpec, cache: Cache, documents: int | None = None) -> dict:
    """`cache_floors` over the tokenizer's whole vocabulary (every id it can produce)."""
    files = spec.tokenizer_files
    vocab = max_token_id(files) + 1
    path = floors_path(cache, documents)
    stored = _stored(path, _computed_from(cache, vocab, TRAIN_TOKEN_CAP, documents))
    if stored is not None:  # a run's usual start: no table of the vocabulary's bytes to build (0.06 s)
        return stored
    return cache_floors(cache, token_byte_lengths(files, vocab), documents=documents)
