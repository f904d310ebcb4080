"""`train(cfg)`: the one entry of a training run (`python train.py` calls it, so do tests).

It turns the composed config into typed settings once (startup.RunSettings), checks what the machine
and a checkpoint allow, prepares or verifies the cache, trains with Lightning (fit.py), writes
`run.json` and `config.yaml` (summary.py), and tells the user where everything went.
"""

from __future__ import annotations

from omegaconf import DictConfig

from ..checkpoints.files import remove_killed_writes
from ..config import Config
from ..errors import PretrainError
from . import startup_collector
from .fit import PlotRun, fit
from .preemption import Signals, active
from .rundir import RunLock, is_rank_zero, remove_refused_run
from .startup import (
    RunSettings,
    _start_over_if_asked,
    _trained,
    _writable_checkpoint_dir,
    quiet_lightning,
)


def train(cfg: DictConfig | Config | RunSettings, callbacks=(), plot_run: PlotRun | None = None) -> dict:
    """Run one training job; returns its summary (also written to run.json in the output dir). `cfg`:
    the composed config, or the settings train.py's launch checks built from it.

    The signal handlers are train.py's when it installed them (from its first line), else this
    call's own, restored when it returns."""
    signals = active()
    own = signals is None
    signals = Signals().install() if own else signals
    assert signals is not None
    try:
        return _train(cfg, callbacks, signals, plot_run)
    finally:
        if own:
            signals.restore()


def _train(
    cfg: DictConfig | Config | RunSettings, callbacks, signals: Signals, plot_run: PlotRun | None
) -> dict:
    quiet_lightning()
    # Schema, device, tokenizer and ckpt_path checks: nothing written yet (train.py: done before Hydra
    # made the run directory).
    run = cfg.in_run_dir() if isinstance(cfg, RunSettings) else RunSettings.from_config(cfg)
    startup_collector.resume()  # imports and config done: start-up's objects frozen, collector on
    output_dir = run.output_dir
    lock = RunLock(output_dir).acquire() if is_rank_zero() else None  # creates the directory
    try:
        try:
            if lock is not None:
                _start_over_if_asked(run.config, output_dir)
            for folder in (output_dir, output_dir / "checkpoints"):
                remove_killed_writes(folder)  # of writers killed mid-write (a full disk, kill -9)
            run = run.resolve_auto()
            _writable_checkpoint_dir(output_dir / "checkpoints")
            return fit(run, callbacks, signals, plot_run)
        except PretrainError:
            if is_rank_zero() and not _trained(output_dir):
                remove_refused_run(output_dir)  # a run that never started leaves the directory as it was
            raise
    finally:
        if lock is not None:
            lock.release()
