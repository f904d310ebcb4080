"""Where the config's YAML lives: `conf/` with its `train.yaml` (a leaf: the schema's checks read the
group options' files, e.g. to name the option that reads a key)."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import ConfigError

CONFIG_NAME = "train"


def config_dir() -> Path:
    """`conf/` of the repository (editable install), else env PRETRAIN_CONFIG_DIR, else ./conf."""
    env = os.environ.get("PRETRAIN_CONFIG_DIR")
    candidates = [Path(env)] if env else []
    candidates += [Path(__file__).resolve().parents[3] / "conf", Path.cwd() / "conf"]
    for candidate in candidates:
        if (candidate / f"{CONFIG_NAME}.yaml").is_file():
            return candidate.resolve()
    searched = ", ".join(map(str, candidates))
    raise ConfigError(f"no {CONFIG_NAME}.yaml in {searched}; set PRETRAIN_CONFIG_DIR to the conf/ folder")
