"""A multirun's jobs before Hydra runs any: the basic sweeper's expansion of the command line.

Hydra checks a sweep only as each job starts: a bad value in job 3 aborts the sweep after jobs 0-2 ran
and leaves a half-made sweep directory. `sweep_jobs` expands the overrides the way Hydra's
BasicSweeper does (`hydra.sweeper.params` of the composed config first, e.g. an experiment's, then the
command line's; comma lists as a cartesian product in key order, numbered as Hydra numbers its jobs), so
train.py can compose and check every job's config first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from omegaconf import DictConfig

from ..config import CONFIG_NAME, config_dir, register_schema
from ..errors import ConfigError, describe, one_line_errors

BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
T = TypeVar("T")


@dataclass(frozen=True)
class Job:
    number: int  # hydra.job.num
    overrides: list[str]  # the job's whole command line, as the sweeper hands it to the job
    swept: list[str]  # only the `key=value` items a sweep chose: what tells this job apart

    def label(self) -> str:
        return f"sweep job {self.number} ({' '.join(self.swept) or 'no swept keys'})"


def _hydra_context():
    from hydra import initialize_config_dir

    register_schema()
    return initialize_config_dir(config_dir=str(config_dir()), version_base="1.3", job_name="pretrain")


def sweep_jobs(overrides: Sequence[str]) -> list[Job] | None:
    """Every job of `--multirun overrides` in Hydra's order; None when another sweeper than the basic
    one is configured (its jobs are its own business)."""
    from hydra import compose
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    given = parser.parse_overrides(list(overrides))
    fixed = [str(o.input_line) for o in given if not o.is_sweep_override()]  # how Hydra composes the primary
    with _hydra_context():
        primary = compose(config_name=CONFIG_NAME, overrides=fixed, return_hydra_config=True)
    sweeper = primary.hydra.sweeper
    if sweeper.get("_target_") != BASIC_SWEEPER:
        return None
    params = [f"{key}={value}" for key, value in (sweeper.get("params") or {}).items()]
    parsed = parser.parse_overrides([*params, *overrides])
    swept = {o.get_key_element() for o in parsed if o.is_sweep_override()}
    (batch,) = BasicSweeper.split_arguments(parsed, None)
    return [
        Job(number, list(job), [item for item in job if item.split("=", 1)[0] in swept])
        for number, job in enumerate(batch)
    ]


def check_jobs(jobs: Sequence[Job], check: Callable[[DictConfig], T]) -> list[T]:
    """Compose every job's config (one Hydra initialisation for all) and `check` it; the first job that
    fails is one ConfigError naming the job and what it sweeps, before any job has started. Returns
    what `check` returned for each job, in the jobs' order."""
    from hydra import compose

    checked = []
    with _hydra_context():
        for job in jobs:
            try:
                checked.append(check(compose(config_name=CONFIG_NAME, overrides=job.overrides)))
            except one_line_errors() as error:
                raise ConfigError(
                    f"{job.label()}: {describe(error).rstrip('.')}; no job was started"
                ) from None
    return checked
