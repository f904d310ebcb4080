"""The token cache: layout, identity and manifest (verify.py checks and opens one).

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
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ...errors import CacheError, ConfigError
from ..files import (
    state_dir,
    writable_dir,
)
from ..index import REBUILD_HINT, read_index_array
from ..sources import source_identity
from ..tokens import EOS_TOKEN_ID, DocumentIds, TokenSplit
from .chat import ChatSettings, chat_settings, check_task
from .prepare_settings import PrepareSettings
from .tokenizer import TokenizerFiles
from .tokenizer_json import TokenizerJson, resolve_tokenizer
from .writer import TOKEN_DTYPES, split_files

if TYPE_CHECKING:
    from ...config import BudgetConfig, Config, SourceConfig, SplitConfig, TokenizerConfig

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
    known = files.known()
    if known is not None:
        return max(known[1], EOS_TOKEN_ID)
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
    chat: ChatSettings | None = None,
    source_part: dict | None = None,
) -> dict:
    """Everything that decides the cache's bytes, and nothing else. A tokenizer.json adds its kind and
    EOS text (GPT-2's identity keeps exactly its keys: its caches keep their keys); a task=sft cache its
    `chat` entry (the loss mask and the template's sha256). `source_part`: the source's identity as
    given (a carried cache's), instead of read from this machine's source."""
    json_file = tokenizer_files if isinstance(tokenizer_files, TokenizerJson) else None
    extra = json_file.identity() if json_file else {}
    return {
        "format": FORMAT_VERSION,
        "source": source_identity(source) if source_part is None else source_part,
        "tokenizer": {
            "name": tokenizer.name,
            "revision": tokenizer.revision,
            # What makes the ids: other vocabulary or merges files must never reuse this cache.
            "content_sha256": tokenizer_files.content_sha256(),
            **extra,
        },
        "split": split_identity(split),
        "budget": {"train_tokens": budget.train_tokens, "validation_tokens": budget.validation_tokens},
        "dtype": token_dtype,
        "eos_token_id": json_file.eos_token_id if json_file else EOS_TOKEN_ID,
        **({"chat": chat.identity()} if chat is not None else {}),
    }


def split_identity(split: SplitConfig) -> dict:
    """The split's part of the identity: seed and fraction, and the leak window of a decontaminated
    validation split (only then: caches built without it keep their keys)."""
    identity: dict = {"seed": int(split.seed), "validation_fraction": float(split.validation_fraction)}
    if split.decontaminate:
        identity["decontaminate"] = {"leak_window": int(split.leak_window)}
    return identity


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
    chat: ChatSettings | None = None  # task=sft: how conversations become tokens and a loss mask

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
        check_task(config, source)
        task, chat = config.task, None
        if str(task.name) == "sft":
            chat = chat_settings(str(task.loss_mask), task.chat_template, tokenizer_files)
        if config.cache.carried and config.cache.rebuild:
            raise ConfigError(
                "cache.carried=true with cache.rebuild=true: a carried cache cannot be rebuilt here (its "
                "source is another machine's); carry it again, or drop cache.carried to build this machine's"
            )
        identity = (
            cache_identity(source, config.tokenizer, tokenizer_files, config.split, budget, dtype, chat)
            if not config.cache.carried
            else carried_identity(
                root,
                str(source.kind),
                cache_identity(
                    source, config.tokenizer, tokenizer_files, config.split, budget, dtype, chat, {}
                ),
            )
        )
        return cls(
            root=root,
            identity=identity,
            key=identity_key(identity),
            source=source,
            tokenizer_files=tokenizer_files,
            rebuild=bool(config.cache.rebuild),
            verify=verify,
            prepare=PrepareSettings.from_config(config.prepare),
            chat=chat,
        )


def carried_identity(root: Path, kind: str, wanted: dict) -> dict:
    """cache.carried: the identity of the one cache under `root` that was prepared elsewhere from a
    `kind` source and matches `wanted` in everything but the source (tokenizer, split, budget, dtype,
    chat). Its source part comes from its manifest, so that this machine's Python or packages (which
    name another pkgdocs or pydocs corpus) do not make it another cache; its files are verified as
    any cache's are."""
    found, nearest = [], None
    for manifest_path in sorted(Path(root).glob(f"*/{MANIFEST}")) if Path(root).is_dir() else []:
        try:
            identity = json.loads(manifest_path.read_text())["identity"]
            source = identity["source"]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not a readable cache: verification names it if it is the one asked for
        if not isinstance(source, dict) or source.get("kind") != kind:
            continue
        candidate = {**wanted, "source": source}
        if candidate == identity:
            found.append(identity)
        elif nearest is None:
            nearest = identity_differences(identity, candidate)
    if len(found) == 1:
        return found[0]
    if found:
        raise ConfigError(
            f"cache.carried=true: {len(found)} {kind} caches under {root} fit this config; keep one there"
        )
    detail = f" (the nearest differs: {'; '.join(nearest[:3])})" if nearest else ""
    raise ConfigError(
        f"cache.carried=true: no source={kind} cache under {root} fits this config{detail}; copy the "
        "folder `pretrain prepare` (or make gpu-cache) built there and pass it as cache_root"
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

    @property
    def masked(self) -> bool:
        """A task=sft cache: its splits carry a loss mask."""
        return is_masked(self.manifest)

    def split(self, name: str) -> TokenSplit:
        if name not in SPLITS:
            raise ConfigError(f"split must be one of {SPLITS}, got {name!r}")
        names = split_files(name, self.masked)
        documents = int(self.manifest["splits"][name]["documents"])
        offsets, lengths = read_index_array(self.directory / names["index_npy"], documents)
        path = self.directory / names["bin"]
        dtype = self.token_dtype
        tokens = np.memmap(path, dtype=dtype, mode="r") if path.stat().st_size else np.zeros(0, dtype)
        ids = DocumentIds(self.directory / names["index"], documents)
        eos = int((self.manifest.get("identity") or {}).get("eos_token_id", EOS_TOKEN_ID))
        mask = None
        if self.masked:
            mask_path = self.directory / names["mask"]
            mask = np.memmap(mask_path, dtype=np.uint8, mode="r") if len(tokens) else np.zeros(0, np.uint8)
        return TokenSplit(
            tokens=tokens,
            offsets=offsets,
            lengths=lengths,
            ids=ids,
            name=name,
            eos_token_id=eos,
            loss_mask=mask,
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
            names = split_files(split, is_masked(manifest))
            if set(entry["files"]) != set(names):
                raise ValueError(f"splits.{split}.files lists {sorted(entry['files'])}")
            for kind, name in names.items():
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
        for kind in split_files(split, is_masked(manifest)):
            yield split, entry, entry["files"][kind]


def is_masked(manifest: dict) -> bool:
    """Whether a cache's splits carry a loss mask (task=sft: its identity has a `chat` entry)."""
    return "chat" in (manifest.get("identity") or {})


def _place_name(directory: Path, key: str) -> str:
    return f"{key}-{hashlib.sha256(str(Path(directory).resolve()).encode()).hexdigest()[:16]}"
