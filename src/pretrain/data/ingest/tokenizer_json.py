"""Any Hugging Face fast tokenizer from its `tokenizer.json`: a local file (`tokenizer.source=file`,
`tokenizer.file=PATH`) or a hub repository's at a pinned revision (`tokenizer.source=hub_file` with
`tokenizer.name` and `tokenizer.revision`; needs the network once, then the HF cache).

Its EOS, which closes every cached document, is `tokenizer.eos_token` when given, else the one the
file names: the `eos_token` of a `tokenizer_config.json` beside it (how Hugging Face ships it), else
the one special token of the file with a conventional EOS name. Neither: refused in one line.

The cache identity records the file's sha256 (`content_sha256`), its EOS id and text. GPT-2's files
(tokenizer.py) keep their own identity: a GPT-2 cache is unchanged.
"""

from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from tokenizers import Tokenizer

from ...errors import TokenizerError
from ..files import sha256_file
from ..gpt2 import GPT2_VOCAB_SIZE
from .tokenizer import TokenizerFiles, TokenizersEncoder, _byte_decoder, resolve_files

if TYPE_CHECKING:
    from ...config import TokenizerConfig

SOURCES = ("file", "hub_file")
EOS_NAMES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eos|>", "[EOS]", "<|im_end|>")
"""Special tokens taken as EOS when the file's special tokens hold exactly one of them."""
BYTE_FALLBACK = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")


@dataclass(frozen=True)
class TokenizerJson(TokenizerFiles):
    """A tokenizer.json and its EOS. `vocab` and `merges` are both the file (what the encoder memo
    and the stat-keyed caches read); the methods below replace GPT-2's vocabulary/merges logic."""

    eos_text: str = ""
    eos_token_id: int = -1

    @property
    def path(self) -> Path:
        return self.vocab

    def content_sha256(self) -> str:
        """The file's sha256: another file (even one giving the same ids) is another cache."""
        return sha256_file(self.path)

    def fingerprint(self) -> dict:
        return {"origin": self.origin, "tokenizer_json_sha256": self.content_sha256()}

    def identity(self) -> dict:
        """What the cache identity adds for this tokenizer (beyond name, revision, content_sha256)."""
        return {"kind": "tokenizer.json", "eos_token": self.eos_text}

    def build(self) -> Tokenizer:
        """The tokenizer, special tokens in document text encoded as text (a document cannot fake a
        boundary), no template (no BOS/EOS added by the post-processor: the cache adds EOS itself)."""
        return _load(str(self.path), *_stat(self.path))

    def vocab_size(self) -> int:
        """Rows an embedding needs: every id the tokenizer can produce, added tokens included."""
        return self.max_token_id() + 1

    def max_token_id(self) -> int:
        return max(self.build().get_vocab(with_added_tokens=True).values())

    def token_byte_lengths(self, vocab_size: int) -> np.ndarray:
        """UTF-8 bytes each id stands for (0 for special tokens), for bits per byte. Byte-level tokens
        through GPT-2's byte alphabet: exact (a text's bytes are the sum over its tokens). Otherwise an
        estimate: `<0xNN>` byte-fallback tokens 1, SentencePiece's `▁` a space (a prepended one counts
        one byte more per document), WordPiece's `##` continuation prefix nothing."""
        tokenizer = self.build()
        config = json.loads(self.path.read_text(encoding="utf-8"))
        special = {t["id"] for t in config.get("added_tokens", []) if t.get("special")}
        byte_level = _uses_byte_level(config)
        decoder = _byte_decoder()
        lengths = np.zeros(vocab_size, dtype=np.int64)
        for token, index in tokenizer.get_vocab(with_added_tokens=True).items():
            if index >= vocab_size or index in special:
                continue
            if byte_level:
                lengths[index] = sum(1 for char in token if char in decoder)
            elif BYTE_FALLBACK.match(token):
                lengths[index] = 1
            else:
                lengths[index] = len(token.removeprefix("##").replace("\u2581", " ").encode("utf-8"))
        return lengths

    def encoder(self) -> JsonEncoder:
        return JsonEncoder(self)


