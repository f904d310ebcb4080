"""Composing the Hydra config outside `train.py` (for the `pretrain` CLI and tests)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig

CONFIG_NAME = "train"


def config_dir() -> Path:
    """`conf/` of the repository (editable install), else env PRETRAIN_CONFIG_DIR, else ./conf."""
    env = os.environ.get("PRETRAIN_CONFIG_DIR")
    candidates = [Path(env)] if env else []
    candidates += [Path(__file__).resolve().parents[2] / "conf", Path.cwd() / "conf"]
    for candidate in candidates:
        if (candidate / f"{CONFIG_NAME}.yaml").is_file():
            return candidate.resolve()
    raise FileNotFoundError(f"no {CONFIG_NAME}.yaml in {', '.join(map(str, candidates))}; set PRETRAIN_CONFIG_DIR")


def load_config(overrides: Sequence[str] = ()) -> DictConfig:
    """The same config `python train.py overrides...` would see."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3", job_name="pretrain"):
        return compose(config_name=CONFIG_NAME, overrides=list(overrides))
