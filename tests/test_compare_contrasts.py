"""`pretrain compare` on a sweep: each level of the factor (data.policy by default) against the
reference level *within each cell* of the other varied keys, seeds paired inside a cell, the pooled
line with cells as blocks, compare.json and the one-screen summary. Runs are hand-written
(config.yaml, metrics.csv) with known numbers; every expected value is recomputed here from the
files with scipy, not read off the code under test."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats

from pretrain.cli import main
from pretrain.cli.command import parse_args
from pretrain.errors import ConfigError
from pretrain.report.arm_table import arm_table
from pretrain.report.arms import group_arms
from pretrain.report.compare import compare, find_runs
from pretrain.report.compare_json import compare_document
from pretrain.report.contrast_render import CONTRAST_FIELDS
from pretrain.report.contrasts import choose_factor, contrast_table
from pretrain.report.statistics import holm
from pretrain.training.run_record import load_run

SEEDS = (0, 1)
BATCHES = (4, 8)
LENGTHS = (128, 256)


def write_run(
    directory: Path, *, policy: str, batch_size: int, max_seq_len: int, seed: int, val: float, waste: float
) -> Path:
    """A 6-step run validated at steps 2, 4 and 6 (the last at `val`), `batch_size * max_seq_len` real
    tokens a step times (1 - waste)."""
    directory.mkdir(parents=True)
    config = {
        "seed": seed,
        "output_dir": str(directory),
        "data": {"policy": policy, "max_seq_len": max_seq_len},
        "train": {"batch_size": batch_size, "lr": 0.01},
    }
    (directory / "config.yaml").write_text(yaml.safe_dump(config))
    lines = [
        "step,train/loss,train/tokens,train/step_seconds,train/tokens_per_sec,train/padding_waste,val/loss"
    ]
    per_step = batch_size * max_seq_len * (1 - waste)
    for step in range(1, 7):
        validation = {2: val + 0.4, 4: val + 0.2, 6: val}.get(step, "")
        lines.append(
            f"{step},{val + 0.5 - 0.05 * step},{per_step * step},1.0,{per_step},{waste},{validation}"
        )
    (directory / "metrics.csv").write_text("\n".join(lines) + "\n")
    return directory


def val_loss(policy: str, batch_size: int, max_seq_len: int, seed: int) -> float:
    """A made-up final val loss: bestfit helps more at the longer context; seeds add their own noise."""
    base = 5.0 - 0.1 * (batch_size == 8) - 0.05 * (max_seq_len == 256)
    effect = {"padded": 0.0, "bestfit": -0.03 - 0.02 * (max_seq_len == 256)}[policy]
    noise = 0.011 * math.sin(7 * seed + batch_size + max_seq_len / 64 + (policy == "bestfit") * 2.3)
    return base + effect + noise


def write_sweep(root: Path, seeds=SEEDS, skip=lambda policy, batch_size, max_seq_len, seed: False) -> Path:
    """The issue's sweep: data=padded,bestfit train.batch_size=4,8 data.max_seq_len=128,256 seed=..."""
    job = 0
    for policy in ("padded", "bestfit"):
        for batch_size in BATCHES:
            for max_seq_len in LENGTHS:
                for seed in seeds(policy, batch_size, max_seq_len) if callable(seeds) else seeds:
                    if skip(policy, batch_size, max_seq_len, seed):
                        continue
                    write_run(
                        root / str(job),
                        policy=policy,
                        batch_size=batch_size,
                        max_seq_len=max_seq_len,
                        seed=seed,
                        val=val_loss(policy, batch_size, max_seq_len, seed),
                        waste=0.3 if policy == "padded" else 0.02,
                    )
                    job += 1
    return root


def metrics_csv_val(directory: Path) -> float:
    """The run's last val/loss read straight from its metrics.csv."""
    with open(directory / "metrics.csv") as handle:
        values = [float(row["val/loss"]) for row in csv.DictReader(handle) if row["val/loss"]]
    return values[-1]


