"""What every data policy is: its config (the `data` group's typed options) and its interface.

A policy turns a split's chunk table into *units* (a padded row or a pack) of *items* (a run of
inputs inside one document), a `Layout`, and says how a batch of units is gathered, what an epoch
costs and how validation chunks are batched. The generic `Sampler` (data/batching/samplers.py) owns the rest:
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

from ....errors import ConfigError
from ....plugins import MISSING
from ..chunking import ChunkTable, check_max_seq_len
from ..packing import best_fit_buffered
from .layout import EpochPlan, Layout, first_chunk_ids, shuffled

if TYPE_CHECKING:
    from ...tokens import TokenSplit
    from ..batch import PackedBatch


class LongDocs(StrEnum):
    """`data.long_docs`: what becomes of a document with more than max_seq_len prediction pairs."""

    chunk = "chunk"  # independent chunks of at most max_seq_len inputs: every pair trained once
    truncate = "truncate"  # its first chunk only (Ding et al. 2024's truncation); the rest is dropped


# `data.positions` (packing policies): how a pack's position ids are numbered. `restart` (the default,
# as before) numbers each attention segment from 0: each document chunk with the mask on, the whole
# pack with it off. `continue` numbers across the whole pack whatever the mask, as concat-then-chunk
# pipelines do. (Functional form: `continue` is a Python keyword.)
Positions = StrEnum("Positions", {"restart": "restart", "continue": "continue"})
RESTART, CONTINUE = Positions("restart"), Positions("continue")


def is_set(value: object) -> bool:
    return value is not None and value != MISSING


def positive_int(value: object, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or int(value) < 1:
        raise ConfigError(f"{key} must be a positive integer, got {value!r}")
    return int(value)


@dataclass
class DataConfig:
    """The `data` group: what every policy has. Each policy's option (`conf/data/<policy>.yaml`)
    types the group with its own subclass, registered in Hydra's ConfigStore by `pretrain.config`."""

    policy: str = MISSING
    """how batches are built from the cache: one of the registered policies (`data=<policy>` sets it)"""
    max_seq_len: int = 512
    """context length = pack capacity = padded row width, 2..4096 (a power of two for vsl)"""
    long_docs: LongDocs = LongDocs.chunk
    """long documents: chunk (every chunk trained) or truncate (first max_seq_len inputs); padded: truncate"""

    # The policy whose options this class holds (None: the group's base, no policy chosen yet).
    for_policy: ClassVar[str | None] = None

    def __post_init__(self) -> None:
        if is_set(self.max_seq_len):
            check_max_seq_len(self.max_seq_len)
        chosen, own = self.policy, type(self).for_policy
        if own is not None and is_set(chosen) and chosen != own:
            raise ConfigError(
                f"data.policy={chosen} does not fit the options of data={own}: choose the policy "
                f"with data={chosen}"
            )

    def microbatch_units(self, batch_size: int | None, microbatch_tokens: int | None) -> int:
        """Units (rows or packs) per microbatch: train.batch_size, or train.microbatch_tokens //
        max_seq_len (the train group checked that exactly one is set). A policy may refuse a pairing."""
        if batch_size is not None:
            return int(batch_size)
        assert microbatch_tokens is not None
        return max(1, int(microbatch_tokens) // int(self.max_seq_len))


@dataclass
class PackingConfig(DataConfig):
    """Options of the policies that pack chunks."""

    document_mask: bool = True
    """packing policies: false makes each pack one attention segment (positions continue across documents)"""
    positions: Positions = RESTART
    """packing policies: restart (each attention segment numbered from 0) or continue (across the pack)"""


class DataPolicy:
    """One data policy, built from its config. Subclasses say which layout an epoch has, how a
    batch of it is gathered and what it costs; `Sampler` calls them, `inspect-data` adds them up."""

    name: ClassVar[str]
    config_class: ClassVar[type[DataConfig]]
    # Option sets that exercise this policy's axes (`data.<key>=value` overrides, case name -> them):
    # the generic tests (every item once, resume, elastic resume) run each one.
    test_variants: ClassVar[dict[str, tuple[str, ...]]] = {}
    # Its recorded cases of tests/golden/batches.json (overrides on the golden smoke run), if any: a
    # policy without one is checked to serve the same batches twice instead.
    golden_variants: ClassVar[dict[str, tuple[str, ...]]] = {}
    fixed_layout: ClassVar[bool] = True  # the same layout every epoch (built once per sampler)
    shuffle_units: ClassVar[bool] = True  # shuffle the units of the layout per training epoch
    unit_name: ClassVar[str] = "packs"  # what a unit is called in messages
    # What a unit's items are: the chunk table's chunks, or "pieces" of them (vsl's power-of-two cuts).
    items: ClassVar[str] = "chunks"
    # The baseline the other layouts are measured against: compare's default reference arm.
    baseline: ClassVar[bool] = False
    # True when `unit_order` groups the units into whole optimizer updates (vsl: one bucket per update):
    # the plan then depends on the update size, which a resumed epoch keeps (Sampler.load_state_dict).
    whole_updates: ClassVar[bool] = False
    # False when the layout is one stream fixed ahead of time (prepacked), so a table planned anew every
    # epoch (a mixture's, data/batching/mixture.py) cannot be laid out.
    mixes: ClassVar[bool] = True

    def __init__(self, config: DataConfig) -> None:
        self.config = config
        self.max_seq_len = int(config.max_seq_len)

    # --- the composition axes every policy has -----------------------------------------------------

    @property
    def truncates(self) -> bool:
        """data.long_docs=truncate: each document trains its first chunk only."""
        return LongDocs(self.config.long_docs) == LongDocs.truncate

    def trained_chunks(self, table: ChunkTable) -> np.ndarray | None:
        """Ids of the chunks an epoch trains: None for every chunk (chunk), else each document's first
        (a mixture's planned epoch holds only chunks to train)."""
        return first_chunk_ids(table) if self.truncates and not table.planned else None

    def _non_default(self, key: str, value: object) -> dict:
        """{key: value} when the option differs from its default for this policy, else {}: a composition
        option joins the resume key only when set, so states saved before it existed still resume."""
        field = type(self.config).__dataclass_fields__[key.split(".")[-1]]
        return {} if value == field.default else {key: value}

    # --- the epoch's layout and its batches --------------------------------------------------------

    def layout(
        self, split: TokenSplit, table: ChunkTable, rng: np.random.Generator, packs_dir: Path | None
    ) -> Layout:
        """The units of an epoch; `rng` is the epoch's own generator (seed, epoch)."""
        raise NotImplementedError

    def unit_order(self, layout: Layout, rng: np.random.Generator, update_units: int) -> np.ndarray | None:
        """The units the epoch serves, in order (None: every unit in layout order); units left out are
        the epoch's dropped tail. `rng` is the epoch's own generator (seed, epoch), `update_units` the
        consecutive units of the order that make one optimizer update over all ranks (units per batch
        x train.accumulation x world size). Default: every unit, shuffled when `shuffle_units`."""
        return shuffled(rng, len(layout)) if self.shuffle_units else None

    def gather(self, split: TokenSplit, layout: Layout, items: np.ndarray, counts: np.ndarray) -> PackedBatch:
        """The batch of `items` (layout item indices, unit after unit; `counts` items per unit)."""
        from ..batch import gather_packed  # torch only when a batch is built: the schema stays light

        starts, lengths = layout.starts(items), layout.lengths(items)
        return gather_packed(
            split.tokens, starts, lengths, counts, self.max_seq_len, loss_mask=split.loss_mask
        )

    def resume_key(self) -> dict:
        """This policy's own knobs, by config key (`inspect-data` reports them; a resume checks them)."""
        return self._non_default("data.long_docs", str(self.config.long_docs))

    # --- what an epoch costs (inspect-data) --------------------------------------------------------

    def segment_lengths(self, plan: EpochPlan) -> np.ndarray:
        """Lengths of the real sequences attention runs over (one per cu_seqlens segment, pads left out)."""
        return plan.layout.length

    def attention_segments(self, plan: EpochPlan) -> np.ndarray:
        """Lengths of the cu_seqlens segments attention computes, pads included (padded rows)."""
        return self.segment_lengths(plan)

    def computed_rows(self, plan: EpochPlan) -> int:
        """Rows the model computes for the epoch: packed policies compute only real tokens."""
        return plan.real_tokens

    def slots(self, plan: EpochPlan) -> int:
        """Token slots the epoch's units offer: packs x max_seq_len."""
        return len(plan.layout) * self.max_seq_len

    def truncated_pairs(self, split: TokenSplit, plan: EpochPlan) -> int:
        """Prediction pairs of the split that no batch holds: the tails of truncated documents."""
        if not self.truncates:
            return 0
        kept = np.minimum(np.asarray(split.lengths, dtype=np.int64) - 1, self.max_seq_len).sum()
        return split.num_pairs - int(kept)

    def cross_document_visible_fraction(self, plan: EpochPlan) -> float:
        """Share of real tokens whose attention can see an earlier document."""
        return 0.0

    def position_numbering(self) -> str:
        """How training batches number positions (`data.positions`): every unit of a policy that does
        not pack is one segment from 0."""
        return "restart"

    # --- validation --------------------------------------------------------------------------------

    def evaluation_units(self, table: ChunkTable, buffer: int) -> tuple[np.ndarray, np.ndarray]:
        """(chunk order, unit pointers) of the chunks evaluation scores, each chunk its own segment;
        `buffer` is train.eval_packing_buffer (a policy that packs validation chunks best fits them in
        index order from that many candidates)."""
        raise NotImplementedError

    def evaluation_batch(
        self, split: TokenSplit, starts: np.ndarray, lengths: np.ndarray, counts: np.ndarray
    ) -> PackedBatch:
        """A validation batch of whole chunks (`counts` chunks per unit), each its own segment."""
        from ..batch import gather_packed

        return gather_packed(
            split.tokens, starts, lengths, counts, self.max_seq_len, loss_mask=split.loss_mask
        )


class PackingPolicy(DataPolicy):
    """A policy that packs chunks. With `data.document_mask=false` a pack is one attention segment
    (its later documents see the earlier ones, positions run on across them); validation packs are best
    fit in index order from `train.eval_packing_buffer` candidates, every chunk its own segment whatever
    the mask (so val/loss compares models)."""

    config: PackingConfig

    def gather(self, split: TokenSplit, layout: Layout, items: np.ndarray, counts: np.ndarray) -> PackedBatch:
        from ..batch import continue_positions, one_segment_per_pack

        out = self.gather_segments(split, layout, items, counts)
        if not self.config.document_mask:
            out = one_segment_per_pack(out)
        return continue_positions(out) if self.position_numbering() == CONTINUE else out

    def position_numbering(self) -> str:
        return str(Positions(self.config.positions))

    def gather_segments(
        self, split: TokenSplit, layout: Layout, items: np.ndarray, counts: np.ndarray
    ) -> PackedBatch:
        """The batch with every item its own segment (`gather` then applies the mask)."""
        return super().gather(split, layout, items, counts)

    def resume_key(self) -> dict:
        return {
            **super().resume_key(),
            **self._non_default("data.document_mask", bool(self.config.document_mask)),
            **self._non_default("data.positions", self.position_numbering()),
        }

    def segment_lengths(self, plan: EpochPlan) -> np.ndarray:
        """Without the document mask a pack is one segment; with it, each item is."""
        return plan.layout.length if self.config.document_mask else plan.layout.unit_tokens

    def cross_document_visible_fraction(self, plan: EpochPlan) -> float:
        """Share of real tokens that attend to another document: without the document mask, those of
        a pack's items after its leading run of one document (with it, none)."""
        layout = plan.layout
        real = layout.real_tokens
        if self.config.document_mask or not real:
            return 0.0
        doc, counts = layout.doc, np.diff(layout.ptr)
        starts = layout.ptr[:-1][counts > 0]
        run_start = np.ones(len(doc), dtype=bool)  # a new run of one document within a pack
        run_start[1:] = doc[1:] != doc[:-1]
        run_start[starts] = True
        run = np.cumsum(run_start)
        leading = run == np.repeat(run[starts], counts[counts > 0])
        return float(layout.length[~leading].sum(dtype=np.int64) / real)

    def evaluation_units(self, table: ChunkTable, buffer: int) -> tuple[np.ndarray, np.ndarray]:
        return best_fit_buffered(table.length, self.max_seq_len, buffer)
