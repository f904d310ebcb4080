"""The comparison figure: one line per arm (colour its policy, a shade of it per arm of that policy,
line style the values of the other keys the arms differ in), its validations as markers, loss against
real tokens and against training time or steps, small multiples for many arms, and per arm the padding
waste, truncated pairs and real tokens per second below (a single run also beside what the other
layouts would do on its data). Nothing is cut: long labels wrap; a panel with nothing to show is left
out; the floors are named in the margin, clear of the curves. Here: the loss panels and the figure's
assembly; its colours are figure_colors', its bottom panels figure_bars'."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..fileio import atomic_write
from ..training.run_record import LOSS, Run
from .arm_render import p_text
from .arm_table import ArmTable
from .arms import SEED, Arm, group_arms, swept_keys
from .figure_bars import CONTENDED_NOTE, bar_label, bar_panels, bars, draw_bar_panels, wrapped
from .figure_colors import LINE_STYLES, arm_styles
from .floors import DESCRIPTION, FLOORS
from .floors import shared as shared_floor
from .statistics import BAND_MIN_MAX_UP_TO, TOO_FEW, band_name, mean_curve, mean_points, smooth


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


TOKENS_AXIS = "real tokens seen"

TIME_AXIS = "training seconds (data + update steps; validation left out)"

STEP_AXIS = "optimizer steps (updates)"


def _legend_label(arm: Arm, comparison: str = "") -> str:
    label = wrapped(arm.label + (f" (n={arm.n}, {band_name(arm.n)})" if arm.n >= 2 else ""))
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


FLOOR_COLOR = "0.35"
"""The floors' lines and names: grey, apart from every arm's colour."""


def draw_floors(ax, runs: list[Run], named: bool = True) -> float:
    """The floors every run shares as dotted horizontal lines, `named` in the margin right of the panel
    at their height (outside the data: no curve under them; the upper floor's name above its line,
    the lower one's below, so two close floors never overlap). Returns the names' width in inches
    (0 without names), for what goes beside the panel (the legend) to keep clear of them."""
    values = {name: shared_floor(runs, name) for name in FLOORS}
    drawn = sorted(((v, name) for name, v in values.items() if math.isfinite(v)), reverse=True)
    width = 0.0
    for rank, (value, name) in enumerate(drawn):
        ax.axhline(value, color=FLOOR_COLOR, linestyle=":", linewidth=1.2)
        if not named:
            continue
        last = len(drawn) - 1
        placement = "center" if last == 0 or 0 < rank < last else "bottom" if rank == 0 else "top"
        note = ax.annotate(
            f"{DESCRIPTION[name]} floor {value:.2f}",
            (1.0, value),
            xycoords=("axes fraction", "data"),
            xytext=(4, 0),
            textcoords="offset points",
            ha="left",
            va=placement,
            fontsize=8,
            color=FLOOR_COLOR,
            annotation_clip=False,
        )
        extent = note.get_window_extent(ax.figure.canvas.get_renderer())
        width = max(width, extent.width / ax.figure.dpi + 4 / 72)
    return width


MARKERS = ("o", "s", "^", "D", "v", "P")
"""Validation markers, one per line style: a validation point carries its arm's style too."""

SMALL_MULTIPLES_ABOVE = 4
"""More arms than this also get one small panel each (the arm over the others in grey)."""


def _marker(style: Any) -> str:
    return MARKERS[LINE_STYLES.index(style) % len(MARKERS)] if style in LINE_STYLES else "o"


def _dot(color: str, style: Any) -> dict[str, Any]:
    """A validation marker's look: the arm's colour, the marker of its line style, a white rim."""
    return {
        "color": color,
        "marker": _marker(style),
        "markersize": 6,
        "markeredgecolor": "white",
        "markeredgewidth": 0.8,
    }


def _draw_arm(
    ax, arm: Arm, attribute: str, color: str, style: Any, comparison: str = "", legend: bool = True
) -> None:
    """One arm on a loss panel: its train loss smoothed (EMA; the raw curve faint), its only line, and
    its validations as markers (its colour, the marker of its line style; no line joins them);
    several seeds: their mean train curve with its band (read off x values every seed covers: nothing
    extrapolated) and the mean of their k-th validations with the band as error bars."""
    trains = [getattr(run, attribute).get(LOSS, []) for run in arm.runs]
    vals = [getattr(run, attribute).get("val/loss", []) for run in arm.runs]
    label = _legend_label(arm, comparison) if legend else "_nolegend_"
    dot = _dot(color, style)
    if arm.n == 1:
        train, val = np.array(trains[0]), np.array(vals[0])
        if len(train):
            ax.plot(train[:, 0], train[:, 1], color=color, linestyle=style, alpha=0.2, linewidth=0.8)
            ax.plot(train[:, 0], smooth(train[:, 1]), color=color, linestyle=style, alpha=0.9, label=label)
        if len(val):
            ax.plot(val[:, 0], val[:, 1], linestyle="None", **dot)
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
            fmt="none",
            ecolor=color,
            elinewidth=1,
            capsize=3,
        )
        ax.plot(dots.x, dots.mean, linestyle="None", **dot)


