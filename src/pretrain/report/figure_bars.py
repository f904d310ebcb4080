"""The comparison figure's bottom panels: per arm (its seeds' mean and band), and for a single run per
layout on its data, the padding waste, the truncated prediction pairs and the real tokens per second
as horizontal bars, each row's label wrapped beside them and every value written at its bar; a
panel no row has a value for is left out."""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass

import numpy as np

from ..training.run_record import Run, run_numbers
from .arm_table import ArmTable
from .arms import Arm
from .figure_colors import family_colors
from .statistics import summarize

LEGEND_WIDTH = 48
"""Legend labels and small panels' titles wrap at this many characters."""

BAR_LABEL_WIDTH = 30
"""The bottom panels' row labels wrap at this many characters (the panel's margin grows to fit them)."""


def wrapped(label: str, width: int = LEGEND_WIDTH) -> str:
    """`label` in lines of at most `width` characters, whole (a long word is broken, never cut)."""
    return "\n".join(textwrap.wrap(label, width, break_long_words=True)) or label


LAYOUT_ONLY = "(layout only)"


def bar_label(label: str) -> str:
    """A bottom panel's row label, wrapped at BAR_LABEL_WIDTH, `(layout only)` kept on one line."""
    glued = LAYOUT_ONLY.replace(" ", "\u00a0")  # textwrap breaks at ASCII spaces only
    return wrapped(label.replace(LAYOUT_ONLY, glued), BAR_LABEL_WIDTH).replace(glued, LAYOUT_ONLY)


def percent(value: float) -> str:
    """A fraction as a bar label: `0%` for nothing (never `-0.0%`), `<0.1%` for a trace, `n/a` unknown."""
    if not math.isfinite(value):
        return "n/a"
    if value <= 0:
        return "0%"
    return "<0.1%" if value < 0.0005 else f"{value:.1%}"


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
    computed, not trained; a shade of their policy's colour beside the run's own)."""
    rows = [_arm_bar(arm, color) for arm, color in zip(arms, colors, strict=True)]
    if len(arms) == 1 and arms[0].n == 1:
        (run,) = arms[0].runs
        others = [arm for arm in run.layouts if arm != run.arm]
        shades = family_colors([run.arm, *others])[1:]  # the run's own keeps its policy's colour
        for arm, color in zip(others, shades, strict=True):
            layout = run.layouts[arm]
            rows.append(
                Bar(
                    f"{arm} {LAYOUT_ONLY}",
                    color,
                    layout["padding_waste"],
                    run.truncated_fraction(arm),
                    layout["truncated_pairs"],
                    math.nan,
                    trained=False,
                )
            )
    return rows


WASTE_TITLE = "padding waste: 1 - real / computed tokens"

TRUNCATION_TITLE = "truncated: prediction pairs never trained (cut tails)"

SPEED_TITLE = "real tokens / s (real tokens / training seconds)"

CONTENDED_NOTE = "\nUNRELIABLE: the machine was contended (compare.md)"


def _truncation_text(row: Bar) -> str:
    return percent(row.truncated) + (f" ({row.truncated_pairs:,.0f})" if row.truncated > 0 else "")


@dataclass
class Panel:
    """One bottom panel: a value per row and the text beside its bar."""

    title: str
    values: list[float]
    texts: list[str]
    fraction: bool  # a share (0-100%) rather than a rate
    band: str | None  # the Bar attribute holding the seeds' band


def _speed_text(row: Bar) -> str:
    """Tokens/s beside a bar; nothing for a layout only computed (the panel's title says so once)."""
    if math.isfinite(row.tokens_per_sec):
        return f"{row.tokens_per_sec:,.0f}"
    return "" if not row.trained else "n/a"


LAYOUTS_NOT_RUN = "\n(hatched rows: layouts not run, no speed)"


def bar_panels(runs: list[Run], rows: list[Bar], table: ArmTable | None, timing: bool) -> list[Panel]:
    """The bottom panels that have something to show: padding waste, truncated pairs and (`timing`)
    real tokens/s; one no row has a value for (nothing logged) is left out, not drawn empty. A
    layout-only row (a single run's other layouts) has no speed: blank, the title says why."""
    single = len(runs) == 1
    layouts = f"\n(at max_seq_len {runs[0].max_seq_len}; hatched: layout only)" if single else ""
    panels = [
        Panel(
            WASTE_TITLE + layouts,
            [r.waste for r in rows],
            [percent(r.waste) for r in rows],
            True,
            "waste_band",
        ),
        Panel(
            TRUNCATION_TITLE + layouts,
            [r.truncated for r in rows],
            [_truncation_text(r) for r in rows],
            True,
            None,
        ),
    ]
    if timing:
        panels.append(
            Panel(
                SPEED_TITLE
                + (CONTENDED_NOTE if table is not None and table.contended else "")
                + (LAYOUTS_NOT_RUN if not all(r.trained for r in rows) else ""),
                [r.tokens_per_sec for r in rows],
                [_speed_text(r) for r in rows],
                False,
                "speed_band",
            )
        )
    return [panel for panel in panels if any(math.isfinite(v) for v in panel.values)]


def draw_bar_panels(fig, cell, rows: list[Bar], row_labels: list[str], panels: list[Panel]) -> None:
    """Per arm (and for a single run per layout on its data) the `panels` side by side, the rows'
    wrapped labels left of the first."""
    grid = cell.subgridspec(1, len(panels))  # constrained layout keeps the axes alike, labels aside
    y = np.arange(len(rows))
    for column, panel in enumerate(panels):
        ax = fig.add_subplot(grid[0, column])
        _draw_bars(ax, rows, y, row_labels if column == 0 else [""] * len(rows), panel)


def _draw_bars(ax, rows: list[Bar], y, tick_labels: list[str], panel: Panel) -> None:
    """One bottom panel: a bar per row (hatched: a layout not trained), with the seeds' band."""
    from matplotlib.ticker import PercentFormatter

    drawn = [v if math.isfinite(v) else 0.0 for v in panel.values]
    bands = [getattr(r, panel.band) if panel.band else None for r in rows]
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
    ax.set_yticks(y, tick_labels, fontsize=8)
    ax.invert_yaxis()  # the legend's order, top to bottom
    ax.set_title(panel.title, fontsize=10)
    notes = ax.bar_label(bar_set, labels=panel.texts, fontsize=7, padding=2)
    for note, value in zip(notes, panel.values, strict=True):
        if not math.isfinite(value):  # not measured: said in grey
            note.set_color("0.45")
            note.set_fontstyle("italic")
    top = max([*drawn, *(b[1] for b in bands if b)], default=0.0)
    if panel.fraction:  # room for the labels; an all-zero panel reads 0-5%, none goes past 100%
        ax.set_xlim(0, max(top * 1.4, 0.05))
        if top * 1.4 > 1:
            ax.set_xticks(np.linspace(0, 1, 5))
        ax.xaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    else:
        ax.set_xlim(0, top * 1.4 if top > 0 else 1)
