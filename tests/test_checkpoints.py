"""Checkpoints: every write checked and recorded (sha256), verified on resume, pruned to
train.keep_checkpoints, ckpt_path=auto, and resumes that cannot train anything refused early."""

from __future__ import annotations

import hashlib
import re
import shutil
import warnings
from pathlib import Path

import lightning as L
import pytest
import torch
from helpers import SHARED_CACHE, TINY_RUN, module_cache_root
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pretrain.checkpoints.files import (
    CheckpointWarning,
    newest_valid_checkpoint,
    record_path,
    save_verified,
    verify_checkpoint,
    write_record,
)
from pretrain.config import load_config
from pretrain.errors import CheckpointError, ConfigError
from pretrain.training.run import train

# One cache for this module and test_preemption.py (the same session folder, under a file lock).
cache_root = module_cache_root(SHARED_CACHE)


SMALL = [*TINY_RUN, "progress_bar=false"]


def compose(out: Path, *overrides: str):
    return load_config([*SMALL, f"output_dir={out}", *overrides])


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory, cache_root) -> Path:
    """A finished 4-step run with a checkpoint at every step, all kept (step 4's is last.ckpt)."""
    out = tmp_path_factory.mktemp("saved") / "run"
    train(
        compose(out, "train.max_steps=4", "train.checkpoint_every_n_steps=1", "train.keep_checkpoints=null")
    )
    return out


def _copy(src: Path, dst: Path, with_record: bool = True) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    if with_record:
        # The record names the file: a copy under a new name gets a record for that name.
        digest = record_path(src).read_text().split()[0]
        record_path(dst).write_text(f"{digest}  {dst.name}\n")
    return dst


def test_every_checkpoint_is_recorded_with_its_sha256(saved_run):
    folder = saved_run / "checkpoints"
    names = sorted(p.name for p in folder.iterdir())
    assert names == [
        "last.ckpt",
        "last.ckpt.sha256",
        "step000001.ckpt",
        "step000001.ckpt.sha256",
        "step000002.ckpt",
        "step000002.ckpt.sha256",
        "step000003.ckpt",
        "step000003.ckpt.sha256",
    ]  # no step000004.ckpt: last.ckpt is step 4's, no two files for one step
    for ckpt in folder.glob("*.ckpt"):
        digest, name = record_path(ckpt).read_text().split()
        assert name == ckpt.name
        assert digest == hashlib.sha256(ckpt.read_bytes()).hexdigest()  # independent hash
        assert verify_checkpoint(ckpt) is True
    last = torch.load(folder / "last.ckpt", map_location="cpu", weights_only=False)
    assert last["global_step"] == 4


def test_keep_checkpoints_keeps_the_newest_periodic_ones(tmp_path, cache_root):
    out = tmp_path / "run"
    train(compose(out, "train.max_steps=5", "train.checkpoint_every_n_steps=1", "train.keep_checkpoints=2"))
    kept = sorted(p.name for p in (out / "checkpoints").glob("*.ckpt"))
    assert kept == [
        "last.ckpt",
        "step000004.ckpt",
    ]  # the newest two by step: 4 and 5, whose file is last.ckpt
    records = sorted(p.name for p in (out / "checkpoints").glob("*.sha256"))
    assert records == [f"{name}.sha256" for name in kept]  # pruned with their checkpoints


def test_a_flipped_byte_is_refused_naming_the_file(tmp_path, saved_run):
    bad = _copy(saved_run / "checkpoints" / "step000002.ckpt", tmp_path / "copies" / "flipped.ckpt")
    data = bytearray(bad.read_bytes())
    data[len(data) // 2] ^= 0x01
    bad.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"flipped\.ckpt is corrupt: its sha256") as error:
        train(compose(tmp_path / "resume", f"ckpt_path={bad}", "train.max_steps=4"))
    assert "\n" not in str(error.value)
    assert not (tmp_path / "resume" / "metrics.csv").exists()  # refused before any training


