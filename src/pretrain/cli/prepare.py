"""`pretrain prepare [OVERRIDES]`: build or verify the config's token cache (a mixture: each
component's); prints a table of its counts and its directory last. With prepare.tasks > 1 and
prepare.task set, it encodes that task's shard instead (prepare_tasks.py runs them as a Hydra app)."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from ..config import Config
    from ..data.ingest.cache import Cache, CacheSpec


def add_parser(sub) -> None:
    prepare = sub.add_parser("prepare", help="build or verify the token cache; prints its directory last")
    prepare.add_argument(
        "overrides", nargs="*", help="Hydra overrides, e.g. source=local source.files='[a.parquet]'"
    )


def run(args: argparse.Namespace) -> int:
    from ..config import load_config, to_config

    config = to_config(load_config(args.overrides))
    # A mixture: each component's cache in turn (its own source and budget), one directory per line.
    for one in component_configs(config) if config.mixture is not None else [config]:
        path, cache = run_prepare(one)  # a task (prepare.task=i) prints its part file instead
        if cache is not None:
            Console().print(counts_table(cache))
        print(path)
    return 0


def run_prepare(config: Config, *, progress: bool = True) -> tuple[Path, Cache | None]:
    """Build or verify the cache of `config` (or, with prepare.task set, encode that task's shard).

    Returns (the cache directory, the cache), or (the task's part file, None) for a task.
    """
    from ..data.ingest.cache import CacheSpec
    from ..data.ingest.prepare import prepare_cache
    from ..data.ingest.staging import prepare_task, staging_dir
    from ..data.ingest.verify import verify_cache

    spec = CacheSpec.from_config(config)  # carries the prepare settings (spec.prepare) to the build
    tasks = spec.prepare.tasks
    if tasks > 1 and spec.prepare.task is not None:
        return prepare_task(spec, progress=progress), None
    cache = prepare_cache(spec, progress=progress)
    staging = staging_dir(spec, tasks)
    if tasks > 1 and staging.exists():
        verify_cache(cache.directory, spec.identity)  # every sha256 and the index, after assembly
        shutil.rmtree(staging, ignore_errors=True)
    return cache.directory, cache


def cache_spec(overrides: list[str]) -> tuple[Config, CacheSpec]:
    """The config of `overrides` and its cache's spec (verify and inspect-data name a cache alike)."""
    from ..config import load_config, to_config

    config = to_config(load_config(overrides))  # a bad override fails before the heavy imports below
    from ..data.ingest.cache import CacheSpec

    return config, CacheSpec.from_config(config)


def component_configs(config):
    """A mixture's components as single-source configs (`source` and `budget` theirs, no mixture)."""
    from dataclasses import replace

    assert config.mixture is not None
    return [
        replace(config, source=c.source, budget=c.budget or config.budget, mixture=None)
        for c in config.mixture.components.values()
    ]


def counts_table(cache) -> Table:
    table = Table(title=f"cache {cache.directory.name}")
    for column in ("split", "documents", "raw tokens (EOS incl.)", "prediction pairs"):
        table.add_column(column, justify="right" if column != "split" else "left")
    for split, counts in cache.counts().items():
        table.add_row(
            split, f"{counts['documents']:,}", f"{counts['tokens']:,}", f"{counts['prediction_pairs']:,}"
        )
    build = cache.manifest.get("build", {})
    read = build.get("documents_read", "?")
    skipped = [build.get(f"{kind}_skipped", 0) for kind in ("duplicates", "empty", "over_budget")]
    table.caption = (
        f"read {read:,} documents: skipped {skipped[0]:,} duplicates, {skipped[1]:,} empty, "
        f"{skipped[2]:,} over budget"
    )
    return table
