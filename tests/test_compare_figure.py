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
from omegaconf import OmegaConf

from pretrain.config import to_config
from pretrain.data.policies import PolicySettings
from pretrain.data.stats import inspect_split
from pretrain.report.compare import compare
from pretrain.report.figure import (
    SPEED_TITLE,
    TIME_AXIS,
    TOKENS_AXIS,
    TRUNCATION_TITLE,
    WASTE_TITLE,
    arm_colors,
    figure,
    percent,
)
from pretrain.report.statistics import smooth
from pretrain.report.table import layout_arms, layout_statistics
from pretrain.training.run_record import load_run

STEPS = [  # step, train/loss, train/tokens, train/step_seconds, train/data_seconds, train/padding_waste
    (1, 10.0, 100, 2.0, 0.5, 0.25),
    (2, 9.0, 200, 1.0, 0.0, 0.25),
    (4, 8.0, 400, 1.5, 0.5, 0.25),  # logged every other step from here: 2 steps of 2 s
]


def write_run(directory: Path, cfg, cache_dir: Path, waste: float | None = None) -> Path:
    directory.mkdir(parents=True)
    (directory / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    (directory / "run.json").write_text(json.dumps({"cache_dir": str(cache_dir)}))
    lines = [
        "step,train/loss,train/tokens,train/step_seconds,train/data_seconds,train/padding_waste,val/loss"
    ]
    for step, loss, tokens, seconds, data, row_waste in STEPS:
        val = loss + 0.5 if step == 4 else ""
        lines.append(f"{step},{loss},{tokens},{seconds},{data},{row_waste if waste is None else waste},{val}")
    (directory / "metrics.csv").write_text("\n".join(lines) + "\n")
    return directory


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


def test_a_sweep_is_grouped_by_policy_colour_and_swept_line_style(runs):
    loaded = [load_run(path) for path, _ in runs.values()]
    for run in loaded:
        run.layouts = layout_statistics(run)
    fig = figure(loaded)
    axes = _axes(fig)
    assert "colour = policy, line style = max_seq_len" in fig.get_suptitle()
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
    # colour = the arm, line style = the swept value: one of each per policy and per length
    assert {train_lines[f"padded max_seq_len={n}"].get_color() for n in (64, 128)} == {
        arm_colors([])["padded"]
    }
    assert {train_lines[f"bestfit max_seq_len={n}"].get_color() for n in (64, 128)} == {
        arm_colors([])["bestfit"]
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
    assert SPEED_TITLE in axes
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
    assert labels == ["bestfit", *(f"{arm} (layout only)" for arm in arms[1:])]
    padded = run.layouts["padded"]
    assert _bar_texts(waste)[1] == percent(padded["padding_waste"]) and padded["padding_waste"] > 0
    assert _bar_texts(axes[SPEED_TITLE])[1:] == ["not trained"] * (len(arms) - 1)
    hatched = [bar.get_hatch() for bar in waste.patches]
    assert hatched == [None] + ["//"] * (len(arms) - 1)
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
    assert _bar_texts(_axes(fig)[TRUNCATION_TITLE + "\n(at max_seq_len 128; hatched: layout only)"]) == [
        "n/a"
    ]
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
    from pretrain.data.ingest.prepare import prepare_cache
    from pretrain.data.mixture import MixtureSpec

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
    labels = [tick.get_text() for tick in waste.get_yticklabels()]
    assert labels == ["bestfit", *(f"{arm} (layout only)" for arm in arms[1:])]
    assert _bar_texts(waste)[1] == percent(run.layouts["padded"]["padding_waste"])
    plt.close(fig)
