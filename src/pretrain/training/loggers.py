"""Loggers: CSV always (what `pretrain compare` reads), W&B with logger=wandb."""

from __future__ import annotations

import os
from pathlib import Path

from lightning.pytorch.loggers import CSVLogger, Logger, WandbLogger
from omegaconf import OmegaConf


def wandb_mode(requested: str | None) -> str:
    """online with a key, otherwise offline (never a failure for a missing key)."""
    if requested:
        return requested
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    has_key = bool(os.environ.get("WANDB_API_KEY")) or (Path.home() / ".netrc").is_file() and "api.wandb.ai" in (
        Path.home() / ".netrc"
    ).read_text(errors="ignore")
    return "online" if has_key else "offline"


def run_group(cfg) -> str:
    """W&B group: the explicit one, else the multirun's sweep directory, else the experiment name."""
    if cfg.logger.get("group"):
        return str(cfg.logger.group)
    try:
        from hydra.core.hydra_config import HydraConfig

        hydra_cfg = HydraConfig.get()
        if hydra_cfg.mode.name == "MULTIRUN":
            return "/".join(Path(hydra_cfg.sweep.dir).parts[-3:])
    except ValueError:  # not under Hydra
        pass
    return str(cfg.get("experiment_name") or "default")


def build_loggers(cfg, output_dir: Path) -> list[Logger]:
    loggers: list[Logger] = [CSVLogger(save_dir=str(output_dir), name="", version="")]
    if cfg.logger.kind == "wandb":
        tags = list(cfg.logger.get("tags") or []) + [f"policy:{cfg.data.policy}", f"attn:{cfg.attn.backend}", f"model:{cfg.model.name}"]
        loggers.append(
            WandbLogger(
                project=cfg.logger.get("project", "pretrain"),
                entity=cfg.logger.get("entity"),
                group=run_group(cfg),
                tags=tags,
                save_dir=str(output_dir),
                mode=wandb_mode(cfg.logger.get("mode")),
                config=OmegaConf.to_container(cfg, resolve=True),
            )
        )
    elif cfg.logger.kind != "csv":
        raise ValueError(f"logger.kind={cfg.logger.kind!r} is not csv or wandb (pick logger=csv or logger=wandb)")
    return loggers


def finish_loggers(trainer) -> None:
    """Close W&B runs: the next job of a multirun in this process must start its own run."""
    for logger in trainer.loggers:
        if isinstance(logger, WandbLogger) and trainer.is_global_zero:
            logger.experiment.finish()
