"""What every source kind shares: documents, parts, part sizes and the protocol a kind implements.

A source yields `Document(text, origin)` in a deterministic order; `origin` names the file and row so
that a bad record can be reported precisely. Its stream is cut into `Part`s, contiguous slices that
can be read independently (a slice of the pydocs modules, a row range of a parquet file, a byte range
of a JSON lines file), so that several processes (`prepare.num_proc`) or tasks (`prepare.tasks`) read
and tokenize disjoint parts while the cache is still assembled in source order.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar, Protocol

from ...errors import ConfigError, SourceError
from ...plugins import MISSING
from .conversations import COLUMN, conversation_text


@dataclass
class SourceConfig:
    """The `source` group: what every kind has. Each kind's option (`conf/source/<kind>.yaml`) types
    the group with its own subclass (registered in Hydra's ConfigStore as `<kind>_schema`), so it holds
    that kind's options only."""

    kind: str = MISSING
    """where documents come from: one of the registered kinds (`source=<kind>` sets it)"""

    # The kind whose options this class holds (None: the group's base, no kind chosen yet).
    for_kind: ClassVar[str | None] = None

    def __post_init__(self) -> None:
        chosen, own = self.kind, type(self).for_kind
        if own is not None and chosen not in (None, MISSING) and chosen != own:
            raise ConfigError(
                f"source.kind={chosen} does not fit the options of source={own}: choose the kind "
                f"with source={chosen}"
            )


@dataclass(frozen=True)
class Document:
    text: str
    origin: str


@dataclass(frozen=True)
class Part:
    """A contiguous slice of a source's document stream, readable on its own (picklable)."""

    kind: str  # how its source reads it: pydocs-topics | pydocs-modules | parquet | jsonl | json
    path: str = ""
    start: int = 0  # first module (pydocs), row (parquet) or byte (jsonl)
    stop: int = 0  # end of the slice, exclusive
    row: int = 0  # jsonl: the row number of the first line at `start` (for messages)
    column: str = "text"  # what a row's document is: its `text`, or a conversation's `messages`


@dataclass(frozen=True)
class PartSizes:
    """How big a part is. Any sizes give the same cache (parts only split the work); tasks of one
    multi-task prepare must use the same sizes, so their part files record them."""

    parquet_rows: int = 1024  # ~0.8M GPT-2 tokens of FineWeb; parts follow row groups
    jsonl_bytes: int = 4 << 20  # cut at line ends
    pydocs_modules: int = 16  # ~30 parts, parsed by the workers in parallel


class Source(Protocol):
    """One source kind: a frozen, picklable value (spawned prepare workers receive it)."""

    @property
    def kind(self) -> str:
        """`source.kind`: its registered name."""
        ...

    def identity(self) -> dict:
        """What identifies the documents (part of the cache identity); never how they are read."""
        ...

    def parts(self) -> Iterator[Part]:
        """The parts in stream order, lazily (a remote listing is not read ahead)."""
        ...

    def read(self, part: Part) -> Iterator[Document]:
        """The documents of one part, in order (blank ones included: the build counts and skips them)."""
        ...

    def describe(self) -> str:
        """The source in a message: `source=local (a.jsonl, b.parquet)`."""
        ...

    def is_small(self) -> bool:
        """Small enough that one process encodes it faster than prepare workers start."""
        ...


def documents(source: Source) -> Iterator[Document]:
    """Every document of the source in stream order: each part's documents, part after part."""
    for part in source.parts():
        yield from source.read(part)


def empty_file_error(path) -> SourceError:
    return SourceError(
        f"{path} has no documents (an empty file); remove it from source.files or give it rows with a "
        "`text` column"
    )


def unreadable_error(path, kind: str, error: BaseException) -> SourceError:
    return SourceError(f"{path}: cannot be read as {kind} ({type(error).__name__}: {error})")


def row_text(path, row_number: int, row, column: str = "text") -> str:
    """The document of one row (its `text`, or the canonical text of its `messages`), or the error
    that names the row and what it holds instead."""
    if not isinstance(row, dict) or column not in row:
        columns = sorted(row) if isinstance(row, dict) else type(row).__name__
        raise SourceError(f"{path}: row {row_number} has no `{column}` column (columns: {columns})")
    return column_value(path, row_number, row[column], column)


def column_value(path, row_number: int, text, column: str = "text") -> str:
    """A row's `text` (a string), or its `messages` as a conversation's canonical text."""
    if column == COLUMN:
        return conversation_text(text, f"{path}: row {row_number}")
    if not isinstance(text, str):
        raise SourceError(f"{path}: row {row_number}: `text` is {type(text).__name__}, not a string")
    return text
