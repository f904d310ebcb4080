"""The Lightning data module: the verified cache, the policy's samplers, and exact-resume state.

Each training item is one whole optimizer update (`train.accumulation` microbatches), so the loss can
be normalised by the update's token count before the first backward. Every item carries the sampler
state *after* it; the module records the state of the last update it actually trained, and that is
what a checkpoint saves. Lightning prefetches one item ahead, so the sampler's live state would be
one update too far: a resume from it would silently skip an update.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace

import lightning as L
from torch.utils.data import DataLoader, IterableDataset

from ..data.batch import PackedBatch
from ..data.cache import Cache, CacheSpec
from ..data.policies import PolicySettings
from ..data.prepare import prepare_cache
from ..data.samplers import Sampler, build_sampler
from ..errors import CheckpointError, ConfigError

STATE_FORMAT = 1


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
        self.val_sampler: Sampler | None = None
        self._trained_state: dict | None = None  # sampler state after the last trained update
        self._resume_state: dict | None = None  # from a checkpoint, applied when the sampler is built
        self._resume_validation: dict | None = None

    def prepare_data(self) -> None:
        # Local rank 0 builds or verifies; the other ranks verify in setup() (the file lock makes
        # them wait for a build). Kept so that this process does not hash the files twice.
        self.cache = prepare_cache(self.spec)

    def setup(self, stage: str | None = None) -> None:
        if self.cache is None:
            self.cache = prepare_cache(self.spec, progress=False)
        if self.train_sampler is None:
            self.train_sampler = self._sampler(self.cache, "train")
        if self.val_sampler is None:
            self.val_sampler = self._sampler(self.cache, "validation")

    def _sampler(self, cache: Cache, split: str) -> Sampler:
        rank, world = (self.trainer.global_rank, self.trainer.world_size) if self.trainer else (0, 1)
        return build_sampler(
            self.policy,
            cache.split(split),
            train=split == "train",
            rank=rank,
            world_size=world,
            packs_dir=cache.packs_dir,
        )

    def val_sampler_ready(self) -> Sampler:
        """The validation sampler, with the checkpoint's state applied once (its order is fixed, so
        this only re-checks that the validation settings did not change)."""
        assert self.val_sampler is not None, "setup() builds the samplers"
        if self._resume_validation is not None:
            self.val_sampler.load_state_dict(copy.deepcopy(self._resume_validation))
            self._resume_validation = None
        return self.val_sampler

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
        validation = self.val_sampler.state_dict() if self.val_sampler is not None else None
        return {
            "format": STATE_FORMAT,
            "cache_key": self.cache_key,
            "train_sampler": self._trained_state,
            "validation_sampler": validation,
        }

    def load_state_dict(self, state: dict) -> None:
        if state.get("cache_key") not in (None, self.cache_key):
            raise CheckpointError(
                f"the checkpoint was trained on cache {state.get('cache_key')}, this config gives "
                f"{self.cache_key}: resume with the same source, tokenizer, split and budget settings"
            )
        self._resume_state = state.get("train_sampler")
        self._resume_validation = state.get("validation_sampler")
