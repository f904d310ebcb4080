"""The verified token cache: layout, identity, manifest, verification and opening.

<cache_root>/<key>/ holds, per split, a `.bin` of document tokens (`token_dtype`: uint16 when the
tokenizer's ids fit, else uint32; EOS after each document), its `.jsonl` index {"id", "offset",
"length"} and the same offsets and lengths as `<split>.index.npy` (what training loads: no JSON), plus
`manifest.json` with the identity, the token dtype, per-split counts and the sha256 of every file.
`<key>` hashes the identity; max_seq_len, the policy and batch settings are not part of it, so one cache
serves them all. A cache that fails verification is never used silently.

Verification: `full` hashes every file and checks that the index tiles the token file (done when a
cache is built, with `cache.verify=full` and by `pretrain verify`); `quick` (the default on reuse)
checks the manifest, the sizes and each file's stat against a *verified record* written after a full
check, and re-hashes only the files whose stat changed (a write changes mtime and ctime, a copy the
inode). The record lives in the cache directory when it is writable, else in the per-user state
directory; it is written under a lock there, so ranks starting together hash at most once and the
others read the fresh record. Nothing of a complete cache is ever written: it can be read-only.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..errors import CacheError, ConfigError
from .files import (
    ensure_dir,
    file_stat,
    read_json,
    sha256_file,
    state_dir,
    wait_until_settled,
    writable_dir,
    write_json_atomic,
)
from .index import REBUILD_HINT, read_index, read_index_array
from .prepare_settings import PrepareSettings
from .sources import source_identity
from .tokenizer import TokenizerFiles
from .tokenizer_json import TokenizerJson, resolve_tokenizer
from .tokens import EOS_TOKEN_ID, DocumentIds, TokenSplit
from .writer import TOKEN_DTYPES, split_files

if TYPE_CHECKING:
    from ..config import BudgetConfig, Config, SourceConfig, SplitConfig, TokenizerConfig

FORMAT_VERSION = 2  # 2: token_dtype (uint16|uint32), <split>.index.npy
SPLITS = ("train", "validation")
MANIFEST = "manifest.json"
RECORD = ".verified.json"  # the verified record inside a writable cache directory
UINT16_IDS = 1 << 16


def cache_root(configured: str | None) -> Path:
    """Where caches live: env PRETRAIN_CACHE_ROOT, else `cache_root` (relative to the working directory).
    A file at that path (or above it) is a ConfigError naming the setting."""
    from_env = os.environ.get("PRETRAIN_CACHE_ROOT")
    root = Path(from_env or configured or "data-cache").expanduser().resolve()
    setting = "PRETRAIN_CACHE_ROOT" if from_env else "cache_root"
    for path in (root, *root.parents):
        if path.exists():
            if not path.is_dir():
                what = "is a file" if path == root else f"is inside the file {path}"
                raise ConfigError(f"{setting}={root} {what}; point it at a directory")
            break
    return root


@functools.lru_cache(maxsize=8)
def _max_token_id(vocab: str, size: int, mtime_ns: int) -> int:
    """The largest id of a vocabulary file (memoised on its stat)."""
    values = json.loads(Path(vocab).read_text(encoding="utf-8")).values()
    return max((int(v) for v in values), default=0)


def max_token_id(files: TokenizerFiles) -> int:
    """The largest id the tokenizer can produce: its vocabulary's, and EOS (added as a special token)."""
    if isinstance(files, TokenizerJson):
        return files.max_token_id()
    st = files.vocab.stat()
    return max(_max_token_id(str(files.vocab), st.st_size, st.st_mtime_ns), EOS_TOKEN_ID)


def resolve_token_dtype(setting: str, files: TokenizerFiles) -> str:
    """`cache.token_dtype`: auto = uint16 when every id fits below 65,536, else uint32."""
    setting = str(setting)
    if setting not in ("auto", *TOKEN_DTYPES):
        raise ConfigError(f"cache.token_dtype={setting!r} is not one of auto, uint16, uint32")
    largest = max_token_id(files)
    if setting == "auto":
        return "uint16" if largest < UINT16_IDS else "uint32"
    if setting == "uint16" and largest >= UINT16_IDS:
        raise ConfigError(
            f"cache.token_dtype=uint16 cannot hold this tokenizer's ids (up to {largest:,}, {files.vocab}); "
            "set cache.token_dtype=auto or uint32"
        )
    return setting


