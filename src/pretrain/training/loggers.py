"""Loggers: CSV always (what `pretrain compare` reads), W&B with logger=wandb."""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path

from lightning.pytorch.loggers import CSVLogger, Logger, WandbLogger

from ..config import Config, LoggerConfig


def wandb_mode(requested: str | None) -> str:
    """online with a key, otherwise offline (never a failure for a missing key)."""
    if requested:
        return requested
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    has_key = (
        bool(os.environ.get("WANDB_API_KEY"))
        or (Path.home() / ".netrc").is_file()
        and "api.wandb.ai" in (Path.home() / ".netrc").read_text(errors="ignore")
    )
    return "online" if has_key else "offline"


def run_group(logger: LoggerConfig, experiment_name: str) -> str:
    """W&B group: the explicit one, else the multirun's sweep directory, else the experiment name."""
    if logger.group:
        return logger.group
    try:
        from hydra.core.hydra_config import HydraConfig

        hydra_cfg = HydraConfig.get()
        if hydra_cfg.mode is not None and hydra_cfg.mode.name == "MULTIRUN":
            return "/".join(Path(hydra_cfg.sweep.dir).parts[-3:])
    except ValueError:  # not under Hydra
        pass
    return experiment_name


def build_loggers(config: Config, output_dir: Path) -> list[Logger]:
    loggers: list[Logger] = [CSVLogger(save_dir=str(output_dir), name="", version="")]
    logger = config.logger
    if logger.kind == "wandb":
        tags = [
            *logger.tags,
            f"policy:{config.data.policy}",
            f"attn:{config.attn.backend}",
            f"model:{config.model.name}",
        ]
        loggers.append(
            WandbLogger(
                project=logger.project,
                entity=logger.entity,
                group=run_group(logger, config.experiment_name),
                tags=tags,
                save_dir=str(output_dir),
                mode=wandb_mode(logger.mode),
                config=asdict(config),
            )
        )
    return loggers


def finish_loggers(trainer) -> None:
    """Close W&B runs: the next job of a multirun in this process must start its own run."""
    for logger in trainer.loggers:
        if isinstance(logger, WandbLogger) and trainer.is_global_zero:
            logger.experiment.finish()