def cell_values(root: Path) -> dict[tuple[int, int], dict[str, dict[int, float]]]:
    """(batch_size, max_seq_len) -> policy -> seed -> final val loss, from the files."""
    cells: dict = {}
    for run in sorted(root.iterdir()):
        config = yaml.safe_load((run / "config.yaml").read_text())
        key = (config["train"]["batch_size"], config["data"]["max_seq_len"])
        cells.setdefault(key, {}).setdefault(config["data"]["policy"], {})[config["seed"]] = metrics_csv_val(
            run
        )
    return cells


def compare_json(root: Path, tmp_path: Path, contrast: str | None = None) -> dict:
    """compare.json's content as `compare` builds it, without drawing (the figures have their tests;
    one test below runs the whole command)."""
    arms = group_arms([load_run(path) for path in find_runs([root])])
    table = arm_table(arms)
    factor = choose_factor(arms, contrast)
    contrasts = contrast_table(arms, factor) if factor else None
    document = compare_document(arms, table, contrasts, [])
    return json.loads(json.dumps(document, allow_nan=False))


@pytest.fixture(scope="module")
def full_compare(tmp_path_factory) -> tuple[Path, Path]:
    """The whole command once on the 2-seed sweep: (the sweep, the output folder)."""
    root = write_sweep(tmp_path_factory.mktemp("full") / "sweep")
    compare([root], output=root.parent / "out" / "cmp.png", quiet=True)
    return root, root.parent / "out"


def by_cell(document: dict, metric: str = "val_loss") -> dict[tuple[int, int], dict]:
    return {
        (int(c["setting"]["train.batch_size"]), int(c["setting"]["data.max_seq_len"])): c
        for c in document["contrasts"]
        if c["metric"] == metric and not c["pooled"]
    }


def test_each_cell_contrasts_bestfit_with_padded_at_its_own_settings(tmp_path):
    """The done-when of issue 39: one bestfit-vs-padded contrast per (batch_size, max_seq_len) cell
    whose diff is the difference of the two arms' mean val loss there (recomputed from metrics.csv),
    paired by seed, Holm over the cells; plus the pooled line (cells as blocks)."""
    root = write_sweep(tmp_path / "sweep")
    document = compare_json(root, tmp_path)
    assert document["factor"] == "data.policy"
    assert document["contrast_reference"] == "padded"
    assert document["cell_keys"] == ["data.max_seq_len", "train.batch_size"]
    truth = cell_values(root)
    cells = by_cell(document)
    assert set(cells) == set(truth)
    p_values = []
    for key, contrast in cells.items():
        padded, bestfit = truth[key]["padded"], truth[key]["bestfit"]
        expected = np.mean(list(bestfit.values())) - np.mean(list(padded.values()))
        assert contrast["diff"] == pytest.approx(expected, abs=1e-12)
        assert contrast["mean"] == pytest.approx(np.mean(list(bestfit.values())), abs=1e-12)
        assert contrast["reference_mean"] == pytest.approx(np.mean(list(padded.values())), abs=1e-12)
        differences = [bestfit[s] - padded[s] for s in SEEDS]
        result = stats.ttest_1samp(differences, 0.0)
        interval = result.confidence_interval(0.95)
        assert (contrast["test"], contrast["n"]) == ("paired t", 2)
        assert contrast["p"] == pytest.approx(result.pvalue, rel=1e-9)
        assert (contrast["ci_low"], contrast["ci_high"]) == pytest.approx(
            (interval.low, interval.high), rel=1e-9
        )
        assert contrast["level"] == "bestfit" and contrast["reference"] == "padded"
        p_values.append(contrast["p"])
    assert [c["p_holm"] for c in cells.values()] == pytest.approx(holm(p_values))
    (pooled,) = [c for c in document["contrasts"] if c["metric"] == "val_loss" and c["pooled"]]
    blocks = [
        np.mean(list(truth[key]["bestfit"].values())) - np.mean(list(truth[key]["padded"].values()))
        for key in cells
    ]
    result = stats.ttest_1samp(blocks, 0.0)
    assert (pooled["n"], pooled["test"], pooled["setting"]) == (4, "paired t (cells as blocks)", {})
    assert pooled["diff"] == pytest.approx(np.mean(blocks), abs=1e-12)
    assert pooled["p"] == pytest.approx(result.pvalue, rel=1e-9)
    interval = result.confidence_interval(0.95)
    assert (pooled["ci_low"], pooled["ci_high"]) == pytest.approx((interval.low, interval.high), rel=1e-9)


