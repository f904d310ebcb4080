"""source=pkgdocs: the prose of this Python environment, offline (~20M GPT-2 tokens in .venv).

One document per file that holds prose, in a fixed order: the standard library's documentation first
(the pydoc topics and the modules source=pydocs reads), then the pinned distributions by name, each
one's files as its RECORD lists them, sorted by path. A Python module's document is its docstrings and
its full-line comment blocks in source order; a documentation file (.md, .rst, .txt) is its text when
it reads as prose (licenses, changelogs, metadata and data files are not); a distribution's long
description (the README in METADATA) is one more document.

Pinned (`source.pins`, data/sources/pkgdocs_pins.py): the project ships the list of distributions it
reads and their versions, `pkgdocs_pins.txt` (the project's .venv after `make install`, less its own
editable install; `scripts/pkgdocs_pins.py` regenerates it). Only pinned distributions are read, so
extra ones on a machine change nothing, and the identity is the list (with the Python version and
EXTRACTION), not the machine. A pinned distribution missing or at another version cannot be read as
pinned; rather than refuse to build (pkgdocs would then fail on every machine whose resolver picked
one newer wheel) or build under the pinned identity (a cache whose identity claims content it does not
hold), the identity records the differences (`differs`: name -> installed version, or null when
missing) and one warning line names them with the fix (`pip install -r <pins>` or `make install`).
Two machines with the pinned set share one cache; one that differs gets its own, never the pinned
one's. `source.pins=installed` reads every distribution there (the identity lists each one).

Short documents are dropped: under MIN_CHARS (256 characters, ~64 GPT-2 tokens at ~4 characters a
token: the tokenizer is not at hand when the source is read) a document is emptied and the build skips
it with the empty ones. These are files whose prose is one or two unrelated one-line docstrings
(10-16 tokens each). Merging consecutive ones of a distribution would make documents of unrelated
text, which the document mask would then treat as one (the cross-document attention it exists to
prevent), and would tie each document to its neighbours across the listing's parts (whose sizes must
not change the cache); their tokens are a small share (docs/data.md gives it).

Copies are read once: a file whose content hash (RECORD's sha256, else the file's) was already
listed, e.g. a vendored copy of another package, or whose lines mostly were (a near copy: `Copies`),
is skipped at listing time; the cache drops any further exact duplicate texts
(data/ingest/collect.py). Editable installs are left out: their code lives outside the environment
and changes without a new version, so the identity could not name it. `source.path` reads another
site-packages directory instead (its distributions only, no standard library; pinned the same way).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import heapq
import importlib.metadata
import logging
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import ClassVar

from ...errors import SourceError
from .base import Document, Part, PartSizes, SourceConfig
from .dist_files import files_of, metadata_of, read_file
from .pkgdocs_pins import (
    PROJECT,
    Pins,
    difference_line,
    differences,
    editable,
    installed,
    python_version,
    resolve_pins,
    site_dirs,
)
from .prose import c_prose, doc_prose, is_prose, module_prose
from .pydocs import _pydoc_topics, _stdlib_dir, _stdlib_modules

STDLIB = "python-stdlib"  # the standard library's entries (this Python's environment only)
EXTRACTION = 4  # bump when what is read from a file changes: another corpus, another identity
MIN_CHARS = 256  # a shorter document (~64 GPT-2 tokens, at ~4 characters a token) is dropped
_DOC_SUFFIXES = {".md", ".rst", ".txt"}
_C_SUFFIXES = {".h", ".hpp", ".cuh", ".c", ".cc", ".cpp"}  # their comments document the C/C++ API
# Documentation files that are not prose about the code: legal text, release notes, metadata.
_NOT_PROSE = re.compile(
    r"licen[cs]e|copying|notice|authors|contributors|changelog|changes|history|news|release|"
    r"requirements|top_level|entry_points|dependency_links|namespace_packages|sources|third.party",
    re.IGNORECASE,
)
log = logging.getLogger(__name__)
_SKETCH, _NEAR, _LONG_LINE = 8, 5, 40  # near copies: 5 of a file's 8 line sketches seen before


@dataclass(frozen=True)
class Entry:
    """One file of one distribution that may hold prose (a document)."""

    distribution: str
    path: str  # relative to the site (or stdlib) directory; "" for a description or the topics
    kind: str  # module | doc | description | topics


@dataclass(frozen=True)
class Distribution:
    name: str
    version: str
    modules: int
    doc_files: int
    c_files: int
    described: bool
    copies_skipped: int
    bytes: int


@dataclass(frozen=True)
class Listing:
    entries: tuple[Entry, ...]
    distributions: tuple[Distribution, ...]


def _kind(path: PurePosixPath) -> str | None:
    """module, doc or None (not read) for one RECORD path."""
    parts = path.parts
    if not parts or parts[0].endswith((".dist-info", ".egg-info", ".data")) or "__pycache__" in parts:
        return None
    if path.suffix == ".py":
        return "module"
    if path.suffix in _C_SUFFIXES:
        return "csource"
    if path.suffix.lower() in _DOC_SUFFIXES and not any(_NOT_PROSE.search(p) for p in parts):
        return "doc"
    return None


def _content_hash(hash_field: str, data: bytes) -> str:
    """The content hash RECORD gives (`sha256=<urlsafe base64>`), else the file's own sha256."""
    if hash_field.startswith("sha256="):
        return hash_field
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


