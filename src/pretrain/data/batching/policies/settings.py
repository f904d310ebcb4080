"""What a run's data path needs, in one object: the chosen policy's options (the typed `data` group)
and the batching knobs of the `train` group. Every value was checked when the typed config was built."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from .base import DataConfig, DataPolicy
from .registry import build_policy

if TYPE_CHECKING:
    from ....config import TrainConfig


@dataclass(frozen=True)
class PolicySettings:
    data: DataConfig  # the chosen policy's config (a DataConfig subclass)
    seed: int
    batch_size: int  # units per microbatch (resolved from train.microbatch_tokens when that is set)
    eval_microbatch_tokens: int
    eval_packing_buffer: int  # validation chunks best fit from this many candidates (packing policies)
    val_batches: int | None
    accumulation: int

    @property
    def policy(self) -> str:
        return str(self.data.policy)

    @property
    def max_seq_len(self) -> int:
        return int(self.data.max_seq_len)

    @cached_property
    def data_policy(self) -> DataPolicy:
        """The policy object that lays out, gathers and accounts for this run's batches."""
        return build_policy(self.data)

    @property
    def eval_batch_size(self) -> int:
        """Validation packs (or rows) per microbatch: train.eval_microbatch_tokens // data.max_seq_len."""
        return max(1, self.eval_microbatch_tokens // self.max_seq_len)

    @classmethod
    def from_config(cls, data: DataConfig, train: TrainConfig, seed: int) -> PolicySettings:
        """From the typed `data` and `train` groups and the run seed."""
        return cls(
            data=data,
            seed=int(seed),
            batch_size=data.microbatch_units(train.batch_size, train.microbatch_tokens),
            eval_microbatch_tokens=int(train.eval_microbatch_tokens),
            eval_packing_buffer=int(train.eval_packing_buffer),
            val_batches=train.val_batches,
            accumulation=int(train.accumulation),
        )
