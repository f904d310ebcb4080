"""Checkpoint faults (issue 17, items 1-3 and 5): a crafted pickle never runs, in any of the four ways a
checkpoint is loaded; a record is compared before anything is unpickled; `ckpt_path=auto` never starts
over a directory holding checkpoints it cannot verify; one training process per run directory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import POLICIES, SHARED_CACHE, TINY_RUN, module_cache_root

from pretrain import cli
from pretrain.checkpoints.files import (
    load_checkpoint,
    newest_valid_checkpoint,
    record_path,
    verify_checkpoint,
    write_record,
)
from pretrain.config import load_config
from pretrain.errors import CheckpointError, ConfigError
from pretrain.training.run import train
from pretrain.training.rundir import LOCK_NAME, RunLock

cache_root = module_cache_root(SHARED_CACHE)  # shared with test_checkpoints/test_preemption
SMALL = [*TINY_RUN, "progress_bar=false"]
OLD = Path("/work/old-ckpts")


def compose(out: Path, *overrides: str):
    return load_config([*SMALL, f"output_dir={out}", *overrides])


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory, cache_root) -> Path:
    out = tmp_path_factory.mktemp("saved") / "run"
    train(compose(out, "train.max_steps=2", "train.checkpoint_every_n_steps=1"))
    return out


class _Payload:
    """Unpickling this touches `marker`: what an attacker's checkpoint would do with its code."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _crafted(path: Path, marker: Path, like: Path) -> Path:
    """A real checkpoint with one crafted object inside, and a record that vouches for it (an attacker
    who can write the file can write its record)."""
    checkpoint = torch.load(like, map_location="cpu", weights_only=True)
    checkpoint["pretrain"]["payload"] = _Payload(marker)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(checkpoint, path)
    write_record(path)
    return path


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("error: ")
    return err[0]


def test_a_crafted_pickle_never_runs_in_any_of_the_four_loads(tmp_path, saved_run, capsys):
    marker = tmp_path / "marker"
    last = saved_run / "checkpoints" / "last.ckpt"
    # 1. ckpt_path=FILE
    crafted = _crafted(tmp_path / "given" / "evil.ckpt", marker, last)
    with pytest.raises(CheckpointError, match=r"evil\.ckpt references \S+: refused without unpickling"):
        train(compose(tmp_path / "a", f"ckpt_path={crafted}", "train.max_steps=3"))
    assert not (tmp_path / "a").exists()  # a run that never started leaves no directory
    # 2. ckpt_path=auto, the file in the run's own checkpoint folder
    run = tmp_path / "auto"
    _crafted(run / "checkpoints" / "last.ckpt", marker, last)
    with pytest.raises(CheckpointError, match=r"cannot verify last\.ckpt \(holds objects a checkpoint never"):
        train(compose(run, "ckpt_path=auto", "train.max_steps=3"))
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["last.ckpt", "last.ckpt.sha256"]
    # 3. pretrain eval, 4. pretrain export: one line, exit 2, nothing written
    for argv in (["eval", str(crafted)], ["export", str(crafted), "--output", str(tmp_path / "hf")]):
        with pytest.raises(SystemExit) as exited:
            cli.main(argv)
        assert exited.value.code == 2
        assert "evil.ckpt references getattr: refused without unpickling" in _one_error_line(capsys)
    assert not (tmp_path / "hf").exists()
    assert not marker.exists()  # the payload never ran


