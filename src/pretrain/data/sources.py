"""Where documents come from: the embedded pydocs corpus, local parquet/jsonl files, or FineWeb.

Every source yields `Document(text, origin)` in a deterministic order; `origin` names the file and
row so that a bad record can be reported precisely. Sources stream: nothing is read ahead of need.

The stream is cut into `Part`s, contiguous slices that can be read independently (a slice of the
pydocs modules, a row range of a parquet file, a byte range of a JSON lines file), so that several
processes (`prepare.num_proc`) or tasks (`prepare.tasks`) can read and tokenize disjoint parts while
the cache is still assembled in source order: `iter_documents(source)` is every part's documents, in
order.
"""

from __future__ import annotations

import ast
import functools
import glob
import json
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

__all__ = ["Document", "Part", "SourceError", "iter_documents", "iter_parts", "read_part", "source_identity"]


@dataclass(frozen=True)
class Document:
    text: str
    origin: str


@dataclass(frozen=True)
class Part:
    """A contiguous slice of a source's document stream, readable on its own (picklable)."""

    kind: str  # pydocs-topics | pydocs-modules | parquet | hf-parquet | jsonl | json
    path: str = ""
    start: int = 0  # first module (pydocs), row (parquet) or byte (jsonl)
    stop: int = 0  # end of the slice, exclusive
    row: int = 0  # jsonl: the row number of the first line at `start` (for messages)


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


