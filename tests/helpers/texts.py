"""English-like fixture texts: varied documents, some long, plus exact duplicates and blanks."""

from __future__ import annotations

import random

_WORDS = (
    "the of and to in is was for that with as on by at from his her they which this be are or an "
    "had not but were have one all their there been has when who will more no if out so said what up "
    "its about into than them can only other new some could time these two may then do first any my "
    "now such like our over man me even most made after also did many before must through back years "
    "where much your way well down should because each just those people how too little state good "
    "very make world still own see men work long get here between both life being under never day "
    "same another know while last might us great old year off come since against go came right used "
    "take three river garden window letter market winter summer morning evening engine station "
    "harbour library question answer history science language number system water country village "
    "mountain teacher student doctor kitchen bridge forest castle island planet violin painter"
).split()
_NAMES = ["Alice", "Bob", "Zürich", "Ångström", "café", "naïve", "Dvořák", "São Paulo", "Kraków", "Tōkyō"]
_PUNCT = [".", ".", ".", "!", "?", ";", ":"]


def _sentence(rng: random.Random) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 22))]
    if rng.random() < 0.3:
        words.insert(rng.randrange(len(words)), rng.choice(_NAMES))
    if rng.random() < 0.2:
        words.insert(rng.randrange(len(words)), str(rng.randint(0, 99999)))
    if rng.random() < 0.1:
        words.insert(rng.randrange(len(words)), "don't")
    words[0] = words[0].capitalize()
    return " ".join(words) + rng.choice(_PUNCT)


def _paragraph(rng: random.Random, sentences: int) -> str:
    return " ".join(_sentence(rng) for _ in range(sentences))


def english_text(rng: random.Random, paragraphs: int) -> str:
    return "\n\n".join(_paragraph(rng, rng.randint(2, 8)) for _ in range(paragraphs))


def make_texts(n: int = 120, seed: int = 0, long_every: int = 40) -> list[str]:
    """`n` distinct English-like documents; every `long_every`-th is long (> 5,000 GPT-2 tokens)."""
    rng = random.Random(seed)
    texts = []
    for i in range(n):
        paragraphs = (
            rng.randint(80, 110) if long_every and i % long_every == long_every - 1 else rng.randint(1, 6)
        )
        texts.append(f"Document {i}. " + english_text(rng, paragraphs))
    return texts


TRICKY_TEXTS = [
    "",  # empty
    "   \n\t  \n",  # whitespace only
    "Hello world",
    "A literal <|endoftext|> inside a document is text, not a boundary.<|endoftext|>",
    "Unicode: café, naïve, Ελληνικά, 日本語, emoji 🎉 and a tab\there.",
    "  leading and trailing spaces  ",
    "\u3000",  # ideographic space: whitespace too
]


def fixture_texts() -> list[str]:
    """The standard fixture corpus: varied documents, some long, plus exact duplicates and blanks."""
    texts = make_texts(120, seed=7)
    mixed = []
    for i, text in enumerate(texts):
        mixed.append(text)
        if i % 17 == 5:
            mixed.append(texts[i // 2])  # an exact duplicate of an earlier document
        if i % 31 == 3:
            mixed.append(TRICKY_TEXTS[(i // 31) % len(TRICKY_TEXTS)])
    mixed[10:10] = TRICKY_TEXTS  # all of them, once
    mixed.append(TRICKY_TEXTS[2])  # duplicate of a tricky one
    return mixed
