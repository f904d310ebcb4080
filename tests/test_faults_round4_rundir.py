"""Reliability, round 4 (issue 42 items 1, 3, 8, 11): the run directory's lifecycle. start_over deletes
only regular files inside its run; a fresh run replaces neither checkpoints nor metrics.csv; every
refusal of `python train.py` comes before anything is made, or leaves the directory as it found it
(Hydra unable to write `.hydra/` on a full disk included): one `error:` line, exit 2."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import SHARED_CACHE, TINY_RUN, cli_env, module_cache_root
from helpers.trained_tokenizers import small_bpe

from pretrain.config import load_config
from pretrain.errors import ConfigError
from pretrain.training.run import train
from pretrain.training.rundir import LOCK_NAME, check_fresh_start, remove_checkpoints

cache_root = module_cache_root(SHARED_CACHE)
SMALL = [*TINY_RUN, "progress_bar=false"]
REPO = Path(__file__).resolve().parents[1]
EOS = "<|endoftext|>"


def _digests(folder: Path) -> dict[str, str]:
    """Every entry under `folder` (links as their target, not followed) and each file's sha256 (a run
    lock's presence only: whoever takes it writes its pid there)."""
    found = {}
    for path in sorted(folder.rglob("*")):
        if path.name == LOCK_NAME:
            found[str(path.relative_to(folder))] = "lock"
        elif path.is_symlink():
            found[str(path.relative_to(folder))] = "-> " + os.readlink(path)
        elif path.is_file():
            found[str(path.relative_to(folder))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory, cache_root) -> Path:
    """A finished run with step000001, step000002 and last.ckpt (and their records)."""
    out = tmp_path_factory.mktemp("saved") / "run"
    overrides = ["train.max_steps=2", "train.checkpoint_every_n_steps=1", "train.warmup_steps=0"]
    train(load_config([*SMALL, f"output_dir={out}", *overrides]))
    return out


def _train_py(cache_root: Path, *args: str, probe: str | None = None) -> subprocess.CompletedProcess:
    """`python train.py SMALL args` (under `probe`, a script that runs train.py, when given)."""
    command = [sys.executable, "train.py"] if probe is None else [sys.executable, "-c", probe]
    return subprocess.run(
        [*command, *SMALL, *args],
        cwd=REPO,
        env={**cli_env(cache_root), "PYTHONPATH": str(REPO / "src")},
        capture_output=True,
        text=True,
        timeout=300,
    )


def _one_error_line(proc: subprocess.CompletedProcess) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


# --- item 1: start_over deletes only regular files inside its run directory ----------------------


def _fake_run(folder: Path) -> Path:
    """A run directory with two checkpoints (and records) of dummy bytes: start_over never reads them."""
    (folder / "checkpoints").mkdir(parents=True)
    for name in ("last.ckpt", "step000002.ckpt"):
        (folder / "checkpoints" / name).write_bytes(b"checkpoint")
        (folder / "checkpoints" / f"{name}.sha256").write_text("0" * 64 + "\n")
    return folder


def _plant(kind: str, run: Path, other: Path) -> None:
    """In `run`, what would make start_over reach outside it (`other` is another run)."""
    folder = run / "checkpoints"
    if kind == "checkpoints folder is a link":
        shutil.rmtree(folder)
        folder.symlink_to(other / "checkpoints", target_is_directory=True)
    elif kind == "checkpoint links to a file":
        (folder / "step000009.ckpt").symlink_to(other / "checkpoints" / "last.ckpt")
    elif kind == "checkpoint links to a folder":
        (folder / "step000009.ckpt").symlink_to(other / "checkpoints", target_is_directory=True)
    elif kind == "record links to a file":
        (folder / "last.ckpt.sha256").unlink()
        (folder / "last.ckpt.sha256").symlink_to(other / "checkpoints" / "last.ckpt.sha256")
    elif kind == "checkpoint is a FIFO":
        os.mkfifo(folder / "step000009.ckpt")
    elif kind == "link inside a sharded checkpoint":
        (folder / "step000009.ckpt").mkdir()
        (folder / "step000009.ckpt" / "__0_0.distcp").symlink_to(other / "checkpoints" / "last.ckpt")


LINKS = [
    "checkpoints folder is a link",
    "checkpoint links to a file",
    "checkpoint links to a folder",
    "record links to a file",
    "checkpoint is a FIFO",
    "link inside a sharded checkpoint",
]


