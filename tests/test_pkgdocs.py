"""source=pkgdocs: the installed packages' prose, built from a small fake environment (a tmp dir laid
out like site-packages, with dist-info metadata); the pin list (which distributions at which versions:
the identity follows it, not the machine), the short-document rule; one slow test builds this
interpreter's own."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import compose, expected_split, prepare

from pretrain.data.sources import documents, source_from_config
from pretrain.data.sources.pkgdocs import MIN_CHARS, PkgdocsSource, list_environment
from pretrain.data.sources.pkgdocs_pins import PINS_FILE, parse_pins, readable, render, site_dirs
from pretrain.data.sources.prose import c_prose, doc_prose, module_prose

ALPHA_MODULE = b'''"""Alpha reads the weather from the sky and writes it down in plain words."""

# Copyright 2020 Alpha authors, licensed under the Apache License.

import os

# The cache keeps the last reading so that a second call costs nothing at all.
# It is cleared when the sky changes colour.
CACHE = {}

# x = compute(y)  # old code


def read(sky):
    """Return the weather that the sky shows, as a sentence a person can read."""
    text = "# not a comment, a string"
    return text


def short():
    """Too short."""
'''
GUIDE = (
    "# The alpha guide\n\n" + "Alpha is a small library that turns the sky into words for people. " * 4
).encode()
DESCRIPTION = "Alpha turns the colour of the sky into a sentence about the weather, for everyone. " * 4
BETA_CORE = (
    b'"""Beta counts the clouds that alpha describes, one cloud after another, and keeps a tally of\n'
    b"every cloud it has seen so far: a small cloud counts once, a large one as many times as it covers\n"
    b'the sun, so that the tally tells a reader how grey the day was without looking at the sky."""\n'
)
NUMBERS = b"1.0 2.0 3.0\n4.0 5.0 6.0\n" * 20


def _hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def install(
    site: Path,
    name: str,
    version: str,
    files: dict[str, bytes],
    description: str = "",
    editable: bool = False,
    hashes: bool = True,
) -> None:
    """A distribution as pip installs it: its files, and dist-info with METADATA and RECORD."""
    info = f"{name}-{version}.dist-info"
    rows = []
    for path, data in files.items():
        (site / path).parent.mkdir(parents=True, exist_ok=True)
        (site / path).write_bytes(data)
        rows.append(f"{path},{_hash(data) if hashes else ''},{len(data) if hashes else ''}")
    (site / info).mkdir(parents=True)
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\n{description}"
    (site / info / "METADATA").write_text(metadata)
    if editable:
        (site / info / "direct_url.json").write_text(
            json.dumps({"url": "file:///src", "dir_info": {"editable": True}})
        )
    rows += [f"{info}/METADATA,,", f"{info}/RECORD,,"]
    (site / info / "RECORD").write_text("\n".join(rows) + "\n")


@pytest.fixture
def site(tmp_path) -> Path:
    site = tmp_path / "site-packages"
    install(
        site,
        "alpha",
        "1.0",
        {
            "alpha/__init__.py": ALPHA_MODULE,
            "alpha/guide.md": GUIDE,
            "alpha/LICENSE.txt": b"Permission is hereby granted, free of charge, to any person " * 5,
            "alpha/CHANGELOG.md": b"Version one point zero was released with many fixes for users " * 5,
            "alpha/data/table.txt": NUMBERS,
            "alpha/__pycache__/x.py": b'"""Compiled leftovers are never read by anyone at all."""',
        },
        description=DESCRIPTION,
    )
    # beta vendors alpha's module byte for byte (skipped by content hash), and has no RECORD hashes.
    install(
        site,
        "Beta_Pkg",
        "2.5",
        {
            "beta/_vendor/alpha.py": ALPHA_MODULE,
            "beta/core.py": BETA_CORE,
        },
        hashes=False,
    )
    install(
        site,
        "gamma",
        "0.1",
        {"gamma.py": b'"""Gamma lives in a checkout and changes all the time."""'},
        editable=True,
    )
    return site


def source(site: Path) -> PkgdocsSource:
    return PkgdocsSource(roots=(str(site),))


def test_identity_names_every_distribution_and_version(site):
    identity = source(site).identity()
    assert identity["kind"] == "pkgdocs"
    assert identity["python"] == sys.version.split()[0]
    assert identity["distributions"] == {"alpha": "1.0", "beta-pkg": "2.5"}  # gamma is editable


def test_another_version_is_another_identity(tmp_path, site):
    other = tmp_path / "other"
    install(other, "alpha", "1.1", {"alpha/__init__.py": ALPHA_MODULE})
    assert source(other).identity()["distributions"] == {"alpha": "1.1"}
    assert source(other).identity() != source(site).identity()


