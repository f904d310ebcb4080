"""Data mixtures by token share: several corpora, each its own verified cache, planned into one epoch.

`mixture=<name>` (conf/mixture/*.yaml) names components, each with a `weight` (its share of the real
training tokens), a `max_repeat` (times its documents may be used per epoch) and the keys of a `source`
option (plus an optional `budget`). Each component is prepared like a run's one source, so its cache
has its own identity and is shared by every mixture (and every single-source run) that names it.
A run without a mixture is the one-component mixture of its `source`: the sampler then takes every
chunk of that cache each epoch in the policy's own shuffle, exactly as before mixtures existed.

The plan of an epoch, from (seed, epoch) alone (so every rank plans the same epoch, and a resume
replans it):
- Component i has N_i trained tokens (the prediction pairs of the chunks its policy trains). The epoch
  is T = min_i max_repeat_i x N_i / weight_i real tokens long: as long as the components allow without
  using any of them more than its max_repeat.
- Component i contributes weight_i x T tokens: the chunks whose start falls in the token interval
  [e x share_i, (e + 1) x share_i) of an endless stream that cycles one per-seed permutation of its
  chunks. So an epoch continues where the previous one stopped: a component with more data than its
  share contributes a different part each epoch, and no chunk is used more than ceil(share_i / N_i)
  <= max_repeat_i times in an epoch. Its share is met within one chunk.
- The components' chunks (each component's in a per-epoch shuffle) are interleaved so that every
  component's cumulative tokens track its weight: the next chunk comes from the component that has
  used the smallest fraction of its epoch share (a stable merge on that fraction).
Then the policy lays that table out as usual. Document masking keeps components apart as it keeps
documents apart. How much of the order a policy keeps: bestfit and firstfit pack the chunks in the
planned order (marked `ChunkTable.planned`), so each update's shares track the weights up to their
candidate buffer; padded shuffles its rows and vsl groups pieces by length, so they keep the share of
every epoch exactly and of each update only on average (`update_shares` measures it). prepacked packs
a fixed stream ahead of time and refuses a mixture.

The components' splits are read as one `TokenSplit` (`mix_splits`): documents of component i are
documents doc_bounds[i]:doc_bounds[i + 1], their tokens token_bounds[i]:token_bounds[i + 1] of a
virtual concatenation (concat.py's `ConcatTokens`, no copy), so a token's offset says its component
(`Mixture.component_of`) and the policies gather batches as from one cache.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import numpy as np

from ...arrays import prefix_sums
from ...errors import ConfigError, PretrainError
from ..tokens import TokenSplit
from .chunking import ChunkTable
from .concat import ConcatIds, ConcatTokens
from .policies import REGISTRY, policy_class
from .policies.layout import EpochPlan, index_dtype, shuffled

if TYPE_CHECKING:
    from ...config import Config
    from ..ingest.cache import CacheSpec

log = logging.getLogger(__name__)

# Streams of the mixture's generators, apart from the sampler's (seed, epoch) one.
_PERMUTATION_STREAM = 0x6D6978  # "mix": a component's per-seed permutation
_EPOCH_STREAM = 0x65706F  # "epo": a component's chunks shuffled within an epoch


@dataclass(frozen=True)
class Component:
    """One component: its name (in metrics), normalised weight, max_repeat and cache."""

    name: str
    weight: float
    max_repeat: int
    cache: CacheSpec


@dataclass(frozen=True)
class MixtureSpec:
    """The mixture a config asks for: its components, their caches and what identifies it."""

    components: tuple[Component, ...]

    @classmethod
    def from_config(cls, config: Config) -> MixtureSpec | None:
        """The config's `mixture` (None without one), each component's cache spec computed now (a
        local source's files are hashed once). Weights that do not sum to 1 are normalised, saying so."""
        from ..ingest.cache import CacheSpec

        mixture = config.mixture
        if mixture is None:
            return None
        total = sum(float(c.weight) for c in mixture.components.values())
        if not math.isclose(total, 1.0, rel_tol=1e-9):
            shares = ", ".join(f"{n}={float(c.weight) / total:.4g}" for n, c in mixture.components.items())
            log.warning(f"mixture weights sum to {total:g}, not 1: normalised to {shares}")
        components = []
        for name, component in mixture.components.items():
            budget = component.budget if component.budget is not None else config.budget
            try:
                cache = CacheSpec.for_source(config, component.source, budget)
            except PretrainError as error:  # the source kind's own check, named by the component
                raise type(error)(f"mixture.components.{name}.source: {error}") from None
            weight = float(component.weight) / total
            components.append(Component(name, weight, int(component.max_repeat), cache))
        return cls(tuple(components))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.components)

    def resume_key(self) -> dict:
        """What a sampler state of this mixture depends on: names, weights, max_repeat and caches."""
        return {
            c.name: {"weight": round(c.weight, 12), "max_repeat": c.max_repeat, "cache": c.cache.key}
            for c in self.components
        }

    @property
    def identity(self) -> dict:
        """The run's data identity (recorded in the checkpoint's `cache_identity`): the tokenizer's (the
        components share it: eval and export check it), and per component its share and cache key."""
        first = self.components[0].cache.identity
        return {"tokenizer": first["tokenizer"], "mixture": self.resume_key()}

    @property
    def key(self) -> str:
        """A short name of the mixture's data (the checkpoint's `cache_key`)."""
        text = json.dumps(self.resume_key(), sort_keys=True, separators=(",", ":"))
        return "mixture-" + hashlib.sha256(text.encode()).hexdigest()[:20]

    def mix(self, splits: Sequence[TokenSplit]) -> tuple[TokenSplit, Mixture]:
        """The components' splits (one per component, in order) read as one, and the mixture."""
        weights = [c.weight for c in self.components]
        repeat = [c.max_repeat for c in self.components]
        return mix_splits(splits, self.names, weights, repeat, self.resume_key())

    def check_policy(self, policy: str) -> None:
        """A policy whose layout is one stream fixed ahead of time cannot lay out a mixture's epochs."""
        check_mixable(policy)


