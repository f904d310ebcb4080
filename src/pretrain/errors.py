"""The errors a user can fix: one family, so the CLI reports exactly these in one line.

Each derives from `PretrainError` and from the builtin that fits it (ValueError for bad settings,
RuntimeError for a broken cache, source or tokenizer), so `except ValueError` code catches them too.
Anything else (a torch, CUDA or programming error) is not caught and keeps its traceback.

The `pretrain` subcommands end on SIGTERM (`kill`, `scancel`, a container stopping) as on Ctrl-C
(`sigterm_unwinds`, at the end).

Python's default for SIGTERM ends the process at once, skipping every cleanup on the way: an export's
staging directory, an atomic write's temporary file, a cache build's folder stayed until the next run
found them. Here the signal raises `Terminated` in the main thread instead; a BaseException like
KeyboardInterrupt, it unwinds through those cleanups (`except BaseException`, `finally`) and the
command exits 143 (128 + SIGTERM), as Ctrl-C exits 130. A second SIGTERM while unwinding is ignored,
so the cleanup is not cut short (SIGKILL still ends it). Training has its own handlers (preemption.py).
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


class PretrainError(Exception):
    """Base of every error whose message says what to change."""


class ConfigError(PretrainError, ValueError):
    """A config value, override or command-line argument that cannot work."""


class SourceError(PretrainError, RuntimeError):
    """A document source that cannot be read (missing file, bad format, unreachable hub)."""


class TokenizerError(PretrainError, RuntimeError):
    """Tokenizer files that are missing or are not GPT-2's."""


class CacheError(PretrainError, RuntimeError):
    """A cache that is missing, incomplete, corrupt or of another identity."""


class CheckpointError(PretrainError, ValueError):
    """A checkpoint that does not exist or does not fit the config it is resumed with."""


class WriteError(PretrainError, OSError):
    """An output that cannot be written (a full disk, a read-only folder): the message names the path
    and what to do; nothing half-written is left behind."""


def one_line_errors() -> tuple[type[BaseException], ...]:
    """What the command line reports without a traceback: our family and Hydra's config errors."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    return (PretrainError, HydraException, OmegaConfBaseException)


def _group_options(found: list[str]) -> list[str]:
    """What a user can choose: Hydra's list without the schemas registered in its ConfigStore."""
    return sorted(option for option in found if not option.endswith("_schema"))


def hide_schema_options(line: str) -> str:
    """A `group: a, a_schema, b` line of Hydra's --help without the schema options; others unchanged."""
    group, sep, options = line.partition(": ")
    if not sep or " " in group or "_schema" not in options:
        return line
    return f"{group}: {', '.join(_group_options(options.split(', ')))}"


def describe(error: BaseException) -> str:
    """The error's message in one line; Hydra's "Error merging override k=v" also gets its cause's
    first line, and an unknown group option (`data=foo`) lists the options."""
    options = getattr(error, "options", None)
    missing = getattr(error, "missing_cfg_file", None)
    if options and missing and "/" in str(missing):
        group, _, option = str(missing).rpartition("/")
        return f"{group}={option}: no such option; choose one of {', '.join(_group_options(options))}"
    message = str(error).strip()
    cause = error.__cause__
    if cause is not None and str(cause).strip() and str(cause).strip() not in message:
        message += f": {str(cause).strip().splitlines()[0]}"
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return " ".join(lines)


@contextmanager
def exit_on_user_error(code: int = 2) -> Iterator[None]:
    """Print a user error as `error: ...` on stderr and exit with `code`; re-raise anything else."""
    try:
        yield
    except one_line_errors() as error:
        print(f"error: {describe(error)}", file=sys.stderr)
        raise SystemExit(code) from None


# --- SIGTERM unwinds like Ctrl-C ---------------------------------------------------------------------


class Terminated(BaseException):
    """SIGTERM arrived: the work unwinds, and the command exits with `exit_code`."""

    exit_code = 128 + signal.SIGTERM


def _terminate(signum: int, frame: FrameType | None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: the cleanups run to their end
    raise Terminated()


@contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """Within: SIGTERM raises `Terminated` (main thread only; elsewhere nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
