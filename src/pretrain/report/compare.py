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
then one row per run with every number. With `--wandb` the same tables
(`wandb.Table`s, numbers as numbers: `compare/arms`, `compare/table`) and the plot go into one W&B
run (job type `compare`) of the compared runs' group.
"""

from __future__ import annotations

import json
import logging
import math
import re
import textwrap
from collections import Counter
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from ..errors import ConfigError
from ..fileio import atomic_write, write_text_atomic
from ..training.metrics_file import FILE_NAME
from ..training.run_record import LOSS, Run, layout_options, load_run, run_numbers
from ..training.summary import read_summary
from .arm_table import WANDB_COLUMNS, ArmTable, arm_table, markdown, p_text, reference_arm, wandb_rows
from .arms import SEED, Arm, distinguishing_paths, flat_config, group_arms, swept_keys
from .floors import DESCRIPTION, FLOORS
from .floors import shared as shared_floor
from .statistics import BAND_MIN_MAX_UP_TO, TOO_FEW, band_name, mean_curve, mean_points, smooth, summarize

log = logging.getLogger(__name__)


LINE_STYLES = ("-", "--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3)))
"""One line style per combination of the swept keys' values."""
PALETTE = tuple(
    f"tab:{c}" for c in ("red", "purple", "blue", "orange", "green", "brown", "pink", "olive", "cyan")
)
"""Arm colours: the registered policies' defaults take the first ones, in registry order."""


def arm_colors(arms: list[str]) -> dict[str, str]:
    """One colour per arm: the registered policies' defaults first (the same colour in every figure),
    then the variants in the order given."""
    from ..data.policies import REGISTRY

    ordered = list(dict.fromkeys([*map(str, REGISTRY), *arms]))
    return {arm: PALETTE[i % len(PALETTE)] for i, arm in enumerate(ordered)}


def layout_arms() -> list[tuple[str, dict[str, object]]]:
    """The layouts a single run is set beside: every registered policy at its defaults and with each
    other value of each of its enum options (`padded pad_to=longest`, `prepacked strategy=bfd`);
    (arm name, `data` group) pairs."""
    from enum import Enum

    from ..data.policies import REGISTRY

    arms: list[tuple[str, dict[str, object]]] = []
    for name, cls in REGISTRY.items():
        arms.append((str(name), {"policy": str(name)}))
        for key, default in layout_options(cls.config_class).items():
            if isinstance(default, Enum):
                for value in type(default):
                    if value != default:
                        arms.append((f"{name} {key}={value}", {"policy": str(name), key: str(value)}))
    return arms


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


def arm_styles(arms: list[Arm], keys: list[str]) -> tuple[list[str], list[Any]]:
    """(colour, line style) per arm: the colour is its layout's, the style that of the values of the
    other keys the arms differ in."""
    combos = [tuple(repr(flat_config(arm.config).get(key)) for key in keys) for arm in arms]
    order = list(dict.fromkeys(combos))
    palette = arm_colors([arm.layout for arm in arms])
    colors = [palette[arm.layout] for arm in arms]
    return colors, [LINE_STYLES[order.index(combo) % len(LINE_STYLES)] for combo in combos]


# --- layouts: what each policy wastes and truncates on a run's data --------------------------------


def _arm_data(run_data: Any, group: dict[str, object]) -> Any:
    """The typed `data` group of another arm (`group`: its policy and layout options) that keeps the
    run's other settings it shares (max_seq_len, packing_buffer)."""
    from ..data.policies import policy_class

    policy = policy_class(group["policy"])
    options = layout_options(policy.config_class)
    kept: dict[str, Any] = {
        f.name: getattr(run_data, f.name)
        for f in fields(policy.config_class)
        if f.init and f.name != "policy" and f.name not in options and hasattr(run_data, f.name)
    }
    kinds: dict[str, Any] = {key: type(default) for key, default in options.items()}
    chosen: dict[str, Any] = {key: kinds[key](value) for key, value in group.items() if key != "policy"}
    return policy.config_class(policy=policy.name, **kept, **chosen)


