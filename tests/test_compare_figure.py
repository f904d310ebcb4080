"""`pretrain compare`'s figure, checked on its data (titles, labels, colours, line styles, bar values),
not its pixels: runs hand-written as a training writes them (config.yaml, run.json, metrics.csv) on a
small local cache, so every number is known."""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
from helpers import prepare, settings_of
from matplotlib.colors import rgb_to_hsv, to_rgb
from matplotlib.text import Text
from omegaconf import OmegaConf

from pretrain.config import to_config
from pretrain.data.batching.policies import PolicySettings
from pretrain.data.measures.stats import inspect_split
from pretrain.report.compare import compare
from pretrain.report.figure import TIME_AXIS, TOKENS_AXIS, figure, plot
from pretrain.report.figure_bars import SPEED_TITLE, TRUNCATION_TITLE, WASTE_TITLE, percent
from pretrain.report.figure_colors import arm_colors
from pretrain.report.statistics import smooth
from pretrain.report.table import layout_arms, layout_statistics
from pretrain.training.run_record import load_run

STEPS = [  # step, train/loss, train/tokens, train/step_seconds, train/data_seconds, train/padding_waste
    (1, 10.0, 100, 2.0, 0.5, 0.25),
    (2, 9.0, 200, 1.0, 0.0, 0.25),
    (4, 8.0, 400, 1.5, 0.5, 0.25),  # logged every other step from here: 2 steps of 2 s
]