def test_the_interpolated_rows_are_read_at_each_cells_own_reach(tmp_path):
    """At equal real tokens the x is the cell's own (the most both arms reached): a cell of longer rows
    compares at more tokens, so `at` differs between cells, and padding waste is contrasted too."""
    root = write_sweep(tmp_path / "sweep")
    document = compare_json(root, tmp_path)
    at_tokens = by_cell(document, "val_loss_at_tokens")
    # padded (30% waste) reaches fewer real tokens: the cell's reach is padded's 6 steps.
    for (batch_size, max_seq_len), contrast in at_tokens.items():
        assert contrast["at"] == pytest.approx(6 * batch_size * max_seq_len * 0.7)
    waste = by_cell(document, "padding_waste")
    assert all(c["diff"] == pytest.approx(0.02 - 0.3) for c in waste.values())


def test_a_cell_with_one_seed_has_its_difference_but_no_interval(tmp_path):
    root = write_sweep(
        tmp_path / "sweep",
        skip=lambda policy, batch_size, max_seq_len, seed: (
            (batch_size, max_seq_len) == (8, 256) and seed == 1
        ),
    )
    document = compare_json(root, tmp_path)
    lone = by_cell(document)[(8, 256)]
    truth = cell_values(root)[(8, 256)]
    assert lone["test"] == "n<2" and lone["n"] == 1
    assert lone["diff"] == pytest.approx(truth["bestfit"][0] - truth["padded"][0], abs=1e-12)
    assert lone["ci_low"] is None and lone["p"] is None and lone["p_holm"] is None
    others = [c for key, c in by_cell(document).items() if key != (8, 256)]
    assert all(c["test"] == "paired t" for c in others)
    # Holm's family is the three cells that were tested.
    assert [c["p_holm"] for c in others] == pytest.approx(holm([c["p"] for c in others]))


def test_a_missing_cell_is_named_and_left_out_of_the_pool(tmp_path):
    root = write_sweep(
        tmp_path / "sweep",
        skip=lambda policy, batch_size, max_seq_len, seed: (
            policy == "bestfit" and (batch_size, max_seq_len) == (4, 256)
        ),
    )
    document = compare_json(root, tmp_path)
    assert set(by_cell(document)) == {(4, 128), (8, 128), (8, 256)}
    assert document["cells_missing"] == [
        {"setting": {"train.batch_size": "4", "data.max_seq_len": "256"}, "levels": ["bestfit"]}
    ]
    (pooled,) = [c for c in document["contrasts"] if c["metric"] == "val_loss" and c["pooled"]]
    assert pooled["n"] == 3
    truth = cell_values(root)
    blocks = [
        np.mean(list(truth[key]["bestfit"].values())) - np.mean(list(truth[key]["padded"].values()))
        for key in ((4, 128), (8, 128), (8, 256))
    ]
    assert pooled["diff"] == pytest.approx(np.mean(blocks), abs=1e-12)


def test_unequal_seeds_in_a_cell_fall_back_to_welch(tmp_path):
    def seeds(policy, batch_size, max_seq_len):
        return (0, 1, 2) if policy == "padded" and (batch_size, max_seq_len) == (4, 128) else (0, 1)

    root = write_sweep(tmp_path / "sweep", seeds=seeds)
    document = compare_json(root, tmp_path)
    cell = by_cell(document)[(4, 128)]
    truth = cell_values(root)[(4, 128)]
    result = stats.ttest_ind(list(truth["bestfit"].values()), list(truth["padded"].values()), equal_var=False)
    assert (cell["test"], cell["n"], cell["n_reference"]) == ("Welch t", 2, 3)
    assert cell["p"] == pytest.approx(result.pvalue, rel=1e-9)
    assert cell["diff"] == pytest.approx(
        np.mean(list(truth["bestfit"].values())) - np.mean(list(truth["padded"].values())), abs=1e-12
    )


