"""Progress while training: the Rich bar on a terminal, a plain line per log step otherwise (SLURM
logs, `make train > log`), where a bar would print nothing readable; and, before anything is built, a
warning when a CPU run would take far too long (`warn_if_slow_on_cpu`)."""

from __future__ import annotations

import logging
import sys
import time

import lightning as L
import numpy as np
from lightning.pytorch.callbacks import RichProgressBar
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from ..config import Config
from ..data.batching.policies import PolicySettings
from ..model import ModelSettings
from ..model.flops import training_flops
from .checks import training_device

log = logging.getLogger(__name__)

CPU_FLOPS = 1e11
"""FLOP/s a CPU sustains training in fp32, roughly (the tiny model ran at ~8e10 on 2 cores here)."""
SLOW_STEP_SECONDS = 5.0
"""A CPU run whose optimizer step would take longer than this (at CPU_FLOPS) gets a warning."""


class StepProgressBar(RichProgressBar):
    """Training runs by optimizer steps, not epochs: say so instead of "Epoch 0/-2"."""

    def _get_train_description(self, current_epoch: int) -> str:
        return f"train (max {self.trainer.max_steps} steps)"


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def progress_line(step: int, max_steps: int, metrics: dict, elapsed: float, done: int | None = None) -> str:
    """`step 40/200 | loss 6.1230 | val 6.2010 | 1,234 tok/s | waste 12.3% | 0m30s elapsed, ETA 2m00s`;
    the ETA extrapolates the `done` steps this process ran in `elapsed` (default: all `step`)."""
    done = step if done is None else done
    parts = [f"step {step}/{max_steps}", f"loss {metrics.get('train/loss', float('nan')):.4f}"]
    if "val/loss" in metrics:
        parts.append(f"val {metrics['val/loss']:.4f}")
    parts.append(f"{metrics.get('train/tokens_per_sec', 0.0):,.0f} tok/s")
    parts.append(f"waste {metrics.get('train/padding_waste', 0.0):.1%}")
    if "train/mfu" in metrics:
        parts.append(f"mfu {metrics['train/mfu']:.1%}")
    eta = elapsed / done * (max_steps - step) if done else 0.0
    parts.append(f"{_duration(elapsed)} elapsed, ETA {_duration(eta)}")
    return " | ".join(parts)


class TextProgress(L.Callback):
    """One line on stdout every `every` optimizer steps (and at the last one), on rank zero."""

    def __init__(self, every: int, stream=None):
        self.every = max(1, every)
        self.stream = stream
        self._started: float | None = None
        self._first_step = 0

    def on_train_start(self, trainer, pl_module) -> None:
        self._started = time.perf_counter()
        self._first_step = trainer.global_step  # a resume's ETA counts the steps it runs

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if not trainer.is_global_zero or not (step % self.every == 0 or step >= trainer.max_steps):
            return
        elapsed = time.perf_counter() - (self._started or time.perf_counter())
        metrics = getattr(pl_module, "last_metrics", {})
        line = progress_line(step, trainer.max_steps, metrics, elapsed, done=step - self._first_step)
        print(line, file=self.stream or sys.stdout, flush=True)


def progress_callbacks(enabled: bool, every: int, interactive: bool | None = None) -> list[L.Callback]:
    """The Rich bar when stdout is a terminal, plain lines when it is not, nothing when disabled."""
    if not enabled:
        return []
    interactive = sys.stdout.isatty() if interactive is None else interactive
    return [StepProgressBar()] if interactive else [TextProgress(every)]


def step_flops(model: ModelSettings, policy: PolicySettings) -> float:
    """Model FLOPs of one optimizer update at most: every row of every microbatch full."""
    rows = policy.batch_size * policy.accumulation
    return training_flops(model, np.full(rows, policy.max_seq_len))


def cpu_speed_warning(
    model: ModelSettings,
    name: str,
    policy: PolicySettings,
    max_steps: int,
    flops_per_second: float = CPU_FLOPS,
) -> str | None:
    """One line when an update of this model would take more than SLOW_STEP_SECONDS on a CPU."""
    flops = step_flops(model, policy)
    seconds = flops / flops_per_second
    if seconds <= SLOW_STEP_SECONDS:
        return None
    tokens = policy.batch_size * policy.accumulation * policy.max_seq_len
    smaller = (
        "model=tiny for a CPU run"
        if name != "tiny"
        else "a smaller train.batch_size, train.accumulation or data.max_seq_len for a CPU run"
    )
    return (
        f"model={name} on the CPU will be very slow: {flops / 1e12:.1f} TFLOP per optimizer step "
        f"({tokens:,} tokens), about {_duration(seconds)} per step and {_duration(seconds * max_steps)} "
        f"for train.max_steps={max_steps} at the ~{flops_per_second / 1e9:.0f} GFLOP/s a CPU sustains; "
        f"use trainer=gpu, or {smaller}"
    )


@rank_zero_only
def warn_if_slow_on_cpu(config: Config, model: ModelSettings, policy: PolicySettings) -> None:
    """The run's entry calls this once, before anything is built (rank zero only)."""
    if training_device(config.trainer) != "cpu":
        return
    message = cpu_speed_warning(model, config.model.name, policy, config.train.max_steps)
    if message:
        log.warning(message)