@pytest.mark.parametrize("kind", LINKS)
def test_start_over_refuses_what_is_not_its_own_regular_file_before_deleting_anything(tmp_path, kind):
    other, run = _fake_run(tmp_path / "other"), _fake_run(tmp_path / "run")
    _plant(kind, run, other)
    before = _digests(tmp_path)
    with pytest.raises(ConfigError, match=r"^start_over=true deletes only regular files inside ") as error:
        check_fresh_start(run, None, start_over=True)
    assert "\n" not in str(error.value) and "nothing was deleted" in str(error.value)
    what = "is not a regular file" if "FIFO" in kind else "is a symbolic link (to "
    assert what in str(error.value)
    assert _digests(tmp_path) == before


def test_start_over_still_deletes_checkpoint_files_and_sharded_folders(tmp_path):
    run = _fake_run(tmp_path / "run")
    sharded = run / "checkpoints" / "step000004.ckpt"
    (sharded / "nested").mkdir(parents=True)
    (sharded / "meta.pt").write_bytes(b"meta")
    (sharded / "nested" / "__0_0.distcp").write_bytes(b"shard")
    check_fresh_start(run, None, start_over=True)  # nothing refused
    assert [p.name for p in remove_checkpoints(run)] == ["last.ckpt", "step000002.ckpt", "step000004.ckpt"]
    assert list((run / "checkpoints").iterdir()) == []


def test_train_py_start_over_through_a_linked_checkpoints_folder_is_one_line(tmp_path, saved_run, cache_root):
    other = shutil.copytree(saved_run, tmp_path / "other")
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoints").symlink_to(other / "checkpoints", target_is_directory=True)
    before = _digests(tmp_path)
    proc = _train_py(cache_root, f"hydra.run.dir={run}", "start_over=true", "train.max_steps=2")
    line = _one_error_line(proc)
    assert line.startswith(f"error: start_over=true deletes only regular files inside {run}, and ")
    assert _digests(tmp_path) == before and sorted(os.listdir(run)) == ["checkpoints"]


# --- item 11: a fresh run does not replace an earlier run's metrics.csv --------------------------


def test_a_fresh_run_onto_an_earlier_runs_metrics_is_refused(tmp_path, saved_run, cache_root):
    run = shutil.copytree(saved_run, tmp_path / "run", ignore=shutil.ignore_patterns("checkpoints"))
    before = _digests(run)
    proc = _train_py(cache_root, f"hydra.run.dir={run}", "train.max_steps=2")
    line = _one_error_line(proc)
    assert line.startswith(f"error: {run / 'metrics.csv'} holds another run's metrics (and no checkpoint)")
    assert "start_over=true" in line and "ckpt_path=" in line
    assert _digests(run) == before
    check_fresh_start(run, None, start_over=True)  # what the line offers: allowed
    check_fresh_start(run, "auto", start_over=False)


# --- item 8: refusals come before the run directory is made --------------------------------------


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory) -> dict[str, Path]:
    """tokenizer.json files (and folders) that a run refuses, by name."""
    root = tmp_path_factory.mktemp("tokenizers")
    for folder in ("good", "no-eos", "not-json", "bad-config"):
        (root / folder).mkdir()
    good = small_bpe(root / "good" / "tokenizer.json")
    unnamed = small_bpe(root / "no-eos" / "tokenizer.json", special_tokens=("<pad>", "<stop>"))
    (root / "not-json" / "tokenizer.json").write_text("{not json")
    shutil.copy(good, root / "bad-config" / "tokenizer.json")
    (root / "bad-config" / "tokenizer_config.json").write_text("{bad")
    os.mkfifo(root / "fifo.json")
    return {
        "good": good,
        "no_eos": unnamed,
        "not_json": root / "not-json" / "tokenizer.json",
        "bad_config": root / "bad-config" / "tokenizer.json",
        "fifo": root / "fifo.json",
        "folder": root / "good",
        "missing": root / "absent.json",
        "wide": _wide_tokenizer(root / "wide" / "tokenizer.json"),
    }