def check_sources(config: Config) -> None:
    """The run's sources and, with a mixture, its policy, checked from the config alone (no file is
    hashed, nothing built): what train.py refuses before Hydra makes the run directory."""
    from ..sources import source_from_config

    if config.mixture is None:
        source_from_config(config.source)
        return
    check_mixable(str(config.data.policy))
    for name, component in config.mixture.components.items():
        try:
            source_from_config(component.source)
        except PretrainError as error:  # the source kind's own check, named by the component
            raise type(error)(f"mixture.components.{name}.source: {error}") from None


def check_mixable(policy: str) -> None:
    """A policy whose layout is one stream fixed ahead of time cannot lay out a mixture's epochs."""
    if not policy_class(policy).mixes:
        able = ", ".join(str(name) for name, cls in REGISTRY.items() if cls.mixes)
        raise ConfigError(
            f"data={policy} packs one fixed token stream ahead of time, a mixture plans its chunks per "
            f"epoch: use data={able} with mixture=..."
        )


@dataclass(frozen=True)
class Mixture:
    """A mixture's components laid over one concatenated split: weights and max_repeat, and where each
    component's documents and tokens are (`doc_bounds`, `token_bounds`: (components + 1,) int64)."""

    names: tuple[str, ...]
    weights: tuple[float, ...]
    max_repeat: tuple[int, ...]
    doc_bounds: np.ndarray
    token_bounds: np.ndarray
    key: dict  # MixtureSpec.resume_key(): a sampler state of another mixture is refused

    def __len__(self) -> int:
        return len(self.names)

    def component_of(self, starts: np.ndarray) -> np.ndarray:
        """The component of tokens at these offsets of the mixed split (int64)."""
        return np.searchsorted(self.token_bounds, np.asarray(starts, dtype=np.int64), side="right") - 1


def mix_splits(
    splits: Sequence[TokenSplit],
    names: Sequence[str],
    weights: Sequence[float],
    max_repeat: Sequence[int] | None = None,
    key: dict | None = None,
) -> tuple[TokenSplit, Mixture]:
    """The components' splits (in `names` order) as one TokenSplit, and the mixture over it
    (`weights` already normalised; `max_repeat` 1 each by default; `key` what a resume checks)."""
    token_bounds = prefix_sums([len(s.tokens) for s in splits])
    doc_bounds = prefix_sums([len(s) for s in splits])
    bases = token_bounds[:-1].tolist()
    offsets = np.concatenate(
        [np.asarray(s.offsets, dtype=np.int64) + b for s, b in zip(splits, bases, strict=True)]
    )
    lengths = np.concatenate([np.asarray(s.lengths, dtype=np.int64) for s in splits])
    split = TokenSplit(
        tokens=cast(np.ndarray, ConcatTokens([s.tokens for s in splits])),
        offsets=offsets,
        lengths=lengths,
        ids=ConcatIds([s.ids for s in splits]),
        name=splits[0].name,
        eos_token_id=splits[0].eos_token_id,  # one tokenizer for every component
    )
    repeat = tuple(int(r) for r in max_repeat) if max_repeat is not None else (1,) * len(splits)
    mixture = Mixture(
        names=tuple(names),
        weights=tuple(float(w) for w in weights),
        max_repeat=repeat,
        doc_bounds=doc_bounds,
        token_bounds=token_bounds,
        key=key
        if key is not None
        else {"names": list(names), "weights": list(weights), "max_repeat": list(repeat)},
    )
    return split, mixture


