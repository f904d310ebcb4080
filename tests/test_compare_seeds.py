"""Seed-aware `pretrain compare`: runs that differ only in `seed` form one arm; the arms' table gives
mean, std and n (interpolated val loss at a common real-token count and training time included) and
each arm's t-based comparison with a reference arm. Runs are hand-written (config.yaml, metrics.csv) with
known numbers: nothing trains, no cache is read."""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
import yaml
from helpers import POLICIES
from scipy import stats
from wandb_records import OfflineRun, finished_run_file

from pretrain.cli import main
from pretrain.cli.command import parse_args
from pretrain.errors import ConfigError
from pretrain.report.arm_metrics import common_reach, tokens_to_reach
from pretrain.report.arm_render import WANDB_COLUMNS, markdown
from pretrain.report.arm_table import arm_table
from pretrain.report.arms import group_arms
from pretrain.report.compare import compare, find_runs, label_runs
from pretrain.report.figure import figure
from pretrain.report.figure_colors import arm_colors
from pretrain.report.statistics import (
    detectable_effect,
    interpolate_at,
    mean_curve,
    mean_points,
    smooth,
    summarize,
)
from pretrain.training.run_record import load_run

A, B, C = "padded max_seq_len=64", "bestfit max_seq_len=64", "padded max_seq_len=128"


def write_run(
    directory: Path,
    *,
    policy: str,
    seed: int,
    max_seq_len: int = 64,
    lr: float = 0.01,
    train_loss: float,
    val: tuple[float, float],
    tokens_per_step: float = 100.0,
    step_seconds: float = 1.0,
    waste: float = 0.0,
    speed: float = 1000.0,
    load: float | None = None,
    **layout: object,
) -> Path:
    """A 4-step run: train/loss falls by 0.1 per step to `train_loss`, validation at steps 2 and 4
    (`val`), `tokens_per_step` real tokens and `step_seconds` seconds per step."""
    directory.mkdir(parents=True)
    config = {
        "seed": seed,
        "experiment_name": f"study-{seed}",  # names a run: never splits an arm
        "output_dir": str(directory),
        "cache_root": str(directory / "cache"),  # a place, not a setting: never splits an arm
        "data": {"policy": policy, "max_seq_len": max_seq_len, **layout},
        "train": {"batch_size": 4, "lr": lr},
    }
    (directory / "config.yaml").write_text(yaml.safe_dump(config))
    lines = [
        "step,train/loss,train/tokens,train/step_seconds,train/tokens_per_sec,train/padding_waste,val/loss"
    ]
    for step in range(1, 5):
        loss = train_loss + 0.1 * (4 - step)
        validation = {2: val[0], 4: val[1]}.get(step, "")
        lines.append(f"{step},{loss},{tokens_per_step * step},{step_seconds},{speed},{waste},{validation}")
    if load is not None:  # the machine's load per CPU, logged at every step
        lines = [lines[0] + ",sys/load_per_cpu"] + [line + f",{load}" for line in lines[1:]]
    (directory / "metrics.csv").write_text("\n".join(lines) + "\n")
    return directory


@pytest.fixture
def study(tmp_path) -> Path:
    """Three arms: padded and bestfit at max_seq_len 64 (3 seeds each) and padded at 128 (one seed).

    padded 64: 100 tokens/step (validations at 200 and 400 real tokens, at 2 and 4 s), final train
      loss 3.1/3.2/3.3, val 4.0/4.2/4.4 then 3.0/3.2/3.4, waste 20/25/30%, 1000/1100/1200 tokens/s;
    bestfit 64: 125 tokens/step (validations at 250 and 500), final train loss 2.5/2.6/2.7,
      val 3.9/4.0/4.1 then 2.9/3.0/3.1, no waste, 900 tokens/s;
    padded 128: 75 tokens/step and 0.75 s/step: its last validation, at 300 real tokens and 3 s, is
      the most every run reached."""
    root = tmp_path / "multirun"
    job = 0
    for seed, (train, val, waste, speed) in enumerate(
        [
            (3.1, (4.0, 3.0), 0.20, 1000.0),
            (3.2, (4.2, 3.2), 0.25, 1100.0),
            (3.3, (4.4, 3.4), 0.30, 1200.0),
        ],
        start=1,
    ):
        write_run(
            root / str(job), policy="padded", seed=seed, train_loss=train, val=val, waste=waste, speed=speed
        )
        job += 1
    for seed, (train, val) in enumerate([(2.5, (3.9, 2.9)), (2.6, (4.0, 3.0)), (2.7, (4.1, 3.1))], start=1):
        write_run(
            root / str(job),
            policy="bestfit",
            seed=seed,
            train_loss=train,
            val=val,
            tokens_per_step=125.0,
            speed=900,
        )
        job += 1
    write_run(
        root / str(job),
        policy="padded",
        seed=1,
        max_seq_len=128,
        train_loss=3.0,
        val=(3.8, 2.8),
        tokens_per_step=75.0,
        step_seconds=0.75,
    )
    return root


def _arms(root: Path):
    return group_arms([load_run(path) for path in find_runs([root])])


def _rows(table, heading: str) -> dict:
    (section,) = [s for s in table.sections if s.metric.name.startswith(heading)]
    return {row.arm.label: row for row in section.rows}


def test_runs_that_differ_only_in_seed_are_one_arm_labelled_by_what_differs(study):
    arms = _arms(study)
    assert [(arm.label, arm.n) for arm in arms] == [(A, 3), (B, 3), (C, 1)]
    assert arms[0].seeds == [1, 2, 3]
    # another key (here train.lr) makes another arm, named by that key
    write_run(study / "7", policy="padded", seed=4, lr=0.1, train_loss=3.0, val=(4.0, 3.0))
    arms = _arms(study)
    assert [(arm.label, arm.n) for arm in arms] == [
        ("padded max_seq_len=64 lr=0.01", 3),
        ("bestfit max_seq_len=64 lr=0.01", 3),
        ("padded max_seq_len=128 lr=0.01", 1),
        ("padded max_seq_len=64 lr=0.1", 1),
    ]


