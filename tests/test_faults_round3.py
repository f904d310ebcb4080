"""Reliability, round 3 (issue 28): no run is overwritten or mislabelled, and every write path and bad
value is one `error:` line with exit 2, nothing lost and no partial file."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import SHARED_CACHE, TINY_RUN, module_cache_root

from pretrain.config import load_config
from pretrain.errors import ConfigError
from pretrain.training.checkpoints import newest_valid_checkpoint
from pretrain.training.run import train
from pretrain.training.rundir import LOCK_NAME, RunLock

cache_root = module_cache_root(SHARED_CACHE)
SMALL = [*TINY_RUN, "progress_bar=false"]
REPO = Path(__file__).resolve().parents[1]


def compose(out: Path, *overrides: str):
    return load_config([*SMALL, f"output_dir={out}", *overrides])


def _digests(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != LOCK_NAME
    }


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory, cache_root) -> Path:
    """A finished run with step000001, step000002 and last.ckpt."""
    out = tmp_path_factory.mktemp("saved") / "run"
    train(compose(out, "train.max_steps=2", "train.checkpoint_every_n_steps=1", "train.warmup_steps=0"))
    return out


def _copy(saved_run: Path, to: Path) -> Path:
    shutil.copytree(saved_run, to)
    return to


# --- item 1: a fresh run never overwrites another run's checkpoints -------------------------------


def test_a_fresh_run_into_another_runs_checkpoints_is_refused_and_start_over_replaces_them(
    tmp_path, saved_run
):
    run = _copy(saved_run, tmp_path / "run")
    before = _digests(run)
    with pytest.raises(ConfigError, match=r"holds another run's checkpoints \(last\.ckpt, step000001"):
        train(compose(run, "train.max_steps=1", "train.warmup_steps=0"))
    assert _digests(run) == before  # nothing of the other run touched
    assert newest_valid_checkpoint(run) == run / "checkpoints" / "last.ckpt"

    # start_over=true: the old run's checkpoints go first, so ckpt_path=auto finds only the new run's.
    summary = train(
        compose(
            run,
            "train.max_steps=1",
            "train.warmup_steps=0",
            "train.checkpoint_every_n_steps=1",
            "start_over=true",
        )
    )
    assert summary["steps"] == 1
    names = sorted(p.name for p in (run / "checkpoints").glob("*.ckpt"))
    assert names == ["last.ckpt", "step000001.ckpt"]
    assert "step000002.ckpt" not in names  # the other run's newer step would have been resumed
    with pytest.raises(ConfigError, match="start_over=true deletes .* choose one of them"):
        train(compose(run, "start_over=true", "ckpt_path=auto"))


_HOLD = """
import sys, time
from pathlib import Path
from pretrain.training.rundir import RunLock
lock = RunLock(Path(sys.argv[1])).acquire()  # held while the object lives
print("locked", flush=True)
time.sleep(120)
"""


def _train_py(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.run(
        [sys.executable, "train.py", *SMALL, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_train_py_refusals_leave_the_live_runs_hydra_files_as_they_were(tmp_path, saved_run):
    """Items 1 and 2 through `python train.py`: Hydra writes .hydra/ and train.log before the job runs,
    so the lock and the fresh-start check come first."""
    run = _copy(saved_run, tmp_path / "run")
    (run / ".hydra").mkdir()
    (run / ".hydra" / "config.yaml").write_text("data:\n  policy: bestfit\n")
    (run / ".hydra" / "overrides.yaml").write_text("- data=bestfit\n")
    before = _digests(run)

    proc = _train_py(f"hydra.run.dir={run}", "data=padded")  # a fresh run onto its checkpoints
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith(f"error: {run / 'checkpoints'} holds another run's")
    assert "start_over=true" in lines[0]
    assert _digests(run) == before and not (run / "train.log").exists()

    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(run)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        proc = _train_py(f"hydra.run.dir={run}", "data=padded", "ckpt_path=auto")
    finally:
        holder.kill()
        holder.wait()
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith(f"error: {run} is in use by pid {holder.pid}")
    assert _digests(run) == before and not (run / "train.log").exists()


def test_the_lock_never_follows_a_symlink_and_a_directory_is_named_as_the_lock(tmp_path):
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me\n")
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / LOCK_NAME).symlink_to(victim)
    with pytest.raises(ConfigError, match=rf"the run lock {linked / LOCK_NAME} is a symbolic link"):
        RunLock(linked).acquire()
    assert victim.read_text() == "keep me\n"

    folder = tmp_path / "folder"
    (folder / LOCK_NAME).mkdir(parents=True)
    with pytest.raises(ConfigError, match=rf"the run lock {folder / LOCK_NAME} is a directory, not a lock"):
        RunLock(folder).acquire()
    RunLock(tmp_path / "plain").acquire().release()
