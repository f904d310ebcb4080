"""Which distributions source=pkgdocs reads: the pin list the project ships, and this environment.

`pkgdocs_pins.txt` beside this module (package data) holds one `name==version` a line (PEP 503 names,
sorted) and a `# python: X.Y.Z` line: every distribution that `make install` put into the project's
.venv but the project's own editable install, as pkgdocs reads them. `source.pins=project` (the
default) reads those distributions only, whatever else is installed, so the corpus and the cache
identity are the list's, not the machine's. Regenerate it after a dependency change (no make needed):

    .venv/bin/python scripts/pkgdocs_pins.py            # rewrites pkgdocs_pins.txt from this Python
    .venv/bin/python scripts/pkgdocs_pins.py --check    # exit 1, naming the differences, if stale

The file is also a pip requirements file: `pip install -r pkgdocs_pins.txt` installs the pinned set
(torch's local version, e.g. `+cpu`, from the index that builds it).
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import json
import re
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from ...errors import SourceError
from .dist_files import metadata_of

PINS_FILE = Path(__file__).with_name("pkgdocs_pins.txt")
PROJECT, INSTALLED = "project", "installed"  # source.pins: the shipped list, or whatever is installed
_SHOWN = 8  # differences named in the warning line (the identity's `differs` holds every one)
_PYTHON = re.compile(r"#\s*python:\s*(\S+)")


def normalize(name: str) -> str:
    """PEP 503's normalized name: `Beta_Pkg` and `beta.pkg` are `beta-pkg`."""
    return re.sub(r"[-_.]+", "-", name.lower())


def python_version() -> str:
    return sys.version.split()[0]


@dataclass(frozen=True)
class Pins:
    """A pin list: (name, version) pairs in name order, and the Python the list was made with."""

    entries: tuple[tuple[str, str], ...]
    python: str | None = None
    file: str = ""

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.entries)


def parse_pins(text: str, file: str = "") -> Pins:
    """The pins of a `name==version` file (comments and blank lines aside); a SourceError names a
    line that is not a pin, or a distribution pinned twice."""
    entries: dict[str, str] = {}
    python = None
    for number, line in enumerate(text.splitlines(), 1):
        if match := _PYTHON.fullmatch(line.strip()):
            python = match.group(1)
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = (part.strip() for part in line.partition("=="))
        if not sep or not name or not version or normalize(name) in entries:
            what = "pinned twice" if sep and normalize(name) in entries else "not a `name==version` pin"
            raise SourceError(f"source.pins={file}: line {number} ({line!r}) is {what}")
        entries[normalize(name)] = version
    return Pins(tuple(sorted(entries.items())), python, file)


def read_pins(path: str | Path) -> Pins:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise SourceError(
            f"source.pins={path}: cannot be read ({error}); give a file of `name==version` lines, "
            f"`{PROJECT}` (the shipped list) or `{INSTALLED}` (every installed distribution)"
        ) from error
    return parse_pins(text, str(path))


def resolve_pins(choice: str | None) -> Pins | None:
    """source.pins: `project` the shipped list, `installed` none (read what is there), else a file."""
    if choice in (None, "", INSTALLED):
        return None
    return read_pins(PINS_FILE if choice == PROJECT else Path(str(choice)).expanduser())


def editable(dist: importlib.metadata.Distribution) -> bool:
    try:  # a direct_url.json that is not UTF-8 JSON (ValueError) says nothing: not editable
        text = dist.read_text("direct_url.json")
        return bool(text and json.loads(text).get("dir_info", {}).get("editable"))
    except (ValueError, AttributeError):
        return False


@functools.lru_cache(maxsize=4)
def installed(roots: tuple[str, ...]) -> dict[str, importlib.metadata.Distribution]:
    """The distributions in `roots` by normalized name (PEP 503), editable ones included."""
    found: dict[str, importlib.metadata.Distribution] = {}
    for dist in importlib.metadata.distributions(path=list(roots)):
        name = normalize(metadata_of(dist)["Name"] or "")  # METADATA not UTF-8: one SourceError
        if name and name not in found:  # the first on the path is the one Python imports
            found[name] = dist
    return found