def _wide_tokenizer(path: Path) -> Path:
    """A word-level tokenizer whose ids go past 65,535 (built, not trained: instant)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    vocab = {f"w{i}": i for i in range(65_600)} | {EOS: 65_600}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="w0"))
    tokenizer.add_special_tokens([EOS])
    path.parent.mkdir(parents=True)
    tokenizer.save(str(path))
    return path


REFUSALS = {  # name: (overrides, {placeholders} filled by _filled; what the line says)
    "tokenizer file missing": (["tokenizer.file={tok_missing}"], "is not a file"),
    "tokenizer not JSON": (["tokenizer.file={tok_not_json}"], "is not a tokenizer.json the tokenizers"),
    "tokenizer without EOS": (["tokenizer.file={tok_no_eos}"], "names no EOS token"),
    "tokenizer unknown EOS": (["tokenizer.file={tok_good}", "tokenizer.eos_token=nope"], "is not a token of"),
    "tokenizer_config.json bad": (
        ["tokenizer.file={tok_bad_config}"],
        "tokenizer_config.json cannot be read",
    ),
    "tokenizer a folder": (["tokenizer.file={tok_folder}"], "is not a file"),
    "tokenizer a FIFO": (["tokenizer.file={tok_fifo}"], "is not a file"),
    "tokenizer ids over uint16": (
        ["tokenizer.file={tok_wide}", "cache.token_dtype=uint16"],
        "cache.token_dtype=uint16 cannot hold",
    ),
    "init_from another shape": (["model.init_from={gpt2}"], "has another shape"),
    "checkpoint missing": (["ckpt_path={missing}"], "missing.ckpt"),
    "checkpoint of another context": (["ckpt_path={ckpt}", "data.max_seq_len=64"], "data.max_seq_len=32"),
}


def _filled(overrides: list[str], tmp_path: Path, tokenizers: dict[str, Path], saved_run: Path) -> list[str]:
    """The overrides with their files: tokenizers (tokenizer=json added), a GPT-2 directory of another
    shape, the saved run's checkpoint, a missing one."""
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir(exist_ok=True)
    shape = {"model_type": "gpt2", "vocab_size": 50257, "n_layer": 3, "n_head": 2, "n_embd": 32}
    (gpt2 / "config.json").write_text(json.dumps({**shape, "n_positions": 32}))
    values = {f"tok_{name}": str(path) for name, path in tokenizers.items()}
    values |= {"gpt2": str(gpt2), "ckpt": str(saved_run / "checkpoints" / "last.ckpt")}
    values["missing"] = str(tmp_path / "missing.ckpt")
    filled = [override.format(**values) for override in overrides]
    return (["tokenizer=json"] if "{tok_" in " ".join(overrides) else []) + filled


@pytest.mark.parametrize("name", list(REFUSALS))
def test_a_refused_train_py_run_makes_no_run_directory(tmp_path, name, tokenizers, saved_run, cache_root):
    overrides, says = REFUSALS[name]
    run = tmp_path / "run"
    proc = _train_py(cache_root, f"hydra.run.dir={run}", *_filled(overrides, tmp_path, tokenizers, saved_run))
    assert says in _one_error_line(proc)
    assert not run.exists()


@pytest.mark.parametrize("name", ["tokenizer not JSON", "checkpoint of another context"])
def test_a_refused_run_leaves_an_existing_directory_as_it_was(
    tmp_path, name, tokenizers, saved_run, cache_root
):
    overrides, says = REFUSALS[name]
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)  # an earlier refused or hand-made run's files
    (run / ".hydra" / "config.yaml").write_text("seed: 1\n")
    (run / "notes.txt").write_text("kept\n")
    before = _digests(run)
    proc = _train_py(cache_root, f"hydra.run.dir={run}", *_filled(overrides, tmp_path, tokenizers, saved_run))
    assert says in _one_error_line(proc)
    assert _digests(run) == before and sorted(os.listdir(run)) == [".hydra", "notes.txt"]


# --- item 3: Hydra cannot write the run directory (a full disk) ----------------------------------

# train.py with Hydra's `_save_config` failing as on a full disk, after a part of `.hydra/` is written.
_FULL_DISK = """
import errno, os, runpy, sys
import hydra.core.utils as utils
def full(cfg, filename, output_dir):
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / filename).write_text("# half")
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
utils._save_config = full
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path("train.py", run_name="__main__")
"""


@pytest.mark.parametrize("existing", [False, True], ids=["new directory", "existing directory"])
def test_hydra_on_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, cache_root, existing):
    run = tmp_path / "run"
    if existing:
        run.mkdir()
        (run / "notes.txt").write_text("kept\n")
    proc = _train_py(cache_root, f"hydra.run.dir={run}", "train.max_steps=2", probe=_FULL_DISK)
    assert _one_error_line(proc) == (
        f"error: cannot write the run directory {run}: No space left on device; free disk space or run "
        "elsewhere with hydra.run.dir=DIR"
    )
    assert (sorted(os.listdir(run)) == ["notes.txt"]) if existing else not run.exists()
