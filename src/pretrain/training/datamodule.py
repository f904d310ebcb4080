"""The Lightning data module: the verified cache, the policy's train sampler, the validation pairs,
and exact-resume state.

Validation scores the same pairs whatever the policy and the world size: every chunk of the first
validation documents up to train.val_batches x train.eval_microbatch_tokens pairs, each chunk its own
segment, split over ranks (data/evaluation.py); the module sums the loss over all ranks.

Each training item is one whole optimizer update (`train.accumulation` microbatches), so the loss can
be normalised by the update's token count before the first backward. Every item carries the sampler
state *after* it; the module records the state of the last update it actually trained, and that is
what a checkpoint saves. Lightning prefetches one item ahead, so the sampler's live state would be
one update too far: a resume from it would silently skip an update.

An update is `train.accumulation` consecutive batches of this rank. A policy that plans whole updates
(vsl: every microbatch of an update, on every rank, from one length bucket) serves a whole number of
updates per epoch, so an update never straddles two epochs, and a saved position is always at an
update's start.

The saved state is the sampler's global position (epoch, units consumed: data/samplers.py), never
global_step x a batch size, so a checkpoint resumes on another number of ranks or train.batch_size
exactly. The update stream has no length: Lightning's epoch never ends and train.max_steps stops the
run, so a resumed epoch that cuts into another number of batches per rank changes nothing here;
global_step, the LR schedule and tokens_seen continue from the checkpoint.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import lightning as L
import numpy as np
from torch.utils.data import DataLoader, IterableDataset

from ..data.batch import PackedBatch
from ..data.cache import Cache, CacheSpec
from ..data.chunking import ChunkTable
from ..data.evaluation import (
    evaluation_batches,
    evaluation_chunks,
    evaluation_positions,
    evaluation_units,
    validation_pairs,
)
from ..data.policies import PolicySettings
from ..data.prepare import prepare_cache
from ..data.samplers import Sampler, build_sampler
from ..data.tokens import TokenSplit
from ..errors import CheckpointError, ConfigError

STATE_FORMAT = 1
log = logging.getLogger(__name__)


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
    """The cache of `cache` (its identity computed once by the run's entry) batched by `policy`."""

    def __init__(self, cache: CacheSpec, policy: PolicySettings):
        super().__init__()
        self.spec = cache
        self.policy = policy
        self.cache_key = cache.key
        self.cache: Cache | None = None
        self.train_sampler: Sampler | None = None
        self.validation_chunks: ChunkTable | None = None  # this rank's share of the validation pairs
        self._validation_units: tuple[np.ndarray, np.ndarray] | None = None  # their packing, built once
        self._validation_split: TokenSplit | None = None
        self._trained_state: dict | None = None  # sampler state after the last trained update
        self._resume_state: dict | None = None  # from a checkpoint, applied when the sampler is built

    def prepare_data(self) -> None:
        # Local rank 0 builds or verifies; the other ranks verify in setup() (the file lock makes
        # them wait for a build). Kept so that this process does not hash the files twice.
        self.cache = prepare_cache(self.spec)

    def setup(self, stage: str | None = None) -> None:
        if self.cache is None:
            self.cache = prepare_cache(self.spec, progress=False)
        rank, world = (self.trainer.global_rank, self.trainer.world_size) if self.trainer else (0, 1)
        if self.train_sampler is None:
            train = self.cache.split("train")
            packs = self.cache.packs_dir
            self.train_sampler = build_sampler(
                self.policy, train, rank=rank, world_size=world, packs_dir=packs
            )
        if self.validation_chunks is None:
            self._validation_split = self.cache.split("validation")  # the index is parsed once
            self.validation_chunks = evaluation_chunks(
                self._validation_split,
                self.policy.max_seq_len,
                validation_pairs(self.policy),
                rank=rank,
                world_size=world,
            )
            self._validation_units = evaluation_units(self.policy, self.validation_chunks)
            if rank == 0 and not self.has_validation:
                log.warning(
                    f"the validation split of {self.cache.directory} has no prediction pairs "
                    "(split.validation_fraction=0, budget.validation_tokens=0 or too few documents): "
                    "no validation runs and val/loss is not logged; set split.validation_fraction "
                    "above 0 (e.g. 0.05) to validate"
                )

    def validation_batches(self) -> Iterator[PackedBatch]:
        """This rank's validation batches: the same pairs for every policy (data/evaluation.py)."""
        assert self._validation_split is not None and self.validation_chunks is not None, "setup() first"
        split = self._validation_split
        return evaluation_batches(self.policy, split, self.validation_chunks, self._validation_units)

    def validation_positions(self) -> Iterator[np.ndarray]:
        """Beside `validation_batches`: each batch's counted targets' positions in their documents."""
        assert self._validation_split is not None and self.validation_chunks is not None, "setup() first"
        split = self._validation_split
        return evaluation_positions(self.policy, split, self.validation_chunks, self._validation_units)

    @property
    def has_validation(self) -> bool:
        """False when the validation split (or its selection) has no pair on any rank."""
        assert self.cache is not None
        return self.cache.counts()["validation"]["prediction_pairs"] > 0

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
                f"{self.cache_key}: resume with the same source, tokenizer, split and budget settings"
            )
        self._resume_state = state.get("train_sampler")
