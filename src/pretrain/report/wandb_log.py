"""compare's W&B run: the tables and the plot logged into one run (job type `compare`) of the compared
runs' group."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import yaml

from ..training.run_record import Run
from .arm_render import WANDB_COLUMNS, wandb_rows
from .arm_table import ArmTable
from .contrast_render import CONTRAST_FIELDS, wandb_contrast_rows
from .contrasts import ContrastTable
from .table import COLUMNS, table_rows


def _sweep_group(hydra: dict) -> str | None:
    """`run_group`'s `"/".join(Path(sweep.dir).parts[-3:])`, from a job's saved `.hydra/hydra.yaml`.
    Hydra saves it unresolved: a `${now:...}` sweep dir is read off the job's resolved output directory
    (the sweep dir followed by the subdir, `${hydra.job.num}`: as many parts as the configured dir)."""
    sweep = hydra.get("sweep") or {}
    configured = Path(str(sweep.get("dir") or ""))
    if not configured.parts:
        return None
    if "${" in str(configured):
        output_dir = (hydra.get("runtime") or {}).get("output_dir")
        if not output_dir:
            return None
        subdir_depth = len(Path(str(sweep.get("subdir") or "0")).parts)
        resolved = Path(output_dir).parents[subdir_depth - 1]
        configured = Path(*resolved.parts[-len(configured.parts) :])
    return "/".join(configured.parts[-3:])


def run_group_of(run: Run) -> str:
    """The W&B group the run logged to, as `training.loggers.run_group` chose it: the explicit
    `logger.group`, else its multirun's sweep directory (last three parts), else `experiment_name`."""
    group = (run.config.get("logger") or {}).get("group")
    if group:
        return str(group)
    hydra_file = run.path / ".hydra" / "hydra.yaml"
    if hydra_file.is_file():
        hydra = (yaml.safe_load(hydra_file.read_text()) or {}).get("hydra") or {}
        group = _sweep_group(hydra) if hydra.get("mode") == "MULTIRUN" else None
        if group:
            return group
    return str(run.config.get("experiment_name") or "compare")


def _tables(runs: list[Run], arms: ArmTable | None, contrasts: ContrastTable | None) -> dict:
    """compare's W&B tables, numbers as numbers (None for n/a): `compare/table` (one row per run,
    COLUMNS), `compare/arms` (arm_render.WANDB_COLUMNS, one row per metric and arm) and
    `compare/contrasts` (contrast_render.CONTRAST_FIELDS, one row per contrast as compare.json holds
    them)."""
    import wandb

    rows = [
        [None if isinstance(value, float) and math.isnan(value) else value for value in row]
        for row in table_rows(runs)
    ]
    tables = {"compare/table": wandb.Table(columns=list(COLUMNS), data=rows)}
    if arms:
        tables["compare/arms"] = wandb.Table(columns=list(WANDB_COLUMNS), data=wandb_rows(arms))
    if contrasts is not None and contrasts.contrasts:
        tables["compare/contrasts"] = wandb.Table(
            columns=list(CONTRAST_FIELDS), data=wandb_contrast_rows(contrasts)
        )
    return tables


def log_to_wandb(
    runs: list[Run],
    plot_path: Path,
    group: str | None = None,
    project: str | None = None,
    entity: str | None = None,
    mode: str | None = None,
    arms: ArmTable | None = None,
    contrasts: ContrastTable | None = None,
) -> str:
    """Log the comparison tables (`_tables`) and plot (`compare/plot`) into a new W&B run
    `compare-<group>` (job type `compare`) of the runs' group. Project and entity default to the
    runs' own; offline without an API key. Returns the run's URL (online) or its local directory
    (offline: `wandb sync DIR` uploads it later)."""
    import wandb

    from ..training.loggers import PLOT_KEY, wandb_mode

    groups = Counter(run_group_of(run) for run in runs)
    group = group or groups.most_common(1)[0][0]
    loggers = [run.config.get("logger") or {} for run in runs]
    project = project or next((lg["project"] for lg in loggers if lg.get("project")), "pretrain")
    entity = entity or next((lg["entity"] for lg in loggers if lg.get("entity")), None)
    mode = wandb_mode(mode)
    experiment = wandb.init(
        project=project,
        entity=entity,
        group=group,
        name=f"compare-{group}",
        job_type="compare",
        dir=str(Path(plot_path).resolve().parent),
        mode=mode,  # type: ignore[arg-type]
        config={
            "runs": [str(run.path) for run in runs],
            "groups": dict(groups),
            "reference": arms.reference.label if arms and arms.reference else None,
        },
        reinit="create_new",
    )
    try:
        experiment.log({**_tables(runs, arms, contrasts), PLOT_KEY: wandb.Image(str(plot_path))})
        # Online: the run's page; offline: the directory `wandb sync` uploads.
        where = experiment.url if mode == "online" else str(Path(experiment.dir).parent)
    finally:
        experiment.finish()
    return str(where)
