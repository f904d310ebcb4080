"""fileio: atomic writes leave the old file or the new one, never a part; stale temporaries go."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest

from pretrain.fileio import atomic_write, remove_stale_temporaries, sha256_file, write_text_atomic


def test_atomic_write_replaces_whole_file_with_plain_permissions(tmp_path):
    path = tmp_path / "a.json"
    path.write_text("old")
    write_text_atomic(path, "new")
    assert path.read_text() == "new"
    assert path.stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_failed_write_keeps_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "a.bin"
    path.write_bytes(b"old")
    with pytest.raises(OSError, match="disk full"):
        with atomic_write(path) as handle:
            handle.write(b"half")
            raise OSError(28, "disk full")
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin"]


def test_stale_temporaries_of_dead_writers_are_removed(tmp_path):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    stale = tmp_path / f".step000002.ckpt.{int(dead.stdout)}.0123abcd.tmp"
    live = tmp_path / f".last.ckpt.{os.getppid()}.0123abcd.tmp"  # our parent is alive
    other = tmp_path / "notes.tmp"
    for path in (stale, live, other):
        path.write_bytes(b"x")
    assert remove_stale_temporaries(tmp_path) == [stale]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, other.name])


def test_sha256_file_matches_hashlib(tmp_path):
    data = os.urandom(3 * 1024 + 17)
    (tmp_path / "x").write_bytes(data)
    assert sha256_file(tmp_path / "x", block_size=1024) == hashlib.sha256(data).hexdigest()
