"""What a launch that passes its checks says before it wastes a run (issue 39 item 4):
`train.val_every_n_steps=auto` (the default) validates a run of any length at least twice; an interval
that validates only once is one warning line (one for a whole sweep); a busy machine is one note line.
Unit tier: configs are composed and checked, nothing trains and no run directory is made."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pretrain.cli import launch_checks
from pretrain.config import (
    AUTO_VALIDATIONS,
    TrainConfig,
    auto_val_every,
    load_config,
    to_config,
    validation_count,
)
from pretrain.errors import ConfigError
from pretrain.report import arm_table
from pretrain.training import machine_load

READ_LOAD = machine_load.load_per_cpu  # the real reading (the fixture patches the module's)


def validated_steps(max_steps: int, every: int) -> list[int]:
    """The steps a run validates at, as training decides it step by step (module._should_validate)."""
    return [step for step in range(1, max_steps + 1) if step % every == 0 or step >= max_steps]


@pytest.fixture(autouse=True)
def quiet_launch(tmp_path, monkeypatch):
    """A fresh 'said once' memory, an idle machine unless a test says otherwise, and a working
    directory with outputs/ (no note about a new one; nothing is written in the repository)."""
    monkeypatch.setattr(launch_checks, "_SAID", set())
    monkeypatch.setattr(machine_load, "load_per_cpu", lambda: 0.2)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "outputs").mkdir()
    for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(key, raising=False)


def test_auto_is_the_default_and_resolves_to_ceil_of_a_fifth_of_max_steps():
    assert TrainConfig().val_every_n_steps == "auto"
    cases = {1: 1, 2: 1, 4: 1, 5: 1, 6: 2, 10: 2, 11: 3, 12: 3, 200: 40, 201: 41, 1000: 200}
    for max_steps, every in cases.items():
        train = TrainConfig(max_steps=max_steps, warmup_steps=0)
        assert train.val_every == auto_val_every(max_steps) == every, max_steps
        assert train.validations == len(validated_steps(max_steps, every))
    assert to_config(load_config([])).train.val_every == 40  # max_steps 200 by default: 5 validations


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=2, max_value=10**7))
def test_auto_validates_at_least_twice_and_at_most_five_times_for_any_length(max_steps):
    every = auto_val_every(max_steps)
    steps = validated_steps(max_steps, every) if max_steps < 5000 else None
    count = validation_count(max_steps, every)
    if steps is not None:
        assert count == len(steps) and steps[-1] == max_steps
    assert 2 <= count <= AUTO_VALIDATIONS
    assert count >= min(max_steps, 3)  # every step of a run under 5 updates, else 3 to 5
    assert TrainConfig(max_steps=max_steps, warmup_steps=0).validations == count


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=1, max_value=3000), st.integers(min_value=1, max_value=4000))
def test_the_validation_count_is_the_steps_training_validates_at(max_steps, every):
    assert validation_count(max_steps, every) == len(validated_steps(max_steps, every))


def test_an_integer_works_as_before():
    train = to_config(load_config(["train.max_steps=40", "train.val_every_n_steps=7"])).train
    assert (train.val_every_n_steps, train.val_every, train.validations) == (7, 7, 6)  # 7..35 and 40
    assert TrainConfig(val_every_n_steps="12").val_every_n_steps == 12  # a quoted integer is one
    assert to_config(load_config(["train.val_every_n_steps=auto"])).train.val_every_n_steps == "auto"


@pytest.mark.parametrize("value", ["abc", "0", "-1", "Auto", "''"])
def test_a_bad_interval_is_one_error_naming_the_key_and_what_it_takes(value):
    with pytest.raises(ConfigError) as refused:
        to_config(load_config([f"train.val_every_n_steps={value}"]))
    message = str(refused.value)
    assert message.startswith("train.val_every_n_steps=")
    assert "must be auto or a positive integer" in message and "\n" not in message


def test_a_run_that_validates_once_is_warned_in_one_line(capsys):
    launch_checks.check_overrides(["train.max_steps=6", "train.val_every_n_steps=50"])
    lines = [line for line in capsys.readouterr().err.splitlines() if "val_every" in line]
    assert lines == [
        "warning: train.val_every_n_steps=50 with train.max_steps=6 validates once (at the last step): "
        "val-loss curves and compare's equal-token row need >= 2; use train.val_every_n_steps=auto "
        "(validates every 2 steps here) or a value <= 3"
    ]
    launch_checks.check_overrides(["train.max_steps=6", "train.val_every_n_steps=50"])
    assert "warning" not in capsys.readouterr().err  # once per process (a failed run's report re-checks)


@pytest.mark.parametrize(
    "overrides",
    [
        ["train.max_steps=6"],  # auto, the default
        ["train.max_steps=6", "train.val_every_n_steps=3"],  # 3 and 6
        ["train.max_steps=1", "train.val_every_n_steps=50"],  # one step: once is all there is
    ],
)
def test_a_run_that_validates_twice_or_cannot_is_not_warned(overrides, capsys):
    launch_checks.check_overrides(overrides)
    assert "warning" not in capsys.readouterr().err


def test_a_sweep_is_warned_in_one_line_naming_its_jobs_before_any_directory(tmp_path, capsys):
    sweep_dir = tmp_path / "sweep"
    launch_checks.check_overrides(
        [
            "--multirun",
            "experiment=smoke",
            "train.max_steps=6,40",
            "data=padded,bestfit",
            "train.val_every_n_steps=20",
            f"hydra.sweep.dir={sweep_dir}",
        ]
    )
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert warnings == [
        "warning: sweep jobs 0 (train.max_steps=6 data=padded), 1 (train.max_steps=6 data=bestfit): "
        "train.val_every_n_steps=20 with train.max_steps=6 validates once (at the last step): val-loss "
        "curves and compare's equal-token row need >= 2; use train.val_every_n_steps=auto (validates "
        "every 2 steps here) or a value <= 3"
    ]
    assert not sweep_dir.exists()


def test_a_sweep_whose_every_job_validates_once_says_so_once(capsys):
    launch_checks.check_overrides(
        ["-m", "experiment=smoke", "train.max_steps=6,8", "seed=1,2,3,4", "train.val_every_n_steps=8"]
    )
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1
    assert warnings[0].startswith(
        "warning: all 8 sweep jobs: train.val_every_n_steps=8 with train.max_steps=6 or 8 validates once"
    )
    assert warnings[0].endswith("use train.val_every_n_steps=auto or a value <= 3")


def test_a_sweep_that_validates_often_enough_is_not_warned(capsys):
    launch_checks.check_overrides(["-m", "experiment=smoke", "train.max_steps=4,6", "seed=1,2"])
    assert "warning" not in capsys.readouterr().err


def test_the_smoke_experiment_validates_at_least_twice_for_any_length_from_4():
    for max_steps in range(4, 21):
        train = to_config(load_config(["experiment=smoke", f"train.max_steps={max_steps}"])).train
        assert len(validated_steps(max_steps, train.val_every)) >= 2, max_steps
        assert launch_checks.few_validations_warning([train]) is None


def test_a_busy_machine_is_noted_once_per_launch_and_an_idle_one_not(monkeypatch, capsys):
    launch_checks.check_overrides(["train.max_steps=6"])
    assert "load" not in capsys.readouterr().err  # 0.2 per CPU (the fixture's)

    monkeypatch.setattr(machine_load, "load_per_cpu", lambda: 3.1)
    launch_checks.check_overrides(["-m", "experiment=smoke", "seed=1,2,3"])
    launch_checks.check_overrides(["train.max_steps=6"])  # the same process: said already
    notes = [line for line in capsys.readouterr().err.splitlines() if "load" in line]
    assert notes == [
        "note: this machine's load is 3.1 per CPU (above 1.5): runs take about 3x the README's times, "
        "which are for idle cores"
    ]
    assert launch_checks.busy_machine_note(machine_load.CONTENDED) is None  # above it, not at it
    assert launch_checks.busy_machine_note(None) is None  # no load average on this system


def test_the_load_per_cpu_is_the_load_average_over_the_cpus_as_compare_reads_it(monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (2.0 * (os.cpu_count() or 1), 0.0, 0.0))
    assert READ_LOAD() == pytest.approx(2.0)
    assert arm_table.CONTENDED is machine_load.CONTENDED == 1.5  # one threshold, one meaning

    def unavailable():
        raise OSError("no load average")

    monkeypatch.setattr(os, "getloadavg", unavailable)
    assert READ_LOAD() is None
