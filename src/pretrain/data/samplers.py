"""Resumable, rank-aware samplers: one per (policy, split, rank), yielding `PackedBatch`es.

Every rank builds the same global sequence of units (packs or padded rows) for an epoch from
(seed, epoch) alone, cuts it into global batches of `units_per_batch` units, and takes global
batches rank, rank + world_size, ...; the last `global_batches % world_size` batches are dropped so
every rank has the same count (`epoch_accounting` says exactly what was dropped). Since the epoch's
order is regenerated, the state is two integers (epoch, cursor) plus settings to check on resume.

Training shuffles per epoch (padded: documents; prepacked: packs; bestfit: the chunk order, then
packs online). Validation uses the fixed index order, the first `train.val_batches` batches per
rank, identical on every pass.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from .batch import IGNORE_INDEX, PackedBatch, gather_packed, gather_padded
from .policies import (
    Layout,
    PolicySettings,
    bestfit_layout,
    load_or_build_packs,
    padded_layout,
    split_chunks,
    split_fingerprint,
)
from .tokens import TokenSplit

STATE_VERSION = 1


@dataclass(frozen=True)
class EpochPlan:
    layout: Layout
    order: np.ndarray  # unit ids in epoch order
    units_per_batch: int
    global_batches: int  # batches the whole order makes (the last may be partial)
    batches: int  # batches per rank

    def units_of(self, global_index: int) -> np.ndarray:
        return self.order[global_index * self.units_per_batch : (global_index + 1) * self.units_per_batch]


class Sampler:
    """Base sampler; subclasses say which layout an epoch has, whether units are shuffled, and how
    a batch is gathered. Interface: iter / len / state_dict / load_state_dict (see module doc)."""

    policy = ""
    shuffle_units = True  # shuffle the units of a fixed layout per training epoch

    def __init__(
        self,
        split: TokenSplit,
        settings: PolicySettings,
        *,
        train: bool,
        rank: int = 0,
        world_size: int = 1,
        packs_dir: Path | None = None,
    ) -> None:
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
        if train and len(split) == 0:
            raise ValueError(f"the {split.name} split has no documents: nothing to train on")
        self.split = split
        self.settings = settings
        self.train = bool(train)
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.packs_dir = None if packs_dir is None else Path(packs_dir)
        self.capacity = settings.max_seq_len
        self.units_per_batch = settings.batch_size if train else settings.eval_batch_size
        self.table = split_chunks(split, settings.max_seq_len)
        self.epoch = 0
        self.cursor = 0
        self._generation = 0  # bumped by load_state_dict: a live iterator from before stops
        self._plans: dict[int, EpochPlan] = {}
        self._split_fingerprint = split_fingerprint(split)
        if self.train and len(self) == 0:
            raise ValueError(
                f"the {split.name} split makes {self._plan(0).global_batches} batches of {self.units_per_batch} "
                f"{'rows' if self.policy == 'padded' else 'packs'}, fewer than world_size={world_size}: "
                "lower train.batch_size (or train.microbatch_tokens) or use more data"
            )

    # --- what subclasses define ------------------------------------------------------------------

    def _layout(self, epoch: int) -> Layout:
        raise NotImplementedError

    def _gather(self, layout: Layout, items: np.ndarray, counts: np.ndarray) -> PackedBatch:
        starts, lengths = layout.start[items], layout.length[items]
        return gather_packed(self.split.tokens, starts, lengths, counts, self.capacity)

    def _settings_key(self) -> dict:
        """Settings a saved state depends on; a resume with different values is refused."""
        return {
            "policy": self.policy,
            "split": self.split.name,
            "train": self.train,
            "max_seq_len": self.capacity,
            "units_per_batch": self.units_per_batch,
            "seed": self.settings.seed if self.train else None,
            "val_batches": None if self.train else self.settings.val_batches,
            "split_fingerprint": self._split_fingerprint,
        }

    # --- the epoch plan --------------------------------------------------------------------------

    def _rng(self, epoch: int) -> np.random.Generator:
        return np.random.default_rng([self.settings.seed & (2**64 - 1), epoch])

    def _unit_order(self, epoch: int, units: int) -> np.ndarray:
        if self.train and self.shuffle_units:
            return self._rng(epoch).permutation(units)
        return np.arange(units, dtype=np.int64)

    def _plan(self, epoch: int) -> EpochPlan:
        key = epoch if self.train else 0  # validation is the same every pass
        plan = self._plans.get(key)
        if plan is None:
            layout = self._layout(key)
            global_batches = math.ceil(len(layout) / self.units_per_batch)
            batches = global_batches // self.world_size
            if not self.train and self.settings.val_batches is not None:
                batches = min(batches, self.settings.val_batches)
            plan = EpochPlan(layout, self._unit_order(key, len(layout)), self.units_per_batch, global_batches, batches)
            if len(self._plans) >= 2:
                self._plans.pop(next(iter(self._plans)))
            self._plans[key] = plan
        return plan

    def batch(self, epoch: int, index: int) -> PackedBatch:
        """This rank's batch `index` of `epoch` (pure: the state is not touched)."""
        plan = self._plan(epoch)
        if not 0 <= index < plan.batches:
            raise IndexError(f"batch {index} of an epoch of {plan.batches}")
        global_index = index * self.world_size + self.rank
        units = plan.units_of(global_index)
        items, counts = plan.layout.items_of(units)
        out = self._gather(plan.layout, items, counts)
        out.meta.update(
            policy=self.policy,
            epoch=epoch,
            index=index,
            global_index=global_index,
            rank=self.rank,
            packs=units,
            chunks=plan.layout.item_id[items],
        )
        return out

    def epoch_accounting(self, epoch: int | None = None) -> dict:
        """Units and items of `epoch` that no rank receives: the tail dropped to keep ranks equal
        (and, for validation, everything past `train.val_batches`)."""
        epoch = self.epoch if epoch is None else epoch
        plan = self._plan(epoch)
        served = plan.batches * self.world_size * self.units_per_batch
        dropped_units = plan.order[served:]
        items, _ = plan.layout.items_of(dropped_units)
        return {
            "units": len(plan.layout),
            "global_batches": plan.global_batches,
            "batches_per_rank": plan.batches,
            "dropped_units": dropped_units,
            "dropped_items": plan.layout.item_id[items],
            "dropped_tokens": int(plan.layout.length[items].sum()),
        }

    # --- the interface ---------------------------------------------------------------------------

    def __len__(self) -> int:
        """Batches of the current epoch for this rank (the same on every rank)."""
        return self._plan(self.epoch).batches

    def __iter__(self) -> Iterator[PackedBatch]:
        generation, epoch = self._generation, self.epoch
        batches = self._plan(epoch).batches
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
            raise ValueError(f"sampler state version {state.get('version')!r}, expected {STATE_VERSION}")
        saved, current = dict(state.get("settings", {})), self._settings_key()
        changed = {k: (saved.get(k), v) for k, v in current.items() if saved.get(k) != v}
        if changed:
            detail = ", ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in changed.items())
            raise ValueError(f"the sampler state was saved with other data settings ({detail}); resume with the same ones")
        epoch, cursor = int(state["epoch"]), int(state["cursor"])
        if epoch < 0 or cursor < 0:
            raise ValueError(f"bad sampler state: epoch={epoch}, cursor={cursor}")
        saved_world = int(state.get("world_size", self.world_size))
        if saved_world != self.world_size:  # same global position, never repeating a batch
            cursor = math.ceil(cursor * saved_world / self.world_size)
        if cursor >= self._plan(epoch).batches:
            epoch, cursor = epoch + 1, 0
        self.epoch, self.cursor = epoch, cursor
        self._generation += 1


