"""The contrast figure: for one metric, what the contrasted factor (`data.policy`) changes within each
cell of the other swept keys, as a forest plot. One row per cell (its setting, `batch_size=4
max_seq_len=128`), a point per level contrasted with the reference (a colour per level when there are
several) with its 95% interval as a horizontal bar, a line at 0 (no difference), the pooled line(s)
below in bold diamonds, and each row's Holm p in the right margin. A cell without a test (`n<2`)
shows its difference alone, hollow, marked `n<2`."""

from __future__ import annotations

import math
from pathlib import Path

from ..fileio import atomic_write
from .arm_render import p_text
from .contrasts import Contrast, describe
from .figure_bars import BAR_LABEL_WIDTH, wrapped
from .figure_colors import arm_colors
from .statistics import TOO_FEW

NO_TEST = TOO_FEW
"""`Contrast.test` of a cell without a test: its difference has no interval."""

POOLED_LABEL = "pooled over {} cells"

ROW_INCHES = 0.42
"""Height of one row per level in it (more for wrapped labels)."""


def _setting_label(contrast: Contrast) -> str:
    """`{"train.batch_size": "4", "data.max_seq_len": "128"}` -> `batch_size=4 max_seq_len=128`."""
    return wrapped(describe(contrast.setting), BAR_LABEL_WIDTH)


def _has_interval(contrast: Contrast) -> bool:
    return contrast.test != NO_TEST and math.isfinite(contrast.ci_low) and math.isfinite(contrast.ci_high)


def _p_note(contrast: Contrast) -> str:
    if not _has_interval(contrast):
        return "n<2: no test"
    holm = contrast.p_holm if math.isfinite(contrast.p_holm) else contrast.p
    name = "Holm p" if math.isfinite(contrast.p_holm) else "p"
    return f"{name} {p_text(holm)}" + (" *" if holm < 0.05 else "")


def contrast_figure(contrasts: list[Contrast]):
    """The forest plot (not saved) of `contrasts`, all of one metric: rows top to bottom in the order
    the cells first appear, the pooled row last."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = list(dict.fromkeys(c.level for c in contrasts))
    colors = arm_colors(levels)
    cells = list(dict.fromkeys(tuple(c.setting.items()) for c in contrasts if not c.pooled))
    pooled = any(c.pooled for c in contrasts)
    labels = _row_labels(contrasts, cells, pooled)
    fig = plt.figure(figsize=(9, _height(labels, len(levels))), layout="constrained")
    ax = fig.add_subplot()
    step = min(0.25, 0.7 / len(levels))  # levels side by side within a row
    for contrast in contrasts:
        row = len(cells) if contrast.pooled else cells.index(tuple(contrast.setting.items()))
        y = row + (levels.index(contrast.level) - (len(levels) - 1) / 2) * step
        color = colors[contrast.level]
        _draw_contrast(ax, contrast, y, color)
        _p_margin(ax, contrast, y, color if len(levels) > 1 else "0.2")
    _draw_rows(ax, labels, len(cells), pooled)
    _titles(ax, contrasts, levels)
    ax.grid(axis="x", color="0.92")
    ax.margins(x=0.06)
    if len(levels) > 1:
        _legend(fig, contrasts[0].factor, levels, colors)
    return fig


def _row_labels(contrasts: list[Contrast], cells: list[tuple], pooled: bool) -> list[str]:
    """Each row's label, top to bottom: the cells' settings (wrapped), then the pooled row if any."""
    labels = [
        _setting_label(next(c for c in contrasts if tuple(c.setting.items()) == cell)) for cell in cells
    ]
    return labels + [POOLED_LABEL.format(len(cells))] * pooled


def _height(labels: list[str], levels: int) -> float:
    """The figure's height in inches: room for every row (more with more levels side by side in it)
    and every line of the rows' wrapped labels, and the titles."""
    lines = sum(label.count("\n") + 1 for label in labels)
    per_row = max(1.0, 0.55 * levels)
    return 2.0 + max(ROW_INCHES * per_row * len(labels), 0.17 * lines)