def small_multiples(fig, cells, runs: list[Run], arms: list[Arm], colors, styles, labels) -> None:
    """One panel per arm, loss against real tokens: the arm in its colour over every other arm in
    light grey (their smoothed train losses), so many arms read without spaghetti; the floors as in
    the large panels, unnamed (the large panel names them)."""
    from matplotlib.ticker import EngFormatter

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
        ax.set_title(wrapped(arm.label) + (f"\n{comparison}" if comparison else ""), fontsize=7)
        ax.tick_params(labelsize=7)
        ax.xaxis.set_major_formatter(EngFormatter(sep=""))
        draw_floors(ax, runs, named=False)


def _logged(arms: list[Arm], attribute: str) -> bool:
    return any(getattr(run, attribute).get(LOSS) for arm in arms for run in arm.runs)


LOSS_HEIGHT = 5.6
"""Inches of the loss panels' row."""

BAR_HEIGHT = 4.2
"""Inches of the bottom panels' row at least; more when many (wrapped) row labels need it."""

LINE_INCHES = 8 * 1.25 / 72
"""One line of an 8-point label."""


def figure(
    runs: list[Run],
    arms: list[Arm] | None = None,
    table: ArmTable | None = None,
    timing: bool = True,
    labels: dict[int, str] | None = None,
):
    """The comparison figure (not saved): loss against real tokens and against training time, one
    line per arm (a single seed's curve, or the seeds' mean with a band) and its validations as
    markers, colour by policy (a shade per arm of it) and line style by the values of the other keys
    the arms differ in; below, per arm (and for a single run per layout on its data) padding waste,
    truncated prediction pairs and real tokens per second. With the arms' `table`, each arm's legend
    entry carries its final val loss comparison with the reference, and the floors the runs share are
    drawn as horizontal lines, named in the margin. `timing=False` (a figure to publish from a shared
    machine, whose times are load noise) draws loss against optimizer steps instead of seconds and
    leaves out the tokens/s bars. A panel with nothing logged is left out (the others take its room).
    `labels` (by arm id) replaces the legend's comparisons: a sweep's matched contrasts, each arm
    against the reference level in its own cell (contrast_render.arm_contrast_labels)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = arms if arms is not None else group_arms(runs)
    keys = swept_keys([arm.runs[0] for arm in arms], ignored=(SEED,))
    colors, styles = arm_styles(arms, keys)
    second = (TIME_AXIS, "by_time") if timing else (STEP_AXIS, "by_step")
    loss_specs = [spec for spec in ((TOKENS_AXIS, "series"), second) if _logged(arms, spec[1])]
    rows = bars(arms, colors)
    panels = bar_panels(runs, rows, table, timing)
    row_labels = [bar_label(row.label) for row in rows]
    multiples = math.ceil(len(arms) / 4) if len(arms) > SMALL_MULTIPLES_ABOVE else 0
    heights = _row_heights(multiples, row_labels if panels else None)
    # Constrained layout makes room for the legend, the floors' names and long labels.
    fig = plt.figure(figsize=(16, sum(heights) + 0.9), layout="constrained")
    outer = fig.add_gridspec(len(heights), 1, height_ratios=heights)
    fig.suptitle(_title(arms, keys), fontsize=11)
    if labels is None:
        labels = comparison_labels(table) if table is not None else {}
    _loss_panels(fig, outer[0], loss_specs, runs, arms, colors, styles, labels, table)
    if multiples:  # many arms: one small panel each, 4 to a row
        cells = outer[1].subgridspec(multiples, 4)
        small_multiples(
            fig, [cells[i // 4, i % 4] for i in range(len(arms))], runs, arms, colors, styles, labels
        )
    if panels:
        draw_bar_panels(fig, outer[-1], rows, row_labels, panels)
    return fig


def _row_heights(multiples: int, row_labels: list[str] | None) -> list[float]:
    """The figure's rows in inches: the loss panels, `multiples` rows of small multiples (if any) and
    the bottom panels (with `row_labels`, the bars' wrapped labels: room for every one of them and
    the titles above)."""
    heights = [LOSS_HEIGHT] + [3.2 * multiples] * bool(multiples)
    if row_labels is not None:
        lines = sum(label.count("\n") + 1 for label in row_labels) + 0.4 * len(row_labels)
        heights.append(max(BAR_HEIGHT, 1.6 + LINE_INCHES * lines))
    return heights


def _title(arms: list[Arm], keys: list[str]) -> str:
    """The figure's title: what colour, line style, lines and markers stand for (and, when an arm has
    several seeds, its band)."""
    swept = ", ".join(key.split(".")[-1] for key in keys)
    seeded = any(arm.n >= 2 for arm in arms)
    return (
        "what packing buys: colour = policy (a shade per arm)"
        + (f", line style = {swept}" if swept else "")
        + "; lines: train loss (EMA; raw faint), markers: validation loss"
        + (
            f"\narms of several seeds: their mean, band min-max for n <= {BAND_MIN_MAX_UP_TO} seeds, "
            "+-1 std above (bars: error bars)"
            if seeded
            else ""
        )
    )


def _loss_panels(fig, cell, specs, runs, arms, colors, styles, labels, table) -> None:
    """Loss against real tokens and against training time (or steps), those logged side by side on
    one loss axis (none logged: the real tokens panel says so); the floors named once, right of the
    first panel (between the two, level with both panels' floor lines), the arms' legend (and its
    comparisons) right of the last panel, clear of the floors' names."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import EngFormatter
    from matplotlib.transforms import ScaledTranslation

    grid = cell.subgridspec(1, max(len(specs), 1))
    ax = first = None
    names = 0.0
    for column, (xlabel, attribute) in enumerate(specs or [(TOKENS_AXIS, "series")]):
        ax = fig.add_subplot(grid[0, column], sharey=first)
        first = first or ax
        for arm, color, style in zip(arms, colors, styles, strict=True):
            _draw_arm(ax, arm, attribute, color, style, labels.get(id(arm), ""))
        short = xlabel.split(" (")[0]
        title = f"loss against {short}"
        if attribute == "by_time" and table is not None and table.contended:
            title += CONTENDED_NOTE
        ax.set(xlabel=xlabel, title=title)
        if column == 0:
            ax.set_ylabel("loss (nats per target)")
        ax.xaxis.set_major_formatter(EngFormatter(sep=""))  # 25k, 1.5M: ticks that never collide
        if not specs:
            ax.text(0.5, 0.5, "no train loss logged", ha="center", transform=ax.transAxes)
        else:
            width = draw_floors(ax, runs, named=column == 0)
            names = width if column == 0 else 0.0  # what the legend must clear: names beside its panel
    handles, texts = ax.get_legend_handles_labels() if ax is not None else ([], [])
    if ax is not None and handles:
        # each entry its arm's line and its validations' marker
        looks = {
            _legend_label(arm, labels.get(id(arm), "")): (color, style)
            for arm, color, style in zip(arms, colors, styles, strict=True)
        }
        handles = [
            Line2D([], [], linestyle=looks[text][1], **_dot(*looks[text])) if text in looks else handle
            for handle, text in zip(handles, texts, strict=True)
        ]
        beside = ax.transAxes + ScaledTranslation(names + 0.08, 0, fig.dpi_scale_trans)
        ax.legend(
            handles,
            texts,
            fontsize=8,
            loc="center left",
            bbox_to_anchor=(1.0, 0.5),
            bbox_transform=beside,
            title="arm",
        )


def plot(
    runs: list[Run],
    output: Path,
    arms: list[Arm] | None = None,
    table: ArmTable | None = None,
    timing: bool = True,
    labels: dict[int, str] | None = None,
) -> None:
    import matplotlib.pyplot as plt

    fig = figure(runs, arms, table, timing, labels)
    output.parent.mkdir(parents=True, exist_ok=True)
    try:  # atomically: a full disk leaves the old plot or none, never a truncated one
        with atomic_write(output) as handle:
            fig.savefig(handle, dpi=100, format=output.suffix.lstrip(".").lower())
    finally:
        plt.close(fig)
