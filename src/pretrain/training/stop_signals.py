"""The `pretrain` subcommands end on SIGTERM (`kill`, `scancel`, a container stopping) as on Ctrl-C.

Python's default for SIGTERM ends the process at once, skipping every cleanup on the way: an export's
staging directory, an atomic write's temporary file, a cache build's folder stayed until the next run
found them. Here the signal raises `Terminated` in the main thread instead; a BaseException like
KeyboardInterrupt, it unwinds through those cleanups (`except BaseException`, `finally`) and the
command exits 143 (128 + SIGTERM), as Ctrl-C exits 130. A second SIGTERM while unwinding is ignored,
so the cleanup is not cut short (SIGKILL still ends it). Training has its own handlers (preemption.py).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


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
