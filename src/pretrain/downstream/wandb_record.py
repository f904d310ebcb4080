"""`pretrain lm-eval`'s scores into the run's own W&B run, when it trained with logger=wandb.

The training run is resumed by its id (read off its `wandb/` folder: `run-<time>-<id>` online,
`offline-run-<time>-<id>` offline) and its summary gains `downstream/<task>/<metric>`, beside the
summary row training wrote. Offline, W&B writes a new offline-run folder of the same id:
`wandb sync` uploads both into the one run.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import yaml

_RUN_FOLDER = re.compile(r"(?:offline-)?run-\d{8}_\d{6}-(?P<id>[a-z0-9]+)")
PREFIX = "downstream/"


def wandb_run_id(run_dir: Path) -> str | None:
    """The W&B id of the run in `run_dir` (its newest run folder), or None when it logged none."""
    folders = [p for p in (run_dir / "wandb").glob("*run-*") if p.is_dir() and _RUN_FOLDER.fullmatch(p.name)]
    if not folders:
        return None
    newest = max(folders, key=lambda p: p.name.removeprefix("offline-"))
    found = _RUN_FOLDER.fullmatch(newest.name)
    return found.group("id") if found else None


def summary_values(metrics: dict[str, dict[str, float]]) -> dict[str, float]:
    """`downstream/<task>/<metric>` -> value, finite numbers only."""
    return {
        f"{PREFIX}{task}/{metric}": float(value)
        for task, values in metrics.items()
        for metric, value in values.items()
        if isinstance(value, int | float) and math.isfinite(value)
    }


def log_downstream(run_dir: Path, metrics: dict[str, dict[str, float]]) -> str | None:
    """Add the scores to the summary of the run's W&B run; returns where (its URL online, its folder
    offline), or None when the run did not log to W&B."""
    config_file = run_dir / "config.yaml"
    if not config_file.is_file():
        return None
    logger = (yaml.safe_load(config_file.read_text()) or {}).get("logger") or {}
    run_id = wandb_run_id(run_dir)
    if logger.get("kind") != "wandb" or run_id is None:
        return None
    import wandb

    from ..training.loggers import wandb_mode

    mode = wandb_mode(logger.get("mode"))
    experiment = wandb.init(
        id=run_id,
        resume="allow",
        project=logger.get("project") or "pretrain",
        entity=logger.get("entity"),
        dir=str(run_dir),
        mode=mode,  # type: ignore[arg-type]
        reinit="create_new",
        settings=wandb.Settings(quiet=True),
    )
    try:
        experiment.summary.update(summary_values(metrics))
        where = experiment.url if mode == "online" else str(Path(experiment.dir).parent)
    finally:
        experiment.finish()
    return str(where)
