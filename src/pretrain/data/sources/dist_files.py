"""What source=pkgdocs reads of an installed distribution, and how, since none of it is trusted: a
RECORD row names any path (`../x.md` is outside the site directory, a FIFO blocks, a link to /dev/zero
never ends) and its metadata files may not be text.

`read_file` reads only regular files inside the site directory, at most MAX_FILE_BYTES each (else
None: not part of the corpus). `metadata_of` / `files_of` give METADATA's and RECORD's contents, or
one SourceError naming the file that is not UTF-8 text or cannot be parsed."""

from __future__ import annotations

import csv
import importlib.metadata
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ...errors import SourceError

MAX_FILE_BYTES = 16 << 20
"""A larger file is not read (generated, not prose): the project's .venv's largest read is 2.2 MB."""


def read_file(site: Path, relative: str) -> bytes | None:
    """The bytes of `relative` under `site`, or None when it resolves outside `site`, is not a regular
    file, is over MAX_FILE_BYTES, or cannot be read (removed since RECORD listed it)."""
    try:
        root = site.resolve()
        path = (root / relative).resolve()
        if not path.is_relative_to(root):
            return None
        # Non-blocking: opening a FIFO does not wait for a writer; fstat then says what was opened.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except (OSError, RuntimeError, ValueError):  # RuntimeError: a symlink loop (older Pythons)
        return None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_FILE_BYTES:
        os.close(fd)
        return None
    with os.fdopen(fd, "rb") as handle:
        try:
            data = handle.read(MAX_FILE_BYTES + 1)
        except OSError:
            return None
    return data if len(data) <= MAX_FILE_BYTES else None  # grew while read


def _where(dist: importlib.metadata.Distribution) -> str:
    """The distribution's metadata directory (its *.dist-info), as messages name it."""
    return str(getattr(dist, "_path", None) or dist.locate_file(""))


@contextmanager
def _readable(dist: importlib.metadata.Distribution, name: str) -> Iterator[None]:
    """One SourceError naming `<dist-info>/<name>` for a metadata file importlib cannot read as text."""
    try:
        yield
    except UnicodeDecodeError as error:
        raise SourceError(
            f"source=pkgdocs: {_where(dist)}/{name} is not UTF-8 text (byte {error.start}: {error.reason}); "
            "reinstall that distribution, or read a site directory without it (source.path)"
        ) from None
    except (csv.Error, TypeError, ValueError) as error:  # e.g. a RECORD row importlib cannot take apart
        raise SourceError(
            f"source=pkgdocs: {_where(dist)}/{name} cannot be parsed ({type(error).__name__}: "
            f"{str(error)[:120]}); reinstall that distribution"
        ) from None


def metadata_of(dist: importlib.metadata.Distribution) -> Any:
    """The distribution's METADATA (an email.message.Message), read as UTF-8 text or refused."""
    with _readable(dist, "METADATA"):
        return dist.metadata


def files_of(dist: importlib.metadata.Distribution) -> list[importlib.metadata.PackagePath]:
    """The files its RECORD lists (none without one), read as UTF-8 CSV or refused."""
    with _readable(dist, "RECORD"):
        return list(dist.files or ())