def test_a_composition_study_reads_as_its_arms_labelled_by_their_layouts(tmp_path):
    """Arms as `experiment=composition_study` makes them (an `arm` choice of data options, `seed`
    swept): a layout option at its default is named where it tells arms of one policy apart."""
    layouts = [
        ("prepacked", {"strategy": "concat", "document_mask": False}),
        ("prepacked", {"strategy": "concat", "document_mask": True}),
        ("prepacked", {"strategy": "bfd", "document_mask": True}),
        ("bestfit", {}),
        ("padded", {"pad_to": "longest"}),
    ]
    job = 0
    for policy, layout in layouts:
        for seed in (1, 2, 3):
            write_run(tmp_path / str(job), policy=policy, seed=seed, train_loss=3.0, val=(4.0, 3.0), **layout)
            job += 1
    assert [(arm.label, arm.n) for arm in _arms(tmp_path)] == [
        ("prepacked document_mask=false strategy=concat", 3),
        ("prepacked document_mask=true strategy=concat", 3),
        ("prepacked document_mask=true strategy=bfd", 3),
        ("bestfit", 3),
        ("padded pad_to=longest", 3),
    ]


def test_an_arm_name_in_the_config_neither_splits_nor_labels_an_arm(tmp_path):
    for job, name in enumerate(("concat-nomask", "concat-nomask-again")):
        path = write_run(tmp_path / str(job), policy="bestfit", seed=job, train_loss=3.0, val=(4.0, 3.0))
        config = yaml.safe_load((path / "config.yaml").read_text())
        (path / "config.yaml").write_text(yaml.safe_dump({**config, "arm_name": name}))
    assert [(arm.label, arm.n) for arm in _arms(tmp_path)] == [("bestfit", 2)]


def test_arms_alike_but_for_a_key_only_some_have_are_told_apart_by_it(tmp_path):
    for job, buffer in enumerate((None, 64)):
        path = write_run(tmp_path / str(job), policy="bestfit", seed=1, train_loss=3.0, val=(4.0, 3.0))
        if buffer:
            config = yaml.safe_load((path / "config.yaml").read_text())
            config["data"]["packing_buffer"] = buffer
            (path / "config.yaml").write_text(yaml.safe_dump(config))
    assert [arm.label for arm in _arms(tmp_path)] == [
        "bestfit data.packing_buffer=None",
        "bestfit data.packing_buffer=64",
    ]


def test_the_table_gives_mean_std_n_and_interpolated_val_loss(study):
    table = arm_table(_arms(study))
    assert table.reference is not None and table.reference.label == A  # the first arm by default
    final = _rows(table, "final val loss")
    assert final[A].summary.n == 3
    assert final[A].summary.mean == pytest.approx(3.2)
    assert final[A].summary.std == pytest.approx(0.2)
    assert final[B].summary.mean == pytest.approx(3.0) and final[B].summary.std == pytest.approx(0.1)
    assert final[C].summary.n == 1 and math.isnan(final[C].summary.std)
    train = _rows(table, "final train loss")
    assert [train[arm].summary.mean for arm in (A, B, C)] == pytest.approx([3.2, 2.6, 3.0])
    # the common real-token count: the most every run reached in validation (padded 128's 300)
    runs = [run for arm in _arms(study) for run in arm.runs]
    assert common_reach(runs, "series") == 300.0
    (heading,) = [
        s.metric.name
        for s in table.sections
        if s.metric.name.startswith("val loss at") and "tokens" in s.metric.name
    ]
    assert heading == "val loss at 300 real tokens (interpolated; the most every run reached in validation)"
    at_tokens = _rows(table, "val loss at 300 real tokens")
    # padded 64: halfway between 200 and 400 tokens; bestfit: 1/5 of the way from 250 to 500
    assert at_tokens[A].summary.values == pytest.approx((3.5, 3.7, 3.9))
    assert at_tokens[B].summary.values == pytest.approx((3.7, 3.8, 3.9))
    assert at_tokens[C].summary.values == pytest.approx((2.8,))  # its own last validation
    # the common training time: 3 s (padded 128: 4 steps of 0.75 s); halfway between 2 and 4 s for both
    at_seconds = _rows(table, "val loss at 3.0 training seconds")
    assert at_seconds[A].summary.mean == pytest.approx(3.7)
    assert at_seconds[B].summary.values == pytest.approx((3.4, 3.5, 3.6))
    speed, waste = _rows(table, "real tokens/s"), _rows(table, "padding waste")
    # from the totals (400 real tokens in 4 training seconds), not the logged per-step rates (1000-1200)
    assert (speed[A].summary.mean, speed[A].summary.std) == pytest.approx((100.0, 0.0))
    assert speed[B].summary.mean == pytest.approx(125.0) and speed[C].summary.mean == pytest.approx(100.0)
    assert (waste[A].summary.mean, waste[A].summary.std) == pytest.approx((0.25, 0.05))
    assert waste[B].summary.mean == 0.0 and waste[B].summary.std == 0.0


def test_val_loss_at_a_common_optimizer_step_separates_updates_from_tokens(study, tmp_path):
    """Every run validates at steps 2 and 4, whatever its real tokens per step: by default the row reads
    step 4 (the last step every run validated at), `--at-step 3` reads halfway between them."""
    table = arm_table(_arms(study))
    at_last = _rows(table, "val loss at optimizer step 4 (interpolated; the last step every run validated")
    assert at_last[A].summary.values == pytest.approx((3.0, 3.2, 3.4))
    assert at_last[B].summary.values == pytest.approx((2.9, 3.0, 3.1))
    at_three = _rows(
        arm_table(_arms(study), at_step=3), "val loss at optimizer step 3 (interpolated; --at-step)"
    )
    assert at_three[A].summary.values == pytest.approx((3.5, 3.7, 3.9))
    assert at_three[B].summary.values == pytest.approx((3.4, 3.5, 3.6))
    assert at_three[C].summary.values == pytest.approx((3.3,))  # 3.8 at step 2, 2.8 at step 4
    # through the command line, and refused when not a positive number
    assert main(["compare", str(study), "--at-step", "3", "--output", str(tmp_path / "s.png")]) == 0
    assert "### val loss at optimizer step 3 (interpolated; --at-step)" in (tmp_path / "s.md").read_text()
    with pytest.raises(ConfigError, match="^--at-step 0.0 must be a positive number$"):
        compare([study], output=tmp_path / "z.png", quiet=True, at_step=0.0)


