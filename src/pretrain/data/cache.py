"""The verified token cache: layout, identity, manifest, verification and opening.

<cache_root>/<key>/ holds, per split, a uint32 `.bin` of document tokens (EOS after each document)
and a `.jsonl` index {"id", "offset", "length"}, plus `manifest.json` with the identity, per-split
counts and the sha256 of every file. `<key>` hashes the identity; max_seq_len, the policy and batch
settings are not part of it, so one cache serves them all. A cache that fails verification is never
used silently.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..errors import CacheError, ConfigError
from .files import sha256_file
from .sources import source_identity
from .tokenizer import TokenizerFiles, resolve_files
from .tokens import EOS_TOKEN_ID, TokenSplit

if TYPE_CHECKING:
    from ..config import BudgetConfig, Config, SourceConfig, SplitConfig, TokenizerConfig

FORMAT_VERSION = 1
SPLITS = ("train", "validation")
MANIFEST = "manifest.json"
REBUILD_HINT = "rebuild it with cache.rebuild=true (or delete the directory)"


def cache_root(configured: str | None) -> Path:
    """Where caches live: env PRETRAIN_CACHE_ROOT, else `cache_root` (relative to the working directory)."""
    root = os.environ.get("PRETRAIN_CACHE_ROOT") or configured or "data-cache"
    return Path(root).expanduser().resolve()


def cache_identity(
    source: SourceConfig,
    tokenizer: TokenizerConfig,
    tokenizer_files: TokenizerFiles,
    split: SplitConfig,
    budget: BudgetConfig,
) -> dict:
    """Everything that decides the cache's bytes, and nothing else."""
    return {
        "format": FORMAT_VERSION,
        "source": source_identity(source),
        "tokenizer": {
            "name": tokenizer.name,
            "revision": tokenizer.revision,
            # What makes the ids: other vocabulary or merges files must never reuse this cache.
            "content_sha256": tokenizer_files.content_sha256(),
        },
        "split": {"seed": int(split.seed), "validation_fraction": float(split.validation_fraction)},
        "budget": {"train_tokens": budget.train_tokens, "validation_tokens": budget.validation_tokens},
        "dtype": "uint32",
        "eos_token_id": EOS_TOKEN_ID,
    }


@dataclass(frozen=True)
class CacheSpec:
    """The cache a config asks for, computed once per process: its identity (which hashes every local
    source file), its directory, and what building it reads."""

    root: Path
    identity: dict
    key: str
    source: SourceConfig
    tokenizer_files: TokenizerFiles
    rebuild: bool = False

    @property
    def directory(self) -> Path:
        return self.root / self.key

    @classmethod
    def from_config(cls, config: Config) -> CacheSpec:
        tokenizer_files = resolve_files(config.tokenizer)
        identity = cache_identity(
            config.source, config.tokenizer, tokenizer_files, config.split, config.budget
        )
        return cls(
            root=cache_root(config.cache_root),
            identity=identity,
            key=identity_key(identity),
            source=config.source,
            tokenizer_files=tokenizer_files,
            rebuild=bool(config.cache.rebuild),
        )