def _draw_contrast(ax, contrast: Contrast, y: float, color: str) -> None:
    """One contrast at height `y`: its difference with its 95% interval as error bars (a diamond when
    pooled), or without a test its difference alone, hollow, marked `n<2`."""
    size, width, marker = (9, 2.5, "D") if contrast.pooled else (6, 1.4, "o")
    if _has_interval(contrast):
        ax.errorbar(
            [contrast.diff],
            [y],
            xerr=[[contrast.diff - contrast.ci_low], [contrast.ci_high - contrast.diff]],
            fmt=marker,
            color=color,
            markersize=size,
            elinewidth=width,
            capsize=3,
        )
    elif math.isfinite(contrast.diff):  # no interval: the point alone, hollow
        ax.plot(
            [contrast.diff],
            [y],
            linestyle="None",
            marker=marker,
            markersize=size,
            markerfacecolor="white",
            markeredgecolor=color,
            markeredgewidth=1.5,
        )
        ax.annotate(
            NO_TEST,
            (contrast.diff, y),
            xytext=(7, 0),
            textcoords="offset points",
            va="center",
            fontsize=8,
            color=color,
        )


def _p_margin(ax, contrast: Contrast, y: float, color: str) -> None:
    """The contrast's (Holm) p in the right margin, level with its point (bold when pooled)."""
    ax.annotate(
        _p_note(contrast),
        (1.0, y),
        xycoords=("axes fraction", "data"),
        xytext=(6, 0),
        textcoords="offset points",
        va="center",
        fontsize=8,
        color=color,
        fontweight="bold" if contrast.pooled else "normal",
        annotation_clip=False,
    )


def _draw_rows(ax, labels: list[str], cells: int, pooled: bool) -> None:
    """The line at 0 (no difference), the rule above the pooled row, and the rows' labels (the first
    cell on top, the pooled row at the bottom, in bold)."""
    ax.axvline(0.0, color="0.3", linewidth=1)
    if pooled and cells:
        ax.axhline(cells - 0.5, color="0.75", linewidth=0.8)
    ax.set_yticks(range(len(labels)), labels, fontsize=9)
    if pooled:
        ax.get_yticklabels()[-1].set_fontweight("bold")
    ax.set_ylim(len(labels) - 0.5, -0.5)  # the first cell on top, the pooled row at the bottom


def _titles(ax, contrasts: list[Contrast], levels: list[str]) -> None:
    """The x axis (the metric, what is subtracted from what) and the title (what the marks mean)."""
    first = contrasts[0]
    references = list(dict.fromkeys(c.reference for c in contrasts))
    reference = " / ".join(references)
    difference = levels[0] if len(levels) == 1 else "level"
    ax.set_xlabel(f"{first.metric_name}: {difference} - {reference} (95% CI)")
    ax.set_title(
        f"{first.factor}: {', '.join(levels)} against {reference}, in each cell of the other swept keys\n"
        f"bars: 95% t intervals; hollow: {NO_TEST}, no test; diamonds: pooled (cells as blocks); "
        "right: Holm p (* < 0.05)",
        fontsize=10,
    )


def _legend(fig, factor: str, levels: list[str], colors: dict[str, str]) -> None:
    """Below the plot, the colour of each contrasted level."""
    from matplotlib.lines import Line2D

    handles = [
        Line2D([], [], color=colors[level], marker="o", linestyle="None", label=level) for level in levels
    ]
    fig.legend(handles=handles, title=factor, fontsize=8, loc="outside lower center", ncols=len(levels))


def plot_contrasts(contrasts: list[Contrast], output: Path, metric: str) -> Path | None:
    """The forest plot of the `metric` contrasts (a `Contrast.metric` key, `val_loss`) written to
    `output` (its suffix names the format), atomically; None, and nothing written, when none is of
    that metric."""
    import matplotlib.pyplot as plt

    chosen = [c for c in contrasts if c.metric == metric]
    if not chosen:
        return None
    fig = contrast_figure(chosen)
    output.parent.mkdir(parents=True, exist_ok=True)
    try:  # atomically: a full disk leaves the old plot or none, never a truncated one
        with atomic_write(output) as handle:
            fig.savefig(handle, dpi=100, format=output.suffix.lstrip(".").lower())
    finally:
        plt.close(fig)
    return output