def test_a_mixtures_components_get_their_own_val_loss_sections(tmp_path):
    """Mixture runs log val/loss/<component>: one section per component, mean over the seeds."""
    for job, (seed, web, docs) in enumerate([(1, 3.0, 4.0), (2, 3.2, 4.4)]):
        run = write_run(tmp_path / str(job), policy="bestfit", seed=seed, train_loss=3.0, val=(4.0, 3.5))
        lines = (run / "metrics.csv").read_text().splitlines()
        lines[0] += ",val/loss/web,val/loss/docs,val/loss_by_position/0-63"
        lines[1:] = [
            f"{line},{web},{docs},5.0" if line.split(",")[-1] else f"{line},,," for line in lines[1:]
        ]
        (run / "metrics.csv").write_text("\n".join(lines) + "\n")
    table = arm_table(_arms(tmp_path))
    web = _rows(table, "final val/loss/web (the web component's validation pairs)")["bestfit"]
    docs = _rows(table, "final val/loss/docs")["bestfit"]
    assert (web.summary.n, web.summary.mean) == (2, pytest.approx(3.1))
    assert docs.summary.values == pytest.approx((4.0, 4.4))
    assert not [s for s in table.sections if "by_position" in s.metric.name]


def test_a_run_in_progress_is_the_same_arm_as_its_finished_seeds(tmp_path):
    """A run still training has only Hydra's unresolved .hydra/config.yaml: its interpolations are
    resolved before grouping, so it does not become an arm `max_seq_len=${data.max_seq_len}`."""
    write_run(tmp_path / "0", policy="padded", seed=1, train_loss=3.0, val=(4.0, 3.0))
    running = write_run(tmp_path / "1", policy="padded", seed=2, train_loss=3.0, val=(4.0, 3.0))
    config = yaml.safe_load((running / "config.yaml").read_text())
    config["model"] = {"max_seq_len": "${data.max_seq_len}"}
    (running / ".hydra").mkdir()
    (running / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    (running / "config.yaml").unlink()
    finished = yaml.safe_load((tmp_path / "0" / "config.yaml").read_text())
    finished["model"] = {"max_seq_len": 64}
    (tmp_path / "0" / "config.yaml").write_text(yaml.safe_dump(finished))
    assert load_run(running).config["model"] == {"max_seq_len": 64}
    assert [(arm.label, arm.n) for arm in _arms(tmp_path)] == [("padded", 2)]


def test_comparisons_with_the_reference_pair_seeds_and_mark_only_holm_significant_ones(study):
    table = arm_table(_arms(study))
    train, final = _rows(table, "final train loss"), _rows(table, "final val loss")
    assert train[A].comparison is None  # the reference itself
    # train loss: bestfit - padded = -0.6 for every seed (paired: seeds 1-3 in both): no spread
    c = train[B].comparison
    assert c is not None and (c.test, c.n, c.df) == ("paired t", 3, 2)
    assert (c.diff, c.low, c.high, c.p) == (
        pytest.approx(-0.6),
        pytest.approx(-0.6),
        pytest.approx(-0.6),
        0.0,
    )
    assert c.holm == 0.0 and c.significant is True  # the only tested arm: Holm changes nothing
    # val loss: per-seed differences -0.1, -0.2, -0.3: a paired t test with 2 degrees of freedom
    c = final[B].comparison
    expected = stats.ttest_rel([2.9, 3.0, 3.1], [3.0, 3.2, 3.4])
    interval = expected.confidence_interval()
    assert (c.diff, c.p, c.low, c.high) == (
        pytest.approx(-0.2),
        pytest.approx(expected.pvalue),
        pytest.approx(interval.low),
        pytest.approx(interval.high),
    )
    assert c.p == pytest.approx(0.0742, abs=1e-4) and c.significant is False  # t = -3.46, df 2
    assert c.mde == pytest.approx(detectable_effect(0.1 / math.sqrt(3), 2))
    # unpaired, the same numbers: Welch's test, wider
    welch = _rows(arm_table(_arms(study), paired=False), "final val loss")[B].comparison
    assert welch.test == "Welch t" and welch.p == pytest.approx(
        stats.ttest_ind([2.9, 3.0, 3.1], [3.0, 3.2, 3.4], equal_var=False).pvalue
    )
    assert welch.p > c.p
    # a single-seed arm: the difference, no test, no decision
    c = final[C].comparison
    assert (
        c.test == "n<2" and c.diff == pytest.approx(2.8 - 3.2) and math.isnan(c.p) and c.significant is None
    )
    text = markdown(table)
    assert f"reference: `{A}`" in text and "Holm" in text and "paired t" in text
    section = text.split("### final train loss")[1].split("###")[0]
    assert f"| {A} | 3 | 3.2000 | 0.1000 | reference |  |  |  |  |  |" in section
    assert (
        f"| {B} | 3 | 2.6000 | 0.1000 | -0.6000 [-0.6000, -0.6000] | <0.001 | <0.001 | 0.0000 | paired t "
        "| yes |" in section
    )
    assert f"| {C} | 1 | 3.0000 | n/a | -0.2000 | n/a | n/a | n/a | n<2 | n<2 |" in section
    section = text.split("### final val loss")[1].split("###")[0]
    low, high = f"{interval.low:+.4f}", f"{interval.high:+.4f}"
    mde = f"{final[B].comparison.mde:.4f}"
    assert (
        f"| {B} | 3 | 3.0000 | 0.1000 | -0.2000 [{low}, {high}] | 0.074 | 0.074 | {mde} | paired t | no |"
        in section
    )
    assert "significant" not in section  # the word only where Holm p < 0.05 (the legend explains it)
    # another reference: the differences turn around
    other = _rows(arm_table(_arms(study), reference=B), "final train loss")
    assert other[B].comparison is None and other[A].comparison.diff == pytest.approx(0.6)


def test_holm_adjusts_across_the_arms_compared_with_one_reference(tmp_path):
    """Three arms against padded, paired by seed: each section's p values are one Holm family."""
    deltas = {"bestfit": (-0.30, -0.28, -0.33), "firstfit": (-0.10, 0.02, -0.12), "vsl": (0.05, -0.07, 0.01)}
    job = 0
    for seed in (1, 2, 3):
        write_run(tmp_path / str(job), policy="padded", seed=seed, train_loss=3.0, val=(4.0, 3.0 + seed / 10))
        job += 1
    for policy, moved in deltas.items():
        for seed, delta in zip((1, 2, 3), moved, strict=True):
            val = (4.0, 3.0 + seed / 10 + delta)
            write_run(tmp_path / str(job), policy=policy, seed=seed, train_loss=3.0, val=val)
            job += 1
    rows = _rows(arm_table(_arms(tmp_path)), "final val loss")
    raw = {policy: stats.ttest_1samp(moved, 0.0).pvalue for policy, moved in deltas.items()}
    order = sorted(raw, key=raw.get)
    expected, running = {}, 0.0
    for rank, policy in enumerate(order):  # Holm by hand: (m - rank) p, made monotone, capped at 1
        running = max(running, min(1.0, (3 - rank) * raw[policy]))
        expected[policy] = running
    for policy in deltas:
        c = rows[policy].comparison
        assert c.p == pytest.approx(raw[policy]) and c.holm == pytest.approx(expected[policy])
        assert c.significant is bool(expected[policy] < 0.05)
    assert rows["bestfit"].comparison.significant is True and rows["vsl"].comparison.significant is False


def test_an_unknown_reference_is_a_clear_error(study):
    with pytest.raises(ConfigError) as error:
        arm_table(_arms(study), reference="padded")
    assert str(error.value) == (
        f"--reference 'padded' is not one of the compared arms: choose one of '{A}'; '{B}'; '{C}'"
    )


def test_a_run_short_of_the_chosen_x_is_left_out_and_named_not_extrapolated(study):
    table = arm_table(_arms(study), at_tokens=450, at_seconds=1.0)
    at_tokens = _rows(table, "val loss at 450 real tokens (interpolated; --at-tokens)")
    assert at_tokens[A].summary.n == 0 and math.isnan(at_tokens[A].summary.mean)  # reached 400 only
    assert at_tokens[B].summary.values == pytest.approx((3.1, 3.2, 3.3))  # 4/5 of the way to 500
    assert at_tokens[C].summary.n == 0
    at_seconds = _rows(table, "val loss at 1.0 training seconds")  # before every run's first validation
    assert all(row.summary.n == 0 for row in at_seconds.values())
    text = markdown(table)
    left_out = [
        line for line in text.splitlines() if line.startswith("left out (validations do not span 450")
    ]
    assert left_out == [
        "left out (validations do not span 450 real tokens: not extrapolated): "
        + ", ".join(str(study / job) for job in ("0", "1", "2", "6"))
    ]
    assert (  # every run first validated after 1 s
        "left out (validations do not span 1.0 training seconds: not extrapolated): "
        + ", ".join(str(study / str(job)) for job in range(7))
    ) in text.splitlines()


def test_the_figure_draws_each_arm_as_the_mean_of_its_seeds_with_a_band(study):
    runs = [load_run(path) for path in find_runs([study])]
    fig = figure(runs)
    axes = {ax.get_title(): ax for ax in fig.axes}
    tokens, seconds = axes["loss against real tokens seen"], axes["loss against training seconds"]
    assert "band min-max for n <= 3 seeds, +-1 std above" in fig.get_suptitle()
    legend = [text.get_text() for text in seconds.get_legend().get_texts()]
    assert legend == [f"{A} (n=3, min-max)", f"{B} (n=3, min-max)", C]
    lines = {line.get_label(): line for line in tokens.lines if not line.get_label().startswith("_")}
    smoothed = lines[f"{A} (n=3, min-max)"]
    # the raw mean beside it, faint: padded 64's seeds share their x (100..400 tokens) and the mean
    # train loss is 3.2 + 0.1 * (4 - step)
    (raw,) = [
        line
        for line in tokens.lines
        if line.get_alpha() == 0.2 and line.get_color() == smoothed.get_color() and len(line.get_xdata()) > 4
    ]
    assert raw.get_xdata()[0] == 100.0 and raw.get_xdata()[-1] == 400.0
    assert raw.get_ydata()[0] == pytest.approx(3.5) and raw.get_ydata()[-1] == pytest.approx(3.2)
    assert smoothed.get_ydata() == pytest.approx(smooth(raw.get_ydata()))  # the EMA of the raw mean
    assert smoothed.get_ydata()[0] == pytest.approx(3.5)  # bias-corrected: the start is not pulled to 0
    assert lines[C].get_xdata().tolist() == [75.0, 150.0, 225.0, 300.0]  # one seed: its own curve
    # validation points: the mean of the seeds' k-th validations (padded 64: 4.2 at 200, 3.2 at 400
    # tokens), markers only (no second curve), the arm's marker (padded 128's style differs: a square)
    dots = {
        (
            line.get_marker(),
            line.get_linestyle(),
            tuple(line.get_xdata()),
            tuple(np.round(np.asarray(line.get_ydata(), dtype=float), 6)),
        )
        for line in tokens.lines
        if line.get_marker() not in ("None", None, "", "_")  # "_": the error bars' caps
    }
    assert dots == {
        ("o", "None", (200.0, 400.0), (4.2, 3.2)),
        ("o", "None", (250.0, 500.0), (4.0, 3.0)),
        ("s", "None", (150.0, 300.0), (3.8, 2.8)),
    }
    bands = tokens.collections  # fill_between per seeded arm, error bars of their validation dots
    assert len([c for c in bands if type(c).__name__ == "FillBetweenPolyCollection"]) == 2
    plt.close(fig)


def test_mean_curve_band_is_min_max_up_to_three_seeds_then_one_std():
    flat = [[(0.0, y), (10.0, y)] for y in (1.0, 2.0, 4.0)]
    curve = mean_curve(flat)
    assert curve is not None
    assert np.allclose(curve.mean, 7 / 3) and np.allclose(curve.low, 1.0) and np.allclose(curve.high, 4.0)
    four = mean_curve([[(0.0, y), (10.0, y)] for y in (1.0, 2.0, 3.0, 4.0)])
    assert four is not None
    std = np.std([1.0, 2.0, 3.0, 4.0], ddof=1)
    assert np.allclose(four.low, 2.5 - std) and np.allclose(four.high, 2.5 + std)
    # only the x range every seed covers: nothing extrapolated
    shifted = mean_curve([[(0.0, 1.0), (10.0, 2.0)], [(5.0, 1.0), (20.0, 1.0)]])
    assert shifted is not None and (shifted.x[0], shifted.x[-1]) == (5.0, 10.0)
    assert shifted.mean[0] == pytest.approx(1.25)  # (1.5 + 1.0) / 2
    assert mean_curve([[(0.0, 1.0), (1.0, 1.0)], [(2.0, 1.0), (3.0, 1.0)]]) is None  # no common x


def test_mean_points_average_the_seeds_kth_validations_and_keep_the_last():
    seeds = [[(100.0, 4.0), (300.0, 3.0)], [(110.0, 4.2), (290.0, 3.4)], [(105.0, 4.4)]]
    dots = mean_points(seeds[:2])
    assert dots is not None
    assert dots.x.tolist() == [105.0, 295.0] and dots.mean.tolist() == pytest.approx([4.1, 3.2])
    assert (dots.low.tolist(), dots.high.tolist()) == ([4.0, 3.0], [4.2, 3.4])  # min-max of two seeds
    shorter = mean_points(seeds)  # a seed with one validation: only the first is shared
    assert (
        shorter is not None
        and shorter.x.tolist() == [105.0]
        and shorter.mean.tolist() == pytest.approx([4.2])
    )
    assert mean_points([[], [(1.0, 1.0)]]) is None


def test_statistics_on_known_values():
    assert interpolate_at([(100.0, 4.0), (300.0, 2.0)], 250.0) == pytest.approx(2.5)
    assert interpolate_at([(100.0, 4.0), (300.0, 2.0)], 300.0) == 2.0
    assert math.isnan(interpolate_at([(100.0, 4.0), (300.0, 2.0)], 301.0))
    assert math.isnan(interpolate_at([(100.0, 4.0), (300.0, 2.0)], 99.0))
    assert math.isnan(interpolate_at([], 1.0))
    summary = summarize([1.0, math.nan, 3.0])  # a seed without the value is left out
    assert (summary.n, summary.mean, summary.std) == (2, 2.0, pytest.approx(math.sqrt(2)))
    assert summary.band() == (1.0, 3.0)


def test_compare_writes_both_tables_and_logs_the_arms_table_to_wandb(study, tmp_path, monkeypatch):
    for name in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        (tmp_path / name).mkdir()
        monkeypatch.setenv(name, str(tmp_path / name))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    png = compare([study], output=tmp_path / "out" / "cmp.png", quiet=True, wandb=True, reference=B)
    assert png.read_bytes()[:4] == b"\x89PNG"
    text = (tmp_path / "out" / "cmp.md").read_text()
    assert text.startswith("## arms (runs that differ only in seed; n = seeds)")
    runs_table = text.split("## runs\n\n")[1].splitlines()
    assert len(runs_table) == 2 + 7  # header, rule, one row per run
    labels = [line.split(" | ")[0].removeprefix("| ") for line in runs_table[2:]]
    assert labels == [f"{A} seed={s}" for s in (1, 2, 3)] + [f"{B} seed={s}" for s in (1, 2, 3)] + [
        f"{C} seed=1"
    ]
    run = OfflineRun(finished_run_file(tmp_path / "out" / "wandb"))
    (row,) = [row for row in run.history if "compare/arms" in row]
    content = json.loads((run.path.parent / "files" / row["compare/arms"]["path"]).read_text())
    assert content["columns"] == list(WANDB_COLUMNS)
    rows = [dict(zip(WANDB_COLUMNS, r, strict=True)) for r in content["data"]]
    assert len(rows) == 11 * 3  # eleven metrics x three arms
    (padded,) = [r for r in rows if r["metric"] == "final train loss" and r["arm"] == A]
    assert padded["n"] == 3 and padded["mean"] == pytest.approx(3.2) and padded["std"] == pytest.approx(0.1)
    assert padded["diff"] == pytest.approx(0.6) and padded["significant"] is True  # against bestfit
    assert (padded["test"], padded["p"], padded["p_holm"]) == ("paired t", 0.0, 0.0)
    assert padded["ci_low"] == pytest.approx(0.6) and padded["mde"] == 0.0
    (single,) = [r for r in rows if r["metric"].startswith("val loss at 300 real tokens") and r["arm"] == C]
    assert single["at"] == 300.0 and single["std"] is None and single["significant"] is None
    assert single["test"] == "n<2" and single["p"] is None and single["ci_low"] is None
    assert "compare/table" in row  # the per-run table stays
    assert run.config_value("reference") == B


def test_cli_reference_takes_a_label_with_spaces_and_an_unknown_one_is_one_error_line(
    study, tmp_path, capsys
):
    args = parse_args(["compare", str(study), "--reference", B, "--at-tokens", "250", "output=x.png"])
    assert (args.reference, args.at_tokens, args.output, args.dirs) == (B, 250.0, "x.png", [str(study)])
    argv = ["compare", str(study), "--output", str(tmp_path / "c.png"), "--reference", "nope"]
    with pytest.raises(SystemExit) as exit:
        main(argv)
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        f"error: --reference 'nope' is not one of the compared arms: choose one of '{A}'; '{B}'; '{C}'"
    ]
    assert not (tmp_path / "c.png").exists()  # refused before anything is drawn


