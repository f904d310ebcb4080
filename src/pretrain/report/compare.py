"""`pretrain compare DIR...`: what packing bought, for one run or whole multiruns, at a glance.

A run directory is any directory with a `metrics.csv` (our CSV logger's output); a multirun
directory is searched for them. A resumed run is one continuous curve: its steps are joined, the last
write of a step wins (also across files: `metrics.<n>.csv` beside it, n ascending, then `metrics.csv`).

Runs whose configs differ only in `seed` are one arm (arms.py: grouping and labels); an arm of one
run is drawn and tabled as before, an arm of several seeds as their mean with a band.

The figure: one line per arm, colour its layout (policy and layout knobs), line style the values of
the other keys the arms differ in (a sweep's keys); loss against real tokens seen and against
training seconds (an arm of several seeds: the mean of its seeds' curves read off a common x grid
they all cover, and the mean of their k-th validations, with a band: min-max for n <= 3 seeds,
+-1 std above; the title says so). Below, per arm (means, with the band as error bars) padding
waste (1 - real / computed tokens), the prediction pairs its layout never trains (truncated document
tails, computed as `inspect-data` does on the run's cache) and real tokens per second. A single run
is also set beside what the other layouts would waste and truncate on its data at its max_seq_len.

The markdown table next to the image: the arms' table (arm_table.py: mean, std and n of final
train/val loss, val loss interpolated at a common real-token count and at a common training time,
tokens/s and padding waste, and each arm's comparison with the reference arm: the difference with
its 95% t interval, p, Holm p, the detectable effect and the test, paired by seed where it can be),
then the contrasts at matched settings (contrasts.py: each policy against padded inside each cell
of the other varied keys, and the pooled line), then one row per run with every number. Beside it,
compare.json (every number, compare_json.py) and the contrast figure (contrast_figure.py). The
terminal gets one screen (summary.py). With `--wandb` the same tables (`wandb.Table`s, numbers as
numbers: `compare/arms`, `compare/contrasts`, `compare/table`) and the plot go into one W&B run (job
type `compare`) of the compared runs' group.
"""

from __future__ import annotations

import logging
import math
import re
from collections import Counter
from pathlib import Path

from ..errors import ConfigError
from ..fileio import write_text_atomic
from ..training.metrics_file import FILE_NAME
from ..training.run_record import LOSS, Run, load_run
from .arm_metrics import Metric, metrics
from .arm_render import markdown
from .arm_table import ArmTable, arm_table, reference_arm
from .arms import SEED, Arm, distinguishing_paths, group_arms
from .compare_json import compare_document, write_compare_json
from .contrast_render import arm_contrast_labels, contrast_markdown
from .contrasts import ContrastTable, choose_factor, contrast_table
from .figure import check_output, plot
from .summary import HEADLINE, summary_lines
from .table import cache_floors_of, layout_arms, layout_statistics, markdown_table
from .wandb_log import log_to_wandb

log = logging.getLogger(__name__)


