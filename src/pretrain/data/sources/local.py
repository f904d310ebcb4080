"""source=local: your parquet / JSON lines files with a `text` column, read in the order given."""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from ...errors import SourceError
from .base import Document, Part, PartSizes, SourceConfig
from .jsonl import jsonl_parts, read_json_array, read_jsonl
from .parquet import parquet_parts, read_parquet

_FORMATS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".ndjson": "json"}
_GLOB_CHARS = frozenset("*?[")
SMALL_SOURCE_BYTES = 32 << 20  # below this, one process encodes faster than workers start


def _file_format(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix not in _FORMATS:
        raise SourceError(
            f"{path}: unsupported file type {suffix!r}; give .parquet or .jsonl files with a `text` column"
        )
    return _FORMATS[suffix]


def _expand(entry: str) -> list[Path]:
    """One `source.files` entry: a file, a directory (every supported file inside, recursively) or a
    glob pattern; directories and patterns expand in sorted order, so the identity is deterministic."""
    path = Path(entry).expanduser()
    if path.is_dir():
        found = sorted(
            (p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in _FORMATS),
            key=lambda p: p.relative_to(path).as_posix(),
        )
        if not found:
            raise SourceError(
                f"source.files: the directory {path.resolve()} holds no {'/'.join(_FORMATS)} files; "
                "point it at the folder of your data files"
            )
        return [p.resolve() for p in found]
    if not path.exists() and _GLOB_CHARS & set(entry):
        matches = sorted(glob.glob(str(path), recursive=True))
        found = [Path(m) for m in matches if Path(m).is_file() and Path(m).suffix.lower() in _FORMATS]
        if not found:
            raise SourceError(
                f"source.files: the pattern {entry!r} matches no {'/'.join(_FORMATS)} files; fix the "
                "pattern or list the files"
            )
        return [p.resolve() for p in found]
    return [path.resolve()]


def local_paths(files) -> list[Path]:
    """The data files `source.files` names, in order: each an existing .parquet or JSON file."""
    if files is None or isinstance(files, str | os.PathLike):
        files = [files] if files else []
    entries = [str(f) for f in files]
    if not entries:
        raise SourceError("source=local needs files: source.files='[a.parquet,b.jsonl]'")
    paths = [p for entry in entries for p in _expand(entry)]
    for path in paths:
        if not path.is_file():
            raise SourceError(
                f"source.files: {path} does not exist; give existing files, a directory or a glob pattern"
            )
        _file_format(path)
    return paths


@dataclass
class LocalConfig(SourceConfig):
    files: list[str] = field(default_factory=list)
    """source=local: parquet or jsonl files with a `text` column, read in the order given"""

    for_kind = "local"


@dataclass(frozen=True)
class LocalSource:
    """The rows of `files` (expanded: absolute paths of data files), file after file."""

    files: tuple[str, ...]
    sizes: PartSizes = field(default_factory=PartSizes)

    name: ClassVar[str] = "local"
    config_class: ClassVar[type[SourceConfig]] = LocalConfig
    test_variants: ClassVar[dict[str, tuple[str, ...]]] = {
        "local": ("source.files=[corpora/pretrain_docs.jsonl]",)  # this repository's docs (relative)
    }

    @property
    def kind(self) -> str:
        return self.name

    @classmethod
    def from_config(cls, source, sizes: PartSizes) -> LocalSource:
        return cls(files=tuple(str(p) for p in local_paths(source.files)), sizes=sizes)

    def identity(self) -> dict:
        # Content, not names, identifies the corpus: a changed file must not reuse an old cache. The
        # digest is remembered by the file's stat, so an unchanged file is not re-hashed every start.
        from ..files import remembered_sha256

        entries = [{"name": Path(p).name, "sha256": remembered_sha256(Path(p))} for p in self.files]
        return {"kind": "local", "files": entries}

    def parts(self) -> Iterator[Part]:
        for path in self.files:
            if _file_format(Path(path)) == "parquet":
                yield from parquet_parts(path, self.sizes.parquet_rows)
            else:
                yield from jsonl_parts(path, self.sizes.jsonl_bytes)

    def read(self, part: Part) -> Iterator[Document]:
        if part.kind == "parquet":
            return read_parquet(part)
        if part.kind == "jsonl":
            return read_jsonl(part)
        return read_json_array(part)

    def describe(self) -> str:
        names = ", ".join(Path(p).name for p in self.files[:5]) + (" ..." if len(self.files) > 5 else "")
        return f"source=local ({names})"

    def is_small(self) -> bool:
        try:
            return sum(os.stat(p).st_size for p in self.files) < SMALL_SOURCE_BYTES
        except OSError:
            return False  # the build reports it
