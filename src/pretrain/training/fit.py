"""A run's fit: the Lightning trainer (checkpoints, loggers, our signal handling), the callbacks that
stop at an update boundary (`Preemption`) or refuse a batch larger than an epoch (`EpochFits`), the fit
itself with its last.ckpt, and the end of the run (`finish`)."""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import lightning as L
import torch
from lightning.fabric.plugins.environments import SLURMEnvironment
from omegaconf import OmegaConf

from ..checkpoints.files import write_record
from ..config import Config
from ..errors import ConfigError
from .checkpoint_io import RecordedModelCheckpoint, VerifiedCheckpointIO, raise_failed_save
from .checks import resolve_trainer
from .datamodule import PretrainDataModule
from .fsdp import lightning_strategy
from .loggers import DataStatistics, MetricsStart, build_loggers, finish_loggers
from .module import PretrainModule
from .preemption import FINISHING, TRAINING, Interrupted, Signals
from .progress import StepProgressBar, progress_callbacks
from .recorder import BatchRecorder
from .release import release_training_state
from .rundir import hydra_mode, is_rank_zero
from .startup import RunSettings
from .summary import report, run_summary, write_outputs


def build_trainer(config: Config, output_dir: Path, callbacks=()) -> L.Trainer:
    t, trainer = config.train, resolve_trainer(config.trainer)  # trainer=auto: concrete for Lightning
    every = t.checkpoint_every_n_steps or 0
    # Periodic checkpoints: the newest train.keep_checkpoints (ranked by step); last.ckpt is written
    # by train() when the run ends or is preempted. A stale file of the same name is replaced.
    checkpoints = RecordedModelCheckpoint(
        dirpath=output_dir / "checkpoints",
        filename="step{step:06d}",
        auto_insert_metric_name=False,
        every_n_train_steps=every or None,
        every_n_epochs=0,
        monitor="step",
        mode="max",
        save_top_k=-1 if t.keep_checkpoints is None else t.keep_checkpoints,
        save_last=False,
        enable_version_counter=False,
    )
    # Every write is atomic, checked and recorded (sha256); under SLURM only our signal handling acts
    # (Lightning's would save inside the handler and requeue on its own).
    plugins: list = [VerifiedCheckpointIO()]
    if SLURMEnvironment.detect():
        plugins.append(SLURMEnvironment(auto_requeue=False))
    progress = progress_callbacks(config.progress_bar, t.log_every_n_steps)
    lightning_trainer = L.Trainer(
        accelerator=trainer.accelerator,
        devices=trainer.devices,
        num_nodes=trainer.num_nodes,
        strategy=lightning_strategy(str(trainer.strategy)),
        precision=trainer.precision,  # type: ignore[arg-type]
        max_steps=t.max_steps,
        max_epochs=-1,
        # Validation runs inside training_step on the optimizer-step count (see module.py).
        limit_val_batches=0,
        num_sanity_val_steps=0,
        log_every_n_steps=t.log_every_n_steps,
        logger=build_loggers(config, output_dir),
        # DataStatistics: the inspect-data numbers in the W&B config (a no-op without W&B).
        # MetricsStart: a resume appends to metrics.csv after its checkpoint's step.
        callbacks=[checkpoints, *progress, DataStatistics(), MetricsStart(), *callbacks],
        default_root_dir=str(output_dir),
        plugins=plugins,
        deterministic=t.deterministic,
        use_distributed_sampler=False,  # our samplers split packs over ranks themselves
        enable_model_summary=False,
        enable_progress_bar=any(isinstance(c, StepProgressBar) for c in progress),
    )
    # Our handlers (preemption.py) act from the run's first line to its last; Lightning's SIGTERM
    # handler would end the run mid-epoch with exit 0 (SIGTERMException).
    lightning_trainer._signal_connector.register_signal_handlers = lambda: None  # type: ignore[method-assign]
    return lightning_trainer


def remove_same_step(trainer: L.Trainer, last: Path) -> None:
    """A periodic checkpoint saved at the final step holds what last.ckpt holds: removed (with its
    record) once last.ckpt is written and checked, so no two checkpoint files share a step."""
    callback = trainer.checkpoint_callback
    if not isinstance(callback, RecordedModelCheckpoint) or callback.dirpath is None:
        return
    same = Path(callback.dirpath) / f"step{trainer.global_step:06d}.ckpt"
    if same != last and (same.exists() or same.is_dir()):
        trainer.strategy.remove_checkpoint(same)  # rank zero only; VerifiedCheckpointIO drops the record
        callback.best_k_models.pop(str(same), None)


class Preemption(L.Callback):
    """Stops training at the update boundary after a signal (preemption.py), agreed by all ranks."""

    def __init__(self, signals: Signals):
        self.signals = signals
        self.stopped_by: signal.Signals | None = None  # the signal the run stopped for (all ranks)
        self.stopped_at: int | None = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.signals.phase = TRAINING  # from now on a signal only sets the flag

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
        local = int(self.signals.received or 0)
        if trainer.world_size > 1:
            flag = torch.tensor([local], dtype=torch.int32, device=trainer.strategy.root_device)
            local = int(trainer.strategy.reduce(flag, reduce_op="max").item())
        return local or None


