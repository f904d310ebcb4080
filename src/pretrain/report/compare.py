"""`pretrain compare DIR...`: loss and padding waste of runs or whole multiruns, side by side.

A run directory is any directory with a `metrics.csv` (our CSV logger's output); a multirun
directory is searched for them. A resumed run is one continuous curve: its steps are joined, the last
write of a step wins (also across files: `metrics.<n>.csv` beside it, n ascending, then `metrics.csv`).
Writes a PNG (loss against real tokens seen, padding waste, tokens/s, pack utilization per run) and a
markdown table next to it. With `--wandb` the same table (a
`wandb.Table`, numbers as numbers) and plot go into one W&B run (job type `compare`) of the compared
runs' group.
"""

from __future__ import annotations

import logging
import math
import textwrap
from collections import Counter
from pathlib import Path

import numpy as np
import yaml

from ..errors import ConfigError
from ..training.metrics_file import FILE_NAME
from ..training.run_record import LOSS, Run, load_run, run_numbers

log = logging.getLogger(__name__)


def find_runs(directories: list[Path]) -> list[Path]:
    runs = []
    for directory in directories:
        if not directory.exists():
            raise ConfigError(f"{directory} does not exist")
        found = sorted(p.parent for p in directory.rglob("metrics.csv"))
        if not found:
            raise ConfigError(f"no metrics.csv under {directory}: is it a run or multirun output directory?")
        runs.extend(found)
    return list(dict.fromkeys(runs))


def _drop_shared_label_parts(runs: list[Run]) -> None:
    """In a sweep, overrides every run shares say nothing: keep what tells runs apart."""
    if len(runs) < 2:
        return
    parts = [run.label.split(" ") for run in runs]
    shared = set(parts[0]).intersection(*parts[1:])
    for run, words in zip(runs, parts, strict=True):
        run.label = " ".join(w for w in words if w not in shared) or run.label


COLUMNS: tuple[str, ...] = ("run", "policy", "max_seq_len", "batch", "real tokens", "train loss")
COLUMNS += ("val loss", "tokens/s", "padding waste", "pack util")
_FORMATS = ("{}", "{}", "{}", "{}", "{:,.0f}", "{:.4f}", "{:.4f}", "{:,.0f}", "{:.1%}", "{:.1%}")


def table_rows(runs: list[Run]) -> list[list]:
    """One row per run, in COLUMNS order, numbers as numbers."""
    return [
        [run.label, run.policy, run.max_seq_len, run.batch_size, *run_numbers(run).values()] for run in runs
    ]


