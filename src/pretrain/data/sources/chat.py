"""source=chat: conversations (`messages: [{role, content}]`, the common chat format) from your
parquet / JSON lines files, or from a hub dataset's parquet files at a pinned revision (task=sft).

Each row is one conversation; the cache digests, splits and deduplicates its canonical text
(conversations.py) and renders it with the chat template when it is tokenized (ingest/chat.py).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import ClassVar

from ...errors import ConfigError, SourceError
from .base import Document, Part, PartSizes, SourceConfig
from .conversations import COLUMN
from .fineweb import check_hub, hub_filesystem
from .jsonl import read_json_array, read_jsonl
from .local import LocalSource, local_paths
from .parquet import parquet_parts, read_parquet


@dataclass
class ChatConfig(SourceConfig):
    files: list[str] = field(default_factory=list)
    """source=chat: local parquet or jsonl files with a `messages` column, read in the order given"""
    path: str | None = None
    """source=chat: a hub dataset of conversations instead of files (its parquet files)"""
    revision: str | None = None
    """source=chat: the hub dataset's pinned revision (commit)"""
    data_files: str = "*.parquet"
    """source=chat: which of the hub dataset's parquet files: a pattern of their paths in the
    repository (fnmatch: `*` crosses folders; e.g. data/train_sft-*.parquet)"""

    for_kind = "chat"


@dataclass(frozen=True)
class ChatSource:
    """Local files (`files`), or the hub dataset `path` at `revision` (its `data_files` in name order)."""

    files: tuple[str, ...] = ()
    path: str = ""
    revision: str = ""
    data_files: str = "*.parquet"
    sizes: PartSizes = field(default_factory=PartSizes)

    name: ClassVar[str] = "chat"
    config_class: ClassVar[type[SourceConfig]] = ChatConfig
    # Conversations train with task=sft only: the generic pretraining tests leave this kind out.
    test_variants: ClassVar[dict[str, tuple[str, ...]]] = {}
    conversations: ClassVar[bool] = True

    @property
    def kind(self) -> str:
        return self.name

    @classmethod
    def from_config(cls, source, sizes: PartSizes) -> ChatSource:
        if bool(source.files) == bool(source.path):
            raise ConfigError(
                "source=chat reads either local files (source.files='[a.jsonl]') or a hub dataset "
                "(source.path=org/name source.revision=<commit>): give exactly one"
            )
        if source.path:
            if not source.revision:
                raise ConfigError(f"source=chat: source.path={source.path} needs a pinned source.revision")
            return cls(
                path=str(source.path),
                revision=str(source.revision),
                data_files=str(source.data_files),
                sizes=sizes,
            )
        return cls(files=tuple(str(p) for p in local_paths(source.files)), sizes=sizes)

    def _local(self) -> LocalSource:
        return LocalSource(files=self.files, sizes=self.sizes)

    def identity(self) -> dict:
        if self.path:
            return {
                "kind": "chat",
                "path": self.path,
                "revision": self.revision,
                "data_files": self.data_files,
            }
        return {**self._local().identity(), "kind": "chat"}

    def parts(self) -> Iterator[Part]:
        if not self.path:
            for part in self._local().parts():
                yield replace(part, column=COLUMN)
            return
        check_hub(self.path)
        fs = hub_filesystem()
        root = f"datasets/{self.path}@{self.revision}"
        found = sorted(
            str(f) for f in fs.find(root) if fnmatch.fnmatch(str(f)[len(root) + 1 :], self.data_files)
        )
        if not found:
            raise SourceError(f"source=chat: no file of {root} matches source.data_files={self.data_files!r}")
        for name in found:
            for part in parquet_parts(name, self.sizes.parquet_rows, filesystem=fs):
                yield replace(part, column=COLUMN)

    def read(self, part: Part) -> Iterator[Document]:
        if part.kind == "parquet":
            return read_parquet(part, hub_filesystem() if self.path else None)
        if part.kind == "jsonl":
            return read_jsonl(part)
        return read_json_array(part)

    def describe(self) -> str:
        if self.path:
            return f"source=chat ({self.path} @ {self.revision[:12]})"
        return "source=chat (" + ", ".join(Path(p).name for p in self.files[:5]) + ")"

    def is_small(self) -> bool:
        return not self.path and self._local().is_small()
