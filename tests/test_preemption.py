"""Preemption with real signals: a run stops after an update, checkpoints exactly that state, says
so in run.json, exits 128 + the signal, and `ckpt_path=auto` continues it as if it never stopped.
Run directories: SLURM job ids, unique ones for runs started in the same second."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import pytest
import torch
from helpers import SHARED_CACHE, TINY_RUN, module_cache_root

from pretrain.checkpoints.files import verify_checkpoint
from pretrain.config import load_config
from pretrain.training.run import train
from pretrain.training.rundir import claim_directory, run_dir, slurm_job_id

REPO = Path(__file__).resolve().parents[1]

SMALL = [
    *TINY_RUN,
    "train.val_every_n_steps=4",
    "train.checkpoint_every_n_steps=4",
    "train.deterministic=true",
    "record_batches=true",
]


# One cache for this module and test_checkpoints.py (the same session folder, under a file lock).
cache_root = module_cache_root(SHARED_CACHE)


def compose(out: Path, *overrides: str):
    return load_config([*SMALL, "progress_bar=false", f"output_dir={out}", *overrides])


def read_losses(run: Path) -> dict[int, float]:
    with open(run / "metrics.csv", newline="") as handle:
        return {
            int(row["step"]): float(row["train/loss"]) for row in csv.DictReader(handle) if row["train/loss"]
        }


def digests(run: Path) -> list[str]:
    lines = (run / "batches.rank0.jsonl").read_text().splitlines()
    return [json.loads(line)["digest"] for line in lines]


def saved_step(checkpoint: Path) -> int:
    return int(torch.load(checkpoint, map_location="cpu", weights_only=False)["global_step"])


@pytest.fixture(scope="module")
def full_run(tmp_path_factory, cache_root) -> Path:
    """An uninterrupted 6-step run to compare interrupted ones with."""
    out = tmp_path_factory.mktemp("full") / "run"
    train(compose(out, "train.max_steps=6"))
    return out


class SignalAt(L.Callback):
    """Sends a real signal to this process once `step` updates are done."""

    def __init__(self, step: int, signum: int):
        self.step, self.signum = step, signum

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == self.step:
            os.kill(os.getpid(), self.signum)


@pytest.mark.parametrize("signum", [signal.SIGUSR1, signal.SIGINT])
def test_a_signal_stops_after_the_update_and_auto_resume_continues_exactly(tmp_path, full_run, signum, capfd):
    run = tmp_path / "run"
    summary = train(compose(run, "train.max_steps=6"), callbacks=[SignalAt(2, signum)])
    assert summary["status"] == "preempted" and summary["signal"] == signum.name
    assert summary["exit_code"] == 128 + signum
    assert summary["steps"] == 2
    assert json.loads((run / "run.json").read_text())["status"] == "preempted"
    last = run / "checkpoints" / "last.ckpt"
    assert verify_checkpoint(last) and saved_step(last) == 2 == len(digests(run))
    assert "resume:" in capfd.readouterr().out  # where everything went: stdout
    # The handlers are restored once the run is over (Ctrl-C is KeyboardInterrupt again).
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler

    resumed = train(compose(run, "train.max_steps=6", "ckpt_path=auto"))
    assert resumed["status"] == "completed" and resumed["exit_code"] == 0
    # The cache's floors (measures/floors.py), in the preempted run's run.json and the resumed one's.
    # They are those of the validation documents val/loss scores: the first ones under train.val_batches.
    cache_dir = Path(summary["cache_dir"])
    documents = json.loads((cache_dir / "manifest.json").read_text())["splits"]["validation"]["documents"]
    scored = summary["floors"]["validation_documents"]
    name = "floors.json" if scored == documents else f"floors.first-{scored}.json"
    stored = {k: v for k, v in json.loads((cache_dir / name).read_text()).items() if k != "computed_from"}
    assert summary["floors"] == stored == json.loads((run / "run.json").read_text())["floors"]
    assert resumed["floors"] == stored and stored["validation_pairs"] > 0
    full = full_run
    assert digests(run) == digests(full)  # no update skipped or repeated
    assert read_losses(run) == read_losses(full)  # bitwise: model, optimizer, schedule, data


def _start(run: Path, *overrides: str) -> subprocess.Popen:
    cmd = [sys.executable, "train.py", *SMALL, "progress_bar=true", f"hydra.run.dir={run}", *overrides]
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _interrupt_at_step_2(proc: subprocess.Popen, signum: int = signal.SIGTERM) -> tuple[str, str]:
    assert proc.stdout is not None
    for line in proc.stdout:  # plain progress lines (stdout is not a terminal): one per update
        if line.startswith("step 2/"):
            proc.send_signal(signum)
            break
    return proc.communicate(timeout=300)


def test_sigterm_to_a_real_run_exits_143_with_its_last_update_checkpointed(tmp_path, cache_root):
    run = tmp_path / "run"
    proc = _start(run, "train.max_steps=30")
    out, err = _interrupt_at_step_2(proc)
    assert proc.returncode == 143, err[-3000:]
    assert "received SIGTERM: stopping after the current update" in err
    _check_preempted(run, out)


def _check_preempted(run: Path, out: str) -> int:
    report = json.loads((run / "run.json").read_text())
    assert report["status"] == "preempted" and report["signal"] == "SIGTERM" and report["exit_code"] == 143
    trained = len(digests(run))
    assert 2 <= trained < 30 and report["steps"] == trained
    last = run / "checkpoints" / "last.ckpt"
    assert saved_step(last) == trained and verify_checkpoint(last)  # the last trained update, exactly
    assert f"checkpoint: {last}\n" in out
    assert f"resume: python train.py {' '.join(SMALL)} progress_bar=true train.max_steps=30 " in out
    return trained


@pytest.mark.slow
def test_sigterm_then_auto_resume_of_real_processes_equals_an_uninterrupted_run(tmp_path, cache_root):
    full = tmp_path / "full"
    train(compose(full, "train.max_steps=30"))
    run = tmp_path / "run"
    proc = _start(run, "train.max_steps=30")
    out, err = _interrupt_at_step_2(proc)
    assert proc.returncode == 143, err[-3000:]
    _check_preempted(run, out)
    resume = subprocess.run(
        [
            sys.executable,
            "train.py",
            *SMALL,
            "progress_bar=false",
            f"hydra.run.dir={run}",
            "train.max_steps=30",
        ]
        + ["ckpt_path=auto"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resume.returncode == 0, resume.stderr[-3000:]
    assert "ckpt_path=auto: resuming from" in resume.stderr
    assert digests(run) == digests(full)
    assert read_losses(run) == read_losses(full)


APP = """
import hydra
from hydra.core.hydra_config import HydraConfig