def cache_identity(
    source: SourceConfig,
    tokenizer: TokenizerConfig,
    tokenizer_files: TokenizerFiles,
    split: SplitConfig,
    budget: BudgetConfig,
    token_dtype: str = "uint32",
) -> dict:
    """Everything that decides the cache's bytes, and nothing else. A tokenizer.json adds its kind and
    EOS text (GPT-2's identity keeps exactly its keys: its caches keep their keys)."""
    json_file = tokenizer_files if isinstance(tokenizer_files, TokenizerJson) else None
    extra = json_file.identity() if json_file else {}
    return {
        "format": FORMAT_VERSION,
        "source": source_identity(source),
        "tokenizer": {
            "name": tokenizer.name,
            "revision": tokenizer.revision,
            # What makes the ids: other vocabulary or merges files must never reuse this cache.
            "content_sha256": tokenizer_files.content_sha256(),
            **extra,
        },
        "split": {"seed": int(split.seed), "validation_fraction": float(split.validation_fraction)},
        "budget": {"train_tokens": budget.train_tokens, "validation_tokens": budget.validation_tokens},
        "dtype": token_dtype,
        "eos_token_id": json_file.eos_token_id if json_file else EOS_TOKEN_ID,
    }


@dataclass(frozen=True)
class CacheSpec:
    """The cache a config asks for, computed once per process: its identity (which hashes every local
    source file), its directory, what building it reads, and how reuse verifies it."""

    root: Path
    identity: dict
    key: str
    source: SourceConfig
    tokenizer_files: TokenizerFiles
    rebuild: bool = False
    verify: str = "quick"
    prepare: PrepareSettings = field(default_factory=PrepareSettings)  # how a build runs, not what it holds

    @property
    def directory(self) -> Path:
        return self.root / self.key

    @property
    def token_dtype(self) -> np.dtype:
        """The numpy dtype of the tokens (SplitWriter's `token_dtype`)."""
        return np.dtype(self.identity["dtype"]).newbyteorder("<")

    @classmethod
    def from_config(cls, config: Config) -> CacheSpec:
        """The cache of the run's one `source` (a run without a mixture)."""
        return cls.for_source(config, config.source, config.budget)

    @classmethod
    def for_source(cls, config: Config, source: SourceConfig, budget: BudgetConfig) -> CacheSpec:
        """The cache of `source` under `budget` with the rest of `config` (tokenizer, split, cache
        settings): the run's source, or a mixture component's (each its own identity and directory)."""
        root = cache_root(config.cache_root)
        verify = str(config.cache.verify)  # quick | full: the schema's enum refused anything else
        tokenizer_files = resolve_tokenizer(config.tokenizer)
        dtype = resolve_token_dtype(config.cache.token_dtype, tokenizer_files)
        identity = cache_identity(source, config.tokenizer, tokenizer_files, config.split, budget, dtype)
        return cls(
            root=root,
            identity=identity,
            key=identity_key(identity),
            source=source,
            tokenizer_files=tokenizer_files,
            rebuild=bool(config.cache.rebuild),
            verify=verify,
            prepare=PrepareSettings.from_config(config.prepare),
        )


def canonical_json(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _leaves(value, key: str = "") -> dict[str, object]:
    """`{"a": {"b": 1}, "c": [x, y]}` -> `{"a.b": 1, "c[0]": x, "c[1]": y}`."""
    if isinstance(value, dict) and value:
        return {
            k: v
            for name, item in value.items()
            for k, v in _leaves(item, f"{key}.{name}" if key else name).items()
        }
    if isinstance(value, list) and value:
        return {k: v for i, item in enumerate(value) for k, v in _leaves(item, f"{key}[{i}]").items()}
    return {key: value}


ABSENT = object()
SHOWN_CHARS = 72
"""A value in an identity difference is cut here (a sha256 stays whole)."""


def identity_differences(old, new) -> list[str]:
    """Only the identity entries that differ, `key: old -> new` (JSON values, `absent` for a key one
    side lacks): what a mismatch error names instead of two whole identities."""

    def shown(value) -> str:
        text = "absent" if value is ABSENT else json.dumps(value, sort_keys=True)
        return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "…"

    before, after = _leaves(old), _leaves(new)
    keys = [*before, *(k for k in after if k not in before)]
    return [
        f"{key or 'identity'}: {shown(before.get(key, ABSENT))} -> {shown(after.get(key, ABSENT))}"
        for key in keys
        if before.get(key, ABSENT) != after.get(key, ABSENT)
    ]


def identity_key(identity: dict) -> str:
    return hashlib.sha256(canonical_json(identity).encode()).hexdigest()[:20]


def manifest_checksum(manifest: dict) -> str:
    """sha256 over the manifest without its own checksum: an edited manifest is detected."""
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    return hashlib.sha256(canonical_json(body).encode()).hexdigest()


def new_manifest(spec: CacheSpec, splits: dict, build: dict) -> dict:
    """The manifest of a freshly built cache (`splits`: SplitWriter.close() per split), checksummed."""
    manifest = {
        "format": FORMAT_VERSION,
        "key": spec.key,
        "identity": spec.identity,
        "token_dtype": spec.identity["dtype"],
        "splits": splits,
        "build": build,
    }
    manifest["checksum"] = manifest_checksum(manifest)
    return manifest


def write_manifest(directory: Path, manifest: dict) -> None:
    """Write (and fsync) `manifest.json`: the last file of a build."""
    with open(Path(directory) / MANIFEST, "w") as handle:
        json.dump(manifest, handle, indent=2)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())