def test_a_multiruns_jobs_are_read_in_numeric_order_so_its_first_arm_is_the_reference(tmp_path):
    for job, policy in ((10, "bestfit"), (2, "padded"), (1, "padded")):
        write_run(tmp_path / str(job), policy=policy, seed=job, train_loss=3.0, val=(4.0, 3.0))
    assert find_runs([tmp_path]) == [tmp_path / "1", tmp_path / "2", tmp_path / "10"]
    arms = _arms(tmp_path)
    assert [(arm.label, arm.n) for arm in arms] == [("padded", 2), ("bestfit", 1)]
    assert arm_table(arms).reference is arms[0]


@pytest.mark.parametrize(
    ("option", "value"), [("at_tokens", 0.0), ("at_seconds", -1.0), ("at_tokens", math.nan)]
)
def test_a_chosen_x_must_be_a_positive_number(study, tmp_path, option, value):
    flag = "--" + option.replace("_", "-")
    with pytest.raises(ConfigError, match=f"^{flag} {value} must be a positive number$"):
        compare([study], output=tmp_path / "c.png", quiet=True, **{option: value})
    assert not (tmp_path / "c.png").exists()


def test_the_budget_section_sets_updates_and_real_tokens_side_by_side_and_flags_unequal_ones(study):
    table = arm_table(_arms(study))
    budgets = {b.arm.label: b for b in table.budgets}
    assert (budgets[A].updates, budgets[A].real_tokens) == (4.0, 400.0)
    # padded's computed tokens: each step's real tokens / (1 - waste), waste 20/25/30% by seed
    assert budgets[A].computed_tokens == pytest.approx((500 + 400 / 0.75 + 400 / 0.7) / 3)
    assert budgets[B].computed_tokens == pytest.approx(500.0)  # no padding: computed = real
    assert budgets[B].unequal() == ["real tokens +25%"] and budgets[C].unequal() == ["real tokens -25%"]
    assert budgets[A].unequal() == [] and math.isnan(budgets[A].tokens_vs_reference)
    text = markdown(table)
    section = text.split("### budget")[1].split("###")[0]
    assert f"| {A} | 3 | 4 | 400 | 535 | 4.0 | reference |" in section
    assert f"| {B} | 3 | 4 | 500 | 500 | 4.0 | NOT equalised: real tokens +25% |" in section
    assert "2 arm(s) differ from the reference" in section
    # equal tokens and updates: no flag
    equal = _rows(arm_table(_arms(study)), "updates")
    assert equal[B].comparison.diff == 0.0
    assert [m for m in (b.unequal() for b in arm_table(_arms(study), reference=B).budgets) if m] == [
        ["real tokens -20%"],
        ["real tokens -40%"],
    ]


