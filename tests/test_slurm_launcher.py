"""hydra/launcher=slurm without a scheduler: what its jobs ask for (conf/hydra/launcher/slurm.yaml through
training/slurm_resources.py), and submitit's SIGUSR2 handed to submitit only after the checkpoint
(training/preemption.py). tests/test_slurm.py runs both on a real Slurm."""

from __future__ import annotations

import os
import signal

import pytest
from omegaconf import OmegaConf

from pretrain.config import config_dir
from pretrain.errors import ConfigError
from pretrain.training.preemption import SETUP, TRAINING, Signals
from pretrain.training.slurm_resources import gpus_per_node, register_slurm_resolvers, tasks_per_node


@pytest.mark.parametrize(
    ("trainer", "nodes", "tasks", "gpus"),
    [
        ({"accelerator": "cpu", "devices": 1, "num_nodes": 1}, 1, 1, 0),
        ({"accelerator": "cpu", "devices": 2, "num_nodes": 1}, 1, 2, 0),
        ({"accelerator": "gpu", "devices": 8, "num_nodes": 2}, 2, 8, 8),
        ({"accelerator": "auto", "devices": 1, "num_nodes": 1}, 1, 1, 1),
    ],
)
def test_the_slurm_launcher_sizes_jobs_from_the_trainer(trainer, nodes, tasks, gpus):
    register_slurm_resolvers()
    launcher = OmegaConf.load(config_dir() / "hydra" / "launcher" / "slurm.yaml")
    cfg = OmegaConf.create({"trainer": trainer, "launcher": launcher})
    assert (cfg.launcher.nodes, cfg.launcher.tasks_per_node, cfg.launcher.gpus_per_node) == (
        nodes,
        tasks,
        gpus,
    )


@pytest.mark.parametrize("devices", [-1, "auto", 0])
def test_devices_that_cannot_size_a_job_are_refused_with_the_fix(devices):
    with pytest.raises(ConfigError, match=r"cannot size a Slurm job .* set trainer.devices"):
        tasks_per_node(devices)
    assert gpus_per_node("cpu", devices) == 0  # a CPU job asks for no GPU whatever its devices


@pytest.fixture
def submitit_handler():
    """A Python handler for SIGUSR2 installed before the run's, as submitit's job environment does."""
    calls: list[int] = []
    previous = signal.signal(signal.SIGUSR2, lambda signum, frame: calls.append(signum))
    yield calls
    signal.signal(signal.SIGUSR2, previous)


def test_sigusr2_stops_after_the_update_and_reaches_submitit_after_the_checkpoint(submitit_handler):
    signals = Signals().install()
    signals.phase = TRAINING
    os.kill(os.getpid(), signal.SIGUSR2)
    assert signals.received == signal.SIGUSR2  # the run stops after this update and saves
    assert submitit_handler == []  # submitit would exit now, mid-update
    signals.restore()  # the run is saved
    assert submitit_handler == [signal.SIGUSR2]  # now submitit requeues
    assert signal.getsignal(signal.SIGUSR2) is not signals._handle


def test_sigusr2_before_training_goes_to_submitit_at_once(submitit_handler):
    signals = Signals().install()
    assert signals.phase == SETUP
    os.kill(os.getpid(), signal.SIGUSR2)  # nothing to save yet: no Interrupted, submitit requeues
    assert submitit_handler == [signal.SIGUSR2]
    signals.restore()
    assert submitit_handler == [signal.SIGUSR2]  # not twice


def test_sigusr2_is_left_alone_without_a_waiting_handler():
    assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL
    signals = Signals().install()
    assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL  # default action: ours only with submitit
    signals.restore()