@functools.lru_cache(maxsize=1)
def _stdlib_modules() -> tuple[Path, ...]:
    root = _stdlib_dir()
    paths: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
        paths.extend(Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py"))
    return tuple(sorted(paths, key=lambda p: p.relative_to(root).as_posix()))


def pydocs_documents() -> Iterator[Document]:
    """One document per pydoc topic and one per standard-library module with docstrings."""
    for part in _pydocs_parts():
        yield from _read_pydocs(part)


PYDOCS_PART_MODULES = 16  # modules per part: ~30 parts, parsed by the workers in parallel


def _pydocs_parts() -> Iterator[Part]:
    yield Part(kind="pydocs-topics")
    count = len(_stdlib_modules())
    for start in range(0, count, PYDOCS_PART_MODULES):
        yield Part(kind="pydocs-modules", start=start, stop=min(start + PYDOCS_PART_MODULES, count))


def _read_pydocs(part: Part) -> Iterator[Document]:
    if part.kind == "pydocs-topics":
        for name, text in sorted(_pydoc_topics().items()):
            yield Document(text=text, origin=f"pydoc_data.topics[{name!r}]")
        return
    root = _stdlib_dir()
    for path in _stdlib_modules()[part.start : part.stop]:
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


PARQUET_PART_ROWS = 1024  # rows per part (~0.8M GPT-2 tokens of FineWeb); parts follow row groups
JSONL_PART_BYTES = 4 << 20  # bytes per part of a JSON lines file, cut at line ends
_SCAN_BLOCK = 16 << 20


def _empty_file(path) -> SourceError:
    return SourceError(
        f"{path} has no documents (an empty file); remove it from source.files or give it rows with a "
        "`text` column"
    )


def _unreadable(path, kind: str, error: BaseException) -> SourceError:
    return SourceError(f"{path}: cannot be read as {kind} ({type(error).__name__}: {error})")


def _row_text(path, row_number: int, row) -> str:
    if not isinstance(row, dict) or "text" not in row:
        columns = sorted(row) if isinstance(row, dict) else type(row).__name__
        raise SourceError(f"{path}: row {row_number} has no `text` column (columns: {columns})")
    text = row["text"]
    if not isinstance(text, str):
        raise SourceError(f"{path}: row {row_number}: `text` is {type(text).__name__}, not a string")
    return text


# parquet: row ranges, read with pyarrow (only the `text` column) --------------------------------


def _parquet_file(path: str, filesystem=None):
    import pyarrow.parquet as pq

    try:
        handle = filesystem.open(path, "rb") if filesystem is not None else path
        return pq.ParquetFile(handle)
    except Exception as error:
        raise _unreadable(path, "parquet", error) from error


def _parquet_parts(path: str, kind: str = "parquet", filesystem=None) -> Iterator[Part]:
    """Row ranges of at most PARQUET_PART_ROWS rows; small row groups are merged, big ones cut."""
    metadata = _parquet_file(path, filesystem).metadata
    if metadata.num_rows == 0:
        raise _empty_file(path)
    start = end = 0
    for group in range(metadata.num_row_groups):
        rows = metadata.row_group(group).num_rows
        pieces = max(1, -(-rows // PARQUET_PART_ROWS))
        for piece in range(pieces):
            size = rows * (piece + 1) // pieces - rows * piece // pieces
            if end - start + size > PARQUET_PART_ROWS and end > start:
                yield Part(kind=kind, path=path, start=start, stop=end)
                start = end
            end += size
    if end > start:
        yield Part(kind=kind, path=path, start=start, stop=end)


class _ParquetReader:
    """The row groups a process reads, kept one at a time: consecutive parts of a big row group
    (which the same worker gets) decode it once."""

    def __init__(self):
        self.key: tuple | None = None
        self.file = None
        self.group: tuple[int, object] | None = None

    def texts(self, part: Part, filesystem=None) -> Iterator[tuple[int, object]]:
        key = (part.path, _stat_key(part.path) if filesystem is None else None)
        if key != self.key:
            self.key, self.file, self.group = key, _parquet_file(part.path, filesystem), None
        parquet = self.file
        assert parquet is not None
        if "text" not in parquet.schema_arrow.names:
            raise SourceError(
                f"{part.path}: row {part.start} has no `text` column "
                f"(columns: {sorted(parquet.schema_arrow.names)})"
            )
        first = 0
        for group in range(parquet.metadata.num_row_groups):
            rows = parquet.metadata.row_group(group).num_rows
            lo, hi = max(part.start, first), min(part.stop, first + rows)
            if lo < hi:
                if self.group is None or self.group[0] != group:
                    try:
                        column = parquet.read_row_group(group, columns=["text"]).column("text")
                    except Exception as error:
                        raise _unreadable(part.path, "parquet", error) from error
                    self.group = (group, column)
                values = self.group[1].slice(lo - first, hi - lo).to_pylist()  # type: ignore[attr-defined]
                yield from enumerate(values, start=lo)
            first += rows
            if first >= part.stop:
                break


def _stat_key(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


_PARQUET = _ParquetReader()


def _read_parquet(part: Part, filesystem=None) -> Iterator[Document]:
    name = Path(part.path).name
    for row_number, text in _PARQUET.texts(part, filesystem):
        if not isinstance(text, str):
            raise SourceError(f"{part.path}: row {row_number}: `text` is {type(text).__name__}, not a string")
        yield Document(text=text, origin=f"{name}:{row_number}")


# JSON lines: byte ranges cut at line ends ------------------------------------------------------


def _jsonl_parts(path: str) -> Iterator[Part]:
    """Byte ranges of about JSONL_PART_BYTES, each ending at a line end (one pass also counts the
    lines, so that messages name the row). A file that is one JSON array is one part."""
    with open(path, "rb") as handle:
        if handle.read(4096).lstrip().startswith(b"["):
            yield Part(kind="json", path=path)
            return
        handle.seek(0)
        start = start_row = rows = offset = 0
        content = False
        next_cut = JSONL_PART_BYTES
        while block := handle.read(_SCAN_BLOCK):
            content = content or bool(block.strip())
            counted = 0  # bytes of this block whose line ends are counted in `rows`
            while next_cut - 1 - offset < len(block):
                newline = block.find(b"\n", max(next_cut - 1 - offset, counted))
                if newline < 0:
                    break
                rows += block.count(b"\n", counted, newline + 1)
                counted = newline + 1
                yield Part(kind="jsonl", path=path, start=start, stop=offset + counted, row=start_row)
                start, start_row = offset + counted, rows
                next_cut = start + JSONL_PART_BYTES
            rows += block.count(b"\n", counted)
            offset += len(block)
    if not content:
        raise _empty_file(path)
    if offset > start:
        yield Part(kind="jsonl", path=path, start=start, stop=offset, row=start_row)


def _read_jsonl(part: Part) -> Iterator[Document]:
    name = Path(part.path).name
    with open(part.path, "rb") as handle:
        handle.seek(part.start)
        data = handle.read(part.stop - part.start)
    for row_number, line in enumerate(data.split(b"\n"), start=part.row):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as error:
            raise SourceError(
                f"{part.path}: cannot be read as JSON lines "
                f"(row {row_number}: {type(error).__name__}: {error})"
            ) from error
        text = _row_text(part.path, row_number, row)
        if b"\\ud" in line or b"\\uD" in line:  # an escaped surrogate: only a pair is text
            try:
                text.encode()
            except UnicodeEncodeError as error:
                raise SourceError(
                    f"{part.path}: cannot be read as JSON lines (row {row_number}: `text` holds a lone "
                    f"surrogate, not Unicode text: {error})"
                ) from error
        yield Document(text=text, origin=f"{name}:{row_number}")


def _read_json_array(part: Part) -> Iterator[Document]:
    name = Path(part.path).name
    try:
        rows = json.loads(Path(part.path).read_bytes())
    except ValueError as error:
        raise _unreadable(part.path, "JSON", error) from error
    if not isinstance(rows, list):
        raise SourceError(f"{part.path}: a JSON file must hold one array of rows or JSON lines")
    for row_number, row in enumerate(rows):
        text = _row_text(part.path, row_number, row)
        try:
            text.encode()
        except UnicodeEncodeError as error:
            raise SourceError(
                f"{part.path}: row {row_number}: `text` is not Unicode text ({error})"
            ) from error
        yield Document(text=text, origin=f"{name}:{row_number}")


def local_documents(files) -> Iterator[Document]:
    """Rows of local parquet/jsonl files (in the order given), streamed part by part."""
    for part in local_parts(files):
        yield from read_part(part)


def local_parts(files) -> Iterator[Part]:
    for path in _local_paths(files):
        if _file_format(path) == "parquet":
            yield from _parquet_parts(str(path))
        else:
            yield from _jsonl_parts(str(path))


_GLOB_CHARS = frozenset("*?[")


def _expand(entry: str) -> list[Path]:
    """One `source.files` entry: a file, a directory (every supported file inside, recursively) or a
    glob pattern; directories and patterns expand in sorted order, so the identity is deterministic."""
    path = Path(entry).expanduser()
    if path.is_dir():
        found = sorted(
            (p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in _FORMATS),
            key=lambda p: p.relative_to(path).as_posix(),
        )
        if not found:
            raise SourceError(
                f"source.files: the directory {path.resolve()} holds no {'/'.join(_FORMATS)} files; "
                "point it at the folder of your data files"
            )
        return [p.resolve() for p in found]
    if not path.exists() and _GLOB_CHARS & set(entry):
        matches = sorted(glob.glob(str(path), recursive=True))
        found = [Path(m) for m in matches if Path(m).is_file() and Path(m).suffix.lower() in _FORMATS]
        if not found:
            raise SourceError(
                f"source.files: the pattern {entry!r} matches no {'/'.join(_FORMATS)} files; fix the "
                "pattern or list the files"
            )
        return [p.resolve() for p in found]
    return [path.resolve()]


def _local_paths(files) -> list[Path]:
    if files is None or isinstance(files, str | os.PathLike):
        files = [files] if files else []
    entries = [str(f) for f in files]
    if not entries:
        raise SourceError("source=local needs files: source.files='[a.parquet,b.jsonl]'")
    paths = [p for entry in entries for p in _expand(entry)]
    for path in paths:
        if not path.is_file():
            raise SourceError(
                f"source.files: {path} does not exist; give existing files, a directory or a glob pattern"
            )
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


def _check_hub(path: str) -> None:
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


@functools.lru_cache(maxsize=1)
def _hub_filesystem():
    from huggingface_hub import HfFileSystem

    return HfFileSystem()


def fineweb_parts(source: SourceConfig) -> Iterator[Part]:
    """Row ranges of the config's parquet files at the pinned revision, in file-name order (the order
    `datasets` streams them in); a file's footer is read only when the stream reaches it."""
    hub = _fineweb_settings(source)
    _check_hub(hub["path"])
    folder = f"datasets/{hub['path']}@{hub['revision']}/{hub['data_dir'].strip('/')}"
    fs = _hub_filesystem()
    files = sorted(f for f in fs.ls(folder, detail=False) if str(f).endswith(".parquet"))
    if not files:
        raise SourceError(f"source=fineweb: no parquet files in {folder}; check source.data_dir")
    for name in files:
        yield from _parquet_parts(str(name), kind="hf-parquet", filesystem=fs)


def fineweb_documents(source: SourceConfig) -> Iterator[Document]:
    """FineWeb rows in the dataset's order; only as many as the budgets need are downloaded."""
    for part in fineweb_parts(source):
        yield from read_part(part)


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
    """What identifies the source's documents (part of the cache identity). Local files are identified
    by content; their sha256 is remembered by (path, size, mtime_ns, ctime_ns, inode) in the per-user
    state (files.remembered_sha256), so an unchanged file is not re-hashed at every start."""
    kind = _kind(source)
    if kind == "pydocs":
        return pydocs_identity()
    if kind == "local":
        from .files import remembered_sha256

        entries = [{"name": p.name, "sha256": remembered_sha256(p)} for p in _local_paths(source.files)]
        return {"kind": "local", "files": entries}
    return fineweb_identity(source)


def iter_parts(source: SourceConfig) -> Iterator[Part]:
    """The source's parts in stream order (lazily: FineWeb's files are listed, not read ahead)."""
    kind = _kind(source)
    if kind == "pydocs":
        return _pydocs_parts()
    if kind == "local":
        return local_parts(source.files)
    return fineweb_parts(source)


def read_part(part: Part) -> Iterator[Document]:
    """The documents of one part, in order (blank ones included: the build counts and skips them)."""
    if part.kind in ("pydocs-topics", "pydocs-modules"):
        return _read_pydocs(part)
    if part.kind == "parquet":
        return _read_parquet(part)
    if part.kind == "hf-parquet":
        return _read_parquet(part, _hub_filesystem())
    if part.kind == "jsonl":
        return _read_jsonl(part)
    if part.kind == "json":
        return _read_json_array(part)
    raise ValueError(f"unknown part kind {part.kind!r}")


def iter_documents(source: SourceConfig) -> Iterator[Document]:
    """Every document of the source in stream order: each part's documents, part after part."""
    for part in iter_parts(source):
        yield from read_part(part)
