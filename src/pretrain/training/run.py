"""`train(cfg)`: the one entry of a training run (`python train.py` calls it, so do tests).

It turns the composed config into typed settings once (`RunSettings`), checks what the machine and a
checkpoint allow, prepares or verifies the cache, trains with Lightning, writes `run.json` and
`config.yaml`, and tells the user where everything went.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import shutil
import signal
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import lightning as L
import torch
from lightning.fabric.plugins.environments import SLURMEnvironment
from omegaconf import DictConfig, OmegaConf
from rich.console import Console

from ..config import Config, check_known_keys, to_config
from ..data.audit import composition_audit
from ..data.cache import CacheSpec
from ..data.mixture import MixtureSpec
from ..data.policies import PolicySettings
from ..errors import CheckpointError, ConfigError, PretrainError, WriteError
from ..fileio import write_text_atomic
from ..model import GPTConfig
from .checkpoint_io import RecordedModelCheckpoint, VerifiedCheckpointIO, raise_failed_save
from .checkpoints import AUTO, newest_valid_checkpoint, remove_killed_writes, write_record
from .checks import attention_backend, check_checkpoint, device_line, launch_world_size, resolve_trainer
from .datamodule import PretrainDataModule
from .loggers import DataStatistics, MetricsStart, build_loggers, finish_loggers
from .module import PretrainModule
from .preemption import FINISHING, TRAINING, Interrupted, Signals, active, exit_code
from .progress import StepProgressBar, progress_callbacks, warn_if_slow_on_cpu
from .recorder import BatchRecorder
from .rundir import RunLock, check_fresh_start, claimed_here, is_rank_zero, remove_checkpoints

_NOISE = (
    "litlogger",
    "`weights_only` was not set",
    "LeafSpec",
    "GPU available",
    "TPU available",
    "`Trainer.fit` stopped",
)


class _DropNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not any(text in record.getMessage() for text in _NOISE)


def quiet_lightning() -> None:
    """Drop Lightning's advertising and messages that do not apply to how we use it."""
    for name in (
        "lightning.pytorch.utilities.rank_zero",
        "lightning.fabric.utilities.rank_zero",
        "lightning.pytorch.trainer.connectors.checkpoint_connector",
    ):
        logging.getLogger(name).addFilter(_DropNoise())
    if logging.getLogger().handlers:
        # Under Hydra the root logger already prints (and writes train.log): Lightning's own console
        # handler would print every message a second time.
        for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
            lightning_logger = logging.getLogger(name)
            for handler in list(lightning_logger.handlers):
                if type(handler) is logging.StreamHandler:
                    lightning_logger.removeHandler(handler)
    # Manual optimization: the checkpoint must hold the state *after* the update, which is what it gets.
    warnings.filterwarnings("ignore", message=".*ModelCheckpoint with manual optimization.*")
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")
    warnings.filterwarnings("ignore", message=".*Experiment logs directory .* exists and is not empty.*")
    # A resumed run writes to its own new output directory; nothing of the old one's top-k applies.
    warnings.filterwarnings("ignore", message=".*The dirpath has changed from.*")
    # ckpt_path=auto resumes into the run's own checkpoint folder; other checkpoint settings are fine.
    warnings.filterwarnings("ignore", message=".*Checkpoint directory .* exists and is not empty.*")
    warnings.filterwarnings(
        "ignore", message=".*callbacks used to create the checkpoint need to be provided.*"
    )


def _hydra_mode() -> str | None:
    """RUN or MULTIRUN under @hydra.main, else None (tests, notebooks)."""
    from hydra.core.hydra_config import HydraConfig

    mode = HydraConfig.get().mode if HydraConfig.initialized() else None
    return None if mode is None else mode.name


def _output_dir(configured: str | None) -> Path:
    if _hydra_mode() is not None:
        from hydra.core.hydra_config import HydraConfig

        return Path(HydraConfig.get().runtime.output_dir)
    return Path(configured or "outputs/manual").resolve()