def disk_bytes(directory: Path | str) -> int:
    """Bytes of every file under a cache directory (tokens, indexes, manifest, side files)."""
    return sum(p.stat().st_size for p in Path(directory).rglob("*") if p.is_file())


@dataclass(frozen=True)
class Cache:
    directory: Path
    manifest: dict

    @property
    def token_dtype(self) -> np.dtype:
        return np.dtype(self.manifest["token_dtype"]).newbyteorder("<")

    @property
    def packs_dir(self) -> Path:
        """Offline packs (prepacked policy) live beside the verified files, keyed by their settings; for
        a read-only cache, in the per-user state directory (`$PRETRAIN_STATE_DIR/packs/<key>-<path>`)."""
        if writable_dir(self.directory):
            return self.directory / "packs"
        return state_dir() / "packs" / _place_name(self.directory, self.manifest.get("key", ""))

    def split(self, name: str) -> TokenSplit:
        if name not in SPLITS:
            raise ConfigError(f"split must be one of {SPLITS}, got {name!r}")
        names = split_files(name)
        documents = int(self.manifest["splits"][name]["documents"])
        offsets, lengths = read_index_array(self.directory / names["index_npy"], documents)
        path = self.directory / names["bin"]
        dtype = self.token_dtype
        tokens = np.memmap(path, dtype=dtype, mode="r") if path.stat().st_size else np.zeros(0, dtype)
        ids = DocumentIds(self.directory / names["index"], documents)
        eos = int((self.manifest.get("identity") or {}).get("eos_token_id", EOS_TOKEN_ID))
        return TokenSplit(
            tokens=tokens, offsets=offsets, lengths=lengths, ids=ids, name=name, eos_token_id=eos
        )

    def counts(self) -> dict:
        return {
            name: {k: self.manifest["splits"][name][k] for k in ("documents", "tokens", "prediction_pairs")}
            for name in SPLITS
        }


# --- the manifest --------------------------------------------------------------------------------


def read_manifest(directory: Path, identity: dict | None = None) -> dict:
    """The manifest of `directory`, checked: valid JSON, its checksum, this format, the identity and the
    structure every later step relies on. Raises CacheError (one line: what, and how to rebuild)."""
    manifest_path = Path(directory) / MANIFEST
    if not manifest_path.is_file():
        raise CacheError(
            f"{manifest_path} is missing: the cache at {directory} is incomplete; {REBUILD_HINT}"
        )
    try:
        manifest = json.loads(manifest_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CacheError(f"{manifest_path} is not valid JSON ({error}); {REBUILD_HINT}") from error
    if not isinstance(manifest, dict) or manifest.get("checksum") != manifest_checksum(manifest):
        raise CacheError(
            f"{manifest_path} was edited: its checksum does not match its content; {REBUILD_HINT}"
        )
    if manifest.get("format") != FORMAT_VERSION:
        raise CacheError(
            f"{manifest_path} is cache format {manifest.get('format')!r}, this pretrain reads format "
            f"{FORMAT_VERSION} (uint16/uint32 tokens and binary indexes); {REBUILD_HINT}"
        )
    if identity is not None and manifest.get("identity") != identity:
        changes = ", ".join(identity_differences(manifest.get("identity"), identity))
        raise CacheError(
            f"{manifest_path} was built for another cache identity than the config asks for "
            f"(cache -> config: {changes}); {REBUILD_HINT}"
        )
    try:
        if (
            manifest["token_dtype"] not in TOKEN_DTYPES
            or manifest["identity"]["dtype"] != manifest["token_dtype"]
        ):
            raise ValueError(f"token_dtype {manifest['token_dtype']!r}")
        for split in SPLITS:
            entry = manifest["splits"][split]
            int(entry["documents"]), int(entry["tokens"])
            if set(entry["files"]) != set(split_files(split)):
                raise ValueError(f"splits.{split}.files lists {sorted(entry['files'])}")
            for kind, name in split_files(split).items():
                if entry["files"][kind]["name"] != name:
                    raise ValueError(f"splits.{split}.files.{kind} names {entry['files'][kind]['name']!r}")
                int(entry["files"][kind]["bytes"]), str(entry["files"][kind]["sha256"])
    except (KeyError, TypeError, ValueError) as error:
        raise CacheError(
            f"{manifest_path} is malformed ({type(error).__name__}: {error}); {REBUILD_HINT}"
        ) from error
    return manifest


def manifest_files(manifest: dict) -> Iterator[tuple[str, dict, dict]]:
    """(split, its entry, file entry) for every file the manifest lists."""
    for split in SPLITS:
        entry = manifest["splits"][split]
        for kind in split_files(split):
            yield split, entry, entry["files"][kind]


# --- verification --------------------------------------------------------------------------------


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


def _place_name(directory: Path, key: str) -> str:
    return f"{key}-{hashlib.sha256(str(Path(directory).resolve()).encode()).hexdigest()[:16]}"


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
    names = split_files(split)
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
