"""The Lightning data module: the verified cache, the policy's train sampler, the validation pairs,
and exact-resume state.

Validation scores the same pairs whatever the policy and the world size: every chunk of the first
validation documents up to train.val_batches x train.eval_microbatch_tokens pairs, each chunk its own
segment, split over ranks (data/batching/evaluation.py); the module sums the loss over all ranks.

Each training item is one whole optimizer update (`train.accumulation` microbatches), so the loss can
be normalised by the update's token count before the first backward. Every item carries the sampler
state *after* it; the module records the state of the last update it actually trained, and that is
what a checkpoint saves. Lightning prefetches one item ahead, so the sampler's live state would be
one update too far: a resume from it would silently skip an update.

An update is `train.accumulation` consecutive batches of this rank. A policy that plans whole updates
(vsl: every microbatch of an update, on every rank, from one length bucket) serves a whole number of
updates per epoch, so an update never straddles two epochs, and a saved position is always at an
update's start.

The saved state is the sampler's global position (epoch, units consumed: data/batching/samplers.py), never
global_step x a batch size, so a checkpoint resumes on another number of ranks or train.batch_size
exactly. The update stream has no length: Lightning's epoch never ends and train.max_steps stops the
run, so a resumed epoch that cuts into another number of batches per rank changes nothing here;
global_step, the LR schedule and tokens_seen continue from the checkpoint.

With a mixture (data/batching/mixture.py) every component's cache is prepared and verified, the train sampler
reads their train splits as one, and validation scores each component's own validation pairs (the same
selection as a run on that component alone), so `val/loss/<name>` sits beside the overall `val/loss`.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import lightning as L
import numpy as np
from torch.utils.data import DataLoader, IterableDataset

from ..config import upgrade_sampler_state
from ..data.batching.batch import PackedBatch
from ..data.batching.chunking import ChunkTable
from ..data.batching.evaluation import (
    evaluation_batches,
    evaluation_chunks,
    evaluation_positions,
    evaluation_units,
    scored_documents,
    validation_pairs,
)
from ..data.batching.mixture import MixtureSpec
from ..data.batching.policies import PolicySettings
from ..data.batching.samplers import Sampler, build_sampler
from ..data.ingest.cache import Cache, CacheSpec
from ..data.ingest.prepare import prepare_cache
from ..data.measures.floors import combined_floors, spec_floors
from ..data.tokens import TokenSplit
from ..errors import CheckpointError, ConfigError

STATE_FORMAT = 1
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ValidationSet:
    """One rank's validation pairs of one split: a component's (`name`), or the run's one source
    (`name` None); their packing is computed once."""

    name: str | None
    split: TokenSplit
    chunks: ChunkTable
    units: tuple[np.ndarray, np.ndarray]

    def batches(self, policy: PolicySettings) -> Iterator[PackedBatch]:
        return evaluation_batches(policy, self.split, self.chunks, self.units)

    def positions(self, policy: PolicySettings) -> Iterator[np.ndarray]:
        """Beside `batches`: each batch's counted targets' positions in their documents."""
        return evaluation_positions(policy, self.split, self.chunks, self.units)


@dataclass
class Update:
    """The microbatches of one optimizer update and the train sampler's state after them."""

    microbatches: list[PackedBatch]
    sampler_state: dict = field(default_factory=dict)

    def to(self, device, non_blocking: bool = False) -> Update:
        return replace(
            self, microbatches=[mb.to(device, non_blocking=non_blocking) for mb in self.microbatches]
        )


class UpdateStream(IterableDataset):
    """Endless updates from a train sampler, epoch after epoch."""

    def __init__(self, sampler, accumulation: int):
        self.sampler = sampler
        self.accumulation = accumulation

    def __iter__(self):
        group: list[PackedBatch] = []
        while True:
            produced = False
            for batch in self.sampler:
                produced = True
                group.append(batch)
                if len(group) == self.accumulation:
                    yield Update(microbatches=group, sampler_state=copy.deepcopy(self.sampler.state_dict()))
                    group = []
            if not produced:
                raise ConfigError(
                    "the training split yields no batch for this rank: the cache is too small for "
                    "train.batch_size x world size; lower train.batch_size or raise budget.train_tokens"
                )