def write_floors(run_dir: Path, unigram: float, bigram: float, bigram_kn: float | None = None) -> None:
    floors = {
        "unigram": {"nats": unigram, "bits_per_byte": 1.0},
        "bigram": {"nats": bigram, "bits_per_byte": 0.8},
    }
    if bigram_kn is not None:  # runs from before the Kneser-Ney floor have none
        floors["bigram_kn"] = {"nats": bigram_kn, "bits_per_byte": 0.7}
    (run_dir / "run.json").write_text(json.dumps({"floors": floors}))


def test_floors_are_rows_of_the_val_loss_sections_and_each_arm_is_judged_against_the_bigram(study, tmp_path):
    for run_dir in sorted(p for p in study.iterdir() if p.is_dir()):
        write_floors(run_dir, 3.5, 3.1)  # final val losses: padded 3.0/3.2/3.4, bestfit 2.9-3.1, C 2.8
    table = arm_table(_arms(study))
    floors = {row.arm.label: row for row in table.floors}
    assert (floors[A].unigram, floors[A].bigram, floors[A].below_bigram, floors[A].judged) == (3.5, 3.1, 1, 3)
    assert (floors[B].below_bigram, floors[B].judged) == (2, 3)  # 3.1 is not below 3.1
    assert (floors[C].below_bigram, floors[C].judged) == (1, 1)
    text = markdown(table)
    final = text.split("### final val loss")[1].split("###")[0]
    assert (
        "| floor: unigram (add-one) |  | 3.5000 |" in final
        and "| floor: bigram (Jelinek-Mercer) |  | 3.1000 |" in final
        and "Kneser-Ney" not in final  # runs from before it: judged on Jelinek-Mercer's
    )
    assert "| floor:" not in text.split("### final train loss")[1].split("###")[0]  # a train loss has none
    section = text.split("### floors")[1]
    assert f"| {A} | 3 | 3.2000 | 3.5000 | 3.1000 | n/a | no (1/3 seeds) |" in section
    assert f"| {C} | 1 | 2.8000 | 3.5000 | 3.1000 | n/a | yes (1/1 seeds) |" in section
    assert "2 arm(s) did not end below the lower bigram floor" in section
    # with a Kneser-Ney floor below Jelinek-Mercer's, the gate is the lower one: 3.0 is not below 2.95
    for run_dir in sorted(p for p in study.iterdir() if p.is_dir()):
        write_floors(run_dir, 3.5, 3.1, 2.95)
    table = arm_table(_arms(study))
    floors = {row.arm.label: row for row in table.floors}
    assert (floors[A].gate, floors[A].below_bigram, floors[B].below_bigram) == (2.95, 0, 1)
    text = markdown(table)
    assert "| floor: bigram (Kneser-Ney) |  | 2.9500 |" in text.split("### final val loss")[1].split("###")[0]
    assert f"| {A} | 3 | 3.2000 | 3.5000 | 3.1000 | 2.9500 | no (0/3 seeds) |" in text
    # runs that scored other validation pairs: no shared floor row, each arm its own floors
    write_floors(study / "6", 3.6, 3.2, 3.0)
    text = markdown(arm_table(_arms(study)))
    assert (
        "| floor:" not in text
        and f"| {C} | 1 | 2.8000 | 3.6000 | 3.2000 | 3.0000 | yes (1/1 seeds) |" in text
    )
    # and without floors the table says what it cannot tell
    for run_json in study.rglob("run.json"):
        run_json.unlink()
    assert "whether the arms learned any context cannot be told" in markdown(arm_table(_arms(study)))