def _stat(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns


@functools.lru_cache(maxsize=4)
def _load(path: str, size: int, mtime_ns: int) -> Tokenizer:
    """Tokenizer.from_file, memoised on the file's stat (a large vocabulary takes a while to parse)."""
    tokenizer = Tokenizer.from_file(path)
    tokenizer.encode_special_tokens = True
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def _uses_byte_level(config: dict) -> bool:
    """Whether the tokens are written in GPT-2's byte alphabet (a ByteLevel pre-tokenizer or decoder)."""
    text = json.dumps([config.get("pre_tokenizer"), config.get("decoder")])
    return '"ByteLevel"' in text


class JsonEncoder(TokenizersEncoder):
    """Document bodies through the tokenizer.json with `tokenizers` (no template, specials as text):
    GPT-2's `tokenizers` encoder on another tokenizer, closed by its own EOS."""

    def __init__(self, files: TokenizerJson):
        self.tokenizer = files.build()
        self.eos_token_id = files.eos_token_id
        self._encode_batch = getattr(self.tokenizer, "encode_batch_fast", self.tokenizer.encode_batch)


def _eos_from_files(path: Path, tokenizer: Tokenizer) -> str | None:
    """The EOS text the files name: tokenizer_config.json's `eos_token`, else the one special token
    with a conventional EOS name."""
    beside = path.with_name("tokenizer_config.json")
    if beside.is_file():
        try:
            settings = json.loads(beside.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise TokenizerError(f"{beside} cannot be read ({error}); fix it or remove it") from None
        if not isinstance(settings, dict):
            raise TokenizerError(
                f"{beside} holds a JSON {type(settings).__name__}, not an object of settings; "
                "fix it or remove it"
            )
        eos = settings.get("eos_token")
        if isinstance(eos, dict):  # transformers may save an AddedToken as a dict
            eos = eos.get("content")
        if isinstance(eos, str) and eos:
            return eos
    specials = [t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special]
    named = [text for text in specials if text in EOS_NAMES]
    return named[0] if len(named) == 1 else None


def resolve_tokenizer_json(tokenizer: TokenizerConfig) -> TokenizerJson:
    """The tokenizer.json the config names (source file | hub_file) with its EOS resolved."""
    source = str(tokenizer.source)
    if source == "file":
        if not tokenizer.file or not Path(tokenizer.file).is_file():
            raise TokenizerError(
                f"tokenizer.file={tokenizer.file!r} is not a file; give the path of a tokenizer.json"
            )
        path, origin = Path(tokenizer.file).resolve(), "file"
    elif source == "hub_file":
        path, origin = _hub_tokenizer_json(tokenizer.name, tokenizer.revision), "hub"
    else:
        raise TokenizerError(f"tokenizer.source={source!r} is not one of {', '.join(SOURCES)}")
    try:
        built = _load(str(path), *_stat(path))
    except Exception as error:  # tokenizers raises a bare Exception for a malformed file
        first = str(error).strip().splitlines()[0][:160] if str(error).strip() else type(error).__name__
        raise TokenizerError(
            f"{path} is not a tokenizer.json the tokenizers library can load ({first})"
        ) from None
    eos = tokenizer.eos_token or _eos_from_files(path, built)
    if not eos:
        raise TokenizerError(
            f"{path} names no EOS token (no tokenizer_config.json eos_token beside it, and none of its "
            f"special tokens is one of {', '.join(EOS_NAMES)}): set tokenizer.eos_token=<its EOS text>"
        )
    eos_id = built.token_to_id(eos)
    if eos_id is None:
        raise TokenizerError(f"tokenizer.eos_token={eos!r} is not a token of {path}: give one of its tokens")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    return TokenizerJson(vocab=path, merges=path, origin=origin, eos_text=eos, eos_token_id=int(eos_id))


def _hub_tokenizer_json(repo: str, revision: str) -> Path:
    """The repository's tokenizer.json at `revision` (downloaded once into the HF cache)."""
    from huggingface_hub import hf_hub_download

    try:
        path = Path(hf_hub_download(repo, "tokenizer.json", revision=revision))
    except Exception as error:  # offline, unreachable, gated, or unknown revision
        raise TokenizerError(
            f"could not get tokenizer.json of {repo}@{revision} from the hub ({type(error).__name__}: "
            f"{error}); download it once and use tokenizer.source=file tokenizer.file=PATH"
        ) from error
    try:  # where the repository names its EOS (read beside the file, as for a local one)
        hf_hub_download(repo, "tokenizer_config.json", revision=revision)
    except Exception:  # not every repository has one: the file's own special tokens decide then
        pass
    return path


def tokenizer_vocab_size(tokenizer: TokenizerConfig) -> int:
    """Rows an embedding needs for the config's tokenizer: a tokenizer.json's ids, GPT-2's 50257."""
    if str(tokenizer.source) in SOURCES:
        return resolve_tokenizer_json(tokenizer).vocab_size()
    return GPT2_VOCAB_SIZE


def resolve_tokenizer(tokenizer: TokenizerConfig) -> TokenizerFiles:
    """The files of any `tokenizer.source`: a tokenizer.json (file, hub_file) or GPT-2's (bundled,
    hub, files: tokenizer.resolve_files)."""
    if str(tokenizer.source) in SOURCES:
        return resolve_tokenizer_json(tokenizer)
    return resolve_files(tokenizer)