@dataclass(frozen=True)
class RunSettings:
    """What a run builds from its config, once, before any heavy work; passed down as plain values."""

    config: Config
    policy: PolicySettings
    model: GPTConfig
    cache: CacheSpec  # its identity hashes every local source file: computed here only
    mixture: MixtureSpec | None  # the components' caches, when the run mixes corpora
    attn_backend: str  # resolved: `auto` is never passed down
    output_dir: Path
    device_line: str = ""  # what trainer=auto / attn=auto chose, said once the run starts

    @classmethod
    def from_config(cls, cfg: DictConfig | Config) -> RunSettings:
        if isinstance(cfg, DictConfig):  # a multirun job's too (train.py checks a single run's first)
            check_known_keys(cfg)
        config = to_config(cfg)
        policy = PolicySettings.from_config(config.data, config.train, config.seed)
        backend = attention_backend(config.attn, config.trainer)
        chosen = device_line(config.attn, config.trainer, backend)  # before auto is replaced below
        config = replace(config, trainer=resolve_trainer(config.trainer))  # Lightning sees concrete values
        model = GPTConfig.from_settings(config.model)
        warn_if_slow_on_cpu(config, model, policy)  # e.g. model=gpt2-small on trainer=cpu
        if config.model.init_from and not config.ckpt_path:
            from ..hf import check_init_from

            check_init_from(config.model.init_from, model, config.model.extend_positions)
        mixture = MixtureSpec.from_config(config)
        if mixture is not None:
            mixture.check_policy(policy.policy)
        cache = CacheSpec.from_config(config) if mixture is None else mixture.components[0].cache
        output_dir = _output_dir(config.output_dir)
        run = cls(config, policy, model, cache, mixture, backend, output_dir, chosen)
        if config.ckpt_path != AUTO:  # auto: chosen once the run directory is locked (resolve_auto)
            check_checkpoint(
                config.ckpt_path,
                policy.max_seq_len,
                model,
                run.data_key,
                config.train.max_steps,
                policy=policy,
                world_size=launch_world_size(config.trainer),
            )
        return run

    @property
    def data_key(self) -> str:
        """What the checkpoint records as `cache_key`: the cache's key, or the mixture's."""
        return self.cache.key if self.mixture is None else self.mixture.key

    @property
    def data_identity(self) -> dict:
        return self.cache.identity if self.mixture is None else self.mixture.identity

    def resolve_auto(self) -> RunSettings:
        """`ckpt_path=auto` (under the run directory's lock): its newest checkpoint, checked, or None."""
        if self.config.ckpt_path != AUTO:
            return self
        found = _auto_checkpoint(self.output_dir)
        check_checkpoint(
            found,
            self.policy.max_seq_len,
            self.model,
            self.data_key,
            self.config.train.max_steps,
            verified=True,
            policy=self.policy,
            world_size=launch_world_size(self.config.trainer),
        )
        return replace(self, config=replace(self.config, ckpt_path=found))


_is_rank_zero = is_rank_zero


def _auto_checkpoint(output_dir: Path) -> str | None:
    """`ckpt_path=auto`: the newest valid checkpoint of the run directory, or a fresh start."""
    say = (lambda text: print(text, file=sys.stderr, flush=True)) if _is_rank_zero() else (lambda text: None)
    found = newest_valid_checkpoint(output_dir)  # refuses checkpoints it cannot verify
    if found is None:
        say(f"ckpt_path=auto: no valid checkpoint in {output_dir / 'checkpoints'}, starting a new run")
        return None
    say(f"ckpt_path=auto: resuming from {found}")
    return str(found)


def _writable_checkpoint_dir(directory: Path) -> None:
    """Fail before any heavy work when checkpoints cannot be written there (not after hours)."""
    probe = directory / f".write-test-{os.getpid()}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        raise CheckpointError(
            f"cannot write checkpoints to {directory}: {error.strerror or error}; make it a writable "
            "directory or run elsewhere (hydra.run.dir=... or output_dir=...)"
        ) from None


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
        strategy=trainer.strategy,
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