def test_the_figure_carries_the_comparison_the_floors_and_drops_times_when_asked(study):
    for run_dir in sorted(p for p in study.iterdir() if p.is_dir()):
        write_floors(run_dir, 3.5, 3.1)
    runs = [load_run(path) for path in find_runs([study])]
    arms = group_arms(runs)
    table = arm_table(arms)
    fig = figure(runs, arms, table, timing=False)
    titles = [ax.get_title() for ax in fig.axes]
    assert "loss against optimizer steps" in titles and "loss against training seconds" not in titles
    assert not any(title.startswith("real tokens / s") for title in titles)
    tokens = next(ax for ax in fig.axes if ax.get_title() == "loss against real tokens seen")
    floors = [line.get_ydata()[0] for line in tokens.lines if line.get_linestyle() == ":"]
    assert floors == [3.5, 3.1]
    notes = [text.get_text() for text in tokens.texts]
    assert "unigram (add-one) floor 3.50" in notes and "bigram (Jelinek-Mercer) floor 3.10" in notes
    legend = [text.get_text() for text in tokens.get_legend().get_texts()] if tokens.get_legend() else []
    legend += [line.get_label() for line in fig.axes[1].lines]
    c = _rows(table, "final val loss")[B].comparison
    expected = f"final val -0.200 [{c.low:+.3f}, {c.high:+.3f}], Holm p 0.074 (paired t)"
    assert any(label.endswith(expected) for label in legend)
    assert any(label.endswith("final val -0.400 (n<2: no test)") for label in legend)
    plt.close(fig)
    default = figure(runs, arms, table)  # compare's default output keeps the times
    assert "loss against training seconds" in [ax.get_title() for ax in default.axes]
    assert any(ax.get_title().startswith("real tokens / s") for ax in default.axes)
    plt.close(default)