class Copies:
    """Files already listed, by exact content hash and by a sketch of their lines: a vendored copy
    that changed a few lines (imports renamed, a version bumped) is a near copy. The sketch is the
    `_SKETCH` smallest CRC-32s of a file's lines of at least `_LONG_LINE` characters (a bottom-k
    sample of its distinct lines); a file whose sketch shares `_NEAR` of them with the files kept
    before shares most of its lines with them (about that share in Jaccard terms)."""

    def __init__(self) -> None:
        self.digests: set[str] = set()
        self.sketches: set[int] = set()

    def seen(self, digest: str, data: bytes) -> bool:
        """Whether the file is a copy; else it is recorded as seen."""
        if digest in self.digests:
            return True
        lines = {zlib.crc32(line) for line in map(bytes.strip, data.splitlines()) if len(line) >= _LONG_LINE}
        sketch = heapq.nsmallest(_SKETCH, lines)
        if len(sketch) == _SKETCH and sum(key in self.sketches for key in sketch) >= _NEAR:
            return True
        self.digests.add(digest)
        self.sketches.update(sketch)
        return False


def _description(dist: importlib.metadata.Distribution) -> str:
    metadata = metadata_of(dist)
    text = metadata["Description"] or ""  # the header (older metadata), else the body
    payload = getattr(metadata, "get_payload", None)  # the METADATA body (Metadata-Version 2.1+)
    if not text and payload is not None:
        text = payload() or ""
    return text if isinstance(text, str) else ""


def _stdlib(entries: list[Entry], copies: Copies) -> Distribution:
    """The interpreter's own documentation first, as source=pydocs reads it: the pydoc topics (one
    entry, a document per topic), then the standard library's modules in path order."""
    root = _stdlib_dir()
    entries.append(Entry(STDLIB, "", "topics"))
    modules = size = skipped = 0
    for path in _stdlib_modules():
        data = path.read_bytes()
        if copies.seen(_content_hash("", data), data):
            skipped += 1
            continue
        entries.append(Entry(STDLIB, path.relative_to(root).as_posix(), "module"))
        modules += 1
        size += len(data)
    return Distribution(STDLIB, python_version(), modules, 0, 0, False, skipped, size)