def layout_statistics(run: Run, arms: list[tuple[str, dict[str, object]]] | None = None) -> dict[str, dict]:
    """Padding waste and truncated prediction pairs of the run's own layout and of `arms` (from
    `layout_arms`) on the run's train split at its max_seq_len, computed as `inspect-data` does (epoch
    0, one rank; packs are built in memory, nothing is written). A mixture run: on its mixed epoch
    (its components' caches, run.json `cache_dirs`, mixed by its weights as inspect-data mixes them),
    without the layouts that cannot lay out a mixture (prepacked). Empty when the run's cache is gone
    or its config cannot be read (said in one line: the figure then leaves those bars out)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from ..config import to_config, upgrade_run_config
    from ..data.cache import Cache, read_manifest
    from ..data.mixture import Mixture, mix_splits
    from ..data.policies import PolicySettings, policy_class
    from ..data.stats import inspect_split
    from ..data.tokens import TokenSplit
    from ..errors import PretrainError

    def cache(directory: str) -> Cache:
        return Cache(directory=Path(directory), manifest=read_manifest(Path(directory)))

    try:
        record = read_summary(run.path)
        config = to_config(OmegaConf.create(upgrade_run_config(run.config)))  # also an older run's
        mixed: Mixture | None = None
        parts: list[TokenSplit] | None = None
        if config.mixture is None:
            one = cache(record["cache_dir"])
            train, validation = one.split("train"), one.split("validation")
        else:  # a mixture: its components' caches (run.json `cache_dirs`) mixed as its run mixed them
            components = config.mixture.components
            caches = [cache(record["cache_dirs"][name]) for name in components]
            total = sum(float(c.weight) for c in components.values())
            weights = [float(c.weight) / total for c in components.values()]
            repeat = [int(c.max_repeat) for c in components.values()]
            train, mixed = mix_splits([c.split("train") for c in caches], list(components), weights, repeat)
            parts = [c.split("validation") for c in caches]
            validation, _ = mix_splits(parts, list(components), weights, repeat)
        datas = {run.arm: config.data}
        datas |= {arm: _arm_data(config.data, group) for arm, group in arms or [] if arm != run.arm}
        if mixed is not None:  # a layout fixed ahead of time (prepacked) cannot lay out a mixture
            datas = {arm: data for arm, data in datas.items() if policy_class(data.policy).mixes}
        layouts = {}
        for arm, data in datas.items():
            settings = PolicySettings.from_config(data, config.train, config.seed)
            stats = inspect_split(
                settings, train, validation, audits=False, mixture=mixed, validation_parts=parts
            )
            layouts[arm] = {
                key: stats[key] for key in ("padding_waste", "truncated_pairs", "prediction_pairs")
            }
        return layouts
    except (PretrainError, OSError, KeyError, ValueError, OmegaConfBaseException) as error:
        log.info(f"{run.path}: no layout statistics ({type(error).__name__}: {error})")
        return {}


def cache_floors_of(run: Run) -> dict:
    """The floors of a run whose run.json has none (it predates them): those stored beside its cache
    (`pretrain inspect-data` or any newer run on that cache computes them); {} when none are."""
    from ..data.cache import Cache
    from ..data.floors import recorded_floors

    try:
        cache_dir = Path(read_summary(run.path)["cache_dir"])
        # The manifest is only matched against floors.json's record of the files: read, not verified.
        manifest = json.loads((cache_dir / "manifest.json").read_text())
        return recorded_floors(Cache(directory=cache_dir, manifest=manifest)) or {}
    except (OSError, KeyError, ValueError, TypeError, AttributeError):
        return {}


COLUMNS: tuple[str, ...] = ("run", "policy", "max_seq_len", "batch", "real tokens", "train loss")
COLUMNS += ("val loss", "tokens/s", "padding waste", "pack util", "truncated pairs", "train seconds")
COLUMNS += ("fragmented docs", "x-doc visible", "attn cost", "load per CPU")
_FORMATS: tuple[str, ...] = ("{}", "{}", "{}", "{}", "{:,.0f}", "{:.4f}", "{:.4f}", "{:,.0f}")
_FORMATS += ("{:.1%}", "{:.1%}", "{:.1%}", "{:,.1f}", "{:.1%}", "{:.1%}", "{:,.1f}", "{:.2f}")


def table_rows(runs: list[Run]) -> list[list]:
    """One row per run, in COLUMNS order, numbers as numbers."""
    return [
        [run.label, run.policy, run.max_seq_len, run.batch_size, *run_numbers(run).values()] for run in runs
    ]


def markdown_table(runs: list[Run]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|---" * len(COLUMNS) + "|"]
    for row in table_rows(runs):
        cells = [
            "n/a" if isinstance(value, float) and math.isnan(value) else fmt.format(value)
            for fmt, value in zip(_FORMATS, row, strict=True)
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


LEGEND_WIDTH = 48
"""Legend labels wrap at this many characters (bar labels are cut there): the figure keeps its shape."""


def _wrapped(label: str) -> str:
    return "\n".join(textwrap.wrap(label, LEGEND_WIDTH, break_long_words=True)) or label


def _cut(label: str) -> str:
    return label if len(label) <= LEGEND_WIDTH else label[: LEGEND_WIDTH - 1] + "…"


def percent(value: float) -> str:
    """A fraction as a bar label: `0%` for nothing (never `-0.0%`), `<0.1%` for a trace, `n/a` unknown."""
    if not math.isfinite(value):
        return "n/a"
    if value <= 0:
        return "0%"
    return "<0.1%" if value < 0.0005 else f"{value:.1%}"


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


@dataclass
class Bar:
    """One row of the bottom panels: an arm (its seeds' mean and band), or (single run) a layout it is
    compared with."""

    label: str
    color: str
    waste: float
    truncated: float  # a fraction of the prediction pairs
    truncated_pairs: float
    tokens_per_sec: float
    trained: bool = True
    waste_band: tuple[float, float] | None = None  # over the arm's seeds (n >= 2)
    speed_band: tuple[float, float] | None = None


def _arm_bar(arm: Arm, color: str) -> Bar:
    waste = summarize([run.mean("train/padding_waste") for run in arm.runs])
    speed = summarize([run_numbers(run)["tokens_per_sec"] for run in arm.runs])
    pairs = [run.layouts.get(run.arm, {}).get("truncated_pairs", math.nan) for run in arm.runs]
    return Bar(
        arm.label,
        color,
        waste.mean,
        summarize([run.truncated_fraction() for run in arm.runs]).mean,
        summarize(pairs).mean,
        speed.mean,
        waste_band=waste.band() if waste.n >= 2 else None,
        speed_band=speed.band() if speed.n >= 2 else None,
    )


def bars(arms: list[Arm], colors: list[str]) -> list[Bar]:
    """The arms (measured waste and speed, their layout's truncation: means over seeds, with the band);
    for a single run also the other layouts on its data at its max_seq_len (hatched in the figure:
    computed, not trained)."""
    rows = [_arm_bar(arm, color) for arm, color in zip(arms, colors, strict=True)]
    if len(arms) == 1 and arms[0].n == 1:
        (run,) = arms[0].runs
        palette = arm_colors(list(run.layouts))
        for arm, layout in run.layouts.items():
            if arm != run.arm:
                rows.append(
                    Bar(
                        f"{arm} (layout only)",
                        palette[arm],
                        layout["padding_waste"],
                        run.truncated_fraction(arm),
                        layout["truncated_pairs"],
                        math.nan,
                        trained=False,
                    )
                )
    return rows


TOKENS_AXIS = "real tokens seen"
TIME_AXIS = "training seconds (data + update steps; validation left out)"
STEP_AXIS = "optimizer steps (updates)"
WASTE_TITLE = "padding waste: 1 - real / computed tokens"
TRUNCATION_TITLE = "truncated: prediction pairs never trained (cut tails)"
SPEED_TITLE = "real tokens / s (real tokens / training seconds)"
CONTENDED_NOTE = "\nUNRELIABLE: the machine was contended (compare.md)"


def _truncation_text(row: Bar) -> str:
    return percent(row.truncated) + (f" ({row.truncated_pairs:,.0f})" if row.truncated > 0 else "")


def _legend_label(arm: Arm, comparison: str = "") -> str:
    label = _wrapped(arm.label + (f" (n={arm.n}, {band_name(arm.n)})" if arm.n >= 2 else ""))
    return label + (f"\n{comparison}" if comparison else "")


def comparison_labels(table: ArmTable) -> dict[int, str]:
    """Per arm (by id) its final val loss against the reference, for the legend: `final val -0.012
    [-0.030, +0.006], Holm p 0.21 (paired t)`; `reference` for the reference itself."""
    sections = [section for section in table.sections if section.metric.name == "final val loss"]
    if table.reference is None or not sections:
        return {}
    labels = {id(table.reference): "reference"}
    for row in sections[0].rows:
        c = row.comparison
        if c is None:
            continue
        if c.test == TOO_FEW:
            labels[id(row.arm)] = f"final val {c.diff:+.3f} (n<2: no test)"
            continue
        mark = " significant" if c.significant else ""
        labels[id(row.arm)] = (
            f"final val {c.diff:+.3f} [{c.low:+.3f}, {c.high:+.3f}], Holm p {p_text(c.holm)}{mark} ({c.test})"
        )
    return labels


def draw_floors(ax, runs: list[Run]) -> None:
    """The floors every run shares as dotted horizontal lines, named at the panel's right edge."""
    for name in FLOORS:
        value = shared_floor(runs, name)
        if math.isfinite(value):
            ax.axhline(value, color="0.35", linestyle=":", linewidth=1.2)
            ax.annotate(
                f"{DESCRIPTION[name]} floor {value:.2f}",
                (1.0, value),
                xycoords=("axes fraction", "data"),
                ha="right",
                va="bottom",
                fontsize=8,
                color="0.3",
            )


MARKERS = ("o", "s", "^", "D", "v", "P")
"""Validation markers, one per line style: a validation point carries its arm's style too."""
SMALL_MULTIPLES_ABOVE = 4
"""More arms than this also get one small panel each (the arm over the others in grey)."""


def _marker(style: Any) -> str:
    return MARKERS[LINE_STYLES.index(style) % len(MARKERS)] if style in LINE_STYLES else "o"


def _draw_arm(
    ax, arm: Arm, attribute: str, color: str, style: Any, comparison: str = "", legend: bool = True
) -> None:
    """One arm on a loss panel: its train loss smoothed (EMA; the raw curve faint) and its validation
    points joined in the arm's line style with its marker; several seeds: their mean train curve with
    its band (read off x values every seed covers: nothing extrapolated) and the mean of their k-th
    validations with the band as error bars."""
    trains = [getattr(run, attribute).get(LOSS, []) for run in arm.runs]
    vals = [getattr(run, attribute).get("val/loss", []) for run in arm.runs]
    label = _legend_label(arm, comparison) if legend else "_nolegend_"
    marker = _marker(style)
    if arm.n == 1:
        train, val = np.array(trains[0]), np.array(vals[0])
        if len(train):
            ax.plot(train[:, 0], train[:, 1], color=color, linestyle=style, alpha=0.2, linewidth=0.8)
            ax.plot(train[:, 0], smooth(train[:, 1]), color=color, linestyle=style, alpha=0.9, label=label)
        if len(val):
            ax.plot(
                val[:, 0], val[:, 1], color=color, linestyle=style, marker=marker, markersize=5, linewidth=1
            )
        return
    curve = mean_curve(trains)
    if curve is not None:
        ax.plot(curve.x, curve.mean, color=color, linestyle=style, alpha=0.2, linewidth=0.8)
        ax.plot(curve.x, smooth(curve.mean), color=color, linestyle=style, alpha=0.9, label=label)
        ax.fill_between(curve.x, curve.low, curve.high, color=color, alpha=0.2, linewidth=0)
    dots = mean_points(vals)
    if dots is not None:
        ax.errorbar(
            dots.x,
            dots.mean,
            yerr=[dots.mean - dots.low, dots.high - dots.mean],
            fmt=marker,
            linestyle=style,
            linewidth=1,
            color=color,
            markersize=5,
            capsize=3,
        )


def small_multiples(fig, cells, runs: list[Run], arms: list[Arm], colors, styles, labels) -> None:
    """One panel per arm, loss against real tokens: the arm in its colour over every other arm in
    light grey (their smoothed train losses), so many arms read without spaghetti."""
    first = None
    for index, (arm, color, style) in enumerate(zip(arms, colors, styles, strict=True)):
        ax = fig.add_subplot(cells[index], sharex=first, sharey=first)
        first = first or ax
        for other in arms:
            if other is not arm:
                for run in other.runs:
                    train = np.array(run.series.get(LOSS, []))
                    if len(train):
                        ax.plot(train[:, 0], smooth(train[:, 1]), color="0.8", linewidth=0.8)
        _draw_arm(ax, arm, "series", color, style, legend=False)
        comparison = labels.get(id(arm), "")
        ax.set_title(_wrapped(arm.label) + (f"\n{comparison}" if comparison else ""), fontsize=7)
        ax.tick_params(labelsize=7)
        draw_floors(ax, runs)


def figure(
    runs: list[Run], arms: list[Arm] | None = None, table: ArmTable | None = None, timing: bool = True
):
    """The comparison figure (not saved): loss against real tokens and against training time, one
    line per arm (a single seed's curve, or the seeds' mean with a band), colour by layout and line
    style by the values of the other keys the arms differ in; below, per arm (and for a single run
    per layout on its data) padding waste, truncated prediction pairs and real tokens per second.
    With the arms' `table`, each arm's legend entry carries its final val loss comparison with the
    reference, and the floors the runs share are drawn as horizontal lines. `timing=False` (a figure
    to publish from a shared machine, whose times are load noise) draws loss against optimizer steps
    instead of seconds and leaves out the tokens/s bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import PercentFormatter

    arms = arms if arms is not None else group_arms(runs)
    keys = swept_keys([arm.runs[0] for arm in arms], ignored=(SEED,))
    colors, styles = arm_styles(arms, keys)
    # Constrained layout makes room for the legend and long labels (tight_layout warned when it could not).
    multiples = math.ceil(len(arms) / 4) if len(arms) > SMALL_MULTIPLES_ABOVE else 0
    fig = plt.figure(figsize=(16, 10 + 3 * multiples), layout="constrained")
    outer = fig.add_gridspec(3, 1, height_ratios=[1.3, 0.9 * multiples, 1]) if multiples else None
    grid = outer[0].subgridspec(1, 6) if outer is not None else fig.add_gridspec(2, 6, height_ratios=[1.3, 1])
    bar_grid = outer[2].subgridspec(1, 6) if outer is not None else grid
    swept = ", ".join(key.split(".")[-1] for key in keys)
    seeded = any(arm.n >= 2 for arm in arms)
    fig.suptitle(
        "what packing buys: colour = policy"
        + (f", line style = {swept}" if swept else "")
        + "; lines: train loss (EMA; raw faint), markers: validation loss"
        + (
            f"\narms of several seeds: their mean, band min-max for n <= {BAND_MIN_MAX_UP_TO} seeds, "
            "+-1 std above (bars: error bars)"
            if seeded
            else ""
        ),
        fontsize=11,
    )
    loss_axes = []
    second = (TIME_AXIS, "by_time") if timing else (STEP_AXIS, "by_step")
    labels = comparison_labels(table) if table is not None else {}
    for column, (xlabel, attribute) in enumerate(((TOKENS_AXIS, "series"), second)):
        ax = fig.add_subplot(grid[0, 3 * column : 3 * column + 3])
        for arm, color, style in zip(arms, colors, styles, strict=True):
            _draw_arm(ax, arm, attribute, color, style, labels.get(id(arm), ""))
        short = xlabel.split(" (")[0]
        title = f"loss against {short}"
        if attribute == "by_time" and table is not None and table.contended:
            title += CONTENDED_NOTE
        ax.set(xlabel=xlabel, ylabel="loss (nats per target)", title=title)
        if not ax.lines:
            ax.text(0.5, 0.5, f"no {short} logged", ha="center", transform=ax.transAxes)
        else:
            draw_floors(ax, runs)
        loss_axes.append(ax)
    # The arms' legend beside the right-hand loss panel, or the left one when no wall time was logged.
    labelled = [ax for ax in loss_axes if ax.get_legend_handles_labels()[0]]
    if labelled and labelled[-1] is loss_axes[-1]:
        labelled[-1].legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5), title="arm")
    elif labelled:  # inside the left panel: outside it would cover the right one
        labelled[-1].legend(fontsize=8, loc="upper right", title="arm")
    if outer is not None:  # many arms: one small panel each, 4 to a row
        cells = outer[1].subgridspec(multiples, 4)
        small_multiples(
            fig, [cells[i // 4, i % 4] for i in range(len(arms))], runs, arms, colors, styles, labels
        )
    rows = bars(arms, colors)
    y = np.arange(len(rows))
    single = len(runs) == 1
    layouts = f"\n(at max_seq_len {runs[0].max_seq_len}; hatched: layout only)" if single else ""
    panels = (
        (
            WASTE_TITLE + layouts,
            [r.waste for r in rows],
            [percent(r.waste) for r in rows],
            True,
            "waste_band",
        ),
        (
            TRUNCATION_TITLE + layouts,
            [r.truncated for r in rows],
            [_truncation_text(r) for r in rows],
            True,
            None,
        ),
        (
            SPEED_TITLE + (CONTENDED_NOTE if table is not None and table.contended else ""),
            [r.tokens_per_sec for r in rows],
            [f"{r.tokens_per_sec:,.0f}" if r.trained else "not trained" for r in rows],
            False,
            "speed_band",
        ),
    )[: 3 if timing else 2]
    width = 6 // len(panels)
    for column, (title, values, texts, fraction, band) in enumerate(panels):
        ax = fig.add_subplot(bar_grid[-1, width * column : width * column + width])
        drawn = [v if math.isfinite(v) else 0.0 for v in values]
        bands = [getattr(r, band) if band else None for r in rows]
        errors = None
        if any(bands):  # the seeds' band around the arm's mean
            errors = np.array(
                [[v - b[0], b[1] - v] if b else [0.0, 0.0] for v, b in zip(drawn, bands, strict=True)]
            ).T
        bar_set = ax.barh(
            y, drawn, color=[r.color for r in rows], xerr=errors, capsize=3 if errors is not None else 0
        )
        for bar, row in zip(bar_set, rows, strict=True):
            if not row.trained:
                bar.set_hatch("//")
                bar.set_alpha(0.55)
        ax.set_yticks(y, [_cut(r.label) for r in rows] if column == 0 else [""] * len(rows), fontsize=8)
        ax.invert_yaxis()  # the legend's order, top to bottom
        ax.set_title(title, fontsize=10)
        ax.bar_label(bar_set, labels=texts, fontsize=7, padding=2)
        top = max([*drawn, *(b[1] for b in bands if b)], default=0.0)
        if fraction:  # room for the labels; an all-zero panel reads 0-5%, none goes past 100%
            ax.set_xlim(0, max(top * 1.4, 0.05))
            if top * 1.4 > 1:
                ax.set_xticks(np.linspace(0, 1, 5))
            ax.xaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
        else:
            ax.set_xlim(0, top * 1.4 if top > 0 else 1)
    return fig


def plot(
    runs: list[Run],
    output: Path,
    arms: list[Arm] | None = None,
    table: ArmTable | None = None,
    timing: bool = True,
) -> None:
    import matplotlib.pyplot as plt

    fig = figure(runs, arms, table, timing)
    output.parent.mkdir(parents=True, exist_ok=True)
    try:  # atomically: a full disk leaves the old plot or none, never a truncated one
        with atomic_write(output) as handle:
            fig.savefig(handle, dpi=100, format=output.suffix.lstrip(".").lower())
    finally:
        plt.close(fig)


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
) -> Path:
    """Write the comparison PNG (and a .md table beside it: the arms' table, then one row per run);
    returns the PNG path. Runs that differ only in `seed` are one arm (arms.py); `reference` names the
    arm the others are compared with, `at_tokens` / `at_seconds` / `at_step` the x of the interpolated
    val loss (arm_table.py), `paired=False` Welch's test for every arm, `timing=False` a figure
    without times (`figure`). `wandb=True` also logs the tables and the plot into one W&B run of the
    compared runs' group (`log_to_wandb`)."""
    output = Path(output) if output else Path(directories[0]) / "compare.png"
    check_output(output)
    for option, value in (("--at-tokens", at_tokens), ("--at-seconds", at_seconds), ("--at-step", at_step)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ConfigError(f"{option} {value} must be a positive number")
    runs = [load_run(path) for path in find_runs([Path(d) for d in directories])]
    for run in runs:
        if not run.series.get(LOSS):
            log.warning(f"{run.path / FILE_NAME} has no logged {LOSS} yet: left out of the comparison")
    runs = [run for run in runs if run.series.get(LOSS)]
    if not runs:
        where = " ".join(str(d) for d in directories)
        raise ConfigError(f"no run under {where} has logged {LOSS} yet: nothing to compare")
    arms = group_arms(runs)
    reference_arm(arms, reference)  # an unknown --reference stops before the slow work
    for run in runs:  # a single run: what the other layouts would waste and truncate on its data
        run.layouts = layout_statistics(run, layout_arms() if len(runs) == 1 else None)
        run.floors = run.floors or cache_floors_of(run)
    label_runs(arms)
    arms_table = arm_table(arms, reference, at_tokens, at_seconds, at_step, paired)
    plot(runs, output, arms, arms_table, timing)
    table = markdown(arms_table) + "\n## runs\n\n" + markdown_table(runs)
    write_text_atomic(output.with_suffix(".md"), table)
    if not quiet:
        print(table)
        print(f"plot: {output.resolve()}")
    if wandb:
        where = log_to_wandb(runs, output, arms=arms_table)
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
    arms: ArmTable | None = None,
) -> str:
    """Log the comparison tables (`compare/arms`, a `wandb.Table` with arm_table.WANDB_COLUMNS, one
    row per metric and arm; `compare/table`, one row per run with COLUMNS) and plot (`compare/plot`)
    into a new W&B run `compare-<group>` (job type `compare`) of the runs' group.
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
        config={
            "runs": [str(run.path) for run in runs],
            "groups": dict(groups),
            "reference": arms.reference.label if arms and arms.reference else None,
        },
        reinit="create_new",
    )
    try:
        experiment.log(
            {
                "compare/table": wandb.Table(columns=list(COLUMNS), data=rows),
                **(
                    {"compare/arms": wandb.Table(columns=list(WANDB_COLUMNS), data=wandb_rows(arms))}
                    if arms
                    else {}
                ),
                PLOT_KEY: wandb.Image(str(plot_path)),
            }
        )
        # Online: the run's page; offline: the directory `wandb sync` uploads.
        where = experiment.url if mode == "online" else str(Path(experiment.dir).parent)
    finally:
        experiment.finish()
    return str(where)