def test_time_based_rows_and_panels_are_marked_unreliable_when_a_run_was_contended(tmp_path):
    write_run(tmp_path / "0", policy="padded", seed=1, train_loss=3.0, val=(4.0, 3.0), load=1.0)
    write_run(tmp_path / "1", policy="bestfit", seed=1, train_loss=3.0, val=(4.0, 3.0), load=1.0)
    calm = arm_table(_arms(tmp_path))
    assert calm.contended == [] and "UNRELIABLE" not in markdown(calm)
    write_run(tmp_path / "2", policy="firstfit", seed=1, train_loss=3.0, val=(4.0, 3.0), load=3.2)
    runs = [load_run(path) for path in find_runs([tmp_path])]
    arms = group_arms(runs)
    table = arm_table(arms)
    assert [(run.path.name, load) for run, load in table.contended] == [("2", 3.2)]
    text = markdown(table)
    marked = [part.split("\n")[0] for part in text.split("\n### ")[1:] if "UNRELIABLE" in part]
    assert marked == [
        "budget: what each arm was given (means over its seeds)",
        "val loss at 4.0 training seconds (interpolated; the longest every run reached in validation)",
        "real tokens/s (real tokens / training seconds)",
    ]
    assert f"up to 3.2 in {tmp_path / '2'}" in text
    fig = figure(runs, arms, table)
    titles = [ax.get_title() for ax in fig.axes]
    assert "loss against training seconds\nUNRELIABLE: the machine was contended (compare.md)" in titles
    assert any(
        t.startswith("real tokens / s") and t.endswith("UNRELIABLE: the machine was contended (compare.md)")
        for t in titles
    )
    plt.close(fig)


def test_a_repeated_seed_is_one_run_not_a_second_seed(tmp_path, caplog):
    write_run(tmp_path / "a" / "0", policy="padded", seed=1, train_loss=3.0, val=(4.0, 3.0))
    write_run(tmp_path / "b" / "0", policy="padded", seed=1, train_loss=3.0, val=(4.0, 3.0))
    write_run(tmp_path / "b" / "1", policy="padded", seed=2, train_loss=3.2, val=(4.0, 3.2))
    with caplog.at_level("WARNING"):
        (arm,) = _arms(tmp_path)
    assert arm.n == 2 and arm.seeds == [1, 2]
    assert [str(run.path) for run in arm.runs] == [str(tmp_path / "a" / "0"), str(tmp_path / "b" / "1")]
    assert f"{tmp_path / 'b' / '0'} repeats seed 1 of {tmp_path / 'a' / '0'}" in caplog.text


def test_the_default_reference_is_the_padded_arm_wherever_the_sweep_put_it(tmp_path):
    # a demo's directories sort bestfit before padded; a sweep's jobs may run padded first
    write_run(tmp_path / "bestfit", policy="bestfit", seed=1, train_loss=2.5, val=(4.0, 2.9))
    write_run(tmp_path / "padded", policy="padded", seed=1, train_loss=3.0, val=(4.0, 3.0))
    arms = _arms(tmp_path)
    assert [arm.label for arm in arms] == ["bestfit", "padded"]
    assert arm_table(arms).reference.label == "padded"
    write_run(tmp_path / "vsl", policy="vsl", seed=1, train_loss=2.5, val=(4.0, 2.9))
    (tmp_path / "padded" / "metrics.csv").unlink()
    assert arm_table(_arms(tmp_path)).reference.label == "bestfit"  # no padded arm: the first