def test_an_empty_or_unreadable_checkpoint_is_named(tmp_path, cache_root):
    empty = tmp_path / "empty.ckpt"
    empty.write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"empty\.ckpt is empty \(0 bytes\)"):
        train(compose(tmp_path / "a", f"ckpt_path={empty}"))
    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(b"not a zip archive at all" * 10)
    with pytest.raises(CheckpointError, match=r"garbage\.ckpt is not a readable torch checkpoint"):
        train(compose(tmp_path / "b", f"ckpt_path={garbage}"))
    # A torch file that is not one of ours (e.g. from another program): one line, no traceback.
    foreign = tmp_path / "foreign.ckpt"
    torch.save({"state_dict": {}}, foreign)
    with (
        pytest.warns(CheckpointWarning),
        pytest.raises(CheckpointError, match=r"foreign\.ckpt is not a checkpoint"),
    ):
        train(compose(tmp_path / "c", f"ckpt_path={foreign}"))


def test_a_copy_without_its_record_loads_with_a_warning(tmp_path, saved_run):
    copy = _copy(saved_run / "checkpoints" / "step000002.ckpt", tmp_path / "moved.ckpt", with_record=False)
    with pytest.warns(CheckpointWarning, match=r"moved\.ckpt has no moved\.ckpt\.sha256 record"):
        summary = train(compose(tmp_path / "resume", f"ckpt_path={copy}", "train.max_steps=4"))
    assert summary["steps"] == 4 and summary["status"] == "completed"


def test_max_steps_at_or_below_the_checkpoint_step_is_refused_early(tmp_path, saved_run):
    ckpt = saved_run / "checkpoints" / "last.ckpt"  # step 4
    for max_steps in (3, 4):
        with pytest.raises(
            ConfigError, match=r"is at step 4 and train\.max_steps=\d: .*raise train\.max_steps"
        ):
            train(compose(tmp_path / f"m{max_steps}", f"ckpt_path={ckpt}", f"train.max_steps={max_steps}"))
        assert not (tmp_path / f"m{max_steps}" / "metrics.csv").exists()


def test_auto_takes_the_newest_checkpoint_and_refuses_what_it_cannot_verify(tmp_path, saved_run):
    run = tmp_path / "run"
    for name in ("step000001.ckpt", "step000002.ckpt", "step000003.ckpt"):
        _copy(saved_run / "checkpoints" / name, run / "checkpoints" / name)
    assert newest_valid_checkpoint(run) == run / "checkpoints" / "step000003.ckpt"
    # The newest is damaged: auto refuses (naming it) instead of silently dropping its steps.
    newest = run / "checkpoints" / "step000003.ckpt"
    newest.write_bytes(newest.read_bytes()[:-10] + b"0123456789")
    with pytest.raises(CheckpointError, match=r"cannot verify step000003\.ckpt \(differs from its record\)"):
        newest_valid_checkpoint(run)
    newest.unlink()
    # A checkpoint without a record is not trusted by auto: refused, with how to go on.
    record_path(run / "checkpoints" / "step000002.ckpt").unlink()
    with pytest.raises(CheckpointError, match=r"step000002\.ckpt \(no record\).*ckpt_path=.*hydra\.run\.dir"):
        newest_valid_checkpoint(run)
    assert newest_valid_checkpoint(tmp_path / "nothing-here") is None


def test_auto_without_a_checkpoint_starts_fresh_then_resumes(tmp_path, cache_root, capfd):
    out = tmp_path / "run"
    first = train(compose(out, "ckpt_path=auto", "train.max_steps=2", "train.checkpoint_every_n_steps=2"))
    assert first["steps"] == 2
    assert "ckpt_path=auto: no valid checkpoint" in capfd.readouterr().err
    second = train(compose(out, "ckpt_path=auto", "train.max_steps=3"))
    assert "ckpt_path=auto: resuming from" in capfd.readouterr().err
    assert second["steps"] == 3 and second["tokens"] > first["tokens"]


class _BreakCheckpointDir(L.Callback):
    """After the first update the checkpoint folder becomes a regular file: the next write fails for
    real (also as root, which file permissions do not stop)."""

    def on_train_batch_end(self, trainer, *args):
        folder = Path(trainer.default_root_dir) / "checkpoints"
        if trainer.global_step == 1 and folder.is_dir():
            shutil.rmtree(folder)
            folder.write_text("not a directory")


