"""Runs that survive a cluster: signals stop training at an update boundary, and a requeued job finds
its own run directory.

SIGTERM (preemption, `scancel`), SIGUSR1 (what `sbatch --signal=USR1@120` sends before the time
limit) and SIGINT (Ctrl-C) only set a flag. After each optimizer update every rank takes the maximum of
its flag over all ranks, so all of them stop after the same update; the run then saves
`checkpoints/last.ckpt` (the state after that update, sampler included), writes `run.json` with
`"status": "preempted"` and exits with 128 + the signal's number (143 SIGTERM, 138 SIGUSR1,
130 SIGINT). A second Ctrl-C aborts at once, without a checkpoint.

A requeued job finds its checkpoints through its run directory (rundir.py) and `ckpt_path=auto`.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType
from typing import Any

import lightning as L
import torch

from .rundir import register_run_dir_resolver

__all__ = ["HANDLED", "Preemption", "exit_code", "register_run_dir_resolver"]  # the resolver: rundir.py

HANDLED = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
"""Signals that stop a run gracefully (after the current update, with a checkpoint)."""


def exit_code(signum: int) -> int:
    """The shell's convention for a process ended by a signal: 128 + its number."""
    return 128 + int(signum)


class Preemption(L.Callback):
    """Turns the handled signals into a stop at the next update boundary, agreed by all ranks.

    `install()` before `fit` (so a signal during set-up is not lost either); when training starts the
    handlers replace the one Lightning registered meanwhile (it would stop mid-epoch and exit 0; its
    SLURM one saves inside the handler). Lightning's teardown puts ours back, so they stay through the
    final checkpoint; `restore()` (the run calls it whatever happens) reinstates the original ones."""

    def __init__(self, signals: tuple[signal.Signals, ...] = HANDLED):
        self.signals = signals
        self.received: signal.Signals | None = None  # this process's first signal
        self.stopped_by: signal.Signals | None = None  # the signal the run stopped for (all ranks)
        self.stopped_at: int | None = None
        self._previous: dict[signal.Signals, Any] = {}

    # --- handlers ------------------------------------------------------------------------------
    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is not None and signum == signal.SIGINT:
            # Ctrl-C twice: abort now, without a checkpoint.
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt
        if self.received is None:
            self.received = signal.Signals(signum)
            again = " (Ctrl-C again aborts without one)" if signum == signal.SIGINT else ""
            message = (
                f"received {self.received.name}: stopping after the current update with a checkpoint{again}\n"
            )
            try:
                os.write(2, message.encode())
            except OSError:
                pass

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signals can only be handled in the main thread
        for signum in self.signals:
            if signum not in self._previous:
                self._previous[signum] = signal.getsignal(signum)
            signal.signal(signum, self._handle)

    def restore(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, handler in self._previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._previous = {}

    # --- Lightning hooks -----------------------------------------------------------------------
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if threading.current_thread() is threading.main_thread():
            for signum in self.signals:  # over the SIGTERM handler Lightning registered in fit()
                signal.signal(signum, self._handle)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx) -> None:
        signum = self._agreed_signal(trainer)
        if signum is None:
            return
        self.stopped_by = signal.Signals(signum)
        self.stopped_at = int(trainer.global_step)
        trainer.should_stop = True
        if trainer.is_global_zero:
            print(
                f"{self.stopped_by.name}: stopped after update {self.stopped_at}", file=sys.stderr, flush=True
            )

    def _agreed_signal(self, trainer: L.Trainer) -> int | None:
        """The largest signal number any rank received (0 = none): one small all-reduce per update."""
        local = int(self.received or 0)
        if trainer.world_size > 1:
            flag = torch.tensor([local], dtype=torch.int32, device=trainer.strategy.root_device)
            local = int(trainer.strategy.reduce(flag, reduce_op="max").item())
        return local or None

    @property
    def exit_code(self) -> int:
        return exit_code(self.stopped_by) if self.stopped_by is not None else 0
