"""The end of a finished `python train.py`: everything an exit does, except the interpreter's teardown.

Once a run has written its checkpoint, run.json, metrics and plot, Python would still tear down every
module it imported (torch, torch._dynamo, Lightning, torchmetrics: thousands), which takes 1-3 s here
(bench/bench_fixed_costs.py), longer on a loaded machine. `exit_now` does the parts of an exit that
matter, in the interpreter's order: it stops idle executor pools and waits for the threads that are not
daemons, runs the atexit handlers (logging's flush and close of train.log, W&B's, multiprocessing's),
flushes stdout and stderr, then ends the process with `os._exit`.

Skipping the teardown also matters for a run stopped by a signal. A DDP rank that left with
`SystemExit(143)` tore down gloo's live threads at random: once in CI a rank aborted in C++ ("terminate
called without an active exception", exit 134) instead of exiting 143. `run_and_exit` is train.py's
`__main__`: every end with an exit code (0, a signal's 128 + n, a config error's 2) goes through
`exit_now`; only an exception's traceback or a `SystemExit` with a message exits the usual way.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from collections.abc import Callable
from typing import NoReturn


def exit_now(code: int = 0) -> NoReturn:
    """End the process with `code` once its threads, atexit handlers and standard streams are done."""
    # The interpreter's own first step: idle pool threads (concurrent.futures, e.g. inductor's compile
    # workers) are told to stop, then every thread that is not a daemon is joined; joining them
    # without the first part waits forever.
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing more can be written there
            pass
    os._exit(code)


def run_and_exit(main: Callable[[], object]) -> NoReturn:
    """Call `main`, then `exit_now` with 0 when it returns or with the code it exits with."""
    try:
        main()
    except SystemExit as exited:
        if exited.code is not None and not isinstance(exited.code, int):
            raise  # a message: Python prints it to stderr and exits 1
        exit_now(exited.code or 0)
    exit_now(0)