def test_runs_alike_are_told_apart_by_their_paths_not_by_job_numbers_every_sweep_has(tmp_path):
    for sweep in ("sweep-a", "sweep-b"):
        directory = tmp_path / sweep / "0"
        directory.mkdir(parents=True)
        (directory / "metrics.csv").write_text("step,train/loss,train/tokens\n1,3.0,100\n")  # no config
    runs = [load_run(path) for path in find_runs([tmp_path])]
    arms = group_arms(runs)
    label_runs(arms)
    assert [arm.label for arm in arms] == ["0 (sweep-a/0)", "0 (sweep-b/0)"]  # no config: arms of their own
    assert [run.label for run in runs] == ["0 (sweep-a/0)", "0 (sweep-b/0)"]


def test_more_than_four_arms_also_get_one_small_panel_each(tmp_path):
    policies = tuple(POLICIES)  # more than four arms
    for job, policy in enumerate(policies):
        write_run(tmp_path / str(job), policy=policy, seed=1, train_loss=3.0 - job / 10, val=(4.0, 3.0))
    runs = [load_run(path) for path in find_runs([tmp_path])]
    arms = group_arms(runs)
    fig = figure(runs, arms, arm_table(arms))
    small = [ax for ax in fig.axes if ax.get_title().split("\n")[0] in policies]
    assert [ax.get_title().split("\n")[0] for ax in small] == list(policies)
    assert small[0].get_title() == "padded\nreference"
    for ax, arm in zip(small, arms, strict=True):
        coloured = [line for line in ax.lines if line.get_color() != "0.8"]
        grey = [line for line in ax.lines if line.get_color() == "0.8"]
        assert len(grey) == 4  # every other arm's smoothed train loss
        assert {line.get_color() for line in coloured} == {arm_colors([arm.layout])[arm.layout]}
    plt.close(fig)
    four = figure(runs[:4], group_arms(runs[:4]))  # four arms: the combined panels alone
    assert not [ax for ax in four.axes if ax.get_title().split("\n")[0] in policies]
    plt.close(four)


def test_the_mean_of_the_last_two_validations_and_the_tokens_a_curve_needs_to_reach_the_floor(
    study, tmp_path
):
    rows = _rows(arm_table(_arms(study)), "val loss, mean of the last two validations")
    assert rows[A].summary.values == pytest.approx((3.5, 3.7, 3.9))  # (4.0 + 3.0) / 2, ...
    # a curve linear in log(tokens): L = 6 - 0.5 ln(t), validated at 100, 200, 400 and 800 tokens
    run_dir = tmp_path / "curve"
    run_dir.mkdir()
    lines = ["step,train/loss,train/tokens,val/loss"]
    lines += [f"{i + 1},3.0,{t},{6 - 0.5 * math.log(t)}" for i, t in enumerate((100, 200, 400, 800))]
    (run_dir / "metrics.csv").write_text("\n".join(lines) + "\n")
    run = load_run(run_dir)
    assert tokens_to_reach(run, 2.0) == pytest.approx(math.exp(8.0))  # where 6 - 0.5 ln(t) = 2
    assert tokens_to_reach(run, 3.0) == 800.0  # already there: its own tokens
    flat = load_run(write_run(tmp_path / "flat", policy="padded", seed=1, train_loss=3.0, val=(3.0, 3.0)))
    assert math.isnan(tokens_to_reach(flat, 2.0))  # two validations: no curve to extrapolate
    # in the floors section, for an arm above the bigram floor
    for run_dir in sorted(p for p in study.iterdir() if p.is_dir()):
        write_floors(run_dir, 3.5, 2.0)
    text = markdown(arm_table(_arms(study)))
    assert f"| {A} | 3 | 3.2000 | 3.5000 | 2.0000 | n/a | no (0/3 seeds) | n/a |" in text


def test_context_gain_is_a_section_paired_by_seed_only_when_a_run_scored_it(tmp_path):
    root = tmp_path / "multirun"
    gains = {"padded": (0.30, 0.32, 0.34), "bestfit": (0.50, 0.51, 0.55)}
    for job, (policy, seed) in enumerate((p, s) for p in gains for s in range(3)):
        run = write_run(root / str(job), policy=policy, seed=seed, train_loss=3.0, val=(4.0, 3.0))
        metrics = run / "metrics.csv"
        lines = metrics.read_text().splitlines()
        lines[0] += ",val/context_gain,val/loss_by_context/1"
        lines[1:] = [line + ",," for line in lines[1:-1]] + [
            lines[-1] + f",{gains[policy][seed]},{3.0 + gains[policy][seed]}"
        ]
        metrics.write_text("\n".join(lines) + "\n")
    table = arm_table(_arms(root), reference="padded")
    rows = _rows(table, "context gain")
    assert rows["padded"].summary.mean == pytest.approx(0.32)
    bestfit = rows["bestfit"].comparison
    assert bestfit.test == "paired t" and bestfit.n == 3
    assert bestfit.diff == pytest.approx(np.mean([0.20, 0.19, 0.21]))
    assert _rows(table, "final val loss from the previous token alone")[
        "bestfit"
    ].summary.mean == pytest.approx(3.52)
    from pretrain.report.summary import _context_lines

    assert _context_lines(table) == [
        "context gain (previous token alone - val loss, nats): padded +0.320, bestfit +0.520"
    ]
    without = tmp_path / "plain"
    write_run(without / "0", policy="padded", seed=0, train_loss=3.0, val=(4.0, 3.0))
    assert not [s for s in arm_table(_arms(without)).sections if s.metric.key == "context_gain"]