def test_documents_in_order_copies_once(site):
    docs = list(documents(source(site)))
    origins = [d.origin for d in docs]
    assert origins == [
        "alpha:alpha/__init__.py",
        "alpha:alpha/data/table.txt",  # listed, but not prose: an empty document the build skips
        "alpha:alpha/guide.md",
        "alpha:METADATA description",
        "beta-pkg:beta/core.py",  # beta/_vendor/alpha.py: the same bytes as alpha's module
    ]
    texts = {d.origin: d.text for d in docs}
    assert texts["alpha:alpha/data/table.txt"] == ""
    assert texts["alpha:alpha/guide.md"] == GUIDE.decode()
    assert texts["alpha:METADATA description"] == DESCRIPTION
    listing = list_environment((str(site),))
    assert [d.copies_skipped for d in listing.distributions] == [0, 1]


def test_a_near_copy_is_skipped(tmp_path):
    """A vendored copy with a renamed import is not the same bytes, but most of its lines are."""
    lines = [
        f"# Step {i}: the reader turns the colour of the sky into the word for the weather."
        for i in range(12)
    ]
    original = ("\n".join(lines) + "\nimport alpha\n").encode()
    renamed = original.replace(b"import alpha", b"import vendored.alpha as alpha")
    other = ("\n".join(line.replace("sky", "sea") for line in lines) + "\n").encode()
    site = tmp_path / "site"
    install(site, "epsilon", "1.0", {"epsilon/core.py": original})
    install(site, "zeta", "1.0", {"zeta/_vendor/core.py": renamed, "zeta/sea.py": other})
    assert [d.origin for d in documents(source(site))] == ["epsilon:epsilon/core.py", "zeta:zeta/sea.py"]
    assert [d.copies_skipped for d in list_environment((str(site),)).distributions] == [0, 1]


def test_module_prose_keeps_docstrings_and_prose_comments_in_source_order():
    text = module_prose(ALPHA_MODULE)
    assert text.split("\n\n") == [
        "Alpha reads the weather from the sky and writes it down in plain words.",
        "The cache keeps the last reading so that a second call costs nothing at all. "
        "It is cleared when the sky changes colour.",
        "read\nReturn the weather that the sky shows, as a sentence a person can read.",
    ]  # no license header, no code commented out, no '#' inside a string, no short docstring
    assert module_prose(b"def broken(:\n") == ""


def test_c_prose_keeps_comment_blocks_and_runs_of_line_comments():
    header = b"""/* Copyright (c) 2020 Alpha authors, licensed under the BSD license. */
#include <alpha.h>
// Returns the number of readings that the sky holds, counting
// every cloud that passed over it.
int count();  // a trailing note about the count of clouds
/**
 * A view shares its readings with the sky it was made from, so that
 * a change through one is seen through the other.
 */
const char* url = "http://example.com/a/b";  // x
"""
    assert c_prose(header).split("\n\n") == [
        "Returns the number of readings that the sky holds, counting every cloud that passed over it.",
        "a trailing note about the count of clouds",
        "A view shares its readings with the sky it was made from, so that\n"
        "a change through one is seen through the other.",
    ]


def test_doc_prose_refuses_data():
    assert doc_prose(NUMBERS) == ""
    assert doc_prose(GUIDE) == GUIDE.decode()
    assert doc_prose(b"\xff\xfe not utf-8") == ""


def test_parts_cover_the_listing_in_any_size(site):
    from pretrain.data.sources import PartSizes

    one = [d.origin for d in documents(PkgdocsSource(roots=(str(site),), sizes=PartSizes(pydocs_modules=1)))]
    assert one == [d.origin for d in documents(source(site))]


def test_source_path_must_be_a_directory(tmp_path):
    from pretrain.errors import SourceError

    config = compose("source=pkgdocs", f"source.path={tmp_path / 'missing'}").source
    with pytest.raises(SourceError, match="is not a directory"):
        source_from_config(config)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SourceError, match="no installed distribution"):
        list(source_from_config(compose("source=pkgdocs", f"source.path={empty}").source).parts())