class PaddedSampler(Sampler):
    """MiniMind baseline: one document per row (its first chunk), rows padded with targets -100 to
    max_seq_len (`data.pad_to=max`) or to the batch's longest row (`longest`)."""

    policy = "padded"

    def _layout(self, epoch: int) -> Layout:
        if not hasattr(self, "_padded"):
            self._padded = padded_layout(self.table)
        return self._padded

    def _gather(self, layout: Layout, items: np.ndarray, counts: np.ndarray) -> PackedBatch:
        lengths = layout.length[items]
        width = self.capacity if self.settings.pad_to == "max" else int(lengths.max())
        return gather_padded(self.split.tokens, layout.start[items], lengths, width)

    def _settings_key(self) -> dict:
        return {**super()._settings_key(), "pad_to": self.settings.pad_to}


class PrepackedSampler(Sampler):
    """Packs fixed ahead of time (`concat` windows or offline `bfd`), stored in `packs_dir`."""

    policy = "prepacked"

    def _layout(self, epoch: int) -> Layout:
        if not hasattr(self, "_packs"):
            self._packs = load_or_build_packs(self.split, self.table, self.settings.strategy, self.packs_dir)
        return self._packs

    def _gather(self, layout: Layout, items: np.ndarray, counts: np.ndarray) -> PackedBatch:
        out = super()._gather(layout, items, counts)
        if self.settings.strategy != "concat":
            return out
        lengths = layout.length[items]
        ends = layout.ends_document[items]
        if ends.any():  # the pair EOS -> next document's first token
            rows = torch.from_numpy((np.cumsum(lengths) - 1)[ends])
            if self.settings.document_mask:
                out.targets[rows] = IGNORE_INDEX
                out = replace(out, num_targets=out.num_targets - int(ends.sum()))
            else:
                first = self.split.offsets[layout.doc[items][ends] + 1]
                out.targets[rows] = torch.from_numpy(np.asarray(self.split.tokens[first], dtype=np.int64))
        if not self.settings.document_mask:  # one segment per window: later documents see earlier ones
            windows = out.pack_lengths.numpy()
            cu = np.zeros(len(windows) + 1, dtype=np.int64)
            np.cumsum(windows, out=cu[1:])
            positions = np.arange(int(cu[-1]), dtype=np.int64) - np.repeat(cu[:-1], windows)
            out = replace(
                out,
                cu_seqlens=torch.from_numpy(cu.astype(np.int32)),
                position_ids=torch.from_numpy(positions),
                max_seqlen=int(windows.max()) if len(windows) else 0,
            )
        return out

    def _settings_key(self) -> dict:
        key = {**super()._settings_key(), "strategy": self.settings.strategy}
        if self.settings.strategy == "concat":
            key["document_mask"] = self.settings.document_mask
        return key