class EpochFits(L.Callback):
    """A batch larger than an epoch's units would never train (or exhaust memory building it)."""

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        datamodule = getattr(trainer, "datamodule", None)
        sampler = getattr(datamodule, "train_sampler", None)
        if sampler is None:
            return
        units = len(sampler.plan(sampler.epoch).layout)
        if sampler.batch_size * trainer.world_size > units:
            kind = sampler.policy.unit_name  # the policy's own word for a unit (rows, packs)
            ranks = f" x {trainer.world_size} ranks" if trainer.world_size > 1 else ""
            plan = getattr(sampler, "mixture_plan", None)
            if plan is not None:  # the epoch is as long as the smallest component allows: name it
                raise ConfigError(
                    f"the mixed epoch has {units:,} {kind}, less than train.batch_size="
                    f"{sampler.batch_size}{ranks}: {plan.limit()}; raise that component's budget or "
                    "max_repeat, or lower its weight"
                )
            raise ConfigError(
                f"train.batch_size={sampler.batch_size}{ranks} is more than an epoch of the train split, "
                f"which has {units:,} {kind}: set train.batch_size<={max(1, units // trainer.world_size)} "
                "or use more training data"
            )


PlotRun = Callable[[Path], Path]
"""Draws a finished run's comparison plot into its directory and returns the image (the entry point
passes report/'s `plot_run`: training never imports report/)."""


def _module(run: RunSettings) -> PretrainModule:
    """The Lightning module of the run (its model started from `model.init_from` unless it resumes)."""
    config = run.config
    module = PretrainModule(
        model=run.model,
        train=config.train,
        attn_backend=run.attn_backend,
        max_seq_len=run.policy.max_seq_len,
        cache_key=run.data_key,
        attn_compile=config.attn.compile_mode,
        run_config=OmegaConf.to_container(OmegaConf.structured(config), enum_to_str=True),  # type: ignore[arg-type]
        cache_identity=run.data_identity,
        peak_tflops=config.trainer.peak_tflops,
        mixture_components=list(run.mixture.names) if run.mixture is not None else None,
        eval_context=list(config.eval.context),
    )
    if config.model.init_from and not config.ckpt_path:  # a resume loads its own weights
        from ..hf.roundtrip import init_from

        init_from(module.model, config.model.init_from, config.model.extend_positions)
    return module


def fit(run: RunSettings, callbacks, signals: Signals, plot_run: PlotRun | None) -> dict:
    """Train with Lightning, save last.ckpt, then end the run (`finish`); returns its summary."""
    config, output_dir = run.config, run.output_dir
    if is_rank_zero():  # the device, precision and attention backend, in one line on stdout
        print(run.device_line, flush=True)
    L.seed_everything(config.seed, workers=True, verbose=False)
    datamodule = PretrainDataModule(run.cache, run.policy, run.mixture)
    module = _module(run)
    if config.record_batches:
        callbacks = [*callbacks, BatchRecorder(output_dir)]
    preemption = Preemption(signals)  # SIGTERM, SIGUSR1, Ctrl-C: stop after the current update
    trainer = build_trainer(config, output_dir, [*callbacks, EpochFits(), preemption])
    started = time.perf_counter()
    deterministic_before = torch.are_deterministic_algorithms_enabled()
    last = output_dir / "checkpoints" / "last.ckpt"
    interrupted: Interrupted | None = None
    try:
        trainer.fit(module, datamodule=datamodule, ckpt_path=config.ckpt_path)
        signals.phase = FINISHING
        # The state after the last trained update (sampler included), checked and recorded when written.
        trainer.save_checkpoint(last)
        raise_failed_save(trainer, last)  # with several ranks: rank 0's failure stops every one
        if trainer.is_global_zero and last.is_dir():  # sharded FSDP: a manifest of its files
            write_record(last)
        remove_same_step(trainer, last)
    except Interrupted as error:
        if error.abort:  # a second Ctrl-C: no checkpoint, no report
            raise
        interrupted = error  # before training started (the cache build): a preemption without a step
    finally:
        # Trainer(deterministic=True) flips a process-wide torch flag; later jobs in this process
        # (a multirun, a notebook) must not inherit it.
        torch.use_deterministic_algorithms(deterministic_before)
    signals.phase = FINISHING  # training is over: a signal now only skips the plot
    stopped_by = preemption.stopped_by or (interrupted.signum if interrupted else None)
    seconds = time.perf_counter() - started
    summary = run_summary(run, trainer, module, datamodule, last, stopped_by, seconds)
    return finish(run, trainer, summary, signals, plot_run, interrupted)


def finish(
    run: RunSettings,
    trainer: L.Trainer,
    summary: dict,
    signals: Signals,
    plot_run: PlotRun | None,
    interrupted: Interrupted | None,
) -> dict:
    """The end of a run: run.json and config.yaml, the comparison plot, the loggers' last word, the
    report of where everything went."""
    config, output_dir = run.config, run.output_dir
    plot = None
    if trainer.is_global_zero:
        write_outputs(output_dir, summary, config)
        # A single run under Hydra, and a W&B run outside a multirun, get their comparison plot
        # (config.yaml first: the plot's label reads it), drawn once the training state is released;
        # not a stopped one: its grace time is short. A multirun's plots are `pretrain compare`'s.
        mode = hydra_mode()
        wants_plot = plot_run is not None and (
            mode == "RUN" or (config.logger.kind == "wandb" and mode is None)
        )
        stopped = summary["signal"] is not None
        if wants_plot and not stopped and signals.late is None and interrupted is None:
            assert plot_run is not None
            release_training_state(trainer)
            plot = plot_run(output_dir)
    if interrupted is None:
        finish_loggers(trainer, summary, plot)  # W&B: the summary row and the plot, then the run ends
    if trainer.is_global_zero:
        report(summary, plot)
    return summary
