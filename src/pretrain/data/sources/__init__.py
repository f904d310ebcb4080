"""Where documents come from: one class per `source.kind` behind one protocol (`base.Source`:
identity, parts, read), found through `SOURCES`. A new kind is one module, one line here and its
conf/source/<kind>.yaml.

    source = source_from_config(config.source)          # a frozen, picklable value
    for part in source.parts(): source.read(part)       # what a prepare worker does
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...errors import ConfigError, SourceError
from .base import Document, Part, PartSizes, Source, documents
from .fineweb import FineWebSource
from .local import LocalSource
from .pkgdocs import PkgdocsSource
from .pydocs import PydocsSource

if TYPE_CHECKING:
    from ...config import SourceConfig

# source.kind -> the factory of its source from `source.*` and the part sizes.
SOURCES: dict[str, Callable[[Any, PartSizes], Source]] = {
    "pydocs": PydocsSource.from_config,
    "pkgdocs": PkgdocsSource.from_config,
    "local": LocalSource.from_config,
    "fineweb": FineWebSource.from_config,
}


def source_from_config(config: SourceConfig, sizes: PartSizes | None = None) -> Source:
    """The source `source.kind` names, with these part sizes (the defaults unless a build says)."""
    kind = str(config.kind)
    if kind not in SOURCES:
        raise ConfigError(
            f"source.kind={kind!r} is not one of {', '.join(SOURCES)} (pick source={'|'.join(SOURCES)})"
        )
    return SOURCES[kind](config, sizes or PartSizes())


def source_identity(config: SourceConfig) -> dict:
    """What identifies the source's documents (part of the cache identity)."""
    return source_from_config(config).identity()


def pydocs_documents():
    """The embedded corpus's documents in order (benchmarks and tests read it without a config)."""
    return documents(PydocsSource())


__all__ = [
    "SOURCES",
    "Document",
    "FineWebSource",
    "LocalSource",
    "Part",
    "PartSizes",
    "PkgdocsSource",
    "PydocsSource",
    "Source",
    "SourceError",
    "documents",
    "pydocs_documents",
    "source_from_config",
    "source_identity",
]