class BestFitSampler(Sampler):
    """Each training epoch: a seeded shuffle of the chunks, packed online by best fit from a bounded
    candidate buffer (`train.packing_buffer`). Validation packs the chunks in index order."""

    policy = "bestfit"
    shuffle_units = False  # the chunk order is shuffled before packing; packs keep their order

    def _layout(self, epoch: int) -> Layout:
        chunks = len(self.table)
        order = self._rng(epoch).permutation(chunks) if self.train else np.arange(chunks, dtype=np.int64)
        return bestfit_layout(self.table, order, self.settings.packing_buffer)

    def _settings_key(self) -> dict:
        return {**super()._settings_key(), "packing_buffer": self.settings.packing_buffer}


SAMPLERS: dict[str, type[Sampler]] = {
    "padded": PaddedSampler,
    "prepacked": PrepackedSampler,
    "bestfit": BestFitSampler,
}


def build_sampler(
    cfg,
    split: TokenSplit,
    *,
    train: bool,
    rank: int = 0,
    world_size: int = 1,
    packs_dir: Path | None = None,
) -> Sampler:
    """The sampler of `cfg.data.policy` for one split and rank (cfg: the composed root config)."""
    settings = cfg if isinstance(cfg, PolicySettings) else PolicySettings.from_cfg(cfg)
    return SAMPLERS[settings.policy](split, settings, train=train, rank=rank, world_size=world_size, packs_dir=packs_dir)
