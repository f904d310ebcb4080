"""Verify and reuse the token cache, or build it: the one entry every command and rank goes through.

The build (`build.build_cache`) writes into a private temporary directory that is renamed into place
only when every file and the manifest are complete and synced, so a crash or kill at any moment leaves
nothing that passes verification, and a rerun starts clean. A file lock per identity lets one process
build while another waits and then reuses.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from filelock import FileLock, Timeout

from ..errors import CacheError
from .build import BATCH_CHARS, build_cache
from .cache import REBUILD_HINT, Cache, CacheSpec, open_cache
from .writer import SplitWriter


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def prepare_cache(spec: CacheSpec, *, progress: bool = True) -> Cache:
    """The verified cache of `spec`: reused if it verifies, built if absent, never used if corrupt."""
    identity, key, root, directory = spec.identity, spec.key, spec.root, spec.directory
    root.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(root / f"{key}.lock"))
    try:
        lock.acquire(timeout=0.5)
    except Timeout:
        _log(f"waiting for another process building this cache (lock {lock.lock_file}) ...")
        lock.acquire()
    try:
        if directory.exists():
            try:
                return open_cache(directory, identity)
            except CacheError as error:
                if not spec.rebuild:
                    raise
                _log(f"rebuilding: {error}")
                _discard(directory, root)
        for stale in [*root.glob(f".{key}.tmp-*"), *root.glob(f".{key}.trash-*")]:
            # We hold the lock, so any temporary build (or half-deleted bad cache) of this identity is
            # a dead process's leftover.
            shutil.rmtree(stale, ignore_errors=True)
        tmp = root / f".{key}.tmp-{os.getpid()}"
        tmp.mkdir()
        try:
            manifest = build_cache(spec, tmp, progress=progress)
            _fsync_dir(tmp)
            os.rename(tmp, directory)
            _fsync_dir(root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return Cache(directory=directory, manifest=manifest)
    finally:
        lock.release()


def _discard(directory: Path, root: Path) -> None:
    """Move a bad cache out of the way atomically, then delete it."""
    trash = root / f".{directory.name}.trash-{os.getpid()}"
    os.rename(directory, trash)
    shutil.rmtree(trash, ignore_errors=True)


__all__ = ["BATCH_CHARS", "CacheError", "REBUILD_HINT", "SplitWriter", "build_cache", "prepare_cache"]
