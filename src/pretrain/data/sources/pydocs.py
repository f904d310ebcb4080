"""source=pydocs: real English prose shipped with every Python install (the offline default).

One document per pydoc topic and one per standard-library module with docstrings.
"""

from __future__ import annotations

import ast
import functools
import os
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from ...errors import SourceError
from .base import Document, Part, PartSizes, SourceConfig

# Tests, demos and vendored third-party code are not the standard library's documentation.
_SKIP_DIRS = {
    "site-packages",
    "dist-packages",
    "test",
    "tests",
    "idle_test",
    "__pycache__",
    "lib2to3",
    "turtledemo",
}


def _stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _pydoc_topics() -> dict[str, str]:
    """The `topics` dict of pydoc_data/topics.py, read with ast (nothing is imported)."""
    path = _stdlib_dir() / "pydoc_data" / "topics.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "topics" for t in node.targets):
            return ast.literal_eval(node.value)
    raise SourceError(f"{path} has no `topics` dict")


def _module_docstrings(path: Path) -> str:
    """The module's docstring followed by those of its classes and functions, in source order."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError):
        return ""
    parts = []
    for node in ast.walk(tree):  # the module itself comes first
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node)
            if doc and (node is tree or len(doc) > 40):
                title = "" if isinstance(node, ast.Module) else f"{node.name}\n"
                parts.append(title + doc)
    return "\n\n".join(dict.fromkeys(parts))  # identical docstrings (overloads) once


@functools.lru_cache(maxsize=1)
def _stdlib_modules() -> tuple[Path, ...]:
    root = _stdlib_dir()
    paths: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
        paths.extend(Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py"))
    return tuple(sorted(paths, key=lambda p: p.relative_to(root).as_posix()))


@dataclass
class PydocsConfig(SourceConfig):
    """source=pydocs has no options: the corpus is whatever this Python ships."""

    for_kind = "pydocs"


@dataclass(frozen=True)
class PydocsSource:
    """The pydoc topics, then the standard library's modules in path order."""

    sizes: PartSizes = field(default_factory=PartSizes)

    name: ClassVar[str] = "pydocs"
    config_class: ClassVar[type[SourceConfig]] = PydocsConfig
    test_variants: ClassVar[dict[str, tuple[str, ...]]] = {}

    @property
    def kind(self) -> str:
        return self.name

    @classmethod
    def from_config(cls, source, sizes: PartSizes) -> PydocsSource:
        return cls(sizes=sizes)

    def identity(self) -> dict:
        # The corpus is whatever this Python ships: its version (and implementation) define the text.
        return {"kind": "pydocs", "python": sys.version.split()[0], "implementation": sys.implementation.name}

    def parts(self) -> Iterator[Part]:
        yield Part(kind="pydocs-topics")
        count, step = len(_stdlib_modules()), self.sizes.pydocs_modules
        for start in range(0, count, step):
            yield Part(kind="pydocs-modules", start=start, stop=min(start + step, count))

    def read(self, part: Part) -> Iterator[Document]:
        if part.kind == "pydocs-topics":
            for name, text in sorted(_pydoc_topics().items()):
                yield Document(text=text, origin=f"pydoc_data.topics[{name!r}]")
            return
        root = _stdlib_dir()
        for path in _stdlib_modules()[part.start : part.stop]:
            text = _module_docstrings(path)
            if text.strip():
                yield Document(text=text, origin=path.relative_to(root).as_posix())

    def describe(self) -> str:
        return f"source=pydocs (the docstrings of Python {sys.version.split()[0]})"

    def is_small(self) -> bool:
        return False  # ~30 parts of parsing: workers pay off
