"""The generic, resumable, rank-aware training sampler: one per (policy, split, rank), yielding
`PackedBatch`es. What an epoch's units are and how a batch of them is gathered is the policy's
(data/batching/policies/); everything else is here and the same for every policy.

Every rank builds the same global sequence of units (packs or padded rows) for an epoch from
(seed, epoch) alone, cuts it into global batches of `batch_size` units, and takes global
batches rank, rank + world_size, ...; the last `global_batches % world_size` batches are dropped so
every rank has the same count (`epoch_accounting` says exactly what was dropped). The policy's
`unit_order` may group the order into whole optimizer updates (`update_units` consecutive units,
vsl: each of one bucket) and leave out units that make none; its plan then serves a whole number
of updates per rank.

Resume is elastic: the state is a global position, (epoch, units of the epoch's order consumed), plus
the settings the order depends on (seed, policy, its layout options, max_seq_len, the split). The
world size and train.batch_size are not among them: a sampler resumed at position p cuts the rest of
the epoch into global batches [p + g x batch_size, p + (g + 1) x batch_size) and rank r takes g = r,
r + world_size, ... (held as p = offset + cursor x world_size x batch_size with offset < world_size x
batch_size, so a resume with unchanged sizes is the uninterrupted run batch for batch). The epoch-end
tail rule applies to the rest: the batches that do not fill a whole round of world_size are dropped.
vsl's order itself depends on the update size: a resumed epoch keeps the update size it was planned
with, which the new one must divide (every new update then lies inside one planned update, so in one
bucket); the next epoch is planned with the new size. A state of version 2 (a rank cursor and its
world size) is read as position cursor x world_size x train.batch_size and update size batch_size x
accumulation x world_size, its own sizes: exact, since its cursor counted whole rounds of them.

With a mixture (data/batching/mixture.py) the split is the components' splits read as one, and each epoch's
chunk table is the mixture's plan of that epoch (its chunks in their interleaved order) instead of
every chunk of the split; the mixture joins the settings a resume checks, and each batch's `meta`
says how many real tokens of each component it holds (`component_tokens`).

Validation is not a sampler's job: its pairs are the same for every policy (evaluation.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import ConfigError
from ..tokens import TokenSplit
from .batch import PackedBatch
from .chunking import ChunkTable
from .exchanges import ExchangeCuts, whole_exchanges
from .mixture import Mixture, MixturePlan
from .policies import EpochPlan, Layout, PolicySettings, split_chunks, split_fingerprint

# 3: a global position (epoch, units); 2: a rank cursor and the world size (read: see the module doc)
STATE_VERSION = 3
# Settings a version-2 state checked that a global position no longer depends on.
SIZES_OF_VERSION_2 = ("train.batch_size", "train.accumulation", "world_size")

__all__ = ["STATE_VERSION", "EpochPlan", "Sampler", "build_sampler", "check_resume"]


class Sampler:
    """The training sampler of one policy, split and rank. Interface: iter / len / state_dict /
    load_state_dict (see module doc); `plan(epoch)` and `batch(epoch, index)` never change the state."""

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
        self.exchange_cuts: ExchangeCuts | None = None
        if split.loss_mask is not None and settings.data_policy.truncates:  # conversations: whole exchanges
            split, self.exchange_cuts = whole_exchanges(split, settings.max_seq_len)
            if len(split) == 0:
                raise ConfigError(
                    f"no conversation of the {split.name} split has a whole first exchange within "
                    f"data.max_seq_len={settings.max_seq_len}: raise it, or set data.long_docs=chunk"
                )
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
        self.cursor = 0  # this rank's batches of the epoch served (counted from `offset`)
        self.offset = 0  # global units of the epoch before batch 0 (below world_size x batch_size)
        self._planned_update_units: tuple[int, int] | None = None  # (epoch, size) a resumed vsl epoch keeps
        self._generation = 0  # bumped by load_state_dict: a live iterator from before stops
        self._plans: dict[tuple[int, int], EpochPlan] = {}  # by (epoch, update size)
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
        """Settings an epoch's order depends on, by config key, the split's included; a resume with
        other values is refused."""
        return {
            **order_key(self.settings),
            "split": self.split.name,
            **({} if self.mixture is None else {"mixture": self.mixture.key}),
            "split_fingerprint": self._split_fingerprint,
        }

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

    def planned_update_units(self, epoch: int) -> int:
        """The update size `epoch`'s order is grouped by: today's, or the saved one of a resumed epoch."""
        kept = self._planned_update_units
        return kept[1] if kept is not None and kept[0] == epoch else self.update_units

    @property
    def round_units(self) -> int:
        """Units of one batch on every rank: the step between a rank's consecutive batches."""
        return self.batch_size * self.world_size

    def plan(self, epoch: int) -> EpochPlan:
        """The units of `epoch` in order and how they are batched (from the epoch's start)."""
        update_units = self.planned_update_units(epoch)
        plan = self._plans.get((epoch, update_units))
        if plan is None:
            layout = self._layout(epoch)
            order = self.policy.unit_order(layout, self._rng(epoch), update_units)
            units = len(layout) if order is None else len(order)
            global_batches = math.ceil(units / self.batch_size)
            batches = global_batches // self.world_size
            plan = EpochPlan(layout, order, self.batch_size, global_batches, batches)
            if len(self._plans) >= 2:
                self._plans.pop(next(iter(self._plans)))
            self._plans[(epoch, update_units)] = plan
        return plan

    def _offset(self, epoch: int) -> int:
        return self.offset if epoch == self.epoch else 0

    def batches(self, epoch: int) -> int:
        """This rank's batches of `epoch`, counted from its offset (a resumed epoch's may differ)."""
        plan, offset = self.plan(epoch), self._offset(epoch)
        if offset == 0:
            return plan.batches
        return math.ceil(max(0, plan.ordered_units - offset) / self.batch_size) // self.world_size

    def batch(self, epoch: int, index: int) -> PackedBatch:
        """This rank's batch `index` of `epoch`, counted from the epoch's offset (the state is untouched)."""
        plan, batches, offset = self.plan(epoch), self.batches(epoch), self._offset(epoch)
        if not 0 <= index < batches:
            raise IndexError(f"batch {index} of an epoch of {batches}")
        global_index = index * self.world_size + self.rank
        first = offset + global_index * self.batch_size
        units = plan.ordered(first, first + self.batch_size)
        items, counts = plan.layout.items_of(units)
        out = self.policy.gather(self.split, plan.layout, items, counts)
        out.meta.update(
            policy=str(self.policy.name),
            epoch=epoch,
            index=index,
            global_index=global_index,
            position=first,  # of its first unit in the epoch's order, whatever the sizes
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
        """Units and items of `epoch` that no rank receives: the tail dropped to keep ranks equal (of a
        resumed epoch: the tail of its rest, as this world size and batch size cut it)."""
        epoch = self.epoch if epoch is None else epoch
        plan, batches = self.plan(epoch), self.batches(epoch)
        served = self._offset(epoch) + batches * self.round_units
        dropped_units = np.concatenate([plan.ordered(served), plan.unordered()])
        items, _ = plan.layout.items_of(dropped_units)
        return {
            "units": len(plan.layout),
            "global_batches": plan.global_batches,
            "batches_per_rank": batches,
            "dropped_units": dropped_units,
            "dropped_items": plan.layout.ids(items),
            "dropped_tokens": int(plan.layout.lengths(items).sum()),
        }

    # --- the interface ---------------------------------------------------------------------------

    def __len__(self) -> int:
        """Batches of the current epoch for this rank (the same on every rank)."""
        return self.batches(self.epoch)

    def __iter__(self) -> Iterator[PackedBatch]:
        generation, epoch = self._generation, self.epoch
        batches = self.batches(epoch)
        while self._generation == generation and self.epoch == epoch and self.cursor < batches:
            index = self.cursor
            out = self.batch(epoch, index)
            if index + 1 >= batches:
                self._start_epoch(epoch + 1)
            else:
                self.cursor = index + 1
            yield out

    def _start_epoch(self, epoch: int) -> None:
        self.epoch, self.offset, self.cursor = epoch, 0, 0

    @property
    def position(self) -> int:
        """Units of the current epoch's order consumed by all ranks together."""
        return self.offset + self.cursor * self.round_units

    def state_dict(self) -> dict:
        state = {
            "version": STATE_VERSION,
            "epoch": int(self.epoch),
            "units": int(self.position),
            "settings": self._settings_key(),
            # Who wrote it (not checked on load): the sizes that cut the order into batches.
            "rank": self.rank,
            "world_size": self.world_size,
            "batch_size": self.batch_size,
        }
        if self.policy.whole_updates:
            state["update_units"] = self.planned_update_units(self.epoch)
        return state

    def load_state_dict(self, state: dict) -> None:
        saved = read_state(state, self.settings, self._settings_key())
        self._planned_update_units = None
        planned = saved.update_units
        if self.policy.whole_updates and saved.units > 0 and planned not in (None, self.update_units):
            check_update_size(self.settings, self.world_size, saved)
            self._planned_update_units = (saved.epoch, int(planned))
        self.epoch = saved.epoch
        self.offset, self.cursor = saved.units % self.round_units, saved.units // self.round_units
        if self.cursor >= self.batches(saved.epoch):  # what is left makes no whole round: the dropped tail
            self._start_epoch(saved.epoch + 1)
        self._generation += 1


# --- saved states, checked by the sampler and, before any rank starts, by the run (check_resume) ------


@dataclass(frozen=True)
class SavedPosition:
    epoch: int
    units: int  # of the epoch's order, consumed by all ranks together
    update_units: int | None  # the update size the epoch's order was planned with (whole-update policies)


def order_key(settings: PolicySettings) -> dict:
    """Settings an epoch's order depends on, by config key, but for the split. Sizes (world size,
    train.batch_size, train.accumulation) only cut the order into batches."""
    policy = settings.data_policy
    return {
        "data.policy": str(policy.name),
        "data.max_seq_len": settings.max_seq_len,
        "seed": settings.seed,
        **policy.resume_key(),
    }


def read_state(
    state: dict, settings: PolicySettings, current: dict, ignore: tuple[str, ...] = ()
) -> SavedPosition:
    """The position of a saved sampler state, refused in one line when it was saved with settings
    other than `current` (keys in `ignore` are not compared) or by another state version."""
    version = int(state.get("version", -1))
    if version not in (2, STATE_VERSION):
        raise ConfigError(
            f"sampler state version {state.get('version')!r}, expected {STATE_VERSION}: the checkpoint "
            "was written by another version of pretrain; start a new run (ckpt_path=null)"
        )
    saved = dict(state.get("settings", {}))
    position = _position(state, saved, settings)
    for key in (*SIZES_OF_VERSION_2, *ignore):
        saved.pop(key, None)
    # Both ways: an option named only when set (data.long_docs, data.document_mask) may be in either.
    changed = {
        k: (saved.get(k), current.get(k))
        for k in {**current, **saved}
        if k not in ignore and saved.get(k) != current.get(k)
    }
    if changed:
        detail = ", ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in changed.items())
        raise ConfigError(
            f"the sampler state was saved with other data settings ({detail}), which plan another data "
            "order, so the resume could not continue it exactly; resume with the same ones (the number "
            "of ranks and train.batch_size may change)"
        )
    if position.epoch < 0 or position.units < 0 or (position.update_units or 1) < 1:
        raise ConfigError(f"bad sampler state: {position}")
    return position


def _position(state: dict, saved: dict, settings: PolicySettings) -> SavedPosition:
    """Version 3 saved the position; version 2 a rank cursor, which counted whole rounds of its world
    size x its train.batch_size (its updates: x its train.accumulation)."""
    if int(state["version"]) == STATE_VERSION:
        update_units = state.get("update_units")
        return SavedPosition(
            int(state["epoch"]), int(state["units"]), None if update_units is None else int(update_units)
        )
    world = int(state["world_size"])
    batch_size = int(saved.get("train.batch_size", settings.batch_size))
    accumulation = int(saved.get("train.accumulation", settings.accumulation))
    return SavedPosition(
        int(state["epoch"]), int(state["cursor"]) * world * batch_size, batch_size * accumulation * world
    )


def check_update_size(settings: PolicySettings, world_size: int, saved: SavedPosition) -> None:
    """A whole-update epoch (vsl) resumed mid-way keeps its planned update size: the new one must divide
    it, so that each new update lies inside one planned update (one bucket)."""
    policy, planned = settings.data_policy, saved.update_units
    new = settings.batch_size * settings.accumulation * world_size
    if not policy.whole_updates or saved.units == 0 or planned is None or planned % new == 0:
        return
    raise ConfigError(
        f"data={policy.name} groups each update from one length bucket: the checkpoint's epoch "
        f"{saved.epoch} was planned for updates of {planned} {policy.unit_name}, and this run's "
        f"({new}: train.batch_size={settings.batch_size} x train.accumulation={settings.accumulation} x "
        f"world size {world_size}) does not divide it; resume with the same trainer.devices x "
        f"trainer.num_nodes x train.batch_size x train.accumulation (or a product dividing {planned})"
    )


def check_resume(state: dict, settings: PolicySettings, world_size: int | None) -> None:
    """What a sampler would refuse of `state`, checked once before any rank starts (the split's
    identity is the cache key's, checked beside it); `world_size` None: not known yet, not checked."""
    # The split's identity and a mixture's are the checkpoint's cache key, compared beside this.
    saved = read_state(state, settings, order_key(settings), ignore=("split", "split_fingerprint", "mixture"))
    if world_size is not None:
        check_update_size(settings, world_size, saved)


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