def markdown_table(runs: list[Run]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|---" * len(COLUMNS) + "|"]
    for row in table_rows(runs):
        cells = [fmt.format(value) for fmt, value in zip(_FORMATS, row, strict=True)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


LEGEND_WIDTH = 40
"""Legend labels wrap at this many characters (bar labels are cut there): the figure keeps its shape."""


def _short(label: str) -> str:
    """`data=padded train.batch_size=2` -> `padded batch_size=2`: room for the numbers."""
    return " ".join(
        w.removeprefix("data=").removeprefix("data.").removeprefix("train.") for w in label.split(" ")
    )


def _wrapped(label: str) -> str:
    return "\n".join(textwrap.wrap(label, LEGEND_WIDTH, break_long_words=True)) or label


def _cut(label: str) -> str:
    return label if len(label) <= LEGEND_WIDTH else label[: LEGEND_WIDTH - 1] + "…"


def image_formats() -> set[str]:
    """File suffixes matplotlib can write (png, pdf, svg, ...)."""
    from matplotlib.backend_bases import FigureCanvasBase

    return set(FigureCanvasBase.get_supported_filetypes())


def check_output(output: Path) -> None:
    """`--output` must name an image file: a path without a (known) image suffix is refused."""
    suffix = output.suffix.lower().removeprefix(".")
    if suffix not in image_formats():
        example = output.with_name(f"{output.name}.png") if not suffix else output.with_suffix(".png")
        raise ConfigError(
            f"--output {output} needs a file name with an image suffix such as .png "
            f"(e.g. --output {example}); leave --output out for compare.png in the first directory"
        )


def plot(runs: list[Run], output: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Constrained layout makes room for the legend and long labels (tight_layout warned when it could not).
    fig = plt.figure(figsize=(15, 10), layout="constrained")
    grid = fig.add_gridspec(2, 3, height_ratios=[1.2, 1])
    colors = [plt.rcParams["axes.prop_cycle"].by_key()["color"][i % 10] for i in range(len(runs))]
    labels = [_short(run.label) for run in runs]
    ax = fig.add_subplot(grid[0, :])
    for run, label, color in zip(runs, labels, colors, strict=True):
        train = np.array(run.series.get("train/loss", []))
        if len(train):
            ax.plot(train[:, 0], train[:, 1], color=color, alpha=0.8, label=_wrapped(label))
        val = np.array(run.series.get("val/loss", []))
        if len(val):
            ax.plot(val[:, 0], val[:, 1], "o--", color=color, markersize=5)
    ax.set(
        xlabel="real tokens seen",
        ylabel="loss (lines: train, dots: validation)",
        title="loss against real tokens seen",
    )
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    y = np.arange(len(runs))
    panels = (
        ("train/padding_waste", "padding waste (pad rows / computed rows)", "{:.1%}", np.mean),
        ("train/tokens_per_sec", "real tokens / s (median)", "{:,.0f}", np.median),
        ("train/pack_utilization", "pack utilization (real / packs x capacity)", "{:.1%}", np.mean),
    )
    for column, (metric, title, fmt, reduce) in enumerate(panels):
        assert callable(reduce)
        ax = fig.add_subplot(grid[1, column])
        values = [float(reduce(run.values(metric))) if len(run.values(metric)) else math.nan for run in runs]
        bars = ax.barh(y, values, color=colors)
        ax.set_yticks(y, [_cut(label) for label in labels] if column == 0 else [""] * len(runs), fontsize=8)
        ax.invert_yaxis()  # the legend's order, top to bottom
        ax.set_title(title, fontsize=10)
        ax.bar_label(bars, labels=[fmt.format(v) for v in values], fontsize=7)
        ax.margins(x=0.2)
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=100)
    plt.close(fig)


def compare(
    directories: list[Path], output: Path | None = None, quiet: bool = False, wandb: bool = False
) -> Path:
    """Write the comparison PNG (and a .md table beside it); returns the PNG path. `wandb=True` also
    logs the table and the plot into one W&B run of the compared runs' group (`log_to_wandb`)."""
    output = Path(output) if output else Path(directories[0]) / "compare.png"
    check_output(output)
    runs = [load_run(path) for path in find_runs([Path(d) for d in directories])]
    for run in runs:
        if not run.series.get(LOSS):
            log.warning(f"{run.path / FILE_NAME} has no logged {LOSS} yet: left out of the comparison")
    runs = [run for run in runs if run.series.get(LOSS)]
    if not runs:
        where = " ".join(str(d) for d in directories)
        raise ConfigError(f"no run under {where} has logged {LOSS} yet: nothing to compare")
    _drop_shared_label_parts(runs)
    plot(runs, output)
    table = markdown_table(runs)
    output.with_suffix(".md").write_text(table)
    if not quiet:
        print(table)
        print(f"plot: {output.resolve()}")
    if wandb:
        where = log_to_wandb(runs, output)
        if not quiet:
            print(f"W&B: {where}")
    return output.resolve()


# --- W&B ----------------------------------------------------------------------------------------


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


def log_to_wandb(
    runs: list[Run],
    plot_path: Path,
    group: str | None = None,
    project: str | None = None,
    entity: str | None = None,
    mode: str | None = None,
) -> str:
    """Log the comparison table (`compare/table`, a `wandb.Table` with COLUMNS) and plot
    (`compare/plot`) into a new W&B run `compare-<group>` (job type `compare`) of the runs' group.
    Project and entity default to the runs' own; offline without an API key. Returns the run's URL
    (online) or its local directory (offline: `wandb sync DIR` uploads it later)."""
    import wandb

    from ..training.loggers import PLOT_KEY, wandb_mode

    groups = Counter(run_group_of(run) for run in runs)
    group = group or groups.most_common(1)[0][0]
    loggers = [run.config.get("logger") or {} for run in runs]
    project = project or next((lg["project"] for lg in loggers if lg.get("project")), "pretrain")
    entity = entity or next((lg["entity"] for lg in loggers if lg.get("entity")), None)
    rows = [
        [None if isinstance(value, float) and math.isnan(value) else value for value in row]
        for row in table_rows(runs)
    ]
    mode = wandb_mode(mode)
    experiment = wandb.init(
        project=project,
        entity=entity,
        group=group,
        name=f"compare-{group}",
        job_type="compare",
        dir=str(Path(plot_path).resolve().parent),
        mode=mode,  # type: ignore[arg-type]
        config={"runs": [str(run.path) for run in runs], "groups": dict(groups)},
        reinit="create_new",
    )
    try:
        experiment.log(
            {
                "compare/table": wandb.Table(columns=list(COLUMNS), data=rows),
                PLOT_KEY: wandb.Image(str(plot_path)),
            }
        )
        # Online: the run's page; offline: the directory `wandb sync` uploads.
        where = experiment.url if mode == "online" else str(Path(experiment.dir).parent)
    finally:
        experiment.finish()
    return str(where)
