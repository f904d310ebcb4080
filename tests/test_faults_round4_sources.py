"""Reliability, round 4 (issue 42 item 4): source=pkgdocs trusts nothing a dist-info says. A RECORD or
METADATA that is not UTF-8 text is one SourceError naming it (was a UnicodeDecodeError traceback); a
RECORD row is read only as a regular file inside the site directory, of bounded size (`../x.md` read
outside it, a FIFO blocked, a link to /dev/zero read without end). Crafted site directories in tmp_path
(test_pkgdocs.install lays one out as pip does)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from test_pkgdocs import ALPHA_MODULE, GUIDE, install

from pretrain.data.sources import dist_files, documents
from pretrain.data.sources.pkgdocs import PkgdocsSource
from pretrain.errors import SourceError

LONG_GUIDE = (
    "# The beta guide\n\n" + "Beta counts the clouds that alpha describes for people. " * 8
).encode()


def _site(tmp_path: Path) -> Path:
    site = tmp_path / "site-packages"
    install(site, "alpha", "1.0", {"alpha/__init__.py": ALPHA_MODULE, "alpha/guide.md": GUIDE})
    return site


def _origins(site: Path) -> list[str]:
    """What pkgdocs reads there, read in a thread: a read that blocks fails the test, not the session."""
    found: list[str] = []
    errors: list[BaseException] = []

    def read() -> None:
        try:
            found.extend(d.origin for d in documents(PkgdocsSource(roots=(str(site),))))
        except BaseException as error:  # re-raised below, in the test's thread
            errors.append(error)

    worker = threading.Thread(target=read, daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "reading the site blocked"
    if errors:
        raise errors[0]
    return found


def _append_rows(site: Path, *rows: str) -> None:
    record = site / "alpha-1.0.dist-info" / "RECORD"
    record.write_text(record.read_text() + "".join(f"{row},,\n" for row in rows))


@pytest.mark.parametrize(
    ("name", "content", "says"),
    [
        ("RECORD", b"alpha/__init__.py,,\n\xff\xfe\x00binary,,\n", "RECORD is not UTF-8 text"),
        ("METADATA", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xd8\xff", "METADATA is not UTF-8 text"),
        ("RECORD", b"alpha/__init__.py,sha256=x,3,an extra column\n", "RECORD cannot be parsed"),
    ],
)
def test_a_metadata_file_that_is_not_text_is_one_line_naming_it(tmp_path, name, content, says):
    site = _site(tmp_path)
    (site / "alpha-1.0.dist-info" / name).write_bytes(content)
    with pytest.raises(SourceError) as error:
        _origins(site)
    line = str(error.value)
    assert "\n" not in line and f"alpha-1.0.dist-info/{says}" in line, line
    assert "reinstall that distribution" in line


def test_a_record_row_outside_the_site_is_not_read(tmp_path):
    site = _site(tmp_path)
    (tmp_path / "secret.md").write_bytes(LONG_GUIDE)  # beside the site, not in it
    (site / "alpha" / "escape.md").symlink_to(tmp_path / "secret.md")
    _append_rows(site, "../secret.md", str(tmp_path / "secret.md"), "alpha/escape.md")
    assert _origins(site) == ["alpha:alpha/__init__.py", "alpha:alpha/guide.md"]


def test_a_fifo_or_a_link_to_dev_zero_is_not_read(tmp_path):
    site = _site(tmp_path)
    os.mkfifo(site / "alpha" / "pipe.md")
    (site / "alpha" / "zero.md").symlink_to("/dev/zero")
    (site / "alpha" / "folder.md").mkdir()
    _append_rows(site, "alpha/pipe.md", "alpha/zero.md", "alpha/folder.md")
    assert _origins(site) == ["alpha:alpha/__init__.py", "alpha:alpha/guide.md"]


def test_a_file_over_the_size_bound_is_not_read(tmp_path, monkeypatch):
    site = _site(tmp_path)
    bound = max(len(ALPHA_MODULE), len(GUIDE), len(LONG_GUIDE))
    (site / "alpha" / "huge.md").write_bytes(LONG_GUIDE * 2)
    (site / "alpha" / "notes").write_bytes(LONG_GUIDE)  # not listed, and not a .md: read through a link
    (site / "alpha" / "inside.md").symlink_to(site / "alpha" / "notes")  # a link inside the site: read
    _append_rows(site, "alpha/huge.md", "alpha/inside.md")
    monkeypatch.setattr(dist_files, "MAX_FILE_BYTES", bound)
    assert _origins(site) == ["alpha:alpha/__init__.py", "alpha:alpha/guide.md", "alpha:alpha/inside.md"]
