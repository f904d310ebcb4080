"""What `pretrain inspect-data` says about a cache's source: its kind, its size in the cache and,
for a source that can tell (`provenance()`, e.g. source=pkgdocs), where its text came from."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import source_from_config

if TYPE_CHECKING:
    from ...config import SourceConfig
    from ..ingest.cache import Cache


def source_summary(config: SourceConfig, cache: Cache) -> dict:
    """inspect-data's `source` entry: `kind`, `documents` and `tokens` (both splits, EOS included),
    `cache_bytes` (the files the manifest lists), then the source's own provenance entries."""
    source = source_from_config(config)
    splits = cache.manifest["splits"].values()
    summary: dict = {
        "kind": source.kind,
        "documents": sum(int(s["documents"]) for s in splits),
        "tokens": sum(int(s["tokens"]) for s in splits),
        "cache_bytes": sum(int(f["bytes"]) for s in splits for f in s["files"].values()),
    }
    provenance = getattr(source, "provenance", None)
    if provenance is not None:
        summary.update(provenance())
    return summary
