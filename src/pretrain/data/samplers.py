"""The generic, resumable, rank-aware training sampler: one per (policy, split, rank), yielding
`PackedBatch`es. What an epoch's units are and how a batch of them is gathered is the policy's
(data/policies/); everything else is here and the same for every policy.

Every rank builds the same global sequence of units (packs or padded rows) for an epoch from
(seed, epoch) alone, cuts it into global batches of `batch_size` units, and takes global
batches rank, rank + world_size, ...; the last `global_batches % world_size` batches are dropped so
every rank has the same count (`epoch_accounting` says exactly what was dropped). The policy's
`unit_order` may group the order into whole optimizer updates (`update_units` consecutive units,
vsl: each of one bucket) and leave out units that make none; its plan then serves a whole number
of updates per rank. Since the epoch's order is regenerated, the state is two integers (epoch,
cursor) plus settings to check on resume.

With a mixture (data/mixture.py) the split is the components' splits read as one, and each epoch's
chunk table is the mixture's plan of that epoch (its chunks in their interleaved order) instead of
every chunk of the split; the mixture joins the settings a resume checks, and each batch's `meta`
says how many real tokens of each component it holds (`component_tokens`).

Validation is not a sampler's job: its pairs are the same for every policy (evaluation.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from .batch import PackedBatch
from .chunking import ChunkTable
from .mixture import Mixture, MixturePlan
from .policies import EpochPlan, Layout, PolicySettings, split_chunks, split_fingerprint
from .tokens import TokenSplit

STATE_VERSION = 2  # 2: settings named by their config keys (renamed keys are mapped by the policy)

__all__ = ["STATE_VERSION", "EpochPlan", "Sampler", "build_sampler"]


class Sampler:
    """The training sampler of one policy, split and rank. Interface: iter / len / state_dict /
    load_state_dict (see module doc); `plan(epoch)` and `batch(epoch, index)` are pure."""

    def __init__(
        self,
        split: TokenSplit,
        settings: PolicySettings,
        *,
        rank: int = 0,
        world_size: int = 1,
        packs_dir: Path | None = None,
        mixture: Mixture | None = None,
    ) -> None:
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
        if len(split) == 0:
            raise ConfigError(f"the {split.name} split has no documents: nothing to train on")
        self.split = split
        self.settings = settings
        self.policy = settings.data_policy
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.packs_dir = None if packs_dir is None else Path(packs_dir)
        self.max_seq_len = settings.max_seq_len
        self.batch_size = settings.batch_size  # units per batch
        self.table = split_chunks(split, settings.max_seq_len)
        self.mixture = mixture
        self.mixture_plan = (
            None
            if mixture is None
            else MixturePlan(mixture, self.table, self.policy.trained_chunks(self.table), settings.seed)
        )
        self.epoch = 0
        self.cursor = 0
        self._generation = 0  # bumped by load_state_dict: a live iterator from before stops
        self._plans: dict[int, EpochPlan] = {}
        self._fixed_layout: Layout | None = None  # a policy whose layout is the same every epoch
        self._split_fingerprint = split_fingerprint(split)
        if len(self) == 0 and self.policy.whole_updates:
            raise ConfigError(
                f"the {split.name} split fills no whole update from one length bucket ({self.update_units} "
                f"{self.policy.unit_name} of {self.max_seq_len} tokens: train.batch_size x "
                f"train.accumulation x world_size={world_size}): lower train.batch_size or "
                "train.accumulation, or use more data"
            )
        if len(self) == 0:
            raise ConfigError(
                f"the {split.name} split makes {self.plan(0).global_batches} batches of {self.batch_size} "
                f"{self.policy.unit_name}, fewer than world_size={world_size}: "
                "lower train.batch_size (or train.microbatch_tokens) or use more data"
            )

    # --- resume ------------------------------------------------------------------------------------

    def policy_settings(self) -> dict:
        """The policy's own knobs, by config key (`inspect-data` reports them; a resume checks them)."""
        return self.policy.resume_key()

    def _settings_key(self) -> dict:
        """Settings a saved state depends on, by config key; a resume with other values is refused."""
        return {
            "data.policy": str(self.policy.name),
            "split": self.split.name,
            "data.max_seq_len": self.max_seq_len,
            "train.batch_size": self.batch_size,
            "seed": self.settings.seed,
            **self.policy_settings(),
            **self._update_key(),
            **({} if self.mixture is None else {"mixture": self.mixture.key}),
            "split_fingerprint": self._split_fingerprint,
        }

    def _update_key(self) -> dict:
        """What a plan of whole updates (vsl) also depends on: another value regroups every update."""
        if not self.policy.whole_updates:
            return {}
        return {"train.accumulation": self.settings.accumulation, "world_size": self.world_size}

    # --- the epoch plan --------------------------------------------------------------------------

    def _rng(self, epoch: int) -> np.random.Generator:
        return np.random.default_rng([self.settings.seed & (2**64 - 1), epoch])

    def epoch_table(self, epoch: int) -> ChunkTable:
        """The chunks `epoch` lays out: every chunk of the split, or the mixture's plan of the epoch."""
        return self.table if self.mixture_plan is None else self.mixture_plan.epoch(epoch).table

    def _layout(self, epoch: int) -> Layout:
        fixed = self.policy.fixed_layout and self.mixture_plan is None  # a mixture plans every epoch
        if fixed and self._fixed_layout is not None:
            return self._fixed_layout
        layout = self.policy.layout(self.split, self.epoch_table(epoch), self._rng(epoch), self.packs_dir)
        if fixed:
            self._fixed_layout = layout
        return layout

    @property
    def update_units(self) -> int:
        """Consecutive units of an epoch's order that make one optimizer update over all ranks: rank r's
        update u is global batches (u x accumulation + j) x world_size + r, j < accumulation."""
        return self.batch_size * self.settings.accumulation * self.world_size

    def plan(self, epoch: int) -> EpochPlan:
        """The units of `epoch` in order and how they are batched."""
        plan = self._plans.get(epoch)
        if plan is None:
            layout = self._layout(epoch)
            order = self.policy.unit_order(layout, self._rng(epoch), self.update_units)
            units = len(layout) if order is None else len(order)
            global_batches = math.ceil(units / self.batch_size)
            batches = global_batches // self.world_size
            plan = EpochPlan(layout, order, self.batch_size, global_batches, batches)
            if len(self._plans) >= 2:
                self._plans.pop(next(iter(self._plans)))
            self._plans[epoch] = plan
        return plan

    def batch(self, epoch: int, index: int) -> PackedBatch:
        """This rank's batch `index` of `epoch` (pure: the state is not touched)."""
        plan = self.plan(epoch)
        if not 0 <= index < plan.batches:
            raise IndexError(f"batch {index} of an epoch of {plan.batches}")
        global_index = index * self.world_size + self.rank
        units = plan.units_of(global_index)
        items, counts = plan.layout.items_of(units)
        out = self.policy.gather(self.split, plan.layout, items, counts)
        out.meta.update(
            policy=str(self.policy.name),
            epoch=epoch,
            index=index,
            global_index=global_index,
            rank=self.rank,
            packs=units,
            chunks=plan.layout.ids(items),
        )
        if self.mixture is not None:  # each item's component, and the real tokens of each component
            components = self.mixture.component_of(plan.layout.starts(items))
            out.meta["components"] = components
            out.meta["component_tokens"] = np.bincount(
                components, weights=plan.layout.lengths(items), minlength=len(self.mixture)
            ).astype(np.int64)
        return out

    def epoch_accounting(self, epoch: int | None = None) -> dict:
        """Units and items of `epoch` that no rank receives: the tail dropped to keep ranks equal."""
        epoch = self.epoch if epoch is None else epoch
        plan = self.plan(epoch)
        served = plan.batches * self.world_size * self.batch_size
        dropped_units = np.concatenate([plan.ordered(served), plan.unordered()])
        items, _ = plan.layout.items_of(dropped_units)
        return {
            "units": len(plan.layout),
            "global_batches": plan.global_batches,
            "batches_per_rank": plan.batches,
            "dropped_units": dropped_units,
            "dropped_items": plan.layout.ids(items),
            "dropped_tokens": int(plan.layout.lengths(items).sum()),
        }

    # --- the interface ---------------------------------------------------------------------------

    def __len__(self) -> int:
        """Batches of the current epoch for this rank (the same on every rank)."""
        return self.plan(self.epoch).batches

    def __iter__(self) -> Iterator[PackedBatch]:
        generation, epoch = self._generation, self.epoch
        batches = self.plan(epoch).batches
        while self._generation == generation and self.epoch == epoch and self.cursor < batches:
            index = self.cursor
            out = self.batch(epoch, index)
            if index + 1 >= batches:
                self.epoch, self.cursor = epoch + 1, 0
            else:
                self.cursor = index + 1
            yield out

    def state_dict(self) -> dict:
        return {
            "version": STATE_VERSION,
            "epoch": int(self.epoch),
            "cursor": int(self.cursor),
            "rank": self.rank,
            "world_size": self.world_size,
            "settings": self._settings_key(),
        }

    def load_state_dict(self, state: dict) -> None:
        if int(state.get("version", -1)) != STATE_VERSION:
            raise ConfigError(
                f"sampler state version {state.get('version')!r}, expected {STATE_VERSION}: the checkpoint "
                "was written by another version of pretrain; start a new run (ckpt_path=null)"
            )
        saved = {
            self.policy.renamed_settings.get(k, k): v for k, v in dict(state.get("settings", {})).items()
        }
        current = self._settings_key()
        # Both ways: an option named only when set (data.long_docs, data.document_mask) may be in either.
        changed = {
            k: (saved.get(k), current.get(k)) for k in {**current, **saved} if saved.get(k) != current.get(k)
        }
        if changed:
            detail = ", ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in changed.items())
            raise ConfigError(
                f"the sampler state was saved with other data settings ({detail}); resume with the same ones"
            )
        epoch, cursor = int(state["epoch"]), int(state["cursor"])
        if epoch < 0 or cursor < 0:
            raise ConfigError(f"bad sampler state: epoch={epoch}, cursor={cursor}")
        saved_world = int(state.get("world_size", self.world_size))
        if saved_world != self.world_size:  # same global position, never repeating a batch
            cursor = math.ceil(cursor * saved_world / self.world_size)
        if cursor >= self.plan(epoch).batches:
            epoch, cursor = epoch + 1, 0
        self.epoch, self.cursor = epoch, cursor
        self._generation += 1


def build_sampler(
    settings: PolicySettings,
    split: TokenSplit,
    *,
    rank: int = 0,
    world_size: int = 1,
    packs_dir: Path | None = None,
    mixture: Mixture | None = None,
) -> Sampler:
    """The training sampler of `settings` (its policy) for one split (a mixture's mixed split) and rank."""
    return Sampler(split, settings, rank=rank, world_size=world_size, packs_dir=packs_dir, mixture=mixture)