def test_contrast_names_another_factor_and_its_cells_include_the_policy(tmp_path):
    root = write_sweep(tmp_path / "sweep", seeds=(0,))
    document = compare_json(root, tmp_path, contrast="train.batch_size")
    assert document["factor"] == "train.batch_size"
    assert document["cell_keys"] == ["layout", "data.max_seq_len"]
    cells = {
        (c["setting"]["layout"], c["setting"]["data.max_seq_len"]): c
        for c in document["contrasts"]
        if c["metric"] == "val_loss" and not c["pooled"]
    }
    assert set(cells) == {(p, str(n)) for p in ("padded", "bestfit") for n in LENGTHS}
    truth = cell_values(root)
    for (policy, length), c in cells.items():
        assert (c["level"], c["reference"]) == ("8", "4")
        assert c["diff"] == pytest.approx(
            truth[(8, int(length))][policy][0] - truth[(4, int(length))][policy][0]
        )


def test_a_contrast_on_a_key_the_runs_do_not_vary_is_refused_with_the_keys_they_do(tmp_path):
    root = write_sweep(tmp_path / "sweep", seeds=(0,))
    arms = group_arms([load_run(path) for path in find_runs([root])])
    with pytest.raises(
        ConfigError, match=r"--contrast train\.lr: .*data\.policy, data\.max_seq_len, train\.batch_size"
    ):
        choose_factor(arms, "train.lr")
    assert choose_factor(arms, None) == "data.policy"


def test_runs_of_one_policy_have_no_default_contrast(tmp_path):
    root = write_sweep(tmp_path / "sweep", seeds=(0,), skip=lambda policy, *_: policy == "bestfit")
    arms = group_arms([load_run(path) for path in find_runs([root])])
    assert choose_factor(arms, None) is None
    document = compare_json(root, tmp_path)
    assert document["contrasts"] == [] and document["factor"] is None


def test_compare_json_holds_every_arm_and_the_documented_fields(full_compare):
    root, out = full_compare
    document = json.loads((out / "cmp.json").read_text())
    assert document["schema"] == 1
    assert len(document["arms"]) == 8
    arm = next(
        a
        for a in document["arms"]
        if a["settings"] == {"data.policy": "bestfit", "train.batch_size": "8", "data.max_seq_len": "256"}
    )
    assert arm["n"] == 2 and arm["seeds"] == [0, 1]
    truth = cell_values(root)[(8, 256)]["bestfit"]
    assert arm["means"]["val_loss"] == pytest.approx(np.mean(list(truth.values())), abs=1e-12)
    for contrast in document["contrasts"]:
        assert list(contrast) == list(CONTRAST_FIELDS)
    assert {Path(f).name for f in document["files"]} == {"cmp.png", "cmp-contrast.png", "cmp.md", "cmp.json"}
    assert all(Path(f).exists() for f in document["files"])
    markdown = (out / "cmp.md").read_text()
    assert "## contrasts: data.policy at matched settings (cells: max_seq_len, batch_size)" in markdown
    assert "**pooled over 4 cells**" in markdown


