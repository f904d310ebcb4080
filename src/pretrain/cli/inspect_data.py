"""`pretrain inspect-data [OVERRIDES] [--output stats.json]`: the cache's statistics under the chosen
policy (docs/data.md), printed as a table and optionally written as JSON."""

from __future__ import annotations

import argparse
import json

from rich.console import Console

from .output import add_output, check_output_file, write_output
from .prepare import cache_spec


def add_parser(sub) -> None:
    inspect = sub.add_parser("inspect-data", help="statistics of the cache under the chosen policy")
    inspect.add_argument(
        "overrides", nargs="*", help="Hydra overrides, e.g. data=padded data.max_seq_len=1024"
    )
    add_output(inspect, "also write the statistics as JSON to this file (the table is always printed)")


def run(args: argparse.Namespace) -> int:
    config, spec = cache_spec(args.overrides)
    path = check_output_file(args.output, example="stats.json") if args.output else None  # before the work
    from ..data.batching.mixture import MixtureSpec
    from ..data.batching.policies import PolicySettings
    from ..data.ingest.prepare import prepare_cache
    from ..data.measures.floors import combined_floors, spec_floors
    from ..data.measures.stats import inspect_split
    from ..data.sources.summary import source_summary
    from ..report.inspect_table import render_table

    settings = PolicySettings.from_config(config.data, config.train, config.seed)
    mixture = MixtureSpec.from_config(config)
    if mixture is None:
        cache = prepare_cache(spec)
        stats = inspect_split(
            settings, cache.split("train"), cache.split("validation"), packs_dir=cache.packs_dir
        )
        # task=sft: val/loss counts the trained targets only, which the floors do not single out
        stats["floors"] = None if cache.masked else spec_floors(spec, cache)
        stats["source"] = source_summary(spec.source, cache)  # its size and where its text came from
    else:  # the mixed epoch, and each component's statistics under mixture.<name>
        mixture.check_policy(settings.policy)
        caches = [prepare_cache(component.cache) for component in mixture.components]
        train, mixed = mixture.mix([cache.split("train") for cache in caches])
        parts = [cache.split("validation") for cache in caches]
        validation, _ = mixture.mix(parts)
        stats = inspect_split(settings, train, validation, mixture=mixed, validation_parts=parts)
        floors = {
            c.name: spec_floors(c.cache, cache) for c, cache in zip(mixture.components, caches, strict=True)
        }
        for name, floor in floors.items():
            stats["mixture"][name]["floors"] = floor
        for component, cache in zip(mixture.components, caches, strict=True):
            stats["mixture"][component.name]["source"] = source_summary(component.cache.source, cache)
        stats["floors"] = {k: v for k, v in combined_floors(floors).items() if k != "components"}
    Console().print(render_table(stats))
    if path is not None:  # without one the table is the answer
        write_output(path, json.dumps(stats, indent=2, default=float) + "\n")
        print(path)
    return 0
