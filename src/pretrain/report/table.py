"""The compare tables' inputs: one row per run (`COLUMNS`), and what each layout wastes and truncates
on a run's data (`layout_statistics`, as `inspect-data` computes it on the run's cache)."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import fields
from pathlib import Path
from typing import Any

from ..training.run_record import Run, layout_options, run_numbers
from ..training.summary import read_summary

log = logging.getLogger(__name__)


def layout_arms() -> list[tuple[str, dict[str, object]]]:
    """The layouts a single run is set beside: every registered policy at its defaults and with each
    other value of each of its enum options (`padded pad_to=longest`, `prepacked strategy=bfd`);
    (arm name, `data` group) pairs."""
    from enum import Enum

    from ..data.batching.policies import REGISTRY

    arms: list[tuple[str, dict[str, object]]] = []
    for name, cls in REGISTRY.items():
        arms.append((str(name), {"policy": str(name)}))
        for key, default in layout_options(cls.config_class).items():
            if isinstance(default, Enum):
                for value in type(default):
                    if value != default:
                        arms.append((f"{name} {key}={value}", {"policy": str(name), key: str(value)}))
    return arms


def _arm_data(run_data: Any, group: dict[str, object]) -> Any:
    """The typed `data` group of another arm (`group`: its policy and layout options) that keeps the
    run's other settings it shares (max_seq_len, packing_buffer)."""
    from ..data.batching.policies import policy_class

    policy = policy_class(group["policy"])
    options = layout_options(policy.config_class)
    kept: dict[str, Any] = {
        f.name: getattr(run_data, f.name)
        for f in fields(policy.config_class)
        if f.init and f.name != "policy" and f.name not in options and hasattr(run_data, f.name)
    }
    kinds: dict[str, Any] = {key: type(default) for key, default in options.items()}
    chosen: dict[str, Any] = {key: kinds[key](value) for key, value in group.items() if key != "policy"}
    return policy.config_class(policy=policy.name, **kept, **chosen)


def layout_statistics(run: Run, arms: list[tuple[str, dict[str, object]]] | None = None) -> dict[str, dict]:
    """Padding waste and truncated prediction pairs of the run's own layout and of `arms` (from
    `layout_arms`) on the run's train split at its max_seq_len, computed as `inspect-data` does (epoch
    0, one rank; packs are built in memory, nothing is written). A mixture run: on its mixed epoch
    (its components' caches, run.json `cache_dirs`, mixed by its weights as inspect-data mixes them),
    without the layouts that cannot lay out a mixture (prepacked). Empty when the run's cache is gone
    or its config cannot be read (said in one line: the figure then leaves those bars out)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from ..config import to_config, upgrade_run_config
    from ..data.batching.mixture import Mixture, mix_splits
    from ..data.batching.policies import PolicySettings, policy_class
    from ..data.ingest.cache import Cache, read_manifest
    from ..data.measures.stats import inspect_split
    from ..data.tokens import TokenSplit
    from ..errors import PretrainError

    def cache(directory: str) -> Cache:
        return Cache(directory=Path(directory), manifest=read_manifest(Path(directory)))

    try:
        record = read_summary(run.path)
        config = to_config(OmegaConf.create(upgrade_run_config(run.config)))  # also an older run's
        mixed: Mixture | None = None
        parts: list[TokenSplit] | None = None
        if config.mixture is None:
            one = cache(record["cache_dir"])
            train, validation = one.split("train"), one.split("validation")
        else:  # a mixture: its components' caches (run.json `cache_dirs`) mixed as its run mixed them
            components = config.mixture.components
            caches = [cache(record["cache_dirs"][name]) for name in components]
            total = sum(float(c.weight) for c in components.values())
            weights = [float(c.weight) / total for c in components.values()]
            repeat = [int(c.max_repeat) for c in components.values()]
            train, mixed = mix_splits([c.split("train") for c in caches], list(components), weights, repeat)
            parts = [c.split("validation") for c in caches]
            validation, _ = mix_splits(parts, list(components), weights, repeat)
        datas = {run.arm: config.data}
        datas |= {arm: _arm_data(config.data, group) for arm, group in arms or [] if arm != run.arm}
        if mixed is not None:  # a layout fixed ahead of time (prepacked) cannot lay out a mixture
            datas = {arm: data for arm, data in datas.items() if policy_class(data.policy).mixes}
        layouts = {}
        for arm, data in datas.items():
            settings = PolicySettings.from_config(data, config.train, config.seed)
            stats = inspect_split(
                settings, train, validation, audits=False, mixture=mixed, validation_parts=parts
            )
            layouts[arm] = {
                key: stats[key] for key in ("padding_waste", "truncated_pairs", "prediction_pairs")
            }
        return layouts
    except (PretrainError, OSError, KeyError, ValueError, OmegaConfBaseException) as error:
        log.info(f"{run.path}: no layout statistics ({type(error).__name__}: {error})")
        return {}


def cache_floors_of(run: Run) -> dict:
    """The floors of a run whose run.json has none (it predates them): those stored beside its cache
    (`pretrain inspect-data` or any newer run on that cache computes them); {} when none are."""
    from ..data.ingest.cache import Cache
    from ..data.measures.floors import recorded_floors

    try:
        cache_dir = Path(read_summary(run.path)["cache_dir"])
        # The manifest is only matched against floors.json's record of the files: read, not verified.
        manifest = json.loads((cache_dir / "manifest.json").read_text())
        return recorded_floors(Cache(directory=cache_dir, manifest=manifest)) or {}
    except (OSError, KeyError, ValueError, TypeError, AttributeError):
        return {}


COLUMNS: tuple[str, ...] = ("run", "policy", "max_seq_len", "batch", "real tokens", "train loss")
COLUMNS += ("val loss", "tokens/s", "padding waste", "pack util", "truncated pairs", "train seconds")
COLUMNS += ("fragmented docs", "x-doc visible", "attn cost", "load per CPU")

_FORMATS: tuple[str, ...] = ("{}", "{}", "{}", "{}", "{:,.0f}", "{:.4f}", "{:.4f}", "{:,.0f}")
_FORMATS += ("{:.1%}", "{:.1%}", "{:.1%}", "{:,.1f}", "{:.1%}", "{:.1%}", "{:,.1f}", "{:.2f}")


def table_rows(runs: list[Run]) -> list[list]:
    """One row per run, in COLUMNS order, numbers as numbers."""
    return [
        [run.label, run.policy, run.max_seq_len, run.batch_size, *run_numbers(run).values()] for run in runs
    ]


def markdown_table(runs: list[Run]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|---" * len(COLUMNS) + "|"]
    for row in table_rows(runs):
        cells = [
            "n/a" if isinstance(value, float) and math.isnan(value) else fmt.format(value)
            for fmt, value in zip(_FORMATS, row, strict=True)
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