def _list_distribution(
    name: str, dist: importlib.metadata.Distribution, entries: list[Entry], copies: Copies
):
    """Append one distribution's files that may hold prose (RECORD's, by path) and its description."""
    base = Path(str(dist.locate_file("")))
    counts = {"module": 0, "doc": 0, "csource": 0}
    skipped = size = 0
    for text_path, record in sorted((str(f), f) for f in files_of(dist)):
        kind = _kind(PurePosixPath(text_path))
        if kind is None:
            continue
        data = read_file(base, text_path)
        if data is None:  # removed since RECORD listed it, outside the site, not a regular file, huge
            continue
        field_ = f"{record.hash.mode}={record.hash.value}" if record.hash else ""
        if copies.seen(_content_hash(field_, data), data):
            skipped += 1
            continue
        entries.append(Entry(name, text_path, kind))
        counts[kind] += 1
        size += len(data)
    description = _description(dist)
    text = description.encode()
    described = is_prose(description, 20) and not copies.seen(hashlib.sha256(text).hexdigest(), text)
    if described:
        entries.append(Entry(name, "", "description"))
    return Distribution(
        name, dist.version, counts["module"], counts["doc"], counts["csource"], described, skipped, size
    )


@functools.lru_cache(maxsize=4)
def list_environment(
    roots: tuple[str, ...], stdlib: bool = False, names: tuple[str, ...] | None = None
) -> Listing:
    """Every file of the distributions installed in `roots` that may hold prose, in corpus order
    (with `stdlib`, the standard library's first): those `names` names (the pinned ones; a name not
    installed is passed over), or every one; editable installs never."""
    found = installed(roots)
    entries: list[Entry] = []
    copies = Copies()
    summaries: list[Distribution] = [_stdlib(entries, copies)] if stdlib else []
    for name in sorted(found if names is None else set(names) & set(found)):
        if not editable(found[name]):
            summaries.append(_list_distribution(name, found[name], entries, copies))
    return Listing(tuple(entries), tuple(summaries))


@dataclass
class PkgdocsConfig(SourceConfig):
    path: str | None = None
    """source=pkgdocs: a site-packages directory to read (null = this Python's, its stdlib docs first)"""
    pins: str = PROJECT
    """source=pkgdocs: which distributions are read, at which versions: `project` (the pin list the
    project ships, data/sources/pkgdocs_pins.txt), `installed` (every one there, unpinned) or a file of
    name==version lines"""

    for_kind = "pkgdocs"


@functools.lru_cache(maxsize=16)
def _warn_once(line: str) -> None:
    log.warning(line)


def _kept(text: str) -> str:
    """The document, or "" (the build skips it with the empty ones) when it is under MIN_CHARS."""
    return text if len(text.strip()) >= MIN_CHARS else ""


