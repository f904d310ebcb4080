"""The end of a finished `python train.py`: everything an exit does, except the interpreter's teardown.

Once a run has written its checkpoint, run.json, metrics and plot, Python would still tear down every
module it imported (torch, torch._dynamo, Lightning, torchmetrics: thousands), which takes 1-3 s here
(bench/bench_fixed_costs.py), longer on a loaded machine. `exit_now` does the parts of an exit that
matter, in the interpreter's order: it stops idle executor pools and waits for the threads that are not
daemons, runs the atexit handlers (logging's flush and close of train.log, W&B's, multiprocessing's),
flushes stdout and stderr, then ends the process with `os._exit`. Only train.py's own `__main__` calls
it, after a run that returned (an error or a signal exits the usual way).
"""

from __future__ import annotations

import atexit
import os
import sys
import threading


def exit_now(code: int = 0) -> None:
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
