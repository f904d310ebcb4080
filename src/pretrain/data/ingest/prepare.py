"""Verify and reuse the token cache, or build it: the one entry every command and rank goes through.

Reuse needs no write access to the cache (nor to its root): a complete cache is verified in place
(`cache.verify`: quick by default, see cache.py) and its verified record goes where this user can write.
Only a build takes the file lock beside the cache (`<root>/<key>.lock`): one process builds while the
others wait and then reuse. The build (`build.build_cache`) writes into a private temporary directory
that is renamed into place only when every file and the manifest are complete and synced, so a crash
or kill at any moment leaves nothing that passes verification, and a rerun starts clean.
"""

from __future__ import annotations

import errno
import os
import shutil
import sys
from pathlib import Path

from filelock import FileLock, Timeout

from ...errors import CacheError
from ...fileio import fsync_dir
from ..files import writable_dir
from .builder import build_cache
from .cache import REBUILD_HINT, Cache, CacheSpec, manifest_checksum, read_manifest, write_manifest
from .verify import Verification, check_cache, record_built
from .writer import SplitWriter


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def verify_existing(spec: CacheSpec, mode: str | None = None) -> Verification:
    """Verify the cache of `spec` in place (no write to it): `mode` defaults to `spec.verify`."""
    if not spec.directory.exists():
        raise CacheError(f"no cache at {spec.directory}; build it with `pretrain prepare` (same overrides)")
    return check_cache(spec.directory, spec.identity, mode or spec.verify)


def prepare_cache(spec: CacheSpec, *, progress: bool = True) -> Cache:
    """The verified cache of `spec`: reused if it verifies, built if absent, never used if corrupt."""
    if spec.directory.exists() and (cache := _reuse(spec)) is not None:
        return cache
    return _build(spec, progress=progress)


def _open(spec: CacheSpec) -> Cache:
    verification = check_cache(spec.directory, spec.identity, spec.verify)
    return Cache(directory=spec.directory, manifest=verification.manifest)


def _reuse(spec: CacheSpec) -> Cache | None:
    """The existing cache if it verifies; None when it does not and cache.rebuild allows building anew."""
    try:
        return _open(spec)
    except CacheError as error:
        if not spec.rebuild:
            raise
        _log(f"rebuilding: {error}")
        return None


def _build(spec: CacheSpec, *, progress: bool) -> Cache:
    key, root, directory = spec.key, spec.root, spec.directory
    if not root.exists():  # e.g. a run started from another directory: say why it tokenizes anew
        _log(
            f"note: new cache root {root} (a relative cache_root is under the working directory); "
            "to reuse another cache, run from its project or set cache_root=DIR (or PRETRAIN_CACHE_ROOT)"
        )
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise CacheError(
            f"no cache {key} under {root}, and it cannot be created there ({error.strerror}); "
            "set cache_root (or PRETRAIN_CACHE_ROOT) to a writable directory, or build it there first"
        ) from error
    if not writable_dir(root):
        what = "the cache failed verification (above)" if directory.exists() else "no cache"
        raise CacheError(
            f"{what} {key} under {root}, and {root} is not writable: build it where you can write "
            "(cache_root=... or PRETRAIN_CACHE_ROOT=...) or ask the root's owner to `pretrain prepare` it"
        )
    lock = FileLock(str(root / f"{key}.lock"))
    try:
        lock.acquire(timeout=0.5)
    except Timeout:
        _log(f"waiting for another process building this cache (lock {lock.lock_file}) ...")
        lock.acquire()
    try:
        if directory.exists():
            # Built (or repaired) by another process while we waited, or still bad.
            if (cache := _reuse(spec)) is not None:
                return cache
            _discard(directory, root)
        for stale in [*root.glob(f".{key}.tmp-*"), *root.glob(f".{key}.trash-*")]:
            # We hold the lock, so any temporary build (or half-deleted bad cache) of this identity is
            # a dead process's leftover.
            shutil.rmtree(stale, ignore_errors=True)
        tmp = root / f".{key}.tmp-{os.getpid()}"
        try:
            tmp.mkdir()
            manifest = _complete_manifest(spec, tmp, build_cache(spec, tmp, progress=progress))
            fsync_dir(tmp)
            os.rename(tmp, directory)
            fsync_dir(root)
        except BaseException as error:
            # Any exception (a full disk, Ctrl-C, a preemption raised by a signal handler): nothing
            # half-built stays; the workers are already stopped (the build closes them first).
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(error, OSError):
                raise _write_error(error, root) from None
            raise
        # Every file was hashed as it was written: the next start only compares stats.
        record_built(directory, manifest)
        return Cache(directory=directory, manifest=manifest)
    finally:
        lock.release()


def _write_error(error: OSError, root: Path) -> CacheError:
    """An OSError of the build (a full disk, a permission) as one line: what failed, where, what to do."""
    where = Path(error.filename) if error.filename else root
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        hint = "free space there or set cache_root (or PRETRAIN_CACHE_ROOT) to a file system with room"
    elif error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        hint = "make it writable or set cache_root (or PRETRAIN_CACHE_ROOT) to a writable directory"
    else:
        hint = "fix the file system (or set cache_root elsewhere)"
    doing = "writing" if where.is_relative_to(root) else "at"
    return CacheError(
        f"building the cache failed {doing} {where}: {error.strerror or error}; nothing was kept: {hint}, "
        "then rerun"
    )


def _complete_manifest(spec: CacheSpec, directory: Path, manifest: dict) -> dict:
    """The built manifest with the top-level `token_dtype` (a build that wrote it already is left as is),
    checked like any cache's manifest so that a build never renames a cache reuse would refuse."""
    if manifest.get("token_dtype") != spec.identity["dtype"] or "format" not in manifest:
        manifest = {**manifest, "format": spec.identity["format"], "token_dtype": spec.identity["dtype"]}
        manifest.pop("checksum", None)
        manifest["checksum"] = manifest_checksum(manifest)
        write_manifest(directory, manifest)
    for split, entry in manifest["splits"].items():
        written = entry.get("token_dtype", spec.identity["dtype"])
        if written != spec.identity["dtype"]:
            raise CacheError(
                f"the build wrote {split} tokens as {written}, the identity says {spec.identity['dtype']}: "
                "pass token_dtype=spec.token_dtype to SplitWriter"
            )
    return read_manifest(directory, spec.identity)


def _discard(directory: Path, root: Path) -> None:
    """Move a bad cache out of the way atomically, then delete it."""
    trash = root / f".{directory.name}.trash-{os.getpid()}"
    os.rename(directory, trash)
    shutil.rmtree(trash, ignore_errors=True)


__all__ = [
    "CacheError",
    "REBUILD_HINT",
    "SplitWriter",
    "build_cache",
    "prepare_cache",
    "verify_existing",
]