def test_a_failed_checkpoint_write_stops_the_run_naming_the_path(tmp_path, cache_root):
    out = tmp_path / "run"
    with pytest.raises(CheckpointError, match=r"could not write checkpoint .*step000002\.ckpt"):
        train(
            compose(out, "train.max_steps=4", "train.checkpoint_every_n_steps=2"),
            callbacks=[_BreakCheckpointDir()],
        )
    assert not (out / "run.json").exists()


def test_an_unusable_checkpoint_dir_fails_before_training(tmp_path, cache_root):
    out = tmp_path / "run"
    out.mkdir()
    (out / "checkpoints").write_text("a regular file where the folder should be")
    with pytest.raises(CheckpointError, match=r"cannot write checkpoints to .*checkpoints"):
        train(compose(out, "train.max_steps=2"))
    assert not (out / "metrics.csv").exists()


def test_save_verified_is_atomic_and_checked(tmp_path):
    target = tmp_path / "c" / "x.ckpt"
    digest = save_verified({"weights": torch.arange(10)}, target)
    assert digest == hashlib.sha256(target.read_bytes()).hexdigest()
    assert record_path(target).read_text() == f"{digest}  x.ckpt\n"
    assert [p.name for p in target.parent.iterdir() if p.name.startswith(".")] == []  # no temp left
    (tmp_path / "file").write_text("")
    with pytest.raises(CheckpointError, match=r"could not write checkpoint .*file/y\.ckpt"):
        save_verified({"weights": torch.arange(3)}, tmp_path / "file" / "y.ckpt")


def test_a_directory_checkpoint_has_a_manifest(tmp_path):
    shard = tmp_path / "step000010.ckpt"
    (shard / "sub").mkdir(parents=True)
    (shard / "meta.pt").write_bytes(b"meta")
    (shard / "sub" / "0.distcp").write_bytes(b"shard zero")
    write_record(shard)
    lines = record_path(shard).read_text().splitlines()
    assert lines == [
        f"{hashlib.sha256(b'meta').hexdigest()}  step000010.ckpt/meta.pt",
        f"{hashlib.sha256(b'shard zero').hexdigest()}  step000010.ckpt/sub/0.distcp",
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert verify_checkpoint(shard) is True
    (shard / "sub" / "0.distcp").write_bytes(b"shard zerO")
    with pytest.raises(CheckpointError, match=r"0\.distcp is corrupt"):
        verify_checkpoint(shard)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    files=st.dictionaries(
        st.from_regex(r"[a-z]{1,6}(/[a-z]{1,6})?", fullmatch=True),
        st.binary(min_size=1, max_size=64),
        min_size=1,
        max_size=4,
    ),
    pick=st.integers(min_value=0),
    bit=st.integers(min_value=0, max_value=7),
)
def test_a_manifest_catches_any_single_flipped_bit(tmp_path_factory, files, pick, bit):
    shard = tmp_path_factory.mktemp("shards") / "step000001.ckpt"
    paths = []
    for name, data in files.items():
        path = shard / name
        if (
            path.exists()
            or any(p == path or p in path.parents for p in paths)
            or any(path in p.parents for p in paths)
        ):
            continue  # a name that is also another's folder
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        paths.append(path)
    write_record(shard)
    assert verify_checkpoint(shard) is True
    victim = paths[pick % len(paths)]
    data = bytearray(victim.read_bytes())
    data[pick % len(data)] ^= 1 << bit
    victim.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=re.escape(f"{victim} is corrupt")):
        verify_checkpoint(shard)


@pytest.mark.parametrize("experiment", ["smoke", "demo"])
def test_the_quick_runs_keep_at_most_two_checkpoint_files(experiment):
    """Retention that fits the run: the smoke and demo runs stay far below 300 MB (~87 MB a file)."""
    from pretrain.config import to_config

    train_config = to_config(load_config([f"experiment={experiment}"])).train
    every, steps = train_config.checkpoint_every_n_steps, train_config.max_steps
    periodic = list(range(every, steps + 1, every)) if every else []
    kept = periodic[-(train_config.keep_checkpoints or len(periodic)) :] if periodic else []
    files = {*kept, steps}  # last.ckpt stands for the final step's periodic one
    assert len(files) <= 2, (experiment, sorted(files))
