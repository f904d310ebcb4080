"""`pretrain verify [OVERRIDES]`: the full sha256 verification of the config's cache (a mixture: each
component's), in place; prints a table of its files and its directory last."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from .prepare import cache_spec


def add_parser(sub) -> None:
    verify = sub.add_parser("verify", help="full sha256 verification of the cache; prints its directory last")
    verify.add_argument("overrides", nargs="*", help="Hydra overrides naming the cache, as for prepare")


def run(args: argparse.Namespace) -> int:
    """Full sha256 verification of the config's cache (a mixture: each component's), in place (it may
    be read-only)."""
    from ..data.batching.mixture import MixtureSpec
    from ..data.ingest.prepare import verify_existing

    config, spec = cache_spec(args.overrides)
    mixture = MixtureSpec.from_config(config)
    for one in [spec] if mixture is None else [c.cache for c in mixture.components]:
        result = verify_existing(one, "full")
        Console().print(verification_table(result))
        print(result.directory)
    return 0


def verification_table(result) -> Table:
    table = Table(title=f"verify {result.directory.name} (full)")
    for column in ("file", "bytes", "sha256", "check"):
        table.add_column(column, justify="right" if column == "bytes" else "left")
    files = result.manifest["splits"]
    for split in files:
        for entry in files[split]["files"].values():
            check = "sha256 matches" if entry["name"] in result.hashed else "stat unchanged since verified"
            table.add_row(entry["name"], f"{entry['bytes']:,}", entry["sha256"][:16], check)
    index = "JSONL and .index.npy indexes agree, tile the tokens, EOS closes every document; "
    table.caption = (
        f"manifest checksum and identity ok; token_dtype {result.manifest['token_dtype']}; "
        + (index if result.index_checked else "")
        + f"{result.seconds:.1f} s; verified record: {result.record or 'none (nowhere writable)'}"
    )
    return table
