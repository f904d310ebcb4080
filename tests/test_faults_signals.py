"""Signal faults (issue 17, item 7): our handlers act from the first line of a run to its last (never
Lightning's); a signal before training ends the run as a preemption without a step; a second Ctrl-C
always aborts with 130; a signal after training leaves run.json and the exit status agreeing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import pytest
from helpers import SHARED_CACHE, TINY_RUN, module_cache_root

from pretrain.config import load_config
from pretrain.training.preemption import Interrupted
from pretrain.training.run import train

cache_root = module_cache_root(SHARED_CACHE)
SMALL = [*TINY_RUN, "progress_bar=false"]
REPO = Path(__file__).resolve().parents[1]


def compose(out: Path, *overrides: str):
    return load_config([*SMALL, f"output_dir={out}", *overrides])


class SignalInSetup(L.Callback):
    """A signal while fit() sets up (where the cache is built), before the first update."""

    def __init__(self, signum: int):
        self.signum = signum

    def setup(self, trainer, pl_module, stage: str) -> None:
        os.kill(os.getpid(), self.signum)


class Record(L.Callback):
    """Which SIGTERM handler is in place while training (Lightning installs its own in fit())."""

    def __init__(self):
        self.handlers: list = []

    def on_train_batch_end(self, trainer, *args) -> None:
        self.handlers.append(signal.getsignal(signal.SIGTERM))


class SignalAt(L.Callback):
    def __init__(self, step: int, *signums: int, hook: str = "batch"):
        self.step, self.signums, self.hook = step, signums, hook

    def _send(self) -> None:
        for signum in self.signums:
            os.kill(os.getpid(), signum)

    def on_train_batch_end(self, trainer, *args) -> None:
        if self.hook == "batch" and trainer.global_step == self.step:
            self._send()

    def on_train_end(self, trainer, pl_module) -> None:
        if self.hook == "end":
            self._send()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1])
def test_a_signal_before_training_is_a_preemption_without_a_step(tmp_path, cache_root, signum):
    out = tmp_path / "run"
    summary = train(compose(out, "train.max_steps=3"), callbacks=[SignalInSetup(signum)])
    assert summary["status"] == "preempted" and summary["signal"] == signum.name
    assert summary["exit_code"] == 128 + signum and summary["steps"] == 0
    assert json.loads((out / "run.json").read_text())["status"] == "preempted"
    assert not (out / "checkpoints" / "last.ckpt").exists()  # nothing trained, nothing saved


def test_our_handler_is_in_place_while_training(tmp_path, cache_root):
    record = Record()
    train(compose(tmp_path / "run", "train.max_steps=2"), callbacks=[record])
    assert record.handlers and all(
        getattr(h, "__self__", None).__class__.__name__ == "Signals" for h in record.handlers
    )


def test_a_second_ctrl_c_aborts_without_a_checkpoint(tmp_path, cache_root):
    out = tmp_path / "run"
    with pytest.raises(Interrupted) as error:
        train(compose(out, "train.max_steps=5"), callbacks=[SignalAt(1, signal.SIGINT, signal.SIGINT)])
    assert error.value.exit_code == 130 and error.value.abort
    assert not (out / "checkpoints" / "last.ckpt").exists() and not (out / "run.json").exists()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored


def test_a_signal_after_the_last_update_agrees_with_run_json(tmp_path, cache_root):
    out = tmp_path / "run"
    summary = train(compose(out, "train.max_steps=2"), callbacks=[SignalAt(0, signal.SIGTERM, hook="end")])
    report = json.loads((out / "run.json").read_text())
    assert summary["status"] == report["status"] == "completed"
    assert summary["exit_code"] == report["exit_code"] == 0 and summary["steps"] == 2
    assert (out / "checkpoints" / "last.ckpt").is_file()


def _start(run: Path, *overrides: str) -> subprocess.Popen:
    cmd = [sys.executable, "train.py", *SMALL, f"hydra.run.dir={run}", *overrides]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_while_train_py_starts_exits_as_a_preemption(tmp_path, cache_root, signum, code):
    proc = _start(tmp_path / "run", "train.max_steps=3")
    time.sleep(1.0)  # importing torch / composing: before training
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err[-2000:]
    assert "Traceback" not in err
