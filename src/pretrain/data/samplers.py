"""Resumable, rank-aware training samplers: one per (policy, split, rank), yielding `PackedBatch`es.

Every rank builds the same global sequence of units (packs or padded rows) for an epoch from
(seed, epoch) alone, cuts it into global batches of `batch_size` units, and takes global
batches rank, rank + world_size, ...; the last `global_batches % world_size` batches are dropped so
every rank has the same count (`epoch_accounting` says exactly what was dropped). Since the epoch's
order is regenerated, the state is two integers (epoch, cursor) plus settings to check on resume.

Each epoch is shuffled (padded: documents; prepacked: packs; bestfit: the chunk order, then packs
online). Validation is not a sampler's job: its pairs are the same for every policy (evaluation.py).

Each policy also owns what its batches cost: `segment_lengths`, `computed_rows`, `slots`,
`truncated_pairs` and `cross_document_visible_fraction` of an epoch plan (what `inspect-data` reports).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from ..arrays import prefix_sums, run_positions
from ..errors import ConfigError
from .batch import IGNORE_INDEX, PackedBatch, gather_packed, gather_padded
from .policies import (
    Layout,
    PolicySettings,
    bestfit_layout,
    load_or_build_packs,
    padded_layout,
    shuffled,
    split_chunks,
    split_fingerprint,
)
from .tokens import TokenSplit

STATE_VERSION = 2  # 2: settings named by their config keys


@dataclass(frozen=True)
class EpochPlan:
    """An epoch as arrays only: the layout (index arrays into the sampler's chunk table) and the
    unit order (None: the units in layout order, as bestfit serves them)."""

    layout: Layout
    order: np.ndarray | None  # unit ids in epoch order (int32 when they fit); None: 0, 1, 2, ...
    batch_size: int  # units per batch
    global_batches: int  # batches the whole order makes (the last may be partial)
    batches: int  # batches per rank

    def ordered(self, first: int = 0, stop: int | None = None) -> np.ndarray:
        """Unit ids at epoch positions first..stop-1 (int64)."""
        stop = len(self.layout) if stop is None else min(stop, len(self.layout))
        if self.order is None:
            return np.arange(first, max(first, stop), dtype=np.int64)
        return self.order[first:stop].astype(np.int64)

    def units_of(self, global_index: int) -> np.ndarray:
        return self.ordered(global_index * self.batch_size, (global_index + 1) * self.batch_size)

    @property
    def real_tokens(self) -> int:
        return self.layout.real_tokens

    @property
    def nbytes(self) -> int:
        """Bytes of this plan's own arrays (layout and order; the chunk table is the sampler's)."""
        return self.layout.nbytes + (0 if self.order is None else self.order.nbytes)


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
        rank: int = 0,
        world_size: int = 1,
        packs_dir: Path | None = None,
    ) -> None:
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
        if len(split) == 0:
            raise ConfigError(f"the {split.name} split has no documents: nothing to train on")
        self.split = split
        self.settings = settings
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.packs_dir = None if packs_dir is None else Path(packs_dir)
        self.max_seq_len = settings.max_seq_len
        self.batch_size = settings.batch_size  # units per batch
        self.table = split_chunks(split, settings.max_seq_len)
        self.epoch = 0
        self.cursor = 0
        self._generation = 0  # bumped by load_state_dict: a live iterator from before stops
        self._plans: dict[int, EpochPlan] = {}
        self._split_fingerprint = split_fingerprint(split)
        if len(self) == 0:
            raise ConfigError(
                f"the {split.name} split makes {self.plan(0).global_batches} batches of {self.batch_size} "
                f"{'rows' if self.policy == 'padded' else 'packs'}, fewer than world_size={world_size}: "
                "lower train.batch_size (or train.microbatch_tokens) or use more data"
            )

    # --- what subclasses define ------------------------------------------------------------------

    def _layout(self, epoch: int) -> Layout:
        raise NotImplementedError

    def _gather(self, layout: Layout, items: np.ndarray, counts: np.ndarray) -> PackedBatch:
        starts, lengths = layout.starts(items), layout.lengths(items)
        return gather_packed(self.split.tokens, starts, lengths, counts, self.max_seq_len)

    def policy_settings(self) -> dict:
        """This policy's own knobs, by config key (`inspect-data` reports them; a resume checks them)."""
        return {}

    # --- what an epoch costs (inspect-data) --------------------------------------------------------

    def segment_lengths(self, plan: EpochPlan) -> np.ndarray:
        """Lengths of the sequences attention runs over (one per cu_seqlens segment)."""
        return plan.layout.length

    def computed_rows(self, plan: EpochPlan) -> int:
        """Rows the model computes for the epoch: packed policies compute only real tokens."""
        return plan.real_tokens

    def slots(self, plan: EpochPlan) -> int:
        """Token slots the epoch's units offer: packs x max_seq_len."""
        return len(plan.layout) * self.max_seq_len

    def truncated_pairs(self, plan: EpochPlan) -> int:
        """Prediction pairs of the split that no batch holds."""
        return 0

    def cross_document_visible_fraction(self, plan: EpochPlan) -> float:
        """Share of real tokens whose attention can see an earlier document."""
        return 0.0

    # --- resume ------------------------------------------------------------------------------------

    def _settings_key(self) -> dict:
        """Settings a saved state depends on, by config key; a resume with other values is refused."""
        return {
            "data.policy": self.policy,
            "split": self.split.name,
            "data.max_seq_len": self.max_seq_len,
            "train.batch_size": self.batch_size,
            "seed": self.settings.seed,
            **self.policy_settings(),
            "split_fingerprint": self._split_fingerprint,
        }

    # --- the epoch plan --------------------------------------------------------------------------

    def _rng(self, epoch: int) -> np.random.Generator:
        return np.random.default_rng([self.settings.seed & (2**64 - 1), epoch])

    def _unit_order(self, epoch: int, units: int) -> np.ndarray | None:
        return shuffled(self._rng(epoch), units) if self.shuffle_units else None

    def plan(self, epoch: int) -> EpochPlan:
        """The units of `epoch` in order and how they are batched."""
        plan = self._plans.get(epoch)
        if plan is None:
            layout = self._layout(epoch)
            global_batches = math.ceil(len(layout) / self.batch_size)
            batches = global_batches // self.world_size
            plan = EpochPlan(
                layout, self._unit_order(epoch, len(layout)), self.batch_size, global_batches, batches
            )
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
        out = self._gather(plan.layout, items, counts)
        out.meta.update(
            policy=self.policy,
            epoch=epoch,
            index=index,
            global_index=global_index,
            rank=self.rank,
            packs=units,
            chunks=plan.layout.ids(items),
        )
        return out

    def epoch_accounting(self, epoch: int | None = None) -> dict:
        """Units and items of `epoch` that no rank receives: the tail dropped to keep ranks equal."""
        epoch = self.epoch if epoch is None else epoch
        plan = self.plan(epoch)
        served = plan.batches * self.world_size * self.batch_size
        dropped_units = plan.ordered(served)
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
        saved, current = dict(state.get("settings", {})), self._settings_key()
        changed = {k: (saved.get(k), v) for k, v in current.items() if saved.get(k) != v}
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