def write_run(directory: Path, cfg, cache_dir: Path, waste: float | None = None, timed: bool = True) -> Path:
    """A run as training writes it; `timed=False`: one that logged no step or data seconds."""
    directory.mkdir(parents=True)
    (directory / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    (directory / "run.json").write_text(json.dumps({"cache_dir": str(cache_dir)}))
    times = "train/step_seconds,train/data_seconds," if timed else ""
    lines = [f"step,train/loss,train/tokens,{times}train/padding_waste,val/loss"]
    for step, loss, tokens, seconds, data, row_waste in STEPS:
        val = loss + 0.5 if step == 4 else ""
        logged = f"{seconds},{data}," if timed else ""
        lines.append(f"{step},{loss},{tokens},{logged}{row_waste if waste is None else waste},{val}")
    (directory / "metrics.csv").write_text("\n".join(lines) + "\n")
    return directory


def write_floors(run_dir: Path, unigram: float, bigram: float) -> None:
    entry = json.loads((run_dir / "run.json").read_text())
    entry["floors"] = {"unigram": {"nats": unigram}, "bigram": {"nats": bigram}}
    (run_dir / "run.json").write_text(json.dumps(entry))


@pytest.fixture
def runs(tmp_path, make_cfg):
    """A sweep over data.max_seq_len (64, 128) of padded and bestfit on one local cache."""
    cache_dir = prepare(make_cfg()).directory
    made = {}
    for policy, waste in (("padded", 0.25), ("bestfit", 0.0)):
        for length in (64, 128):
            cfg = make_cfg(None, f"data={policy}", f"data.max_seq_len={length}", "train.batch_size=4")
            made[policy, length] = (
                write_run(tmp_path / "sweep" / f"{policy}-{length}", cfg, cache_dir, waste),
                cfg,
            )
    return made


def _axes(fig) -> dict[str, plt.Axes]:
    return {ax.get_title(): ax for ax in fig.axes}


def _bar_texts(ax) -> list[str]:
    return [text.get_text() for text in ax.texts]


def _hue_apart(a: str, b: str) -> float:
    """How far apart two colours' hues are, around the colour circle (0: one hue, 0.5: opposite)."""
    distance = abs(float(rgb_to_hsv(to_rgb(a))[0]) - float(rgb_to_hsv(to_rgb(b))[0]))
    return min(distance, 1 - distance)


def _validation_lines(ax) -> list:
    """The lines that carry markers (the validations; "_" marks error bar caps)."""
    return [line for line in ax.lines if line.get_marker() not in ("None", None, "", "_")]


def assert_reads_at_a_glance(fig) -> None:
    """No text anywhere is cut, no panel is empty or says that nothing was there, and validations are
    markers, never a second line."""
    texts = [text.get_text() for text in fig.findobj(Text)]
    assert not [t for t in texts if "…" in t]
    assert not [t for t in texts if "not trained" in t or " logged" in t]
    for ax in fig.axes:
        assert ax.lines or ax.patches or ax.collections, ax.get_title()
        assert {line.get_linestyle() for line in _validation_lines(ax)} <= {"None"}


def test_a_sweep_is_grouped_by_policy_colour_and_swept_line_style(runs):
    loaded = [load_run(path) for path, _ in runs.values()]
    for run in loaded:
        run.layouts = layout_statistics(run)
    fig = figure(loaded)
    axes = _axes(fig)
    assert "colour = policy (a shade per arm), line style = max_seq_len" in fig.get_suptitle()
    tokens, seconds = axes["loss against real tokens seen"], axes["loss against training seconds"]
    assert (tokens.get_xlabel(), seconds.get_xlabel()) == (TOKENS_AXIS, TIME_AXIS)
    legend = [text.get_text() for text in seconds.get_legend().get_texts()]
    assert legend == [
        "padded max_seq_len=64",
        "padded max_seq_len=128",
        "bestfit max_seq_len=64",
        "bestfit max_seq_len=128",
    ]
    train_lines = {line.get_label(): line for line in tokens.lines if not line.get_label().startswith("_")}
    # colour = the policy, a shade of it per arm: the first arm keeps the policy's own colour (the same
    # in every figure), the second is another shade of the same hue; the policies differ
    colors = {label: line.get_color() for label, line in train_lines.items()}
    for policy in ("padded", "bestfit"):
        first, second = colors[f"{policy} max_seq_len=64"], colors[f"{policy} max_seq_len=128"]
        assert first == arm_colors([])[policy] and second != first
        assert _hue_apart(first, second) < 0.005  # a shade: its hue kept (up to 8-bit rounding)
        assert sum(to_rgb(second)) < sum(to_rgb(first))  # darker
    assert _hue_apart(colors["padded max_seq_len=128"], colors["bestfit max_seq_len=128"]) > 0.2
    # validations: markers alone in the arm's colour, one marker per line style
    dots = {(line.get_color(), line.get_marker(), line.get_linestyle()) for line in _validation_lines(tokens)}
    assert dots == {
        (colors["padded max_seq_len=64"], "o", "None"),
        (colors["padded max_seq_len=128"], "s", "None"),
        (colors["bestfit max_seq_len=64"], "o", "None"),
        (colors["bestfit max_seq_len=128"], "s", "None"),
    }
    assert {(tuple(line.get_xdata()), tuple(line.get_ydata())) for line in _validation_lines(tokens)} == {
        ((400,), (8.5,))
    }
    for length in (64, 128):
        styles = {
            train_lines[f"{policy} max_seq_len={length}"].get_linestyle() for policy in ("padded", "bestfit")
        }
        assert len(styles) == 1
    assert (
        train_lines["padded max_seq_len=64"].get_linestyle()
        != train_lines["padded max_seq_len=128"].get_linestyle()
    )
    # loss against real tokens and against training seconds (data + update, steps since the last row)
    assert list(train_lines["padded max_seq_len=64"].get_xdata()) == [100, 200, 400]
    time_line = next(line for line in seconds.lines if line.get_label() == "padded max_seq_len=64")
    assert list(time_line.get_xdata()) == [2.5, 3.5, 7.5]
    assert list(time_line.get_ydata()) == pytest.approx(list(smooth(np.array([10.0, 9.0, 8.0]))))  # EMA
    raw = [
        line
        for line in seconds.lines
        if line.get_alpha() == 0.2 and list(line.get_xdata()) == [2.5, 3.5, 7.5]
    ]
    assert [10.0, 9.0, 8.0] in [list(line.get_ydata()) for line in raw]  # the raw curve, faint
    # the bottom panels: waste (never "-0.0%"), truncation per run, tokens/s
    waste, truncation = axes[WASTE_TITLE], axes[TRUNCATION_TITLE]
    assert _bar_texts(waste) == ["25.0%", "25.0%", "0%", "0%"]
    assert waste.get_xlim() == (0.0, pytest.approx(0.35))
    padded = inspect_split(settings_of(runs["padded", 64][1]), *_splits(runs["padded", 64][0]), audits=False)
    assert padded["truncated_pairs"] > 0
    fraction = padded["truncated_pairs"] / padded["prediction_pairs"]
    assert _bar_texts(truncation)[0] == f"{percent(fraction)} ({padded['truncated_pairs']:,})"
    assert _bar_texts(truncation)[2:] == ["0%", "0%"]
    assert _bar_texts(axes[SPEED_TITLE]) == ["53"] * 4  # 400 real tokens in 7.5 training seconds
    assert [bar.get_facecolor()[:3] for bar in waste.patches] == [to_rgb(c) for c in colors.values()]
    assert_reads_at_a_glance(fig)
    plt.close(fig)


def _splits(run_dir: Path):
    from pretrain.data.ingest.cache import Cache, read_manifest

    directory = Path(json.loads((run_dir / "run.json").read_text())["cache_dir"])
    cache = Cache(directory, read_manifest(directory))
    return cache.split("train"), cache.split("validation")


def test_a_single_run_is_compared_with_every_layout_on_its_data(runs, tmp_path, make_cfg):
    path, _ = runs["bestfit", 64]
    (run,) = [load_run(path)]
    run.layouts = layout_statistics(run, layout_arms())
    arms = ["bestfit", *(arm for arm, _ in layout_arms() if arm != "bestfit")]
    assert list(run.layouts) == arms  # its own first, then the registry's order
    assert {"padded", "padded pad_to=longest", "prepacked", "prepacked strategy=bfd"} <= set(arms)
    train, validation = _splits(path)
    for arm, overrides in (
        ("padded", ["data=padded"]),
        ("padded pad_to=longest", ["data=padded", "data.pad_to=longest"]),
        ("prepacked strategy=bfd", ["data=prepacked", "data.strategy=bfd"]),
    ):
        config = to_config(make_cfg(None, *overrides, "data.max_seq_len=64", "train.batch_size=4"))
        settings = PolicySettings.from_config(config.data, config.train, config.seed)
        expected = inspect_split(settings, train, validation, audits=False)
        assert run.layouts[arm]["truncated_pairs"] == expected["truncated_pairs"]
        assert run.layouts[arm]["padding_waste"] == pytest.approx(expected["padding_waste"])
    fig = figure([run])
    axes = {ax.get_title().split("\n")[0]: ax for ax in fig.axes}
    waste = axes[WASTE_TITLE]
    assert "at max_seq_len 64; hatched: layout only" in waste.get_title()
    labels = [tick.get_text() for tick in waste.get_yticklabels()]
    # whole labels, wrapped (never cut): the long ones take two lines
    assert [label.replace("\n", " ") for label in labels] == [
        "bestfit",
        *(f"{arm} (layout only)" for arm in arms[1:]),
    ]
    assert "prepacked strategy=bfd\n(layout only)" in labels  # "(layout only)" is never split
    assert not [label for label in labels if "(layout\n" in label]
    assert max(len(line) for label in labels for line in label.split("\n")) <= 30
    padded = run.layouts["padded"]
    assert _bar_texts(waste)[1] == percent(padded["padding_waste"]) and padded["padding_waste"] > 0
    # the layouts were not run: no speed, said once in the title (not "not trained" per row)
    speed = axes[SPEED_TITLE]
    assert speed.get_title() == SPEED_TITLE + "\n(hatched rows: layouts not run, no speed)"
    assert _bar_texts(speed) == ["53", *[""] * (len(arms) - 1)]
    assert [bar.get_width() for bar in speed.patches][1:] == [0.0] * (len(arms) - 1)
    hatched = [bar.get_hatch() for bar in waste.patches]
    assert hatched == [None] + ["//"] * (len(arms) - 1)
    # a layout's colour is its policy's, in a shade per layout of that policy; the run's own unshaded
    shades = {
        label.replace("\n", " "): bar.get_facecolor()[:3]
        for label, bar in zip(labels, waste.patches, strict=True)
    }
    assert shades["bestfit"] == to_rgb(arm_colors([])["bestfit"])
    assert shades["padded (layout only)"] == to_rgb(arm_colors([])["padded"])
    longest = shades["padded pad_to=longest (layout only)"]
    assert longest != shades["padded (layout only)"]
    assert _hue_apart(longest, arm_colors([])["padded"]) < 0.005
    assert_reads_at_a_glance(fig)
    plt.close(fig)
    # compare() does the same from the directory alone, and the table gains the truncation column
    png = compare([path], output=tmp_path / "one.png", quiet=True)
    table = (tmp_path / "one.md").read_text()
    assert png.read_bytes()[:4] == b"\x89PNG" and "| truncated pairs | train seconds |" in table
    assert "| 0.0% | 7.5 |" in table  # bestfit truncates nothing; 7.5 training seconds


def test_a_run_whose_cache_is_gone_still_plots_without_layouts(runs, tmp_path):
    path, _ = runs["padded", 128]
    (path / "run.json").write_text(json.dumps({"cache_dir": str(tmp_path / "gone")}))
    run = load_run(path)
    assert layout_statistics(run, layout_arms()) == {}
    assert math.isnan(run.truncated_fraction())
    fig = figure([run])
    titles = [title.split("\n")[0] for title in _axes(fig)]
    # no truncation known: its panel is left out rather than drawn empty with "n/a"
    assert TRUNCATION_TITLE not in titles and {WASTE_TITLE, SPEED_TITLE} <= set(titles)
    assert_reads_at_a_glance(fig)
    plt.close(fig)


@pytest.mark.parametrize(
    ("value", "text"),
    [(0.0, "0%"), (-0.0, "0%"), (-1e-9, "0%"), (0.0004, "<0.1%"), (0.25, "25.0%"), (math.nan, "n/a")],
)
def test_percent_labels_never_read_minus_zero(value, text):
    assert percent(value) == text


def test_a_mixture_run_is_compared_with_every_layout_that_can_mix_on_its_mixed_epoch(tmp_path, make_cfg):
    """A mixture's run.json names each component's cache (`cache_dirs`, no `cache_dir`): the layout
    bars are those of its mixed epoch, as `inspect-data` computes them on the mixture."""
    from pretrain.data.batching.mixture import MixtureSpec
    from pretrain.data.ingest.prepare import prepare_cache

    second = tmp_path / "second.jsonl"
    second.write_text(
        "".join(
            json.dumps({"text": f"Document {i} about rivers and their stones. " * (3 + i % 17)}) + "\n"
            for i in range(60)
        )
    )
    cfg = make_cfg(None, "data=bestfit", "data.max_seq_len=64", "train.batch_size=4")
    OmegaConf.set_struct(cfg, False)  # as conf/mixture/<name>.yaml adds it
    cfg = OmegaConf.merge(
        cfg,
        {
            "mixture": {
                "components": {
                    "fixture": {"weight": 3, "source": OmegaConf.to_container(cfg.source)},
                    "rivers": {
                        "weight": 1,
                        "max_repeat": 2,
                        "source": {"kind": "local", "files": [str(second)]},
                    },
                }
            }
        },
    )
    spec = MixtureSpec.from_config(to_config(cfg))
    caches = {c.name: prepare_cache(c.cache) for c in spec.components}
    path = write_run(tmp_path / "mixture-run", cfg, tmp_path / "unused")
    (path / "run.json").write_text(
        json.dumps({"cache_dirs": {n: str(c.directory) for n, c in caches.items()}})
    )
    run = load_run(path)
    run.layouts = layout_statistics(run, layout_arms())
    arms = [
        "bestfit",
        *(arm for arm, _ in layout_arms() if arm != "bestfit" and not arm.startswith("prepacked")),
    ]
    assert list(run.layouts) == arms  # prepacked (one stream packed ahead of time) cannot mix
    train, mixed = spec.mix([c.split("train") for c in caches.values()])
    parts = [c.split("validation") for c in caches.values()]
    validation, _ = spec.mix(parts)
    for arm, overrides in (
        ("bestfit", []),
        ("padded", ["data=padded"]),
        ("padded pad_to=longest", ["data=padded", "data.pad_to=longest"]),
    ):
        config = to_config(make_cfg(None, *overrides, "data.max_seq_len=64", "train.batch_size=4"))
        settings = PolicySettings.from_config(config.data, config.train, config.seed)
        expected = inspect_split(
            settings, train, validation, audits=False, mixture=mixed, validation_parts=parts
        )
        assert run.layouts[arm]["prediction_pairs"] == expected["prediction_pairs"] == train.num_pairs
        assert run.layouts[arm]["truncated_pairs"] == expected["truncated_pairs"]
        assert run.layouts[arm]["padding_waste"] == pytest.approx(expected["padding_waste"], rel=1e-12)
    assert run.layouts["padded"]["padding_waste"] > 0 and run.layouts["padded"]["truncated_pairs"] > 0
    fig = figure([run])
    waste = {ax.get_title().split("\n")[0]: ax for ax in fig.axes}[WASTE_TITLE]
    labels = [tick.get_text().replace("\n", " ") for tick in waste.get_yticklabels()]
    assert labels == ["bestfit", *(f"{arm} (layout only)" for arm in arms[1:])]
    assert _bar_texts(waste)[1] == percent(run.layouts["padded"]["padding_waste"])
    plt.close(fig)


def test_floors_are_named_once_between_the_panels_apart_and_clear_of_the_curves(runs, tmp_path):
    for path, _ in runs.values():
        write_floors(path, 9.30, 9.26)  # inside the curves (10 -> 8), a hair apart
    loaded = [load_run(path) for path, _ in runs.values()]
    fig = figure(loaded)
    fig.canvas.draw()  # the constrained layout placed
    axes = _axes(fig)
    tokens, seconds = axes["loss against real tokens seen"], axes["loss against training seconds"]
    assert tokens.get_ylim() == seconds.get_ylim()  # one loss axis: the floors level in both panels
    for ax in (tokens, seconds):
        floors = [line for line in ax.lines if line.get_color() == "0.35"]
        assert [line.get_ydata()[0] for line in floors] == [9.30, 9.26]
        assert [line.get_linestyle() for line in floors] == [":", ":"]
    assert not seconds.texts  # named once
    notes = {text.get_text(): text for text in tokens.texts}
    assert set(notes) == {"unigram (add-one) floor 9.30", "bigram (Jelinek-Mercer) floor 9.26"}
    high = notes["unigram (add-one) floor 9.30"].get_window_extent()
    low = notes["bigram (Jelinek-Mercer) floor 9.26"].get_window_extent()
    left, right = tokens.get_window_extent(), seconds.get_window_extent()
    for note in (high, low):  # between the panels: on no curve
        assert left.x1 <= note.x0 and note.x1 <= right.x0
    # the upper floor's name above its line, the lower's below: close floors never overlap
    assert not high.overlaps(low) and high.y0 >= low.y1
    y_upper, y_lower = (tokens.transData.transform((0, v))[1] for v in (9.30, 9.26))
    assert high.y0 == pytest.approx(y_upper, abs=1) and low.y1 == pytest.approx(y_lower, abs=1)
    assert_reads_at_a_glance(fig)
    plt.close(fig)
    # plot writes it (closed after)
    for run in loaded:
        run.layouts = layout_statistics(run)
    output, before = tmp_path / "figures" / "compare.png", len(plt.get_fignums())
    plot(loaded, output)
    assert output.read_bytes()[:4] == b"\x89PNG" and len(plt.get_fignums()) == before


def test_a_panel_nothing_was_logged_for_is_left_out(runs, tmp_path, make_cfg):
    """Runs that logged no seconds: no time panel (the tokens panel takes the row, the floors' names and
    the legend beside it) and no tokens/s panel, instead of panels that say nothing was logged."""
    untimed = []
    for (policy, length), (path, cfg) in runs.items():
        cache_dir = Path(json.loads((path / "run.json").read_text())["cache_dir"])
        untimed.append(write_run(tmp_path / "untimed" / f"{policy}-{length}", cfg, cache_dir, timed=False))
        write_floors(untimed[-1], 9.30, 9.26)
    loaded = [load_run(path) for path in untimed]
    for run in loaded:
        run.layouts = layout_statistics(run)
    fig = figure(loaded)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["loss against real tokens seen", WASTE_TITLE, TRUNCATION_TITLE]
    tokens = fig.axes[0]
    assert len(tokens.get_legend().get_texts()) == 4
    fig.canvas.draw()
    assert tokens.get_window_extent().width > 0.6 * fig.bbox.width  # the whole row, bar its legend
    # the floors' names right of the panel, the legend right of them
    names = [text.get_window_extent() for text in tokens.texts]
    assert len(names) == 2 and all(name.x0 >= tokens.get_window_extent().x1 for name in names)
    assert tokens.get_legend().get_window_extent().x0 > max(name.x1 for name in names)
    assert_reads_at_a_glance(fig)
    plt.close(fig)