def _as_is(item):
    return item


class PretrainDataModule(L.LightningDataModule):
    """The cache of `cache` (its identity computed once by the run's entry) batched by `policy`; with
    a `mixture`, its components' caches (`cache` is then unused)."""

    def __init__(self, cache: CacheSpec, policy: PolicySettings, mixture: MixtureSpec | None = None):
        super().__init__()
        self.spec = cache
        self.policy = policy
        self.mixture = mixture
        if mixture is not None:
            mixture.check_policy(policy.policy)
        self.cache_key = cache.key if mixture is None else mixture.key
        self.cache: Cache | None = None  # the one source's (None with a mixture)
        self.caches: dict[str, Cache] = {}  # a mixture's, by component
        self.train_sampler: Sampler | None = None
        self.validation_sets: list[ValidationSet] | None = None  # this rank's share of the pairs
        self._trained_state: dict | None = None  # sampler state after the last trained update
        self._resume_state: dict | None = None  # from a checkpoint, applied when the sampler is built
        self._floors: dict | None = None

    def prepare_data(self) -> None:
        # Local rank 0 builds or verifies; the other ranks verify in setup() (the file lock makes
        # them wait for a build). Kept so that this process does not hash the files twice.
        self._prepare(progress=True)

    def _prepare(self, progress: bool) -> None:
        if self.mixture is None:
            if self.cache is None:
                self.cache = prepare_cache(self.spec, progress=progress)
            return
        for component in self.mixture.components:
            if component.name not in self.caches:
                self.caches[component.name] = prepare_cache(component.cache, progress=progress)

    @property
    def named_caches(self) -> dict[str | None, Cache]:
        """The caches training reads: the one source's (named None) or each component's."""
        if self.mixture is None:
            assert self.cache is not None, "prepare_data() or setup() first"
            return {None: self.cache}
        return {name: cache for name, cache in self.caches.items()}

    def setup(self, stage: str | None = None) -> None:
        self._prepare(progress=False)
        rank, world = (self.trainer.global_rank, self.trainer.world_size) if self.trainer else (0, 1)
        if self.train_sampler is None:
            if self.mixture is None:
                assert self.cache is not None
                self.train_sampler = build_sampler(
                    self.policy,
                    self.cache.split("train"),
                    rank=rank,
                    world_size=world,
                    packs_dir=self.cache.packs_dir,
                )
            else:
                splits = [self.caches[name].split("train") for name in self.mixture.names]
                train, mixture = self.mixture.mix(splits)
                self.train_sampler = build_sampler(
                    self.policy, train, rank=rank, world_size=world, mixture=mixture
                )
        if self.validation_sets is None:
            self.validation_sets = []
            for name, cache in self.named_caches.items():
                split = cache.split("validation")  # the index is parsed once
                chunks = evaluation_chunks(
                    split, self.policy.max_seq_len, validation_pairs(self.policy), rank=rank, world_size=world
                )
                units = evaluation_units(self.policy, chunks)
                self.validation_sets.append(ValidationSet(name, split, chunks, units))
            if rank == 0 and not self.has_validation:
                where = ", ".join(str(cache.directory) for cache in self.named_caches.values())
                log.warning(
                    f"the validation split of {where} has no prediction pairs "
                    "(split.validation_fraction=0, budget.validation_tokens=0 or too few documents): "
                    "no validation runs and val/loss is not logged; set split.validation_fraction "
                    "above 0 (e.g. 0.05) to validate"
                )
        if rank == 0:
            self.floors()  # now, not in a preempted run's grace time at its end (stored once per cache)

    def floors(self) -> dict | None:
        """The floors a run must beat (measures/floors.py) on the validation pairs val/loss scores: its one
        cache's, or a mixture's pooled over its components' (each under `components`); None while a
        cache is not prepared (a run stopped while building it)."""
        if self._floors is None:
            if self.mixture is None:
                # task=sft: val/loss counts the trained targets only, which the floors do not single out
                if self.cache is not None and not self.cache.masked:
                    self._floors = spec_floors(self.spec, self.cache, self._scored_documents(self.cache))
            elif len(self.caches) == len(self.mixture.components):
                self._floors = combined_floors(
                    {
                        c.name: spec_floors(c.cache, cache, self._scored_documents(cache))
                        for c in self.mixture.components
                        for cache in (self.caches[c.name],)
                    }
                )
        return self._floors

    def _scored_documents(self, cache: Cache) -> int:
        """The validation documents whose pairs val/loss scores (train.val_batches: the first ones)."""
        return scored_documents(cache.split("validation"), validation_pairs(self.policy))

    def validation_batches(self) -> Iterator[PackedBatch]:
        """This rank's validation batches (every set's, in order): the same pairs for every policy."""
        assert self.validation_sets is not None, "setup() first"
        for validation in self.validation_sets:
            yield from validation.batches(self.policy)

    def validation_positions(self) -> Iterator[np.ndarray]:
        """Beside `validation_batches`: each batch's counted targets' positions in their documents."""
        assert self.validation_sets is not None, "setup() first"
        for validation in self.validation_sets:
            yield from validation.positions(self.policy)

    def statistics(self, audits: bool = False) -> dict:
        """`pretrain inspect-data`'s statistics of this run's data, from its own train sampler's epoch 0
        (a mixture: the mixed epoch, and each component's under `mixture`)."""
        from ..data.measures.stats import inspect_split

        assert self.train_sampler is not None, "setup() first"
        sampler = self.train_sampler
        if self.mixture is None:
            assert self.cache is not None
            validation = self.cache.split("validation")
            return inspect_split(self.policy, sampler.split, validation, audits=audits, sampler=sampler)
        parts = [self.caches[name].split("validation") for name in self.mixture.names]
        validation, _ = self.mixture.mix(parts)
        return inspect_split(
            self.policy, sampler.split, validation, audits=audits, sampler=sampler, validation_parts=parts
        )

    @property
    def has_validation(self) -> bool:
        """False when no validation split (or its selection) has a pair on any rank."""
        counts = (cache.counts()["validation"]["prediction_pairs"] for cache in self.named_caches.values())
        return sum(counts) > 0

    def train_dataloader(self) -> DataLoader:
        assert self.train_sampler is not None, "setup() builds the samplers"
        if self._resume_state is not None:
            self.train_sampler.load_state_dict(copy.deepcopy(self._resume_state))
            self._trained_state, self._resume_state = self._resume_state, None
        stream = UpdateStream(self.train_sampler, self.policy.accumulation)
        return DataLoader(stream, batch_size=None, collate_fn=_as_is, num_workers=0)

    def mark_trained(self, sampler_state: dict) -> None:
        self._trained_state = sampler_state

    def state_dict(self) -> dict:
        # Validation needs no state: its pairs are a pure function of the settings.
        return {"format": STATE_FORMAT, "cache_key": self.cache_key, "train_sampler": self._trained_state}

    def load_state_dict(self, state: dict) -> None:
        if state.get("cache_key") not in (None, self.cache_key):
            raise CheckpointError(
                f"the checkpoint was trained on cache {state.get('cache_key')}, this config gives "
                f"{self.cache_key}: resume with the same source (or mixture), tokenizer, split and budget "
                "settings"
            )
        saved = state.get("train_sampler")
        self._resume_state = None if saved is None else upgrade_sampler_state(saved)
