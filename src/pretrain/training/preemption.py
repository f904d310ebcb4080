"""Runs that survive a cluster: our signal handlers act from the first line of a run to its last.

SIGTERM (preemption, `scancel`), SIGUSR1 (what `sbatch --signal=USR1@120` sends before the time
limit) and SIGINT (Ctrl-C) end a run as *preempted* with exit status 128 + the signal's number (143
SIGTERM, 138 SIGUSR1, 130 SIGINT), whenever they come:

* before training starts (composition, checks, the cache build): the handler raises `Interrupted`,
  which unwinds the set-up (a cache build removes what it half-built) and ends the run at once;
* while training: the handler only sets a flag. After each optimizer update every rank takes the
  maximum of its flag over all ranks, so all of them stop after the same update; the run saves
  `checkpoints/last.ckpt` (the state after that update, sampler included), writes `run.json` with
  `"status": "preempted"` and exits. A second Ctrl-C aborts at once, without a checkpoint: exit 130;
* after training (last.ckpt written): the run has completed; the signal only skips the comparison plot.

SIGUSR2 is submitit's (hydra/launcher=slurm): it sends it before the time limit and its handler
requeues the job and exits at once, mid-update. When such a Python handler is installed before ours,
ours takes SIGUSR2 over while training (stop after the update, checkpoint) and hands the signal to
submitit's handler once the run is saved (`restore`), which then requeues; before training starts
the signal goes to submitit's handler straight away (nothing to save yet).

Lightning's own SIGTERM handling is switched off (run.py): it would end the run mid-epoch with exit 0.
Nothing here imports Lightning; the callback that polls the flag lives in run.py.
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType
from typing import Any

HANDLED = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
"""Signals that stop a run gracefully (after the current update, with a checkpoint)."""

CHAINED = (signal.SIGUSR2,)
"""Signals handled only when another Python handler waits for them (submitit's requeue), which gets
them after the checkpoint."""

SETUP, TRAINING, FINISHING = "setup", "training", "finishing"


def exit_code(signum: int) -> int:
    """The shell's convention for a process ended by a signal: 128 + its number."""
    return 128 + int(signum)


class Interrupted(BaseException):
    """A signal that ends the run now: before training started, or a second Ctrl-C. A BaseException,
    so no `except Exception` on the way swallows it (Lightning re-raises it after its teardown)."""

    def __init__(self, signum: int, abort: bool = False):
        self.signum = signal.Signals(signum)
        self.abort = abort
        super().__init__(f"{self.signum.name}")

    @property
    def exit_code(self) -> int:
        return exit_code(self.signum)


def _say(text: str) -> None:
    try:
        os.write(2, text.encode())
    except OSError:
        pass


class Signals:
    """The run's handlers for `HANDLED`; what a signal does depends on the phase (module docstring)."""

    def __init__(self, signals: tuple[signal.Signals, ...] = HANDLED):
        self.signals = signals
        self.phase = SETUP
        self.received: signal.Signals | None = None  # this process's first signal while training
        self.late: signal.Signals | None = None  # a signal after training ended
        self._previous: dict[signal.Signals, Any] = {}
        self._chained: dict[signal.Signals, Any] = {}  # CHAINED signals and the handlers waiting for them

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        received = signal.Signals(signum)
        if self.phase == SETUP and received in self._chained:
            _say(f"received {received.name} before training started: passing it on to the launcher\n")
            self._chained[received](signum, frame)
            return
        if self.phase == SETUP:
            _say(f"received {received.name} before training started: stopping\n")
            raise Interrupted(received)
        if self.received is not None or self.late is not None:
            if received == signal.SIGINT:  # Ctrl-C twice: abort now, without a checkpoint
                _say("received SIGINT again: aborting without a checkpoint\n")
                raise Interrupted(received, abort=True)
            return
        if self.phase == FINISHING:
            self.late = received
            _say(
                f"received {received.name} after training finished: the run is complete, skipping the rest\n"
            )
            return
        self.received = received
        again = " (Ctrl-C again aborts without one)" if received == signal.SIGINT else ""
        _say(f"received {received.name}: stopping after the current update with a checkpoint{again}\n")

    def install(self) -> Signals:
        if threading.current_thread() is not threading.main_thread():
            return self  # signals can only be handled in the main thread
        for signum in self.signals:
            if signum not in self._previous:
                self._previous[signum] = signal.getsignal(signum)
            signal.signal(signum, self._handle)
        for signum in CHAINED:
            waiting = signal.getsignal(signum)
            if callable(waiting) and waiting != self._handle and signum not in self._previous:
                self._previous[signum] = self._chained[signum] = waiting
                signal.signal(signum, self._handle)
        return self

    def restore(self) -> None:
        """The earlier handlers back; a CHAINED signal that stopped the run now goes to the handler
        that was waiting for it (submitit's: requeue and exit), the checkpoint being written."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, handler in self._previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._previous = {}
        waiting = self._chained.get(self.received) if self.received is not None else None
        self._chained = {}
        if waiting is not None and self.received is not None:
            _say(f"passing {self.received.name} on to the launcher (submitit requeues the job)\n")
            waiting(int(self.received), None)

    @property
    def installed(self) -> bool:
        return bool(self._previous)


_ACTIVE: Signals | None = None


def install_early() -> Signals:
    """train.py's first lines: the handlers of the whole run, before Hydra or torch is imported."""
    global _ACTIVE
    _ACTIVE = Signals().install()
    return _ACTIVE


def active() -> Signals | None:
    """The handlers train.py installed, if any (train() installs its own otherwise)."""
    return _ACTIVE if _ACTIVE is not None and _ACTIVE.installed else None