def train(cfg: DictConfig | Config, callbacks=(), plot_run: PlotRun | None = None) -> dict:
    """Run one training job; returns its summary (also written to run.json in the output dir).

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


def _train(cfg: DictConfig | Config, callbacks, signals: Signals, plot_run: PlotRun | None) -> dict:
    quiet_lightning()
    run = RunSettings.from_config(cfg)  # schema, device and ckpt_path checks: nothing written yet
    output_dir = run.output_dir
    fresh = not output_dir.exists() or claimed_here(output_dir)
    lock = RunLock(output_dir).acquire() if _is_rank_zero() else None  # creates the directory
    try:
        try:
            if lock is not None:
                _start_over_if_asked(run.config, output_dir)
            for folder in (output_dir, output_dir / "checkpoints"):
                remove_killed_writes(folder)  # of writers killed mid-write (a full disk, kill -9)
            run = run.resolve_auto()
            _writable_checkpoint_dir(output_dir / "checkpoints")
            return _fit(run, callbacks, signals, plot_run)
        except PretrainError:
            if fresh and _is_rank_zero() and not _trained(output_dir):
                # A run that never started leaves no directory behind (only what Hydra and we made).
                shutil.rmtree(output_dir, ignore_errors=True)
            raise
    finally:
        if lock is not None:
            lock.release()


def _start_over_if_asked(config: Config, output_dir: Path) -> None:
    """A run that resumes nothing never mixes with another run's checkpoints: refused, or (start_over)
    those are deleted first, in one line."""
    check_fresh_start(output_dir, config.ckpt_path, config.start_over)
    if config.start_over:
        removed = remove_checkpoints(output_dir)
        if removed:
            print(
                f"start_over=true: deleted {len(removed)} checkpoints of an earlier run in "
                f"{output_dir / 'checkpoints'}",
                file=sys.stderr,
                flush=True,
            )


def _trained(output_dir: Path) -> bool:
    return (output_dir / "metrics.csv").exists() or any((output_dir / "checkpoints").glob("*.ckpt"))


def _fit(run: RunSettings, callbacks, signals: Signals, plot_run: PlotRun | None) -> dict:
    config, output_dir = run.config, run.output_dir
    if _is_rank_zero():  # the device, precision and attention backend, in one line on stdout
        print(run.device_line, flush=True)
    L.seed_everything(config.seed, workers=True, verbose=False)
    datamodule = PretrainDataModule(run.cache, run.policy, run.mixture)
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
    )
    if config.model.init_from and not config.ckpt_path:  # a resume loads its own weights
        from ..hf import init_from

        init_from(module.model, config.model.init_from, config.model.extend_positions)
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
    cache = datamodule.cache
    summary = {
        "status": "preempted" if stopped_by is not None else "completed",
        "signal": stopped_by.name if stopped_by is not None else None,
        "exit_code": exit_code(stopped_by) if stopped_by is not None else 0,
        "output_dir": str(output_dir),
        "checkpoint": str(last) if trainer.is_global_zero and last.exists() else None,
        # A mixture has no one cache: each component's directory and its real tokens instead.
        **(
            {"cache_dir": str(cache.directory) if cache is not None else None}
            if run.mixture is None
            else {
                "cache_dirs": {n: str(c.directory) for n, c in datamodule.caches.items()},
                "mixture_tokens": dict(zip(module.component_names, module.component_tokens, strict=True)),
            }
        ),
        "policy": run.policy.policy,
        "attn": run.attn_backend,
        "model": config.model.name,
        "max_seq_len": run.policy.max_seq_len,
        "batch_size": config.train.batch_size,
        "steps": int(trainer.global_step),
        "tokens": int(module.tokens_seen),
        "seconds": round(time.perf_counter() - started, 2),
        "metrics": dict(module.last_metrics),
        "is_global_zero": trainer.is_global_zero,
        "max_tokens": config.train.max_tokens,
        # What context-free models score on the validation pairs (data/floors.py): rank zero's.
        "floors": datamodule.floors() if trainer.is_global_zero else None,
    }
    if trainer.is_global_zero and datamodule.train_sampler is not None:
        # What the policy did to the corpus (data/audit.py), for `pretrain compare`'s table: the
        # sampler's epoch-0 plan is reused (rank zero's layout, as inspect-data reports it).
        summary["composition"] = composition_audit(
            run.policy, datamodule.train_sampler.split, sampler=datamodule.train_sampler
        )
    plot = None
    if trainer.is_global_zero:
        _write_outputs(output_dir, summary, config)
        # A single run under Hydra, and every W&B run, get their comparison plot (config.yaml first:
        # the plot's label reads it); not a stopped one: its grace time is short.
        wants_plot = plot_run is not None and (_hydra_mode() == "RUN" or config.logger.kind == "wandb")
        if wants_plot and stopped_by is None and signals.late is None and interrupted is None:
            assert plot_run is not None
            plot = plot_run(output_dir)
    if interrupted is None:
        finish_loggers(trainer, summary, plot)  # W&B: the summary row and the plot, then the run ends
    if trainer.is_global_zero:
        report(summary, plot)
    return summary


def _write_outputs(output_dir: Path, summary: dict, config: Config) -> None:
    """run.json and config.yaml, atomically; a full disk or a permission is one line."""
    try:
        write_text_atomic(output_dir / "run.json", json.dumps(summary, indent=2) + "\n")
        write_text_atomic(
            output_dir / "config.yaml", OmegaConf.to_yaml(OmegaConf.structured(config), resolve=True)
        )
    except OSError as error:
        raise WriteError(
            f"could not write {output_dir / 'run.json'}: {error.strerror or error}; free disk space "
            f"(the checkpoint {output_dir / 'checkpoints' / 'last.ckpt'} is complete)"
        ) from None


def report(summary: dict, plot: Path | None = None) -> None:
    """Where everything went, on stdout (and the comparison plot, when the run made one)."""
    console = Console(soft_wrap=True)  # paths and commands stay on one line
    output = Path(summary["output_dir"])
    if plot is not None:
        console.print(f"comparison plot: {plot}")
    metrics = summary["metrics"]
    losses = ", ".join(f"{key} {metrics[key]:.3f}" for key in ("train/loss", "val/loss") if key in metrics)
    status = (
        "done" if summary.get("status", "completed") == "completed" else f"stopped by {summary['signal']}"
    )
    console.print(
        f"[bold]{status}[/bold]: {summary['steps']} steps, {summary['tokens']:,} real tokens, {losses}"
    )
    console.print(f"outputs: {output}")
    checkpoint = summary.get("checkpoint")
    if checkpoint and Path(checkpoint).is_file():  # never a line for a file that is not there
        console.print(f"checkpoint: {checkpoint}")
    console.print(f"metrics: {output / 'metrics.csv'}")
    if summary.get("status") == "preempted":
        console.print(f"resume: {resume_command(output)} (exit status {summary['exit_code']})")


def resume_command(output_dir: Path) -> str:
    """The command that continues this run in its own directory from its newest valid checkpoint."""
    overrides: list[str] = []
    if _hydra_mode() == "RUN":
        from hydra.core.hydra_config import HydraConfig

        overrides = [
            o
            for o in HydraConfig.get().overrides.task
            # start_over deleted the earlier run's checkpoints once; a resume continues this run's
            if not o.lstrip("+").startswith(("ckpt_path=", "hydra.run.dir=", "start_over="))
        ]
    elif _hydra_mode() is None:
        return f"train(config with ckpt_path=auto output_dir={output_dir})"
    words = [
        "python",
        "train.py",
        *overrides,
        f"hydra.run.dir={hydra_quote(str(output_dir))}",
        "ckpt_path=auto",
    ]
    return " ".join(shlex.quote(word) for word in words)


_HYDRA_PLAIN = re.compile(r"[A-Za-z0-9_./+\-:@%~]+")


def hydra_quote(value: str) -> str:
    """`value` as Hydra's override grammar reads it back: quoted when it holds anything but plain
    path characters (spaces, accents, commas, brackets, quotes); the shell quoting goes around it."""
    if _HYDRA_PLAIN.fullmatch(value):
        return value
    # Inside Hydra's quotes a backslash escapes only a quote or the backslashes before a quote (or
    # before the closing one); every other backslash is literal.
    escaped = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", value)
    escaped = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, escaped)
    return f"'{escaped}'"
