"""The comparison figure: one line per arm (colour its layout, line style the values of the other keys
the arms differ in), loss against real tokens and against training time or steps, small multiples
for many arms, and per arm the padding waste, truncated pairs and real tokens per second below
(a single run also beside what the other layouts would do on its data)."""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..fileio import atomic_write
from ..training.run_record import LOSS, Run, run_numbers
from .arm_render import p_text
from .arm_table import ArmTable
from .arms import SEED, Arm, flat_config, group_arms, swept_keys
from .floors import DESCRIPTION, FLOORS
from .floors import shared as shared_floor
from .statistics import BAND_MIN_MAX_UP_TO, TOO_FEW, band_name, mean_curve, mean_points, smooth, summarize

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


def arm_styles(arms: list[Arm], keys: list[str]) -> tuple[list[str], list[Any]]:
    """(colour, line style) per arm: the colour is its layout's, the style that of the values of the
    other keys the arms differ in."""
    combos = [tuple(repr(flat_config(arm.config).get(key)) for key in keys) for arm in arms]
    order = list(dict.fromkeys(combos))
    palette = arm_colors([arm.layout for arm in arms])
    colors = [palette[arm.layout] for arm in arms]
    return colors, [LINE_STYLES[order.index(combo) % len(LINE_STYLES)] for combo in combos]


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
    labels = comparison_labels(table) if table is not None else {}
    _loss_panels(fig, grid, runs, arms, colors, styles, labels, table, timing)
    if outer is not None:  # many arms: one small panel each, 4 to a row
        cells = outer[1].subgridspec(multiples, 4)
        small_multiples(
            fig, [cells[i // 4, i % 4] for i in range(len(arms))], runs, arms, colors, styles, labels
        )
    _bar_panels(fig, bar_grid, runs, arms, colors, table, timing)
    return fig


def _loss_panels(fig, grid, runs, arms, colors, styles, labels, table, timing) -> None:
    """Loss against real tokens and against training time (or steps), the arms' legend beside them."""
    loss_axes = []
    second = (TIME_AXIS, "by_time") if timing else (STEP_AXIS, "by_step")
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


def _bar_panels(fig, bar_grid, runs, arms, colors, table, timing) -> None:
    """Per arm (and for a single run per layout on its data): padding waste, truncated pairs, tokens/s."""
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
        _draw_bars(ax, rows, y, column, title, values, texts, fraction, band)


def _draw_bars(ax, rows, y, column, title, values, texts, fraction, band) -> None:
    """One bottom panel: a bar per row (hatched: a layout not trained), with the seeds' band."""
    from matplotlib.ticker import PercentFormatter

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
