"""`python train.py`: check the config, prepare or verify the cache, train with Lightning, report."""

from __future__ import annotations

import json
import logging
import time
import warnings
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint, RichProgressBar
from omegaconf import OmegaConf

from ..data.cache import cache_identity, identity_key
from .checks import check_config
from .datamodule import PretrainDataModule
from .loggers import build_loggers, finish_loggers
from .module import PretrainModule
from .recorder import BatchRecorder

_NOISE = ("litlogger", "`weights_only` was not set", "LeafSpec")


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


def _output_dir(cfg) -> Path:
    try:
        from hydra.core.hydra_config import HydraConfig

        return Path(HydraConfig.get().runtime.output_dir)
    except ValueError:  # not under @hydra.main (tests, notebooks)
        return Path(cfg.get("output_dir") or "outputs/manual").resolve()


class StepProgressBar(RichProgressBar):
    """Training runs by optimizer steps, not epochs: say so instead of "Epoch 0/-2"."""

    def _get_train_description(self, current_epoch: int) -> str:
        return f"train (max {self.trainer.max_steps} steps)"


def build_trainer(cfg, output_dir: Path, callbacks=()) -> L.Trainer:
    t = cfg.train
    every = int(t.checkpoint_every_n_steps or 0)
    checkpoints = ModelCheckpoint(
        dirpath=output_dir / "checkpoints",
        filename="step{step:06d}",
        auto_insert_metric_name=False,
        every_n_train_steps=every or None,
        save_top_k=-1,
        save_last=True,
    )
    return L.Trainer(
        accelerator=cfg.trainer.accelerator,
        devices=cfg.trainer.devices,
        num_nodes=cfg.trainer.get("num_nodes", 1),
        strategy=cfg.trainer.strategy,
        precision=cfg.trainer.precision,
        max_steps=int(t.max_steps),
        max_epochs=-1,
        # Validation runs inside training_step on the optimizer-step count (see module.py).
        limit_val_batches=0,
        num_sanity_val_steps=0,
        log_every_n_steps=int(t.log_every_n_steps),
        logger=build_loggers(cfg, output_dir),
        callbacks=[checkpoints, StepProgressBar(), *callbacks] if cfg.get("progress_bar", True) else [checkpoints, *callbacks],
        default_root_dir=str(output_dir),
        deterministic=bool(t.get("deterministic", False)),
        use_distributed_sampler=False,  # our samplers split packs over ranks themselves
        enable_model_summary=False,
        enable_progress_bar=bool(cfg.get("progress_bar", True)),
    )


def train(cfg, callbacks=()) -> dict:
    """Run one training job; returns its summary (also written to run.json in the output dir)."""
    quiet_lightning()
    output_dir = _output_dir(cfg)
    output_dir.mkdir(parents=True, exist_ok=True)
    cache_key = identity_key(cache_identity(cfg))
    backend = check_config(cfg, cache_key)
    L.seed_everything(int(cfg.seed), workers=True, verbose=False)
    datamodule = PretrainDataModule(cfg, cache_key=cache_key)
    module = PretrainModule.from_config(cfg, attn_backend=backend, cache_key=cache_key)
    if cfg.get("record_batches"):
        callbacks = [*callbacks, BatchRecorder(output_dir)]
    trainer = build_trainer(cfg, output_dir, callbacks)
    started = time.perf_counter()
    deterministic_before = torch.are_deterministic_algorithms_enabled()
    try:
        trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"))
    finally:
        # Trainer(deterministic=True) flips a process-wide torch flag; later jobs in this process
        # (a multirun, a notebook) must not inherit it.
        torch.use_deterministic_algorithms(deterministic_before)
    last = output_dir / "checkpoints" / "last.ckpt"
    trainer.save_checkpoint(last)
    summary = {
        "output_dir": str(output_dir),
        "checkpoint": str(last),
        "cache_dir": str(datamodule.cache.directory),
        "policy": str(cfg.data.policy),
        "attn": backend,
        "model": str(cfg.model.name),
        "max_seq_len": int(cfg.data.max_seq_len),
        "batch_size": cfg.train.batch_size,
        "steps": int(trainer.global_step),
        "tokens": int(module.tokens_seen),
        "seconds": round(time.perf_counter() - started, 2),
        "metrics": dict(module.last_metrics),
        "is_global_zero": trainer.is_global_zero,
    }
    finish_loggers(trainer)
    if trainer.is_global_zero:
        (output_dir / "run.json").write_text(json.dumps(summary, indent=2) + "\n")
        OmegaConf.save(cfg, output_dir / "config.yaml", resolve=True)
    return summary
