"""What every data policy is: its config (the `data` group's typed options) and its interface.

A policy turns a split's chunk table into *units* (a padded row or a pack) of *items* (a run of
inputs inside one document), a `Layout`, and says how a batch of units is gathered, what an epoch
costs and how validation chunks are batched. The generic `Sampler` (data/samplers.py) owns the rest:
the epoch plan, the rank split, the cursor and the resume state.

A config dataclass holds only its policy's options and checks them once, when the typed config is
built (`to_config`): nothing below re-checks a range.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from ...errors import ConfigError
from ..chunking import ChunkTable, check_max_seq_len
from ..packing import best_fit_buffered
from .layout import EpochPlan, Layout

if TYPE_CHECKING:
    from ..batch import PackedBatch
    from ..tokens import TokenSplit

# omegaconf's marker of a value a group option sets (its YAML file), spelled out: no module below the
# entry imports omegaconf.
MISSING = "???"


class Policy(StrEnum):
    """The choices of `data.policy`: one member per module of this package (the registry checks it)."""

    padded = "padded"
    prepacked = "prepacked"
    bestfit = "bestfit"


def _is_set(value: object) -> bool:
    return value is not None and value != MISSING


def positive_int(value: object, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or int(value) < 1:
        raise ConfigError(f"{key} must be a positive integer, got {value!r}")
    return int(value)


@dataclass
class DataConfig:
    """The `data` group: what every policy has. Each policy's option (`conf/data/<policy>.yaml`)
    types the group with its own subclass, registered in Hydra's ConfigStore by `pretrain.config`."""

    policy: Policy = MISSING  # type: ignore[assignment]
    """how batches are built from the cache: padded, prepacked or bestfit"""
    max_seq_len: int = 512
    """context length = pack capacity = padded row width, 2..4096"""

    # The policy whose options this class holds (None: the group's base, no policy chosen yet).
    for_policy: ClassVar[Policy | None] = None

    def __post_init__(self) -> None:
        if _is_set(self.max_seq_len):
            check_max_seq_len(self.max_seq_len)
        chosen, own = self.policy, type(self).for_policy
        if own is not None and _is_set(chosen) and chosen != own:
            raise ConfigError(
                f"data.policy={chosen} does not fit the options of data={own}: choose the policy "
                f"with data={chosen} (one of {', '.join(Policy)})"
            )


@dataclass
class PackingConfig(DataConfig):
    """Options of the policies that pack chunks (validation chunks are best fit by every one)."""

    packing_buffer: int = 64
    """chunks in the best-fit candidate buffer (bestfit's packs, validation packs of packing policies)"""

    def __post_init__(self) -> None:
        super().__post_init__()
        if _is_set(self.packing_buffer):
            positive_int(self.packing_buffer, "data.packing_buffer")


class DataPolicy:
    """One data policy, built from its config. Subclasses say which layout an epoch has, how a
    batch of it is gathered and what it costs; `Sampler` calls them, `inspect-data` adds them up."""

    name: ClassVar[Policy]
    config_class: ClassVar[type[DataConfig]]
    fixed_layout: ClassVar[bool] = True  # the same layout every epoch (built once per sampler)
    shuffle_units: ClassVar[bool] = True  # shuffle the units of the layout per training epoch
    unit_name: ClassVar[str] = "packs"  # what a unit is called in messages
    # Resume-key names of older checkpoints -> today's (a state saved before a key moved still resumes).
    renamed_settings: ClassVar[dict[str, str]] = {}

    def __init__(self, config: DataConfig) -> None:
        self.config = config
        self.max_seq_len = int(config.max_seq_len)

    # --- the epoch's layout and its batches --------------------------------------------------------

    def layout(
        self, split: TokenSplit, table: ChunkTable, rng: np.random.Generator, packs_dir: Path | None
    ) -> Layout:
        """The units of an epoch; `rng` is the epoch's own generator (seed, epoch)."""
        raise NotImplementedError

    def gather(self, split: TokenSplit, layout: Layout, items: np.ndarray, counts: np.ndarray) -> PackedBatch:
        """The batch of `items` (layout item indices, unit after unit; `counts` items per unit)."""
        from ..batch import gather_packed  # torch only when a batch is built: the schema stays light

        starts, lengths = layout.starts(items), layout.lengths(items)
        return gather_packed(split.tokens, starts, lengths, counts, self.max_seq_len)

    def resume_key(self) -> dict:
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

    def truncated_pairs(self, split: TokenSplit, plan: EpochPlan) -> int:
        """Prediction pairs of the split that no batch holds."""
        return 0

    def cross_document_visible_fraction(self, plan: EpochPlan) -> float:
        """Share of real tokens whose attention can see an earlier document."""
        return 0.0

    # --- validation --------------------------------------------------------------------------------

    def evaluation_units(self, table: ChunkTable) -> tuple[np.ndarray, np.ndarray]:
        """(chunk order, unit pointers) of the chunks evaluation scores, each chunk its own segment."""
        raise NotImplementedError

    def evaluation_batch(
        self, split: TokenSplit, starts: np.ndarray, lengths: np.ndarray, counts: np.ndarray
    ) -> PackedBatch:
        """A validation batch of whole chunks (`counts` chunks per unit), each its own segment."""
        from ..batch import gather_packed

        return gather_packed(split.tokens, starts, lengths, counts, self.max_seq_len)


class PackingPolicy(DataPolicy):
    """A policy that packs chunks: validation packs are best fit in index order from the policy's
    candidate buffer (`data.packing_buffer`)."""

    config: PackingConfig

    def evaluation_units(self, table: ChunkTable) -> tuple[np.ndarray, np.ndarray]:
        return best_fit_buffered(table.length, self.max_seq_len, self.config.packing_buffer)
