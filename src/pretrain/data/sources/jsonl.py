"""JSON lines files as parts: byte ranges cut at line ends (a file that is one JSON array is one part)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from ...errors import SourceError
from .base import Document, Part, empty_file_error, row_text, unreadable_error

_SCAN_BLOCK = 16 << 20


def _open(path: str):
    try:
        return open(path, "rb")
    except OSError as error:  # unreadable (permissions, removed meanwhile): the file's error, one line
        raise unreadable_error(path, "JSON lines", error) from error


def jsonl_parts(path: str, bytes_per_part: int) -> Iterator[Part]:
    """Byte ranges of about `bytes_per_part`, each ending at a line end (one pass also counts the
    lines, so that messages name the row). A file that is one JSON array is one part."""
    with _open(path) as handle:
        if handle.read(4096).lstrip().startswith(b"["):
            yield Part(kind="json", path=path)
            return
        handle.seek(0)
        start = start_row = rows = offset = 0
        content = False
        next_cut = bytes_per_part
        while block := handle.read(_SCAN_BLOCK):
            content = content or bool(block.strip())
            counted = 0  # bytes of this block whose line ends are counted in `rows`
            while next_cut - 1 - offset < len(block):
                newline = block.find(b"\n", max(next_cut - 1 - offset, counted))
                if newline < 0:
                    break
                rows += block.count(b"\n", counted, newline + 1)
                counted = newline + 1
                yield Part(kind="jsonl", path=path, start=start, stop=offset + counted, row=start_row)
                start, start_row = offset + counted, rows
                next_cut = start + bytes_per_part
            rows += block.count(b"\n", counted)
            offset += len(block)
    if not content:
        raise empty_file_error(path)
    if offset > start:
        yield Part(kind="jsonl", path=path, start=start, stop=offset, row=start_row)


def read_jsonl(part: Part) -> Iterator[Document]:
    name = Path(part.path).name
    with _open(part.path) as handle:
        handle.seek(part.start)
        data = handle.read(part.stop - part.start)
    for row_number, line in enumerate(data.split(b"\n"), start=part.row):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as error:
            raise SourceError(
                f"{part.path}: cannot be read as JSON lines "
                f"(row {row_number}: {type(error).__name__}: {error})"
            ) from error
        text = row_text(part.path, row_number, row, part.column)
        if b"\\ud" in line or b"\\uD" in line:  # an escaped surrogate: only a pair is text
            try:
                text.encode()
            except UnicodeEncodeError as error:
                raise SourceError(
                    f"{part.path}: cannot be read as JSON lines (row {row_number}: `text` holds a lone "
                    f"surrogate, not Unicode text: {error})"
                ) from error
        yield Document(text=text, origin=f"{name}:{row_number}")


def read_json_array(part: Part) -> Iterator[Document]:
    name = Path(part.path).name
    with _open(part.path) as handle:
        data = handle.read()
    try:
        rows = json.loads(data)
    except ValueError as error:
        raise unreadable_error(part.path, "JSON", error) from error
    if not isinstance(rows, list):
        raise SourceError(f"{part.path}: a JSON file must hold one array of rows or JSON lines")
    for row_number, row in enumerate(rows):
        text = row_text(part.path, row_number, row, part.column)
        try:
            text.encode()
        except UnicodeEncodeError as error:
            raise SourceError(
                f"{part.path}: row {row_number}: `text` is not Unicode text ({error})"
            ) from error
        yield Document(text=text, origin=f"{name}:{row_number}")
