"""Where documents come from: one class per `source.kind` behind one protocol (`base.Source`:
identity, parts, read), each with the dataclass of its options, listed once in `SOURCES`. A new kind
is one module, one line here and its conf/source/<kind>.yaml (whose defaults list names
`<kind>_schema`).

    source = source_from_config(config.source)          # a frozen, picklable value
    for part in source.parts(): source.read(part)       # what a prepare worker does
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from ...errors import ConfigError, SourceError
from ...plugins import MISSING, Registry
from .base import Document, Part, PartSizes, Source, SourceConfig, documents
from .chat import ChatConfig, ChatSource
from .chatdocs import ChatdocsConfig, ChatdocsSource
from .fineweb import FineWebConfig, FineWebSource
from .local import LocalConfig, LocalSource
from .pkgdocs import PkgdocsConfig, PkgdocsSource
from .pydocs import PydocsConfig, PydocsSource

SOURCES: Registry[Any] = Registry(
    "source.kind",
    PydocsSource,
    PkgdocsSource,
    LocalSource,
    FineWebSource,
    ChatSource,
    ChatdocsSource,
)


def holds_conversations(config: SourceConfig) -> bool:
    """Whether the source's documents are conversations (task=sft reads them, task=pretrain not)."""
    kind = str(config.kind)
    return kind in SOURCES and bool(getattr(SOURCES[kind], "conversations", False))


def source_from_config(config: SourceConfig, sizes: PartSizes | None = None) -> Source:
    """The source `source.kind` names, with these part sizes (the defaults unless a build says)."""
    kind = str(config.kind)
    if kind not in SOURCES:
        raise ConfigError(
            f"source.kind={kind!r} is not one of {', '.join(SOURCES)} (pick source={'|'.join(SOURCES)})"
        )
    return SOURCES[kind].from_config(config, sizes or PartSizes())


def source_identity(config: SourceConfig) -> dict:
    """What identifies the source's documents (part of the cache identity)."""
    return source_from_config(config).identity()


def typed_source(values: Mapping[str, Any] | SourceConfig, key: str = "source") -> SourceConfig:
    """`values` (the keys of a `source` option) as its kind's dataclass: a key the kind has no option
    for is refused, naming the kind's keys (a mixture component's source is typed here)."""
    if isinstance(values, SourceConfig) and type(values) is not SourceConfig:
        return values
    given = dict(vars(values)) if isinstance(values, SourceConfig) else dict(values)
    kind = given.get("kind")
    if kind in (None, MISSING):
        raise ConfigError(f"{key}.kind is missing: give the keys of a source option (kind, ...)")
    if str(kind) not in SOURCES:
        raise ConfigError(f"{key}.kind={kind!r} is not one of {', '.join(SOURCES)}")
    cls = SOURCES[str(kind)].config_class
    own = [f.name for f in fields(cls)]
    foreign = sorted(set(given) - set(own))
    if foreign:
        read_by = SOURCES.read_by(foreign[0])  # `; read by source=local (...)` when another kind has it
        raise ConfigError(f"{key}.{foreign[0]}: no such key; source={kind} has: {', '.join(own)}{read_by}")
    return cls(**given)


def pydocs_documents():
    """The embedded corpus's documents in order (benchmarks and tests read it without a config)."""
    return documents(PydocsSource())


__all__ = [
    "SOURCES",
    "ChatConfig",
    "ChatSource",
    "ChatdocsConfig",
    "ChatdocsSource",
    "holds_conversations",
    "Document",
    "FineWebConfig",
    "FineWebSource",
    "LocalConfig",
    "LocalSource",
    "Part",
    "PartSizes",
    "PkgdocsConfig",
    "PkgdocsSource",
    "PydocsConfig",
    "PydocsSource",
    "Source",
    "SourceConfig",
    "SourceError",
    "documents",
    "pydocs_documents",
    "source_from_config",
    "source_identity",
    "typed_source",
]
