"""source=chatdocs: a tiny offline chat corpus written from the standard library's docstrings (the
text source=pydocs reads), for task=sft without the network.

Each documented function or class becomes one exchange: the user asks what `module.name` does (is
for), the assistant answers with the docstring's first paragraphs. A module's exchanges are grouped
two by two into conversations after one system message, so that conversations have several turns.
Deterministic: the same Python gives the same conversations in the same order.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import ClassVar

from .base import Document, Part, PartSizes, SourceConfig
from .conversations import COLUMN, conversation_text
from .pydocs import PydocsSource, _stdlib_dir, _stdlib_modules

SYSTEM = "You answer questions about the Python standard library in its own words."
EXCHANGES = 2  # exchanges per conversation
ANSWER_CHARS = 1200  # an answer's first paragraphs, up to about this many characters


def _answer(doc: str) -> str:
    """The docstring's first paragraphs, whole, up to ~ANSWER_CHARS characters."""
    paragraphs = [p.strip() for p in doc.split("\n\n") if p.strip()]
    kept: list[str] = []
    for paragraph in paragraphs:
        if kept and sum(len(p) for p in kept) + len(paragraph) > ANSWER_CHARS:
            break
        kept.append(paragraph)
    return "\n\n".join(kept)


def _exchanges(module: str, tree: ast.Module) -> Iterator[tuple[str, str]]:
    """(question, answer) per documented public function or class of a module, in source order."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        doc = ast.get_docstring(node)
        if not doc or len(doc) <= 40 or node.name.startswith("_"):
            continue
        if isinstance(node, ast.ClassDef):
            question = f"What is the class `{module}.{node.name}` for?"
        else:
            question = f"What does `{module}.{node.name}` do?"
        yield question, _answer(doc)


@dataclass
class ChatdocsConfig(SourceConfig):
    """source=chatdocs has no options: the conversations are written from this Python's docstrings."""

    for_kind = "chatdocs"


@dataclass(frozen=True)
class ChatdocsSource:
    """The standard library's modules in path order, each module's conversations in source order."""

    sizes: PartSizes = field(default_factory=PartSizes)

    name: ClassVar[str] = "chatdocs"
    config_class: ClassVar[type[SourceConfig]] = ChatdocsConfig
    test_variants: ClassVar[dict[str, tuple[str, ...]]] = {}  # conversations: task=sft only
    conversations: ClassVar[bool] = True

    @property
    def kind(self) -> str:
        return self.name

    @classmethod
    def from_config(cls, source, sizes: PartSizes) -> ChatdocsSource:
        return cls(sizes=sizes)

    def identity(self) -> dict:
        return {**PydocsSource().identity(), "kind": "chatdocs"}

    def parts(self) -> Iterator[Part]:
        count, step = len(_stdlib_modules()), self.sizes.pydocs_modules
        for start in range(0, count, step):
            yield Part(kind="chatdocs-modules", start=start, stop=min(start + step, count), column=COLUMN)

    def read(self, part: Part) -> Iterator[Document]:
        root = _stdlib_dir()
        for path in _stdlib_modules()[part.start : part.stop]:
            relative = path.relative_to(root).with_suffix("")
            module = ".".join(p for p in relative.parts if p != "__init__")
            try:
                tree = ast.parse(path.read_bytes(), filename=str(path))
            except (SyntaxError, ValueError):
                continue
            pairs = list(dict.fromkeys(_exchanges(module, tree)))
            for first in range(0, len(pairs), EXCHANGES):
                messages = [{"role": "system", "content": SYSTEM}]
                for question, answer in pairs[first : first + EXCHANGES]:
                    messages += [
                        {"role": "user", "content": question},
                        {"role": "assistant", "content": answer},
                    ]
                origin = f"{relative.as_posix()}.py#{first // EXCHANGES}"
                yield Document(text=conversation_text(messages, origin), origin=origin)

    def describe(self) -> str:
        return "source=chatdocs (conversations from the standard library's docstrings)"

    def is_small(self) -> bool:
        return False