class PaddedSampler(Sampler):
    """MiniMind baseline: one document per row (its first chunk), rows padded with targets -100 to
    max_seq_len (`data.pad_to=max`) or to the batch's longest row (`longest`)."""

    policy = "padded"

    def _layout(self, epoch: int) -> Layout:
        if not hasattr(self, "_padded"):
            self._padded = padded_layout(self.table)
        return self._padded

    def _gather(self, layout: Layout, items: np.ndarray, counts: np.ndarray) -> PackedBatch:
        lengths = layout.lengths(items)
        width = self.max_seq_len if self.settings.pad_to == "max" else int(lengths.max())
        return gather_padded(self.split.tokens, layout.starts(items), lengths, width)

    def policy_settings(self) -> dict:
        return {"data.pad_to": self.settings.pad_to}

    def computed_rows(self, plan: EpochPlan) -> int:
        """Every row is computed at its padded width: max_seq_len, or its batch's longest row."""
        rows = len(plan.layout)
        if self.settings.pad_to == "max":
            return rows * self.max_seq_len
        ordered = plan.layout.unit_tokens[plan.ordered()]
        heads = np.arange(0, rows, plan.batch_size)
        return (
            int((np.maximum.reduceat(ordered, heads) * np.diff(np.append(heads, rows))).sum()) if rows else 0
        )

    def slots(self, plan: EpochPlan) -> int:
        return self.computed_rows(plan)  # a padded row holds its padded width

    def truncated_pairs(self, plan: EpochPlan) -> int:
        return self.split.num_pairs - plan.real_tokens


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
        lengths = layout.lengths(items)
        assert layout.ends_document is not None  # concat windows mark them
        ends = layout.ends_document[items]
        if ends.any():  # the pair EOS -> next document's first token
            rows = torch.from_numpy((np.cumsum(lengths) - 1)[ends])
            if self.settings.document_mask:
                out.targets[rows] = IGNORE_INDEX
                out = replace(out, num_targets=out.num_targets - int(ends.sum()))
            else:
                first = self.split.offsets[layout.docs(items[ends]) + 1]
                out.targets[rows] = torch.from_numpy(np.asarray(self.split.tokens[first], dtype=np.int64))
        if not self.settings.document_mask:  # one segment per window: later documents see earlier ones
            windows = out.pack_lengths.numpy()
            out = replace(
                out,
                cu_seqlens=torch.from_numpy(prefix_sums(windows).astype(np.int32)),
                position_ids=torch.from_numpy(run_positions(windows)),
                max_seqlen=int(windows.max()) if len(windows) else 0,
            )
        return out

    def _windows_unmasked(self) -> bool:
        return self.settings.strategy == "concat" and not self.settings.document_mask

    def policy_settings(self) -> dict:
        key: dict[str, str | bool] = {"data.strategy": self.settings.strategy}
        if self.settings.strategy == "concat":
            key["data.document_mask"] = self.settings.document_mask
        return key

    def segment_lengths(self, plan: EpochPlan) -> np.ndarray:
        """concat windows without the document mask are one segment each; otherwise their pieces."""
        return plan.layout.unit_tokens if self._windows_unmasked() else plan.layout.length

    def cross_document_visible_fraction(self, plan: EpochPlan) -> float:
        """Without the document mask, every token of a window after its first piece sees another document."""
        layout = plan.layout
        unit_tokens = layout.unit_tokens
        real = int(unit_tokens.sum())
        if not self._windows_unmasked() or not real:
            return 0.0
        first_piece = layout.lengths(layout.ptr[:-1][np.diff(layout.ptr) > 0])
        return float((unit_tokens[unit_tokens > 0] - first_piece).sum() / real)


class BestFitSampler(Sampler):
    """Each training epoch: a seeded shuffle of the chunks, packed online by best fit from a bounded
    candidate buffer (`train.packing_buffer`)."""

    policy = "bestfit"
    shuffle_units = False  # the chunk order is shuffled before packing; packs keep their order

    def _layout(self, epoch: int) -> Layout:
        order = shuffled(self._rng(epoch), len(self.table))  # the chunk order of this epoch
        return bestfit_layout(self.table, order, self.settings.packing_buffer)

    def policy_settings(self) -> dict:
        return {"train.packing_buffer": self.settings.packing_buffer}


SAMPLERS: dict[str, type[Sampler]] = {
    "padded": PaddedSampler,
    "prepacked": PrepackedSampler,
    "bestfit": BestFitSampler,
}


def build_sampler(
    settings: PolicySettings,
    split: TokenSplit,
    *,
    rank: int = 0,
    world_size: int = 1,
    packs_dir: Path | None = None,
) -> Sampler:
    """The training sampler of `settings.policy` for one split and rank (evaluation and validation
    batches are policy-independent: data/evaluation.py)."""
    return SAMPLERS[settings.policy](split, settings, rank=rank, world_size=world_size, packs_dir=packs_dir)