from pretrain.config import config_dir, register_schema
from pretrain.training.rundir import register_run_dir_resolver

register_schema()
register_run_dir_resolver()  # as train.py does


@hydra.main(config_path=str(config_dir()), config_name="train", version_base="1.3")
def main(cfg):
    print(HydraConfig.get().runtime.output_dir)


main()
"""


def test_two_runs_started_in_the_same_second_get_two_directories(tmp_path):
    # Two real Hydra processes with conf/train.yaml and the resolver, the time stamp pinned so that
    # both ask for the same directory at once: one claims it, the other gets `-1`. (The app stands in
    # for train.py, which would spend most of its start importing torch.)
    app = tmp_path / "app.py"
    app.write_text(APP)
    env = {key: value for key, value in os.environ.items() if not key.startswith("SLURM_")}
    base = tmp_path / "outputs"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(app),
                f"hydra.run.dir=${{pretrain.run_dir:{base},same-second}}",
                f"seed={seed}",
            ],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in (1, 2)
    ]
    printed = set()
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-2000:]
        printed.add(out.strip())
    assert printed == {str(base / "same-second"), str(base / "same-second-1")}
    seeds = {(base / d / ".hydra" / "overrides.yaml").read_text().count("seed=1") for d in printed}
    assert seeds == {0, 1}  # each run wrote its own directory
    # The default (no override) is a claimed directory under ./outputs/<date>/<time>.
    default = subprocess.run(
        [sys.executable, str(app)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert default.returncode == 0, default.stderr[-2000:]
    made = Path(default.stdout.strip())
    assert made.is_dir() and made.parent.parent == tmp_path / "outputs"


def test_run_dirs_follow_the_slurm_job_and_are_claimed_elsewhere(tmp_path, monkeypatch):
    for key in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"):
        monkeypatch.delenv(key, raising=False)
    assert slurm_job_id() is None
    first = run_dir(str(tmp_path), "12-00-00")
    assert first == str(tmp_path / "12-00-00") and Path(first).is_dir()
    assert run_dir(str(tmp_path), "12-00-00") == first  # resolved again in this process: the same
    assert claim_directory(tmp_path / "12-00-00") == tmp_path / "12-00-00-1"
    assert claim_directory(tmp_path / "12-00-00") == tmp_path / "12-00-00-2"

    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    assert run_dir(str(tmp_path), "13-00-00") == str(tmp_path / "slurm-4242")  # requeued: the same
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "4000")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "7")
    assert run_dir(str(tmp_path), "13-00-00") == str(tmp_path / "slurm-4000_7")


def _no_root_powers() -> list[str]:
    caps = "-dac_override,-dac_read_search,-fowner"
    return ["setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}"]


@pytest.mark.slow
@pytest.mark.skipif(not Path("/usr/bin/setpriv").exists(), reason="needs util-linux setpriv")
def test_a_read_only_checkpoint_dir_is_a_clear_error(tmp_path, cache_root):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints").chmod(0o555)  # root ignores this unless its capabilities are dropped
    cmd = [
        *_no_root_powers(),
        sys.executable,
        "train.py",
        *SMALL,
        f"hydra.run.dir={run}",
        "train.max_steps=2",
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"error: cannot write checkpoints to {run / 'checkpoints'}: Permission denied" in proc.stderr
    assert "checkpoint:" not in proc.stderr and not (run / "run.json").exists()


@pytest.mark.slow
def test_ddp_ranks_stop_after_the_same_update(tmp_path, cache_root):
    run = tmp_path / "ddp"
    cmd = [
        sys.executable,
        "train.py",
        *SMALL,
        "progress_bar=true",
        "trainer=ddp",
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "trainer.precision=32-true",
        "train.max_steps=40",
        f"hydra.run.dir={run}",
    ]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("step 2/"):
            proc.send_signal(signal.SIGTERM)  # only rank 0 (the launching process) gets it
            break
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 143, err[-3000:]
    deadline = time.monotonic() + 60  # rank 1 is Lightning's child: let it finish writing
    while time.monotonic() < deadline and len(digests(run)) != len(
        (run / "batches.rank1.jsonl").read_text().splitlines()
    ):
        time.sleep(1)
    steps = len(digests(run))
    assert steps == len((run / "batches.rank1.jsonl").read_text().splitlines())
    assert saved_step(run / "checkpoints" / "last.ckpt") == steps < 40


def test_under_slurm_lightning_neither_requeues_nor_handles_the_signals(tmp_path, monkeypatch):
    from lightning.fabric.plugins.environments import SLURMEnvironment

    from pretrain.config import to_config
    from pretrain.training.checkpoint_io import VerifiedCheckpointIO
    from pretrain.training.fit import build_trainer

    slurm = {"SLURM_NTASKS": "1", "SLURM_JOB_NAME": "pretrain", "SLURM_JOB_ID": "77", "SLURM_PROCID": "0"}
    slurm |= {"SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NODELIST": "node1"}
    for key, value in slurm.items():
        monkeypatch.setenv(key, value)
    trainer = build_trainer(to_config(compose(tmp_path / "run")), tmp_path / "run")
    environment = trainer._accelerator_connector.cluster_environment
    assert isinstance(environment, SLURMEnvironment) and environment.auto_requeue is False
    assert isinstance(trainer.strategy.checkpoint_io, VerifiedCheckpointIO)


@pytest.mark.slow
def test_ddp_a_failed_checkpoint_write_stops_every_rank(tmp_path, cache_root):
    # Only rank 0 writes: when its write fails every rank must stop with the error, not wait for it.
    run = tmp_path / "ddp"
    cmd = [sys.executable, "train.py", *SMALL, "progress_bar=true", "trainer=ddp", "trainer.accelerator=cpu"]
    cmd += ["trainer.devices=2", "trainer.precision=32-true", "train.max_steps=40"]
    cmd += ["train.checkpoint_every_n_steps=8", f"hydra.run.dir={run}"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("step 1/"):
            shutil.rmtree(run / "checkpoints")
            (run / "checkpoints").write_text("a file: the write at step 8 fails, also as root")
            break
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 2, err[-3000:]
    assert "error: could not write checkpoint" in err and "step000008.ckpt" in err
    assert not (run / "run.json").exists()