def test_cache_from_a_fake_environment(site):
    """The cache holds the prose documents, each in the split its hash gives, exact duplicate texts
    once (two modules whose prose is the same), and inspect-data's source entry says where from."""
    twin = BETA_CORE + b"\nX = 1\n"
    install(site, "delta", "3.0", {"delta/twin.py": twin})  # other bytes, the same prose as beta/core.py
    cfg = compose("source=pkgdocs", f"source.path={site}", "source.pins=installed", "prepare.num_proc=1")
    cache = prepare(cfg, progress=False)
    texts = [d.text for d in documents(source(site)) if d.text.strip()]
    expected: dict[str, list[str]] = {"train": [], "validation": []}
    for text in dict.fromkeys(texts):
        expected[expected_split(text)].append(hashlib.sha256(text.encode()).hexdigest())
    for split in ("train", "validation"):
        assert list(cache.split(split).ids) == expected[split]
    build = cache.manifest["build"]
    assert build["duplicates_skipped"] == 1 and build["empty_skipped"] == 1
    assert cache.manifest["identity"]["source"]["distributions"] == {
        "alpha": "1.0",
        "beta-pkg": "2.5",
        "delta": "3.0",
    }

    from pretrain.data.sources.summary import source_summary

    summary = source_summary(cfg.source, cache)
    assert summary["kind"] == "pkgdocs"
    assert summary["documents"] == len(set(texts)) == 4
    assert summary["tokens"] == sum(cache.counts()[s]["tokens"] for s in ("train", "validation"))
    assert summary["distributions"] == 3 and summary["copies_skipped"] == 1
    assert summary["largest"]["alpha"].startswith("1.0: 1 modules, 2 docs")


def pins_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pins.txt"
    path.write_text(text)
    return path


def pinned(site: Path, pins: Path) -> PkgdocsSource:
    """The source as `source=pkgdocs source.path=SITE source.pins=FILE` builds it."""
    config = compose("source=pkgdocs", f"source.path={site}", f"source.pins={pins}").source
    built = source_from_config(config)
    assert isinstance(built, PkgdocsSource)
    return built


def test_pinned_identity_ignores_unpinned_extras(tmp_path, site, caplog):
    """Two environments that differ only in distributions the list does not pin: one identity, one
    corpus, no warning (what is not pinned is not read)."""
    pins = pins_file(tmp_path, "# python: 3.0.0\nalpha==1.0\nBeta.Pkg == 2.5\n")
    other = tmp_path / "other"
    install(other, "alpha", "1.0", {"alpha/__init__.py": ALPHA_MODULE, "alpha/guide.md": GUIDE}, DESCRIPTION)
    install(other, "beta_pkg", "2.5", {"beta/core.py": BETA_CORE})
    install(other, "omega", "9.9", {"omega/core.py": BETA_CORE.replace(b"Beta", b"Omega")})
    install(site, "extra", "0.3", {"extra/doc.md": GUIDE.replace(b"alpha", b"extra")})
    first, second = pinned(site, pins), pinned(other, pins)
    assert first.identity() == second.identity()
    assert first.identity() == {
        "kind": "pkgdocs",
        "python": sys.version.split()[0],
        "extraction": 4,
        "distributions": {"alpha": "1.0", "beta-pkg": "2.5"},  # no differs: the environment has the pins
    }
    assert [d.name for d in first.listing().distributions] == ["alpha", "beta-pkg"]  # not extra, gamma
    kept = [(d.origin, d.text) for d in documents(first) if d.text]
    assert kept == [(d.origin, d.text) for d in documents(second) if d.text]
    assert [origin for origin, _ in kept] == [
        "alpha:alpha/__init__.py",
        "alpha:alpha/guide.md",
        "alpha:METADATA description",
        "beta-pkg:beta/core.py",
    ]
    assert caplog.records == []  # stdlib is not read here, so the pinned Python 3.0.0 is not named


def test_a_pinned_distribution_at_another_version_is_one_line_and_in_the_identity(tmp_path, site, caplog):
    """alpha 1.0 installed where 1.1 is pinned, zeta pinned and missing: one warning line names both,
    the identity keeps the pinned list and records the differences (another identity, never the
    pinned one's)."""
    pins = pins_file(tmp_path, "alpha==1.1\nbeta-pkg==2.5\nzeta==0.2\n")
    source = pinned(site, pins)
    with caplog.at_level("WARNING"):
        identity = source.identity()
        assert source.identity() == identity  # asked again: the same, and no second line
    assert identity["distributions"] == {"alpha": "1.1", "beta-pkg": "2.5", "zeta": "0.2"}
    assert identity["differs"] == {"alpha": "1.0", "zeta": None}
    assert [r.getMessage() for r in caplog.records] == [
        "source=pkgdocs: 2 pins differ from this environment: alpha 1.0 installed (pinned 1.1), "
        "zeta missing (pinned 0.2); the corpus is not the pinned one and its cache identity says so "
        f"(source.differs); `pip install -r {pins}` (or `make install`) restores the pinned one"
    ]
    matching = pinned(site, pins_file(tmp_path, "alpha==1.0\nbeta-pkg==2.5\nzeta==0.2\n"))
    assert matching.identity()["differs"] == {"zeta": None} and matching.identity() != identity
    assert source.provenance()["differs"] == {"alpha": "1.0", "zeta": None}


