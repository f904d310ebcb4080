"""The contrast figure (`plot_contrasts`): a forest plot of hand-made contrasts, checked on its
matplotlib objects (rows, interval extents, colours, notes), not its pixels."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.container import ErrorbarContainer
from matplotlib.text import Text

from pretrain.report.contrast_figure import contrast_figure, plot_contrasts
from pretrain.report.contrasts import Contrast
from pretrain.report.figure_colors import arm_colors

NAN = math.nan


def contrast(
    level, setting, diff, low, high, p_holm, test="paired t", pooled=False, metric="val_loss", p=None
):
    return Contrast(
        factor="data.policy",
        level=level,
        reference="padded",
        setting=setting,
        metric=metric,
        metric_name="final val loss",
        at=None,
        n=2 if test != "n<2" else 1,
        n_reference=2,
        mean=3.0 + diff,
        reference_mean=3.0,
        diff=diff,
        ci_low=low,
        ci_high=high,
        p=p if p is not None else p_holm / 2 if math.isfinite(p_holm) else NAN,
        p_holm=p_holm,
        mde=0.1,
        test=test,
        pooled=pooled,
    )


SMALL = {"train.batch_size": "4", "data.max_seq_len": "128"}
LARGE = {"train.batch_size": "8", "data.max_seq_len": "128"}
CONTRASTS = [
    contrast("bestfit", SMALL, -0.20, -0.35, -0.05, 0.03),  # a cell with an interval
    contrast("bestfit", LARGE, -0.10, NAN, NAN, NAN, test="n<2"),  # a cell without a test
    contrast("firstfit", SMALL, -0.15, -0.40, 0.10, 0.4),  # a second level
    contrast("firstfit", LARGE, 0.05, -0.05, 0.15, 0.5),
    contrast("bestfit", {}, -0.15, -0.30, 0.0, NAN, test="paired t (cells as blocks)", pooled=True, p=0.25),
    contrast("firstfit", {}, -0.05, -0.25, 0.15, NAN, test="paired t (cells as blocks)", pooled=True, p=0.6),
    contrast("bestfit", SMALL, 1.0, 0.5, 1.5, 0.01, metric="train_loss"),  # another metric: not drawn
]


def _intervals(ax) -> dict[tuple[str, float], tuple[float, float]]:
    """(colour, point's x) -> the (left, right) ends of its horizontal error bar."""
    found = {}
    for container in ax.containers:
        if isinstance(container, ErrorbarContainer):
            point, _, (bars,) = container.lines
            (segment,) = bars.get_segments()
            found[point.get_color(), float(point.get_xdata()[0])] = (
                round(segment[0][0], 9),
                round(segment[1][0], 9),
            )
    return found


def test_a_forest_plot_has_a_row_per_cell_and_the_pooled_row_and_draws_each_interval():
    chosen = [c for c in CONTRASTS if c.metric == "val_loss"]
    fig = contrast_figure(chosen)
    (ax, *_) = fig.axes
    labels = [tick.get_text() for tick in ax.get_yticklabels()]
    assert labels == ["batch_size=4 max_seq_len=128", "batch_size=8 max_seq_len=128", "pooled over 2 cells"]
    assert list(ax.get_yticks()) == [0, 1, 2] and ax.get_ylim() == (2.5, -0.5)  # first cell on top
    assert ax.get_yticklabels()[-1].get_fontweight() == "bold"
    colors = arm_colors(["bestfit", "firstfit"])
    best, first = colors["bestfit"], colors["firstfit"]
    assert best != first
    assert _intervals(ax) == {
        (best, -0.20): (-0.35, -0.05),
        (first, -0.15): (-0.40, 0.10),
        (first, 0.05): (-0.05, 0.15),
        (best, -0.15): (-0.30, 0.0),
        (first, -0.05): (-0.25, 0.15),
    }
    # the two levels side by side within a row, the pooled points as diamonds on the last row
    points = {
        (c[0].get_color(), float(c[0].get_xdata()[0])): (float(c[0].get_ydata()[0]), c[0].get_marker())
        for c in ax.containers
    }
    assert points[best, -0.20][0] < 0 < points[first, -0.15][0] < 0.5
    assert points[best, -0.15] == (pytest.approx(2 - 0.125), "D") and points[first, -0.05][1] == "D"
    # n<2: the point alone, hollow, with its note, and no interval
    (hollow,) = [line for line in ax.lines if line.get_markerfacecolor() == "white"]
    assert (hollow.get_xdata()[0], hollow.get_linestyle(), hollow.get_markeredgecolor()) == (
        -0.10,
        "None",
        best,
    )
    assert not any(x == -0.10 for _, x in _intervals(ax))
    texts = [t.get_text() for t in ax.texts]
    assert texts.count("n<2") == 1 and "n<2: no test" in texts
    assert "Holm p 0.030 *" in texts and "Holm p 0.400" in texts and "p 0.250" in texts  # pooled: its own p
    # a line at no difference, the axis and title name what is contrasted
    assert any(list(line.get_xdata()) == [0, 0] for line in ax.lines)
    assert ax.get_xlabel() == "final val loss: level - padded (95% CI)"
    assert ax.get_title().startswith("data.policy: bestfit, firstfit against padded")
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["bestfit", "firstfit"]
    # the p notes lie right of the data, outside it
    fig.canvas.draw()
    for note in ax.texts:
        if note.get_text().startswith(("Holm p", "p ", "n<2:")):
            assert note.get_window_extent().x0 >= ax.get_window_extent().x1
    assert not any("…" in t.get_text() for t in fig.findobj(Text))
    plt.close(fig)


def test_one_level_names_it_on_the_axis_and_wraps_long_settings():
    setting = {f"model.option_{i}": str(i) for i in range(6)}
    fig = contrast_figure([contrast("bestfit", setting, -0.2, -0.3, -0.1, 0.01)])
    (ax,) = fig.axes
    assert ax.get_xlabel() == "final val loss: bestfit - padded (95% CI)"
    (label,) = [tick.get_text() for tick in ax.get_yticklabels()]
    assert "\n" in label and label.replace("\n", " ") == " ".join(f"option_{i}={i}" for i in range(6))
    assert not fig.legends  # one level: the title names it
    plt.close(fig)


def test_plot_contrasts_writes_the_metric_asked_for_and_nothing_without_it(tmp_path):
    output = tmp_path / "figures" / "contrast_val_loss.png"
    assert plot_contrasts(CONTRASTS, output, "val_loss") == output
    assert output.read_bytes()[:4] == b"\x89PNG"
    assert not plt.get_fignums()  # closed
    assert plot_contrasts(CONTRASTS, tmp_path / "none.png", "tokens_per_sec") is None
    assert not (tmp_path / "none.png").exists()
    svg = plot_contrasts(CONTRASTS, tmp_path / "train.svg", "train_loss")
    assert svg is not None and b"<svg" in svg.read_bytes()[:400]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["figures", "train.svg"]  # no temporary left


def test_a_contrast_figure_of_many_cells_grows_instead_of_crowding():
    cells = [
        {"train.batch_size": str(b), "data.max_seq_len": str(s)} for b in (2, 4, 8) for s in (64, 128, 256)
    ]
    few = contrast_figure([contrast("bestfit", cells[0], 0.1, 0.0, 0.2, 0.2)])
    many = contrast_figure([contrast("bestfit", c, 0.1, 0.0, 0.2, 0.2) for c in cells])
    assert many.get_size_inches()[1] > few.get_size_inches()[1] + 2
    assert np.array_equal(many.axes[0].get_yticks(), np.arange(9))
    plt.close(few)
    plt.close(many)
