"""Parquet files as parts: row ranges, read with pyarrow (only the `text` column), from a local path
or through an fsspec filesystem (the hub)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from ...errors import SourceError
from .base import Document, Part, column_value, empty_file_error, unreadable_error


def open_parquet(path: str, filesystem=None):
    import pyarrow.parquet as pq

    try:
        handle = filesystem.open(path, "rb") if filesystem is not None else path
        return pq.ParquetFile(handle)
    except Exception as error:
        raise unreadable_error(path, "parquet", error) from error


def parquet_parts(path: str, rows_per_part: int, filesystem=None) -> Iterator[Part]:
    """Row ranges of at most `rows_per_part` rows; small row groups are merged, big ones cut."""
    metadata = open_parquet(path, filesystem).metadata
    if metadata.num_rows == 0:
        raise empty_file_error(path)
    start = end = 0
    for group in range(metadata.num_row_groups):
        rows = metadata.row_group(group).num_rows
        pieces = max(1, -(-rows // rows_per_part))
        for piece in range(pieces):
            size = rows * (piece + 1) // pieces - rows * piece // pieces
            if end - start + size > rows_per_part and end > start:
                yield Part(kind="parquet", path=path, start=start, stop=end)
                start = end
            end += size
    if end > start:
        yield Part(kind="parquet", path=path, start=start, stop=end)


def _stat_key(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


class _ParquetReader:
    """The row groups a process reads, kept one at a time: consecutive parts of a big row group
    (which the same worker gets) decode it once."""

    def __init__(self):
        self.key: tuple | None = None
        self.file = None
        self.group: tuple[int, object] | None = None

    def texts(self, part: Part, filesystem=None) -> Iterator[tuple[int, object]]:
        key = (part.path, part.column, _stat_key(part.path) if filesystem is None else None)
        if key != self.key:
            self.key, self.file, self.group = key, open_parquet(part.path, filesystem), None
        parquet = self.file
        assert parquet is not None
        if part.column not in parquet.schema_arrow.names:
            raise SourceError(
                f"{part.path}: row {part.start} has no `{part.column}` column "
                f"(columns: {sorted(parquet.schema_arrow.names)})"
            )
        first = 0
        for group in range(parquet.metadata.num_row_groups):
            rows = parquet.metadata.row_group(group).num_rows
            lo, hi = max(part.start, first), min(part.stop, first + rows)
            if lo < hi:
                if self.group is None or self.group[0] != group:
                    try:
                        column = parquet.read_row_group(group, columns=[part.column]).column(part.column)
                    except Exception as error:
                        raise unreadable_error(part.path, "parquet", error) from error
                    self.group = (group, column)
                values = self.group[1].slice(lo - first, hi - lo).to_pylist()  # type: ignore[attr-defined]
                yield from enumerate(values, start=lo)
            first += rows
            if first >= part.stop:
                break


_READER = _ParquetReader()  # per process: a cache of the open file, not a setting


def read_parquet(part: Part, filesystem=None) -> Iterator[Document]:
    name = Path(part.path).name
    for row_number, value in _READER.texts(part, filesystem):
        text = column_value(part.path, row_number, value, part.column)
        yield Document(text=text, origin=f"{name}:{row_number}")