# --- the plan of an epoch ---------------------------------------------------------------------------


@dataclass(frozen=True)
class MixedEpoch:
    """One epoch of a mixture: the chunks it trains in order (a planned ChunkTable of the mixed split)
    and the component of each."""

    table: ChunkTable
    component: np.ndarray  # int8 (int16 past 127 components) per row of `table`


class MixturePlan:
    """The epochs of a mixture over the mixed split's chunk `table`; `trained` (policy.trained_chunks:
    None = every chunk) are the chunks a component can contribute. Everything is numpy over whole
    arrays (a 10B-token mixture plans in seconds); the per-seed permutations are held (12 bytes per
    chunk), an epoch's table is built when asked for (the last two are kept)."""

    def __init__(self, mixture: Mixture, table: ChunkTable, trained: np.ndarray | None, seed: int):
        self.mixture = mixture
        self.table = table
        self.seed = int(seed) & (2**64 - 1)
        chunk_bounds = np.searchsorted(table.doc, mixture.doc_bounds, side="left")
        self.chunks: list[np.ndarray] = []  # per component: its chunk ids in its per-seed permutation
        self.starts: list[np.ndarray] = []  # per component: each one's first token in that stream
        for i in range(len(mixture)):
            lo, hi = int(chunk_bounds[i]), int(chunk_bounds[i + 1])
            if trained is None:
                ids = np.arange(lo, hi, dtype=np.int64)
            else:
                ids = trained[(trained >= lo) & (trained < hi)].astype(np.int64)
            if not len(ids):
                raise ConfigError(
                    f"mixture component {mixture.names[i]!r} has no training chunks: its cache's train split "
                    "is empty; raise its budget or give its source documents"
                )
            order = ids[shuffled(np.random.default_rng([self.seed, _PERMUTATION_STREAM, i]), len(ids))]
            self.chunks.append(order.astype(index_dtype(len(table))))
            self.starts.append(prefix_sums(table.length[order])[:-1])
        self.available = np.array([int(table.length[c].sum(dtype=np.int64)) for c in self.chunks])
        weights = np.asarray(mixture.weights, dtype=np.float64)
        repeat = np.asarray(mixture.max_repeat, dtype=np.float64)
        limits = repeat * self.available / weights
        self.epoch_tokens = float(limits.min())  # T
        limiting = int(np.argmin(limits))
        self.limiting = limiting
        shares = np.rint(weights * self.epoch_tokens).astype(np.int64)
        shares[limiting] = int(mixture.max_repeat[limiting]) * int(self.available[limiting])  # exact
        self.shares = np.maximum(shares, 1)
        self._epochs: dict[int, MixedEpoch] = {}
        if self.epoch_tokens < table.max_seq_len:  # less than one full context: a degenerate epoch
            log.warning(
                f"the mixed epoch is only {self.epoch_tokens:,.0f} real tokens, less than one "
                f"data.max_seq_len={table.max_seq_len}: {self.limit()}; raise its budget or max_repeat, "
                "or lower its weight"
            )

    def limit(self) -> str:
        """Which component bounds the epoch and why (its tokens x max_repeat / weight)."""
        i = self.limiting
        name, weight = self.mixture.names[i], float(self.mixture.weights[i])
        return (
            f"mixture component {name!r} limits it ({int(self.available[i]):,} trained tokens x "
            f"max_repeat {int(self.mixture.max_repeat[i])} / weight {weight:.3g})"
        )

    def uses_per_epoch(self) -> np.ndarray:
        """Times each component's tokens are used per epoch on average (share / available)."""
        return self.shares / self.available

    def _component_chunks(self, i: int, epoch: int) -> np.ndarray:
        """Component i's chunks of `epoch`: those starting in [epoch x share, (epoch + 1) x share) of
        its cycled stream."""
        share, total = int(self.shares[i]), int(self.available[i])
        first, stop = epoch * share, (epoch + 1) * share
        starts, chunks = self.starts[i], self.chunks[i]
        parts = []
        for cycle in range(first // total, (stop - 1) // total + 1):
            base = cycle * total
            lo = np.searchsorted(starts, first - base, side="left")
            hi = np.searchsorted(starts, stop - base, side="left")
            parts.append(chunks[lo:hi])
        return np.concatenate(parts)

    def epoch(self, epoch: int) -> MixedEpoch:
        cached = self._epochs.get(epoch)
        if cached is not None:
            return cached
        table = self.table
        rows, keys, components = [], [], []
        for i in range(len(self.mixture)):
            chunks = self._component_chunks(i, epoch)
            chunks = chunks[
                shuffled(np.random.default_rng([self.seed, _EPOCH_STREAM, i, epoch]), len(chunks))
            ]
            rows.append(chunks)
            # The fraction of its epoch share used before each chunk: the merge key.
            keys.append(prefix_sums(table.length[chunks])[:-1] / float(self.shares[i]))
            components.append(np.full(len(chunks), i, dtype=np.int16))
        order = np.argsort(np.concatenate(keys), kind="stable")
        picked = np.concatenate(rows)[order]
        component = np.concatenate(components)[order]
        if len(self.mixture) < 128:
            component = component.astype(np.int8)
        mixed = MixedEpoch(
            table=ChunkTable(
                doc=table.doc[picked],
                start=table.start[picked],
                length=table.length[picked],
                max_seq_len=table.max_seq_len,
                planned=True,
            ),
            component=component,
        )
        if len(self._epochs) >= 2:
            self._epochs.pop(next(iter(self._epochs)))
        self._epochs[epoch] = mixed
        return mixed


def update_shares(mixture: Mixture, plan: EpochPlan, update_units: int) -> np.ndarray:
    """(updates, components): each whole update's share of its real tokens per component, for the
    epoch `plan` of a mixed split (an update is `update_units` consecutive units of its order)."""
    updates = plan.ordered_units // update_units
    units = plan.ordered(0, updates * update_units)
    items, counts = plan.layout.items_of(units)
    update = np.repeat(np.arange(len(units), dtype=np.int64) // update_units, counts)
    tokens = np.zeros((updates, len(mixture)), dtype=np.float64)
    component = mixture.component_of(plan.layout.starts(items))
    np.add.at(tokens, (update, component), plan.layout.lengths(items).astype(np.float64))
    return tokens / np.maximum(tokens.sum(axis=1, keepdims=True), 1.0)


def mixture_statistics(plan: MixturePlan, epoch_plan: EpochPlan, update_units: int) -> dict:
    """Per component (inspect-data's `mixture`): its weight, the real tokens it contributes per epoch
    and their share, the tokens it has (`available_tokens`), `uses_per_epoch` (tokens used / available),
    the fraction of its documents an epoch uses (epoch 0), and how far one update's share strays from
    the weight once the policy has laid the epoch out (`update_share_deviation`: max and mean of
    |share - weight| over the epoch's whole updates)."""
    mixture = plan.mixture
    mixed = plan.epoch(0)
    tokens = np.bincount(mixed.component, weights=mixed.table.length, minlength=len(mixture))
    shares = update_shares(mixture, epoch_plan, update_units)
    out = {}
    for i, name in enumerate(mixture.names):
        mine = mixed.component == i
        documents = int(mixture.doc_bounds[i + 1] - mixture.doc_bounds[i])
        used = np.zeros(documents, dtype=bool)  # the documents its epoch uses (a mask: linear)
        used[mixed.table.doc[mine] - int(mixture.doc_bounds[i])] = True
        deviation = np.abs(shares[:, i] - mixture.weights[i]) if len(shares) else np.zeros(1)
        out[name] = {
            "weight": mixture.weights[i],
            "tokens": int(tokens[i]),
            "share": float(tokens[i] / max(tokens.sum(), 1)),
            "available_tokens": int(plan.available[i]),
            "uses_per_epoch": float(tokens[i] / plan.available[i]),
            "max_repeat": mixture.max_repeat[i],
            "documents": documents,
            "documents_used_per_epoch": int(used.sum()) / documents if documents else 0.0,
            "update_share_deviation_max": float(deviation.max()),
            "update_share_deviation_mean": float(deviation.mean()),
        }
    return out
