"""Tokenizers trained offline here with the `tokenizers` library's trainers (no download): a small
byte-level BPE on the fixture texts, and a large one (more than 65,536 ids) on generated distinct words."""

from __future__ import annotations

import random
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from .texts import make_texts

EOS = "<|endoftext|>"
LARGE_VOCAB = 66_600  # past 65,536: ids that need uint32


def _byte_level_bpe(texts, vocab_size: int, special_tokens: list[str]) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def small_bpe(path: Path, vocab_size: int = 700, special_tokens: tuple[str, ...] = (EOS,)) -> Path:
    """A byte-level BPE of `vocab_size` ids trained on the fixture texts, saved as `path`."""
    _byte_level_bpe(make_texts(200, seed=3), vocab_size, list(special_tokens)).save(str(path))
    return path


def distinct_words(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words: set[str] = set()
    while len(words) < count:
        words.add("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(4, 9))))
    return sorted(words)


def large_bpe(path: Path) -> tuple[Path, list[str]]:
    """A byte-level BPE of LARGE_VOCAB ids (trained on ~76k distinct generated words, most of which
    become one token each), and the words."""
    words = distinct_words(76_000)
    lines = (" ".join(words[i : i + 100]) for i in range(0, len(words), 100))
    tokenizer = _byte_level_bpe(lines, LARGE_VOCAB, [EOS])
    assert tokenizer.get_vocab_size() == LARGE_VOCAB
    tokenizer.save(str(path))
    return path, words
