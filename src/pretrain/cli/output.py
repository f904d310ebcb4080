"""What every subcommand that writes a file shares: `--output PATH` (or `output=PATH`), checked before the
work that fills it, and written atomically after."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..errors import ConfigError


def add_output(parser: argparse.ArgumentParser, help: str, required: bool = False) -> None:
    parser.add_argument("--output", metavar="PATH", required=required, help=f"{help} (or output=PATH)")


def check_output_file(output: str, spelling: str | None = None, example: str = "eval.json") -> Path:
    """An `output=FILE` checked before the work that fills it: its folder exists (or can be made) and
    is writable, and it is not a directory. `spelling` names it in messages (default `output=FILE`;
    compare: `--output FILE`)."""
    name = spelling or f"output={output}"
    flag = name.startswith("--output")
    other = "--output FILE.png" if flag else "output=FILE"
    path = Path(output).resolve()
    if path.is_dir():
        given = f"--output {Path(output) / example}" if flag else f"output={output}/{example}"
        raise ConfigError(f"{name} is a directory: give a file name, e.g. {given}")
    folder = path.parent
    blocker = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        raise ConfigError(f"{name}: {blocker} is a file, not a folder; pick another {other}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(f"{name}: cannot create {folder} ({error.strerror or error})") from None
    if not os.access(folder, os.W_OK | os.X_OK) or not can_create_in(folder):
        raise ConfigError(f"{name}: {folder} is not writable; pick another {other}")
    return path


def can_create_in(folder: Path) -> bool:
    """A file can be made in `folder` (root passes os.access on a read-only mount: try it)."""
    from ..fileio import temporary_path

    probe = temporary_path(folder / "write-test")
    try:
        probe.touch(exist_ok=False)
    except OSError:
        return False
    probe.unlink(missing_ok=True)
    return True


def write_output(path: Path, text: str) -> None:
    from ..errors import WriteError
    from ..fileio import remove_stale_temporaries, write_text_atomic

    remove_stale_temporaries(path.parent)  # of an earlier eval killed while writing
    try:
        write_text_atomic(path, text)
    except OSError as error:
        raise WriteError(
            f"could not write {path}: {error.strerror or error}; free disk space or pick another output=FILE"
        ) from None