def _natural(path: Path) -> list[tuple[int, int | str]]:
    """A sort key that orders numbered parts by number: a multirun's job 2 before job 10."""
    return [(0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", str(path)) if part]


def find_runs(directories: list[Path]) -> list[Path]:
    """The run directories under each directory (in the order given), job numbers in numeric order: a
    multirun's arms come in the order its jobs ran."""
    runs = []
    for directory in directories:
        if not directory.exists():
            raise ConfigError(f"{directory} does not exist")
        found = sorted((p.parent for p in directory.rglob("metrics.csv")), key=_natural)
        if not found:
            raise ConfigError(f"no metrics.csv under {directory}: is it a run or multirun output directory?")
        runs.extend(found)
    return list(dict.fromkeys(runs))


def label_runs(arms: list[Arm]) -> None:
    """Each run's label (the run table's first column) is its arm's, plus its seed when the compared
    runs' seeds differ (`bestfit max_seq_len=128 seed=2`); runs still alike (runs without a config)
    add the shortest end of their paths that tells them apart (`sweep-a/0`, not a job number that
    every sweep has)."""
    runs = [run for arm in arms for run in arm.runs]
    seeded = len({repr(run.config.get(SEED)) for run in runs}) > 1
    for arm in arms:
        for run in arm.runs:
            run.label = arm.label + (f" seed={run.config.get(SEED)}" if seeded and run.config else "")
    counts = Counter(run.label for run in runs)
    alike: dict[str, list[Run]] = {}
    for run in runs:
        if counts[run.label] > 1:
            alike.setdefault(run.label, []).append(run)
    for label, group in alike.items():
        for run, where in zip(group, distinguishing_paths([run.path for run in group]), strict=True):
            run.label = f"{label} ({where})"


def logged_runs(directories: list[Path]) -> list[Run]:
    """The runs under the directories that have logged a train loss (the others named in a warning)."""
    runs = [load_run(path) for path in find_runs([Path(d) for d in directories])]
    for run in runs:
        if not run.series.get(LOSS):
            log.warning(f"{run.path / FILE_NAME} has no logged {LOSS} yet: left out of the comparison")
    runs = [run for run in runs if run.series.get(LOSS)]
    if not runs:
        where = " ".join(str(d) for d in directories)
        raise ConfigError(f"no run under {where} has logged {LOSS} yet: nothing to compare")
    return runs


def _contrast_figure(contrasts: ContrastTable | None, output: Path) -> list[Path]:
    """The per-cell contrast figure beside the plot (`<name>-contrast.<suffix>`), when there is one."""
    if contrasts is None:
        return []
    from .contrast_figure import plot_contrasts

    drawn = plot_contrasts(
        contrasts.contrasts, output.with_name(f"{output.stem}-contrast{output.suffix}"), HEADLINE
    )
    return [drawn] if drawn is not None else []


def _markdown(
    runs: list[Run], table: ArmTable, contrasts: ContrastTable | None, formats: list[Metric]
) -> str:
    """compare.md: the arms' table first (DESIGN), then the contrasts, then one row per run."""
    sections = [markdown(table)]
    if contrasts is not None and contrasts.contrasts:
        sections.append("\n".join(contrast_markdown(contrasts, formats)) + "\n")
    sections.append("## runs\n\n" + markdown_table(runs))
    return "\n".join(sections)


def plot_run(run_dir: Path) -> Path:
    """A finished run's own comparison plot, `<run_dir>/compare.png` (what `python train.py` draws at
    the end of a single run, and into W&B)."""
    return compare([run_dir], output=run_dir / "compare.png", quiet=True)


def compare(
    directories: list[Path],
    output: Path | None = None,
    quiet: bool = False,
    wandb: bool = False,
    reference: str | None = None,
    at_tokens: float | None = None,
    at_seconds: float | None = None,
    at_step: float | None = None,
    paired: bool = True,
    timing: bool = True,
    contrast: str | None = None,
) -> Path:
    """Write the comparison PNG (and a .md table beside it: the arms' table, then one row per run);
    returns the PNG path. Runs that differ only in `seed` are one arm (arms.py); `reference` names the
    arm the others are compared with, `at_tokens` / `at_seconds` / `at_step` the x of the interpolated
    val loss (arm_table.py), `paired=False` Welch's test for every arm, `timing=False` a figure
    without times (`figure`). `contrast` the factor contrasted at matched settings (contrasts.py;
    default `data.policy` when the runs vary it): its per-cell figure goes beside the plot
    (`<name>-contrast.<suffix>`). Beside them: `.md` (every table) and `.json` (every number,
    compare_json.py). Unless `quiet`, prints one screen (summary.py). `wandb=True` also logs the tables
    and the plot into one W&B run of the compared runs' group (`log_to_wandb`)."""
    output = Path(output) if output else Path(directories[0]) / "compare.png"
    check_output(output)
    for option, value in (("--at-tokens", at_tokens), ("--at-seconds", at_seconds), ("--at-step", at_step)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ConfigError(f"{option} {value} must be a positive number")
    runs = logged_runs(directories)
    arms = group_arms(runs)
    reference_arm(arms, reference)  # an unknown --reference or --contrast stops before the slow work
    factor = choose_factor(arms, contrast)
    for run in runs:  # a single run: what the other layouts would waste and truncate on its data
        run.layouts = layout_statistics(run, layout_arms() if len(runs) == 1 else None)
        run.floors = run.floors or cache_floors_of(run)
    label_runs(arms)
    arms_table = arm_table(arms, reference, at_tokens, at_seconds, at_step, paired)
    ref = arms_table.reference if reference is not None else None
    contrasts = contrast_table(arms, factor, ref, at_tokens, at_seconds, at_step, paired) if factor else None
    # A sweep's legend says what each arm did against the reference at its own settings.
    labels = arm_contrast_labels(contrasts) if contrasts is not None and contrasts.keys else None
    plot(runs, output, arms, arms_table, timing, labels)
    files = [output, *_contrast_figure(contrasts, output)]
    files += [output.with_suffix(".md"), output.with_suffix(".json")]
    formats = metrics(runs, at_tokens, at_seconds, at_step)  # the contrasts' number formats
    write_text_atomic(files[-2], _markdown(runs, arms_table, contrasts, formats))
    write_compare_json(files[-1], compare_document(arms, arms_table, contrasts, files))
    if not quiet:
        print("\n".join(summary_lines(runs, arms, arms_table, contrasts, files)))
    if wandb:
        where = log_to_wandb(runs, output, arms=arms_table, contrasts=contrasts)
        if not quiet:
            print(f"W&B: {where}")
    return output.resolve()
