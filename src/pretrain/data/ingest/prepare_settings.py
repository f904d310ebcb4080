"""How a cache is built (never what is in it): the `prepare` config group as a plain value, passed
explicitly (CacheSpec.prepare) from every entry that may build: `pretrain prepare`, `python train.py`,
`pretrain eval`, `pretrain inspect-data`."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ...errors import ConfigError
from ..sources.base import PartSizes, Source


class Encoder(StrEnum):
    """`prepare.encoder`: which encoder tokenizes a build (never part of the identity: the ids are equal)."""

    auto = "auto"
    tiktoken = "tiktoken"
    tokenizers = "tokenizers"


@dataclass(frozen=True)
class PrepareSettings:
    num_proc: int | None = None  # worker processes; None = the usable cores (small sources: one)
    encoder: str = "auto"
    tasks: int = 1
    task: int | None = None
    part_sizes: PartSizes = field(default_factory=PartSizes)  # not a config key: tests and benches

    def __post_init__(self) -> None:
        if self.num_proc is not None and self.num_proc < 1:
            raise ConfigError(f"prepare.num_proc={self.num_proc} must be >= 1 (or null for the usable cores)")
        if self.encoder not in list(Encoder):
            raise ConfigError(f"prepare.encoder={self.encoder!r} is not one of {', '.join(Encoder)}")
        if self.tasks < 1:
            raise ConfigError(f"prepare.tasks={self.tasks} must be >= 1")
        if self.task is not None and not 0 <= self.task < self.tasks:
            raise ConfigError(
                f"prepare.task={self.task} must be in 0..{self.tasks - 1} (prepare.tasks={self.tasks}); "
                "leave it null to assemble the tasks' parts"
            )

    @classmethod
    def from_config(cls, prepare: Any) -> PrepareSettings:
        return cls(
            num_proc=None if prepare.num_proc is None else int(prepare.num_proc),
            encoder=str(prepare.encoder),
            tasks=int(prepare.tasks),
            task=None if prepare.task is None else int(prepare.task),
        )


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def resolve_num_proc(settings: PrepareSettings, source: Source) -> int:
    """prepare.num_proc capped at the usable cores (more workers than cores only add start-up and
    switching), or for null the usable cores, except for small sources (one process encodes them faster
    than workers start)."""
    cores = usable_cores()
    if settings.num_proc is not None:
        if settings.num_proc > cores:
            print(
                f"prepare.num_proc={settings.num_proc} is above the {cores} usable cores: using {cores}",
                file=sys.stderr,
                flush=True,
            )
            return cores
        return settings.num_proc
    if cores > 1 and source.is_small():
        return 1
    return cores
