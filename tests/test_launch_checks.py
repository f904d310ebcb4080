"""A single run is checked on Hydra's own composition (launch_checks.CheckBeforeRun) and composed
once more by nobody; the start-up collector pause ends once the run's settings are known."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import SHARED_CACHE, TINY_RUN, cli_env, module_cache_root
from hydra import compose, initialize_config_dir

from pretrain.cli import launch_checks
from pretrain.config import CONFIG_NAME, config_dir, load_config, register_schema, to_config
from pretrain.training import startup_collector
from pretrain.training.startup import RunSettings

REPO = Path(__file__).resolve().parents[1]
cache_root = module_cache_root(SHARED_CACHE)

# train.py under a probe: Hydra's compositions counted, and the collector's state when the run ends.
_PROBE = """
import atexit, gc, json, runpy, sys
from hydra._internal.config_loader_impl import ConfigLoaderImpl
composed = []
load = ConfigLoaderImpl.load_configuration
def counted(self, *args, **kwargs):
    composed.append(kwargs.get("run_mode") or args[2])
    return load(self, *args, **kwargs)
ConfigLoaderImpl.load_configuration = counted
import pretrain.cli.launch_checks as checks
check = checks.check_overrides
checked_with = []
def recorded(argv):
    checked_with.append(gc.isenabled())
    return check(argv)
checks.check_overrides = recorded
atexit.register(lambda: print("PROBE " + json.dumps({"compositions": len(composed), "enabled": gc.isenabled(),
    "frozen": gc.get_freeze_count(), "checked_with_collector": checked_with})))
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path("train.py", run_name="__main__")
"""


def _hydra_config(overrides: list[str]):
    """The config Hydra's run mode hands its callbacks: the job's keys and the `hydra` node."""
    register_schema()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3", job_name="train"):
        return compose(config_name=CONFIG_NAME, overrides=overrides, return_hydra_config=True)


def test_the_callback_checks_hydras_composition_and_hands_on_the_run_settings(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "outputs").mkdir()
    overrides = ["experiment=smoke", "data=padded", "train.lr=0.002"]
    config = _hydra_config(overrides)
    launch_checks.CheckBeforeRun().on_run_start(config=config)
    handed = launch_checks.checked_config(config)
    assert isinstance(handed, RunSettings)  # built once, before the run directory: the job places it
    typed = to_config(load_config(overrides))
    assert handed.config.data == typed.data and handed.config.train == typed.train
    assert handed.config.data.policy == "padded" and handed.config.train.lr == 0.002
    assert launch_checks.checked_config(config) is config  # handed on once: a later job types its own


def test_a_refusal_in_the_callback_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    config = _hydra_config(["experiment=smoke", "trainer=gpu"])
    with pytest.raises(SystemExit) as exited:
        launch_checks.CheckBeforeRun().on_run_start(config=config)
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: trainer.accelerator=gpu but this machine has no CUDA")


def test_a_bug_in_the_checks_stops_the_run_with_its_traceback(tmp_path, monkeypatch, capsys):
    """Hydra turns an exception from a callback into a warning and runs the job: not this one."""
    monkeypatch.chdir(tmp_path)

    def broken(cfg, overrides, **kwargs):
        raise KeyError("a bug")

    monkeypatch.setattr(launch_checks, "check_single_run", broken)
    with pytest.raises(SystemExit) as exited:
        launch_checks.CheckBeforeRun().on_run_start(config=_hydra_config(["experiment=smoke"]))
    assert exited.value.code == 1
    assert "KeyError: 'a bug'" in capsys.readouterr().err


def test_resume_after_pause_freezes_start_up_and_collects_again():
    assert gc.isenabled()
    startup_collector.resume()  # without a pause: nothing changes (train() from a test or notebook)
    assert gc.isenabled() and gc.get_freeze_count() == 0
    try:
        startup_collector.pause()
        assert not gc.isenabled()
        startup_collector.resume()
        assert gc.isenabled() and gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.enable()


def _probed_train_py(cache_root: Path, *args: str) -> dict:
    """`python train.py args` under _PROBE: what it saw (it must succeed)."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *args, *TINY_RUN, "train.max_steps=2"],  # flags first (argparse)
        cwd=REPO,
        env={**cli_env(cache_root), "PYTHONPATH": str(REPO / "src")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("PROBE ")]
    return json.loads(line.removeprefix("PROBE "))


def test_train_py_composes_only_in_hydra_and_ends_with_the_collector_on(tmp_path, cache_root):
    """Hydra composes a run twice (its mode, then the run); the checks add no composition of their
    own, and the collector train.py paused at launch is on again, start-up frozen, when it ends."""
    probe = _probed_train_py(cache_root, f"hydra.run.dir={tmp_path / 'run'}")
    assert probe == {
        "compositions": 2,
        "enabled": True,
        "frozen": probe["frozen"],
        "checked_with_collector": [],
    }
    assert probe["frozen"] > 100_000  # the imports' objects: torch, Lightning, Hydra
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()


def test_a_multirun_checks_its_jobs_with_the_collector_on(tmp_path, cache_root):
    """A sweep's job configs are composed with the collector on (their garbage is not start-up's)."""
    sweep = tmp_path / "sweep"
    probe = _probed_train_py(cache_root, "-m", "seed=0,1", f"hydra.sweep.dir={sweep}")
    assert probe["checked_with_collector"] == [True] and probe["enabled"] is True
    assert sorted(p.parent.name for p in sweep.glob("*/checkpoints")) == ["0", "1"]
