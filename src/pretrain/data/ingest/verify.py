"""Is a cache directory the one its manifest describes: sizes, sha256 (quick: only what changed since
the verified record; full: every file) and the split indexes; the verified record written after a
check (`record_built`, `verify_cache`, `open_cache`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...errors import CacheError
from ..files import (
    ensure_dir,
    file_stat,
    read_json,
    sha256_file,
    state_dir,
    wait_until_settled,
    writable_dir,
    write_json_atomic,
)
from ..index import REBUILD_HINT, read_index, read_index_array
from ..tokens import EOS_TOKEN_ID
from .cache import RECORD, SPLITS, Cache, _place_name, is_masked, manifest_files, read_manifest
from .writer import split_files


@dataclass
class Verification:
    """What a verification checked: returned by `check_cache`, printed by `pretrain verify`."""

    directory: Path
    manifest: dict
    mode: str
    hashed: list[str] = field(default_factory=list)  # files re-hashed now
    trusted: list[str] = field(default_factory=list)  # files whose stat matched the verified record
    index_checked: bool = False  # the indexes' consistency was checked now
    record: Path | None = None  # where the verified record is (None: nowhere writable)
    seconds: float = 0.0


def record_path(directory: Path, key: str) -> Path | None:
    """Where the verified record of the cache at `directory` lives: inside it when writable, else in the
    per-user state (keyed by the cache's absolute path and key); None if neither can be written."""
    directory = Path(directory).resolve()
    if writable_dir(directory):
        return directory / RECORD
    place = state_dir() / "verified"
    return place / f"{_place_name(directory, key)}.json" if ensure_dir(place) else None


def _load_record(path: Path | None, directory: Path, manifest: dict) -> dict:
    """The record's files (name -> stat + sha256) when it belongs to this directory and manifest."""
    record = read_json(path) if path is not None else None
    if (
        not record
        or record.get("directory") != str(Path(directory).resolve())
        or record.get("checksum") != manifest["checksum"]
        or not isinstance(record.get("files"), dict)
    ):
        return {"files": {}, "full_ns": 0}
    return record


def _lock(path: Path | None):
    from contextlib import nullcontext

    from filelock import FileLock

    return FileLock(str(path) + ".lock") if path is not None else nullcontext()


def check_cache(directory: Path, identity: dict | None = None, mode: str = "full") -> Verification:
    """Verify the cache at `directory` (see the module docstring for `full` and `quick`).

    Returns what was checked; raises CacheError naming the first problem and how to rebuild.
    """
    started = time.perf_counter()
    asked_ns = time.time_ns()
    directory = Path(directory).resolve()
    mode = "full" if mode == "full" else "quick"
    manifest = read_manifest(directory, identity)
    result = Verification(directory=directory, manifest=manifest, mode=mode)
    for _, _, entry in manifest_files(manifest):
        _check_size(directory / entry["name"], entry["bytes"])
    path = record_path(directory, manifest["key"])
    result.record = path
    record = _load_record(path, directory, manifest)
    if mode == "quick" and record["files"] and not _stale(directory, manifest, record):
        result.trusted = [entry["name"] for _, _, entry in manifest_files(manifest)]
        result.seconds = time.perf_counter() - started
        return result
    # Something to hash: one process per place does it, the others wait and read its fresh record.
    with _lock(path):
        record = _load_record(path, directory, manifest)
        stale = _stale(directory, manifest, record)
        if mode == "quick" and record["files"] and not stale:
            result.trusted = [entry["name"] for _, _, entry in manifest_files(manifest)]
        elif mode == "full" and not stale and record.get("full_ns", 0) >= asked_ns:
            # Another rank finished a full verification after this one asked for it.
            result.trusted = [entry["name"] for _, _, entry in manifest_files(manifest)]
        else:
            full = mode == "full" or not record["files"]
            todo = [e for _, _, e in manifest_files(manifest)] if full else stale
            files = dict(record["files"]) if not full else {}
            for entry in todo:
                files[entry["name"]] = _hash_checked(directory, entry)
                result.hashed.append(entry["name"])
            result.trusted = [
                e["name"] for _, _, e in manifest_files(manifest) if e["name"] not in result.hashed
            ]
            if full:
                for split in SPLITS:
                    check_index(directory, split, manifest)
                result.index_checked = True
            new = {
                "directory": str(directory),
                "key": manifest["key"],
                "checksum": manifest["checksum"],
                "files": files,
                "full_ns": time.time_ns() if full else record.get("full_ns", 0),
            }
            if path is not None and not write_json_atomic(path, new):
                result.record = None
    result.seconds = time.perf_counter() - started
    return result


def _check_size(path: Path, expected: int) -> None:
    if not path.is_file():
        raise CacheError(f"{path} is missing; {REBUILD_HINT}")
    size = path.stat().st_size
    if size != expected:
        raise CacheError(
            f"{path} has {size} bytes, the manifest says {expected} (truncated or appended); {REBUILD_HINT}"
        )


def _stale(directory: Path, manifest: dict, record: dict) -> list[dict]:
    """The manifest's file entries whose current stat (or recorded digest) differs from the record."""
    stale = []
    for _, _, entry in manifest_files(manifest):
        known = record["files"].get(entry["name"])
        if (
            not isinstance(known, dict)
            or known.get("sha256") != entry["sha256"]
            or known.get("stat") != file_stat(directory / entry["name"])
        ):
            stale.append(entry)
    return stale


def _hash_checked(directory: Path, entry: dict) -> dict:
    """Hash one file; its stat is taken before and after, so a write during hashing is not recorded."""
    path = directory / entry["name"]
    wait_until_settled([path])
    before = file_stat(path)
    if sha256_file(path) != entry["sha256"]:
        raise CacheError(f"{path} does not match its sha256 in the manifest (corrupted); {REBUILD_HINT}")
    after = file_stat(path)
    return {"stat": after if after == before else None, "sha256": entry["sha256"]}


def check_index(directory: Path, split: str, manifest: dict) -> None:
    """The JSONL index and its binary twin must agree and tile the token file exactly, one EOS
    closing each document (a full check: it parses the JSONL and reads each document's last token)."""
    entry = manifest["splits"][split]
    names = split_files(split, is_masked(manifest))
    dtype = np.dtype(manifest["token_dtype"]).newbyteorder("<")
    index_path = directory / names["index"]
    ids, offsets, lengths = read_index(index_path)
    problem = None
    if len(ids) != entry["documents"]:
        problem = f"{len(ids)} documents, the manifest says {entry['documents']}"
    elif int(lengths.sum()) != entry["tokens"]:
        problem = f"{int(lengths.sum())} tokens in the index, the manifest says {entry['tokens']}"
    elif (directory / names["bin"]).stat().st_size != dtype.itemsize * entry["tokens"]:
        problem = f"the token file does not hold {entry['tokens']} {dtype.name} tokens"
    elif "mask" in names and (directory / names["mask"]).stat().st_size != entry["tokens"]:
        problem = f"the loss-mask file does not hold one byte for each of {entry['tokens']} tokens"
    elif len(lengths) and (lengths.min() < 2 or not np.array_equal(offsets, np.cumsum(lengths) - lengths)):
        problem = "offsets and lengths do not tile the token file"
    if problem is None:
        array_offsets, array_lengths = read_index_array(directory / names["index_npy"], len(ids), mmap=False)
        if not (np.array_equal(array_offsets, offsets) and np.array_equal(array_lengths, lengths)):
            problem = f"{names['index_npy']} does not agree with the JSONL index"
    if problem is None and len(lengths):
        tokens = np.memmap(directory / names["bin"], dtype=dtype, mode="r")
        eos = (manifest.get("identity") or {}).get("eos_token_id", EOS_TOKEN_ID)
        if not np.all(tokens[offsets + lengths - 1] == eos):
            problem = "a document does not end with EOS"
    if problem:
        raise CacheError(f"{index_path}: {problem}; {REBUILD_HINT}")


def record_built(directory: Path, manifest: dict) -> Path | None:
    """After a build (every file hashed as it was written, the index written consistent): the verified
    record, so that the next start checks stats only."""
    directory = Path(directory).resolve()
    path = record_path(directory, manifest["key"])
    if path is None:
        return None
    wait_until_settled([directory / entry["name"] for _, _, entry in manifest_files(manifest)])
    files = {
        entry["name"]: {"stat": file_stat(directory / entry["name"]), "sha256": entry["sha256"]}
        for _, _, entry in manifest_files(manifest)
    }
    record = {
        "directory": str(directory),
        "key": manifest["key"],
        "checksum": manifest["checksum"],
        "files": files,
        "full_ns": time.time_ns(),
    }
    return path if write_json_atomic(path, record) else None


def verify_cache(directory: Path, identity: dict | None = None, mode: str = "full") -> dict:
    """Check the manifest, the identity and every file (`full`: sizes, sha256, index consistency;
    `quick`: sizes and stats against the verified record, re-hashing what changed). Returns the manifest;
    raises CacheError naming the first problem and how to rebuild."""
    return check_cache(directory, identity, mode).manifest


def open_cache(directory: Path, identity: dict | None = None, mode: str = "full") -> Cache:
    return Cache(directory=Path(directory), manifest=verify_cache(directory, identity, mode))