def test_eval_and_export_refuse_a_checkpoint_that_fails_its_record(tmp_path, saved_run, capsys):
    bad = tmp_path / "bad.ckpt"
    shutil.copyfile(saved_run / "checkpoints" / "last.ckpt", bad)
    record_path(bad).write_text(
        record_path(saved_run / "checkpoints" / "last.ckpt").read_text().replace("last", "bad")
    )
    data = bytearray(bad.read_bytes())
    data[len(data) // 2] ^= 0x10
    bad.write_bytes(bytes(data))
    for argv in (
        ["eval", str(bad), f"output={tmp_path / 'e.json'}"],
        ["export", str(bad), "--output", str(tmp_path / "hf")],
    ):
        with pytest.raises(SystemExit) as exited:
            cli.main(argv)
        assert exited.value.code == 2
        assert "bad.ckpt is corrupt: its sha256" in _one_error_line(capsys)
    assert not (tmp_path / "e.json").exists() and not (tmp_path / "hf").exists()


def test_export_refuses_an_existing_output_before_loading(tmp_path, capsys):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    with pytest.raises(SystemExit) as exited:  # the checkpoint does not even exist: never read
        cli.main(["export", str(tmp_path / "missing.ckpt"), "--output", str(taken)])
    assert exited.value.code == 2
    assert "exists and is not an empty directory" in _one_error_line(capsys)
    assert (taken / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize("policy", POLICIES)
def test_a_checkpoint_of_every_policy_loads_weights_only_and_resumes_through_lightning(
    tmp_path, cache_root, policy
):
    out = tmp_path / "run"
    train(compose(out, f"data={policy}", "train.max_steps=2"))
    checkpoint = load_checkpoint(out / "checkpoints" / "last.ckpt", require_record=True)
    assert checkpoint["global_step"] == 2
    assert checkpoint["optimizer_states"][0]["state"]  # AdamW moments
    assert checkpoint["lr_schedulers"][0]["last_epoch"] == 2
    assert checkpoint["PretrainDataModule"]["train_sampler"]["units"] == 2 * 2  # updates x train.batch_size
    # Lightning's own resume reads through VerifiedCheckpointIO: weights_only, record first.
    resumed = train(compose(out, f"data={policy}", "train.max_steps=3", "ckpt_path=auto"))
    assert resumed["steps"] == 3 and resumed["status"] == "completed"


@pytest.mark.skipif(not OLD.is_dir(), reason="checkpoints written before weights_only loading")
@pytest.mark.parametrize("name", sorted(p.name for p in OLD.iterdir()) if OLD.is_dir() else [])
def test_checkpoints_written_before_this_change_still_load(name):
    run = OLD / name
    for path in sorted((run / "checkpoints").glob("*.ckpt")):
        checkpoint = load_checkpoint(path, require_record=True)
        assert checkpoint["hyper_parameters"]["model"]["n_layer"] >= 1
    assert newest_valid_checkpoint(run) == run / "checkpoints" / "last.ckpt"


def test_auto_never_starts_over_checkpoints_without_records(tmp_path, saved_run):
    run = tmp_path / "run"
    shutil.copytree(saved_run, run)
    for record in (run / "checkpoints").glob("*.sha256"):
        record.unlink()
    before = {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()}
    metrics = (run / "metrics.csv").read_text()
    with pytest.raises(CheckpointError) as error:
        train(compose(run, "ckpt_path=auto", "train.max_steps=4"))
    message = str(error.value)
    assert "\n" not in message
    assert "last.ckpt (no record)" in message and "step000001.ckpt (no record)" in message
    assert f"ckpt_path={run / 'checkpoints'}/<name>" in message and "hydra.run.dir=" in message
    assert {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()} == before  # untouched
    assert (run / "metrics.csv").read_text() == metrics


def test_verification_reads_no_pickle(tmp_path, saved_run, monkeypatch):
    path = saved_run / "checkpoints" / "last.ckpt"

    def refuse(*args, **kwargs):
        raise AssertionError("unpickled during verification")

    monkeypatch.setattr(torch, "load", refuse)
    assert verify_checkpoint(path, require_record=True) is True


_HOLD = """
import sys, time
from pathlib import Path
from pretrain.training.rundir import RunLock
lock = RunLock(Path(sys.argv[1])).acquire()  # held while the object lives
print("locked", flush=True)
time.sleep(60)
"""


def test_a_second_process_in_a_run_directory_is_refused_naming_the_holder(tmp_path, saved_run):
    run = tmp_path / "run"
    run.mkdir()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(run)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with pytest.raises(ConfigError, match=rf"{run} is in use by pid {holder.pid} on .*: two runs"):
            train(compose(run, "train.max_steps=2"))
        assert sorted(p.name for p in run.iterdir()) == [LOCK_NAME]  # nothing else written
    finally:
        holder.kill()
        holder.wait()
    # The holder is gone (killed: its lock file stays): the lock is taken over.
    assert "pid" in (run / LOCK_NAME).read_text()
    summary = train(compose(run, "train.max_steps=1", "train.warmup_steps=0"))
    assert summary["status"] == "completed"
    assert json.loads((run / "run.json").read_text())["steps"] == 1


def test_the_lock_is_held_for_the_whole_run_and_released(tmp_path):
    lock = RunLock(tmp_path).acquire()
    with pytest.raises(ConfigError, match=f"pid {os.getpid()}"):
        RunLock(tmp_path).acquire()
    lock.release()
    RunLock(tmp_path).acquire().release()
