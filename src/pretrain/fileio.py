"""Writing files so that a crash never leaves a half-written one, and hashing them: the one owner of
temp-file + fsync + rename, directory fsync and file sha256 (a leaf module: imports nothing of ours).

`atomic_write(path)` yields a handle on a temporary file beside `path` (same directory, so the rename
is atomic on POSIX), then fsyncs it, renames it over `path` and fsyncs the directory. On any error the
temporary file is removed and the error propagates: `path` is either the old file or the new one.
Temporaries are named `.<name>.<pid>.<random>.tmp`; `remove_stale_temporaries` deletes those a killed
writer left behind (a process that no longer exists).
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

TEMP_SUFFIX = ".tmp"
_TEMP_NAME = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.[0-9a-f]{8}\.tmp$")


def temporary_path(path: Path) -> Path:
    """Where a write of `path` is staged: a hidden file beside it naming the writing process."""
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}{TEMP_SUFFIX}")


def fsync_dir(directory: Path | str) -> None:
    """Make a rename or a new file in `directory` durable (best effort where a file system refuses)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def atomic_write(
    path: Path | str, mode: str = "wb", *, perm: int = 0o644, **open_kwargs: Any
) -> Iterator[IO]:
    """Write `path` atomically: yield a handle on a temporary sibling; on success fsync, chmod to
    `perm` (like the files a plain `open` makes under the usual umask), rename over `path` and fsync
    the directory; on failure remove the temporary and re-raise."""
    path = Path(path)
    tmp = temporary_path(path)
    try:
        with open(tmp, mode, **open_kwargs) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, perm)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_bytes_atomic(path: Path | str, data: bytes, *, perm: int = 0o644) -> None:
    with atomic_write(path, "wb", perm=perm) as handle:
        handle.write(data)


def write_text_atomic(path: Path | str, text: str, *, perm: int = 0o644) -> None:
    with atomic_write(path, "w", perm=perm, encoding="utf-8") as handle:
        handle.write(text)


def sha256_file(path: Path | str, block_size: int = 1 << 22) -> str:
    """sha256 hex digest of a file, read in blocks (memory does not grow with the file)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(block_size), b""):
            digest.update(block)
    return digest.hexdigest()


def process_alive(pid: int) -> bool:
    """Whether process `pid` exists (ours counts): a temporary or lock naming a gone one is stale."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temporaries(directory: Path | str) -> list[Path]:
    """Delete the temporaries of `atomic_write` in `directory` whose writer is gone (killed mid-write,
    e.g. on a full disk); returns what was removed. Another live process's temporaries are kept."""
    removed: list[Path] = []
    try:
        entries = list(Path(directory).iterdir())
    except OSError:
        return removed
    for entry in entries:
        match = _TEMP_NAME.match(entry.name)
        if match and int(match["pid"]) != os.getpid() and not process_alive(int(match["pid"])):
            try:
                entry.unlink()
            except OSError:
                continue
            removed.append(entry)
    return removed
