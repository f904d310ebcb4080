"""File digests shared by the cache, the sources and the tokenizer, and the per-user state that
remembers them.

A digest is remembered with the file's stat (size, mtime_ns, ctime_ns, inode): any write changes
mtime and ctime (ctime cannot be set back by a user), a copy has another inode, so a remembered digest
is only reused for the very same, unchanged file. The state lives in `$PRETRAIN_STATE_DIR` (default
`~/.cache/pretrain/`); when it cannot be written, digests are simply computed every time.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from ..fileio import sha256_file, write_text_atomic

__all__ = ["sha256_file"]  # re-exported: the cache and the sources hash through this module

STATE_ENV = "PRETRAIN_STATE_DIR"


def state_dir() -> Path:
    """The per-user writable state: `$PRETRAIN_STATE_DIR`, default `~/.cache/pretrain`."""
    return Path(os.environ.get(STATE_ENV) or Path.home() / ".cache" / "pretrain").expanduser().resolve()


def file_stat(path: Path | str) -> dict:
    """What changes when a file is written, replaced or copied: size, mtime_ns, ctime_ns, inode."""
    st = os.stat(path)
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "inode": st.st_ino}


# File timestamps come from a coarse clock (one kernel tick, up to 10 ms): a write in the same tick as
# the stat we remember would leave the stat unchanged. So a stat is only remembered once the clock has
# moved past the file's last change, and only if it did not change while the file was read.
SETTLE_NS = 20_000_000


def wait_until_settled(paths) -> None:
    """Sleep (at most a second) until the clock is past the newest mtime/ctime of `paths` by a tick."""
    newest = max((max(s["mtime_ns"], s["ctime_ns"]) for s in map(file_stat, paths)), default=0)
    delay = newest + SETTLE_NS - time.time_ns()
    if delay > 0:
        time.sleep(min(delay, 1_000_000_000) / 1e9)


def writable_dir(path: Path) -> bool:
    """Whether files can be created in `path` (an existing directory)."""
    return path.is_dir() and os.access(path, os.W_OK | os.X_OK)


def ensure_dir(path: Path) -> bool:
    """Create `path` if needed; False when that is not possible (a read-only home, a file in the way)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return writable_dir(path)


def read_json(path: Path) -> dict | None:
    """A JSON object from `path`, or None if it is absent, unreadable or not an object."""
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def write_json_atomic(path: Path, value: dict) -> bool:
    """Write `value` as JSON to `path` atomically (pretrain.fileio). False when the directory cannot be
    written: callers treat the state as a cache, never a must."""
    try:
        # 0o644 like the cache's other files: readable by whoever can read the cache.
        write_text_atomic(path, json.dumps(value, indent=1, sort_keys=True) + "\n", perm=0o644)
    except OSError:
        return False
    return True


def remembered_sha256(path: Path | str) -> str:
    """sha256 of a file, remembered in the per-user state by (absolute path, size, mtime_ns, ctime_ns,
    inode): an unchanged file is hashed once, not at every start; a written or copied one again."""
    path = Path(path).resolve()
    stat = file_stat(path)
    place = state_dir() / "files"
    record_path = place / (hashlib.sha256(str(path).encode()).hexdigest()[:32] + ".json")
    record = read_json(record_path)
    if record and record.get("path") == str(path) and record.get("stat") == stat and record.get("sha256"):
        return str(record["sha256"])
    wait_until_settled([path])
    stat = file_stat(path)
    digest = sha256_file(path)
    if file_stat(path) == stat and ensure_dir(place):  # not written while it was hashed
        write_json_atomic(record_path, {"path": str(path), "stat": stat, "sha256": digest})
    return digest