def test_the_summary_fits_one_screen_and_says_how_to_get_intervals(tmp_path, capsys, monkeypatch):
    root = write_sweep(tmp_path / "sweep", seeds=(0,))
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    compare([root], output=tmp_path / "out" / "first.png")
    printed = capsys.readouterr().out.strip().splitlines()
    assert len(printed) <= 30
    assert printed[0] == "compared 8 run(s) in 8 arm(s), 1 seed each"
    cell_lines = [line for line in printed if line.startswith("  max_seq_len=")]
    assert len(cell_lines) == 4
    assert any("seed=0,1,2" in line for line in printed)
    assert printed[-1] == f"wrote in {tmp_path / 'out'}: first.png first-contrast.png first.md first.json"
    assert list(cwd.iterdir()) == []  # nothing outside --output's folder
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "first-contrast.png",
        "first.json",
        "first.md",
        "first.png",
    ]


def test_a_summary_names_the_runs_without_enough_validations_and_the_fix(tmp_path, capsys):
    root = write_sweep(tmp_path / "sweep", seeds=(0,))
    for run in list(root.iterdir())[:3]:  # these validated once, at the last step
        lines = (run / "metrics.csv").read_text().splitlines()
        kept = [lines[0]] + [
            line if line.startswith("6,") else line.rsplit(",", 1)[0] + "," for line in lines[1:]
        ]
        (run / "metrics.csv").write_text("\n".join(kept) + "\n")
    compare([root], output=tmp_path / "out" / "c.png")
    printed = capsys.readouterr().out
    assert (
        "left out of a val-loss row: 3 run(s) (fewer than two validations); "
        "rerun with train.val_every_n_steps=auto" in printed
    )


def test_the_command_writes_the_contrasts_contrast_table_computes(full_compare):
    """The JSON compare writes holds what contrast_table returns on the same runs."""
    root, out = full_compare
    arms = group_arms([load_run(path) for path in find_runs([root])])
    table = contrast_table(arms, "data.policy")
    document = json.loads((out / "cmp.json").read_text())
    assert len(table.contrasts) == len(document["contrasts"])
    assert [c.diff for c in table.contrasts] == pytest.approx(
        [c["diff"] if c["diff"] is not None else math.nan for c in document["contrasts"]], nan_ok=True
    )


def test_the_cli_passes_contrast_and_refuses_an_unvaried_key_in_one_line(tmp_path, capsys):
    root = write_sweep(tmp_path / "sweep", seeds=(0,))
    args = parse_args(["compare", str(root), "--contrast", "train.batch_size", "--output", "x.png"])
    assert (args.contrast, args.dirs) == ("train.batch_size", [str(root)])
    with pytest.raises(SystemExit) as stopped:
        main(["compare", str(root), "--contrast", "model.d_model", "--output", str(tmp_path / "c.png")])
    assert stopped.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert error == [
        "error: --contrast model.d_model: the compared runs do not vary it; keys they vary: "
        "data.policy, data.max_seq_len, train.batch_size"
    ]
    assert not (tmp_path / "c.png").exists()


def test_a_sweeps_legend_says_what_each_arm_did_against_padded_at_its_own_settings(tmp_path):
    """Not against one padded arm at other settings: each bestfit arm's legend entry carries its
    cell's contrast, each padded arm is its cell's reference."""
    import matplotlib.pyplot as plt

    from pretrain.report.contrast_render import arm_contrast_labels
    from pretrain.report.figure import figure

    root = write_sweep(tmp_path / "sweep")
    runs = [load_run(path) for path in find_runs([root])]
    arms = group_arms(runs)
    labels = arm_contrast_labels(contrast_table(arms, "data.policy"))
    truth = cell_values(root)
    for arm in arms:
        policy = arm.config["data"]["policy"]
        key = (arm.config["train"]["batch_size"], arm.config["data"]["max_seq_len"])
        if policy == "padded":
            assert labels[id(arm)] == "reference here"
        else:
            diff = np.mean(list(truth[key]["bestfit"].values())) - np.mean(
                list(truth[key]["padded"].values())
            )
            assert labels[id(arm)].startswith(f"vs padded here: final val {diff:+.3f} [")
    fig = figure(runs, arms, arm_table(arms), labels=labels)
    legend = [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]
    assert sum("vs padded here" in text for text in legend) == 4
    assert sum("reference here" in text for text in legend) == 4
    plt.close(fig)