def site_dirs() -> tuple[str, ...]:
    """The running interpreter's site-packages (purelib and platlib, once each)."""
    paths = sysconfig.get_paths()
    return tuple(dict.fromkeys(str(Path(paths[key]).resolve()) for key in ("purelib", "platlib")))


def readable(roots: tuple[str, ...]) -> dict[str, str]:
    """What pkgdocs can read in `roots`: every installed distribution but editable ones (their code
    lives outside the environment and changes without a new version), name -> version."""
    return {name: dist.version for name, dist in sorted(installed(roots).items()) if not editable(dist)}


def differences(pins: Pins, roots: tuple[str, ...]) -> dict[str, str | None]:
    """The pinned distributions that `roots` holds at another version (-> that version) or not at all
    (-> None). Distributions that are not pinned are not read, so they never differ."""
    found = readable(roots)
    return {name: found.get(name) for name, version in pins.entries if found.get(name) != version}


def difference_line(pins: Pins, differs: dict[str, str | None], stdlib: bool) -> str | None:
    """The one line that says how this environment's corpus departs from the pinned one (None: not)."""
    pinned = dict(pins.entries)
    items = [
        f"{name} missing (pinned {pinned[name]})"
        if found is None
        else f"{name} {found} installed (pinned {pinned[name]})"
        for name, found in differs.items()
    ]
    if stdlib and pins.python and pins.python != python_version():
        items.append(f"Python {python_version()} (pinned {pins.python})")
    if not items:
        return None
    shown = ", ".join(items[:_SHOWN]) + (f" and {len(items) - _SHOWN} more" if len(items) > _SHOWN else "")
    return (
        f"source=pkgdocs: {len(items)} pins differ from this environment: {shown}; the corpus "
        "is not the pinned one and its cache identity says so (source.differs); "
        f"`pip install -r {pins.file}` (or `make install`) restores the pinned one"
    )


def render(entries: dict[str, str], python: str) -> str:
    """The pin file's text for these distributions (name -> version)."""
    header = (
        "# The distributions source=pkgdocs reads (source.pins=project), at these versions: the project's\n"
        "# .venv after `make install`, less its own editable install. Regenerate after a dependency change:\n"
        "#   .venv/bin/python scripts/pkgdocs_pins.py   (--check: exit 1 if this environment differs)\n"
        "# Also a requirements file: pip install -r <this file>.\n"
        f"# python: {python}\n"
    )
    return header + "".join(f"{name}=={entries[name]}\n" for name in sorted(entries))


def main(argv: list[str] | None = None) -> int:
    """Write (or with --check compare) the pin list of this Python's environment."""
    prog = "python scripts/pkgdocs_pins.py"
    parser = argparse.ArgumentParser(prog=prog, description=main.__doc__)
    parser.add_argument("--output", default=str(PINS_FILE), help="the pin file (default: the shipped one)")
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 when they differ")
    args = parser.parse_args(argv)
    here = readable(site_dirs())
    if args.check:
        pins = read_pins(args.output)
        line = difference_line(pins, differences(pins, site_dirs()), stdlib=True)
        extra = sorted(set(here) - set(pins.names))
        if line or extra:
            print(line or "source=pkgdocs: every pinned distribution is installed at its pinned version")
            print(f"installed, not pinned (not read): {', '.join(extra) or 'none'}; regenerate: {prog}")
            return 1
        print(f"{args.output}: the pins are this environment's")
        return 0
    Path(args.output).write_text(render(here, python_version()), encoding="utf-8")
    print(f"{args.output}: {len(here)} distributions pinned (Python {python_version()})")
    return 0
