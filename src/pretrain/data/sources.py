"""Where documents come from: the embedded pydocs corpus, local parquet/jsonl files, or FineWeb.

Every source yields `Document(text, origin)` in a deterministic order; `origin` names the file and
row so that a bad record can be reported precisely. Sources stream: nothing is read ahead of need.
"""

from __future__ import annotations

import ast
import os
import socket
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError, SourceError
from .files import sha256_file

if TYPE_CHECKING:
    from ..config import SourceConfig

__all__ = ["Document", "SourceError", "iter_documents", "source_identity"]


@dataclass(frozen=True)
class Document:
    text: str
    origin: str


# --- pydocs: real English prose shipped with every Python install --------------------------------

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


def _stdlib_modules() -> list[Path]:
    root = _stdlib_dir()
    paths: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
        paths.extend(Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py"))
    return sorted(paths, key=lambda p: p.relative_to(root).as_posix())


def pydocs_documents() -> Iterator[Document]:
    """One document per pydoc topic and one per standard-library module with docstrings."""
    for name, text in sorted(_pydoc_topics().items()):
        yield Document(text=text, origin=f"pydoc_data.topics[{name!r}]")
    root = _stdlib_dir()
    for path in _stdlib_modules():
        text = _module_docstrings(path)
        if text.strip():
            yield Document(text=text, origin=path.relative_to(root).as_posix())


def pydocs_identity() -> dict:
    # The corpus is whatever this Python ships: its version (and implementation) define the text.
    return {"kind": "pydocs", "python": sys.version.split()[0], "implementation": sys.implementation.name}


# --- local parquet / jsonl ----------------------------------------------------------------------

_FORMATS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".ndjson": "json"}


def _file_format(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix not in _FORMATS:
        raise SourceError(
            f"{path}: unsupported file type {suffix!r}; give .parquet or .jsonl files with a `text` column"
        )
    return _FORMATS[suffix]


def _rows(builder: str, path: Path) -> Iterator[dict]:
    from datasets import load_dataset

    stream = load_dataset(builder, data_files=[str(path)], split="train", streaming=True)
    if builder == "parquet":
        stream = stream.select_columns(["text"]) if "text" in (stream.column_names or ["text"]) else stream
    yield from stream


def _readable_rows(builder: str, path: Path) -> Iterator[dict]:
    """`_rows`, with a file the reader cannot parse (corrupt parquet, a broken JSON line) reported by name."""
    try:
        yield from _rows(builder, path)
    except Exception as error:
        kind = "parquet" if builder == "parquet" else "JSON lines"
        raise SourceError(f"{path}: cannot be read as {kind} ({type(error).__name__}: {error})") from error


def local_documents(files) -> Iterator[Document]:
    """Rows of local parquet/jsonl files (in the order given), streamed with `datasets`."""
    for path in _local_paths(files):
        builder = _file_format(path)
        for row_number, row in enumerate(_readable_rows(builder, path)):
            if "text" not in row:
                raise SourceError(f"{path}: row {row_number} has no `text` column (columns: {sorted(row)})")
            text = row["text"]
            if not isinstance(text, str):
                raise SourceError(f"{path}: row {row_number}: `text` is {type(text).__name__}, not a string")
            yield Document(text=text, origin=f"{path.name}:{row_number}")


def _local_paths(files) -> list[Path]:
    if files is None or isinstance(files, str | os.PathLike):
        files = [files] if files else []
    paths = [Path(f).expanduser().resolve() for f in files]
    if not paths:
        raise SourceError("source=local needs files: source.files='[a.parquet,b.jsonl]'")
    for path in paths:
        if not path.is_file():
            raise SourceError(f"source.files: {path} does not exist")
        _file_format(path)
    return paths


def local_identity(files) -> dict:
    # Content, not names, identifies the corpus: a changed file must not reuse an old cache.
    entries = [{"name": path.name, "sha256": sha256_file(path)} for path in _local_paths(files)]
    return {"kind": "local", "files": entries}


# --- FineWeb sample-10BT, streamed from the hub -------------------------------------------------

_OFFLINE_HINT = (
    "use source=local source.files='[...]' for your own parquet/jsonl files, "
    "or source=pydocs for the embedded offline corpus"
)


def _hub_reachable(host: str = "huggingface.co", timeout: float = 3.0) -> bool:
    try:
        with socket.create_connection((host, 443), timeout=timeout):
            return True
    except OSError:
        return False


def _fineweb_settings(source: SourceConfig) -> dict[str, str]:
    """The hub coordinates (conf/source/fineweb.yaml pins them): all four are needed."""
    settings = {
        "path": source.path,
        "config_name": source.config_name,
        "data_dir": source.data_dir,
        "revision": source.revision,
    }
    unset = [f"source.{key}" for key, value in settings.items() if not value]
    if unset:
        raise ConfigError(f"source=fineweb needs {', '.join(unset)} (conf/source/fineweb.yaml sets them)")
    return {key: str(value) for key, value in settings.items()}


def fineweb_documents(source: SourceConfig) -> Iterator[Document]:
    """FineWeb rows in the dataset's order; only as many as the budgets need are downloaded."""
    hub = _fineweb_settings(source)
    path = hub["path"]
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in {"1", "true", "yes"} or os.environ.get(
        "HF_DATASETS_OFFLINE", "0"
    ).lower() in {"1", "true", "yes"}:
        raise SourceError(
            f"source=fineweb needs the Hugging Face hub, but HF_HUB_OFFLINE is set; {_OFFLINE_HINT}"
        )
    if not _hub_reachable():
        raise SourceError(
            f"source=fineweb: huggingface.co cannot be reached from this machine; {_OFFLINE_HINT}"
        )
    from datasets import load_dataset

    stream = load_dataset(
        path,
        name=hub["config_name"],
        data_dir=hub["data_dir"],
        revision=hub["revision"],
        split="train",
        streaming=True,
    )
    for row_number, row in enumerate(stream):
        text = row.get("text")
        if not isinstance(text, str):
            raise SourceError(f"{path}: row {row_number}: `text` is {type(text).__name__}, not a string")
        yield Document(text=text, origin=f"{path}:{row.get('id', row_number)}")


def fineweb_identity(source: SourceConfig) -> dict:
    return {"kind": "fineweb", **_fineweb_settings(source)}


# --- dispatch -----------------------------------------------------------------------------------

SOURCE_KINDS = ("pydocs", "local", "fineweb")


def _kind(source: SourceConfig) -> str:
    kind = str(source.kind)
    if kind not in SOURCE_KINDS:
        raise ConfigError(
            f"source.kind={kind!r} is not one of {', '.join(SOURCE_KINDS)} (pick source=pydocs|local|fineweb)"
        )
    return kind


def source_identity(source: SourceConfig) -> dict:
    """What identifies the source's documents (part of the cache identity)."""
    kind = _kind(source)
    if kind == "pydocs":
        return pydocs_identity()
    if kind == "local":
        return local_identity(source.files)
    return fineweb_identity(source)


def iter_documents(source: SourceConfig) -> Iterator[Document]:
    kind = _kind(source)
    if kind == "pydocs":
        return pydocs_documents()
    if kind == "local":
        return local_documents(source.files)
    return fineweb_documents(source)