@dataclass(frozen=True)
class PkgdocsSource:
    """The installed distributions' prose; `roots` are the site directories (this Python's by default,
    `source.path` names another, e.g. a copy of an environment); `pins` the distributions read and
    their versions (None: every installed one)."""

    roots: tuple[str, ...]
    stdlib: bool = False  # this Python's environment: its standard library's docs come first
    pins: Pins | None = None
    sizes: PartSizes = field(default_factory=PartSizes)

    name: ClassVar[str] = "pkgdocs"
    config_class: ClassVar[type[SourceConfig]] = PkgdocsConfig
    # No generic-test variant: the real environment is ~20M tokens (tests/test_pkgdocs.py builds a fake one).
    test_variants: ClassVar[dict[str, tuple[str, ...]]] = {}

    @property
    def kind(self) -> str:
        return self.name

    @classmethod
    def from_config(cls, source, sizes: PartSizes) -> PkgdocsSource:
        path, pins = getattr(source, "path", None), resolve_pins(getattr(source, "pins", PROJECT))
        if not path:
            return cls(roots=site_dirs(), stdlib=True, pins=pins, sizes=sizes)
        root = Path(str(path)).expanduser()
        if not root.is_dir():
            raise SourceError(
                f"source.path={path!s} is not a directory; give a site-packages directory, or "
                "source.path=null for this Python's"
            )
        return cls(roots=(str(root.resolve()),), pins=pins, sizes=sizes)

    def listing(self) -> Listing:
        listing = list_environment(self.roots, self.stdlib, self.pins.names if self.pins else None)
        if not listing.entries:
            pinned = f" of the {len(self.pins.entries)} pinned in {self.pins.file}" if self.pins else ""
            raise SourceError(
                f"source=pkgdocs: no installed distribution{pinned} with documentation in "
                f"{', '.join(self.roots)}; give source.path a site-packages directory with *.dist-info "
                "folders (source.pins=installed reads whatever it holds)"
            )
        return listing

    def differences(self) -> dict[str, str | None]:
        """The pinned distributions installed at another version (-> it) or missing (-> None)."""
        return {} if self.pins is None else differences(self.pins, self.roots)

    def identity(self) -> dict:
        # Not where the environment is, but what it holds: the same packages anywhere are one corpus.
        # Pinned: the list, and where this environment departs from it (one warning line says how).
        identity = {"kind": "pkgdocs", "python": python_version(), "extraction": EXTRACTION}
        if self.pins is None:
            dists = self.listing().distributions
            return {**identity, "distributions": {d.name: d.version for d in dists if d.name != STDLIB}}
        differs = self.differences()
        line = difference_line(self.pins, differs, self.stdlib)
        if line:
            _warn_once(line)
        identity["distributions"] = dict(self.pins.entries)
        return {**identity, "differs": differs} if differs else identity

    def parts(self) -> Iterator[Part]:
        count, step = len(self.listing().entries), 4 * self.sizes.pydocs_modules
        for start in range(0, count, step):
            yield Part(kind="pkgdocs", start=start, stop=min(start + step, count))

    def read(self, part: Part) -> Iterator[Document]:
        for entry in self.listing().entries[part.start : part.stop]:
            if entry.kind == "topics":
                for name, text in sorted(_pydoc_topics().items()):
                    yield Document(text=_kept(text), origin=f"pydoc_data.topics[{name!r}]")
                continue
            origin = f"{entry.distribution}:{entry.path or 'METADATA description'}"
            yield Document(text=_kept(self._text(entry)), origin=origin)

    def _text(self, entry: Entry) -> str:
        """The prose of one listed file (or description), as extracted, before the length rule."""
        if entry.distribution == STDLIB:
            return module_prose((_stdlib_dir() / entry.path).read_bytes())
        dist = installed(self.roots)[entry.distribution]
        if entry.kind == "description":
            return _description(dist)
        data = read_file(Path(str(dist.locate_file(""))), entry.path)
        if data is None:  # listed, so it was a regular file inside the site when the listing was made
            file = dist.locate_file(entry.path)
            raise SourceError(f"source=pkgdocs: {file} cannot be read (changed since listed); reinstall it")
        if entry.kind == "csource":
            return c_prose(data)
        return module_prose(data) if entry.kind == "module" else doc_prose(data)

    def provenance(self) -> dict:
        """Where the text comes from, for inspect-data: the pins, the distributions and what each gave."""
        listing = self.listing()
        dists = listing.distributions
        largest = sorted(dists, key=lambda d: (-d.bytes, d.name))[:10]
        return {
            "python": python_version(),
            "pins": f"{self.pins.file} ({len(self.pins.entries)})" if self.pins else "installed",
            "differs": self.differences(),
            "distributions": len(dists),
            "modules": sum(d.modules for d in dists),
            "doc_files": sum(d.doc_files for d in dists),
            "c_files": sum(d.c_files for d in dists),
            "descriptions": sum(d.described for d in dists),
            "copies_skipped": sum(d.copies_skipped for d in dists),
            "files_bytes": sum(d.bytes for d in dists),
            "largest": {
                d.name: f"{d.version}: {d.modules:,} modules, {d.doc_files} docs, {d.c_files:,} C/C++, "
                f"{d.bytes / 1e6:.1f} MB"
                for d in largest
            },
        }

    def describe(self) -> str:
        count = len(self.listing().distributions)
        pinned = f", pinned by {Path(self.pins.file).name}" if self.pins else ""
        return f"source=pkgdocs (the docs of {count} distributions in {', '.join(self.roots)}{pinned})"

    def is_small(self) -> bool:
        return False