def test_a_bad_pin_file_is_one_clear_error(tmp_path, site):
    from pretrain.errors import SourceError

    with pytest.raises(SourceError, match=r"line 2 \('alpha>=1.0'\) is not a `name==version` pin"):
        pinned(site, pins_file(tmp_path, "beta-pkg==2.5\nalpha>=1.0\n"))
    with pytest.raises(SourceError, match="line 2 .* is pinned twice"):
        pinned(site, pins_file(tmp_path, "alpha==1.0\nAlpha==1.1\n"))
    with pytest.raises(SourceError, match="cannot be read"):
        pinned(site, tmp_path / "no-such-pins.txt")


def test_documents_under_min_chars_are_dropped(tmp_path):
    """A document under 256 characters (~64 GPT-2 tokens) reads as empty: the build skips it with the
    empty ones. 255 characters of prose are dropped, 256 kept (the topic docs and descriptions too)."""
    assert MIN_CHARS == 256
    sentence = "The reader turns the sky into words. "  # 37 characters
    body = (sentence * 7)[:-1]  # 258
    site = tmp_path / "site"
    files = {f"eta/m{n}.md": (body[:n] + "\n").encode() for n in (255, 256)}
    install(
        site,
        "eta",
        "1.0",
        {"eta/one_line.py": b'"""The one docstring of a small helper module."""\n', **files},
    )
    texts = {d.origin: d.text for d in documents(source(site))}
    assert texts == {
        "eta:eta/m255.md": "",
        "eta:eta/m256.md": body[:256] + "\n",
        "eta:eta/one_line.py": "",  # 45 characters: a few unrelated docstrings in the real corpus
    }


def test_the_shipped_pins_are_what_source_pkgdocs_reads():
    """source=pkgdocs reads the pin list shipped as package data (pyproject.toml's package-data), as
    the regeneration script writes it: `name==version` in name order, the editable project left out."""
    import tomllib

    from helpers import REPO

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert pyproject["tool"]["setuptools"]["package-data"]["pretrain.data.sources"] == [PINS_FILE.name]
    text = PINS_FILE.read_text()
    pins = parse_pins(text, str(PINS_FILE))
    assert len(pins.entries) > 50 and "pretrain" not in pins.names and "torch" in pins.names
    assert text == render(dict(pins.entries), pins.python or "")  # the generated format, untouched
    built = source_from_config(compose("source=pkgdocs").source)
    assert isinstance(built, PkgdocsSource)
    assert built.pins == pins and built.stdlib and built.roots == site_dirs()
    assert compose("source=pkgdocs").source.pins == "project"


def test_the_pin_script_checks_and_writes(tmp_path, capsys):
    """scripts/pkgdocs_pins.py (pkgdocs_pins.main): --check names a stale pin and exits 1; without it
    the file is this environment's list, which --check then accepts."""
    from pretrain.data.sources.pkgdocs_pins import main

    output = tmp_path / "pins.txt"
    assert main(["--output", str(output)]) == 0
    here = readable(site_dirs())
    assert dict(parse_pins(output.read_text()).entries) == here and "pretrain" not in here
    assert main(["--check", "--output", str(output)]) == 0
    output.write_text(output.read_text().replace(f"numpy=={here['numpy']}", "numpy==0.0.1"))
    capsys.readouterr()
    assert main(["--check", "--output", str(output)]) == 1
    assert f"numpy {here['numpy']} installed (pinned 0.0.1)" in capsys.readouterr().out


@pytest.mark.slow
def test_the_shipped_pins_are_this_environment():
    """After `make install` the environment is the pinned one (else: scripts/pkgdocs_pins.py)."""
    from pretrain.data.sources.pkgdocs_pins import differences, read_pins

    pins = read_pins(PINS_FILE)
    assert differences(pins, site_dirs()) == {}, "stale pins: .venv/bin/python scripts/pkgdocs_pins.py"
    assert set(readable(site_dirs())) == set(pins.names)


def test_pkgdocs_option_composes():
    cfg = compose("source=pkgdocs")
    assert cfg.source.kind == "pkgdocs" and cfg.source.path is None


@pytest.mark.slow
def test_this_environment_builds_about_20m_tokens(tmp_path):
    """The real corpus: this interpreter's pinned packages (minutes; `make test-all` only); 19.99M
    tokens since documents under 256 characters are dropped (20.10M before, docs/data.md)."""
    env = {**os.environ, "PRETRAIN_CACHE_ROOT": str(tmp_path / "root")}
    command = [
        sys.executable,
        "-m",
        "pretrain.cli",
        "inspect-data",
        "source=pkgdocs",
        "data=prepacked",
        f"output={tmp_path / 'stats.json'}",
    ]
    subprocess.run(command, check=True, env=env, timeout=1800, capture_output=True)
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["source"]["tokens"] - stats["source"]["documents"] >= 19_500_000  # EOS not counted
    assert stats["source"]["distributions"] > 50