def canonical_json(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def identity_key(identity: dict) -> str:
    return hashlib.sha256(canonical_json(identity).encode()).hexdigest()[:20]


def manifest_checksum(manifest: dict) -> str:
    """sha256 over the manifest without its own checksum: an edited manifest is detected."""
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    return hashlib.sha256(canonical_json(body).encode()).hexdigest()


def split_files(split: str) -> tuple[str, str]:
    return f"{split}.bin", f"{split}.jsonl"


def read_index(path: Path) -> tuple[tuple[str, ...], np.ndarray, np.ndarray]:
    """(ids, offsets, lengths) of a `.jsonl` index, parsed with pyarrow (fast for millions of lines)."""
    if path.stat().st_size == 0:
        return (), np.zeros(0, np.int64), np.zeros(0, np.int64)
    import pyarrow.json as pajson

    table = pajson.read_json(path)
    missing = {"id", "offset", "length"} - set(table.column_names)
    if missing:
        raise CacheError(f"{path} lacks the fields {sorted(missing)}; {REBUILD_HINT}")
    ids = tuple(table.column("id").to_pylist())
    offsets = table.column("offset").to_numpy().astype(np.int64)
    lengths = table.column("length").to_numpy().astype(np.int64)
    return ids, offsets, lengths


@dataclass(frozen=True)
class Cache:
    directory: Path
    manifest: dict

    @property
    def packs_dir(self) -> Path:
        """Offline packs (prepacked policy) live beside the verified files, keyed by their settings."""
        return self.directory / "packs"

    def split(self, name: str) -> TokenSplit:
        if name not in SPLITS:
            raise ConfigError(f"split must be one of {SPLITS}, got {name!r}")
        bin_name, index_name = split_files(name)
        ids, offsets, lengths = read_index(self.directory / index_name)
        path = self.directory / bin_name
        tokens = np.memmap(path, dtype=np.uint32, mode="r") if path.stat().st_size else np.zeros(0, np.uint32)
        return TokenSplit(tokens=tokens, offsets=offsets, lengths=lengths, ids=ids, name=name)

    def counts(self) -> dict:
        return {
            name: {k: self.manifest["splits"][name][k] for k in ("documents", "tokens", "prediction_pairs")}
            for name in SPLITS
        }


def verify_cache(directory: Path, identity: dict | None = None) -> dict:
    """Check the manifest, the identity and every file (size, sha256, index consistency).

    Returns the manifest; raises CacheError naming the first problem and how to rebuild.
    """
    directory = Path(directory)
    manifest_path = directory / MANIFEST
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
    if identity is not None and manifest.get("identity") != identity:
        raise CacheError(
            f"{manifest_path} describes another cache identity than the config asks for "
            f"(cache: {canonical_json(manifest.get('identity'))}, config: {canonical_json(identity)}); "
            f"{REBUILD_HINT}"
        )
    for split in SPLITS:
        entry = manifest["splits"][split]
        for kind, name in zip(("bin", "index"), split_files(split), strict=True):
            path = directory / name
            expected = entry["files"][kind]
            if not path.is_file():
                raise CacheError(f"{path} is missing; {REBUILD_HINT}")
            if path.stat().st_size != expected["bytes"]:
                raise CacheError(
                    f"{path} has {path.stat().st_size} bytes, the manifest says {expected['bytes']} "
                    f"(truncated or appended); {REBUILD_HINT}"
                )
            if sha256_file(path) != expected["sha256"]:
                raise CacheError(
                    f"{path} does not match its sha256 in the manifest (corrupted); {REBUILD_HINT}"
                )
        _check_index(directory, split, entry)
    return manifest


def _check_index(directory: Path, split: str, entry: dict) -> None:
    """The index must tile the token file exactly, one EOS closing each document."""
    ids, offsets, lengths = read_index(directory / split_files(split)[1])
    tokens_path = directory / split_files(split)[0]
    problem = None
    if len(ids) != entry["documents"]:
        problem = f"{len(ids)} documents, the manifest says {entry['documents']}"
    elif int(lengths.sum()) != entry["tokens"] or tokens_path.stat().st_size != 4 * entry["tokens"]:
        problem = f"{int(lengths.sum())} tokens in the index, the manifest says {entry['tokens']}"
    elif len(lengths) and (lengths.min() < 2 or not np.array_equal(offsets, np.cumsum(lengths) - lengths)):
        problem = "offsets and lengths do not tile the token file"
    elif len(lengths):
        tokens = np.memmap(tokens_path, dtype=np.uint32, mode="r")
        if not np.all(tokens[offsets + lengths - 1] == EOS_TOKEN_ID):
            problem = "a document does not end with EOS"
    if problem:
        raise CacheError(f"{directory / split_files(split)[1]}: {problem}; {REBUILD_HINT}")


def open_cache(directory: Path, identity: dict | None = None) -> Cache:
    return Cache(directory=Path(directory), manifest=verify_cache(directory, identity))
