"""Full disks and permissions (issue 17, item 8): one `error:` line naming the path and what to do,
exit 2, nothing partial left. ENOSPC is injected (an OSError where the write happens); permissions are
real, with root's capabilities dropped by setpriv (root ignores file modes otherwise)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import SHARED_CACHE, TINY_RUN, module_cache_root

from pretrain import cli, fileio
from pretrain.checkpoints import files as checkpoints
from pretrain.config import load_config
from pretrain.errors import CheckpointError, ConfigError, WriteError
from pretrain.hf import init_from, read_hf_config
from pretrain.model import GPT, GPTConfig
from pretrain.training.run import train

cache_root = module_cache_root(SHARED_CACHE)
SMALL = [*TINY_RUN, "progress_bar=false"]
REPO = Path(__file__).resolve().parents[1]
DROP = "-dac_override,-dac_read_search,-fowner"
SETPRIV = ["setpriv", f"--inh-caps={DROP}", f"--bounding-set={DROP}"]


def compose(out: Path, *overrides: str):
    return load_config([*SMALL, f"output_dir={out}", *overrides])


def _temporaries(folder: Path) -> list[str]:
    return sorted(
        p.name for p in folder.rglob("*") if p.name.endswith((".tmp", ".export")) or ".tmp-" in p.name
    )


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory, cache_root) -> Path:
    out = tmp_path_factory.mktemp("saved") / "run"
    train(compose(out, "train.max_steps=2"))
    return out


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_checkpoint_that_does_not_fit_is_one_line_and_leaves_no_temporary(
    tmp_path, cache_root, monkeypatch
):
    real_save = torch.save

    def half_then_full(obj, handle, *args, **kwargs):
        handle.write(b"x" * 1000)  # some bytes reach the disk, then torch's zip writer fails
        raise RuntimeError(
            "[enforce fail at inline_container.cc:664] . unexpected pos 64 vs 0: file write failed"
        )

    monkeypatch.setattr(checkpoints.torch, "save", half_then_full)
    out = tmp_path / "run"
    with pytest.raises(
        CheckpointError,
        match=r"could not write checkpoint .*step000002\.ckpt \(.*file write failed\); free disk space",
    ) as error:
        train(compose(out, "train.max_steps=3", "train.checkpoint_every_n_steps=2"))
    assert "\n" not in str(error.value)
    assert _temporaries(out) == [] and not list((out / "checkpoints").glob("*.ckpt"))
    monkeypatch.setattr(checkpoints.torch, "save", real_save)


def test_a_killed_writers_temporaries_are_removed_at_the_next_start(tmp_path, cache_root):
    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    dead = 2**22 + 12345  # above any pid_max: no such process
    stale = out / "checkpoints" / f".last.ckpt.{dead}.0123abcd.tmp"
    stale.write_bytes(b"x" * 4096)
    legacy = out / "checkpoints" / f".step000004.ckpt.tmp-{dead}"  # what earlier versions left
    legacy.write_bytes(b"x" * 4096)
    mine = out / f".run.json.{os.getpid()}.0123abcd.tmp"  # a live writer's: kept
    mine.write_text("{}")
    train(compose(out, "train.max_steps=1", "train.warmup_steps=0"))
    assert not stale.exists() and not legacy.exists() and mine.exists()


def test_enospc_in_metrics_csv_is_one_line_and_keeps_whole_rows(tmp_path, cache_root, monkeypatch):
    out = tmp_path / "run"
    monkeypatch.setattr(fileio.os, "fsync", _enospc)  # the rewrite (first row, new column) fails
    with pytest.raises(
        WriteError, match=rf"could not write {out / 'metrics.csv'}: No space left on device; free disk"
    ):
        train(compose(out, "train.max_steps=2"))
    assert _temporaries(out) == []


def test_eval_output_is_checked_before_evaluating_and_written_atomically(
    tmp_path, saved_run, monkeypatch, capsys
):
    ckpt = saved_run / "checkpoints" / "last.ckpt"
    folder = tmp_path / "a-folder"
    folder.mkdir()
    with pytest.raises(SystemExit) as exited:  # a directory given as the file: before any evaluation
        cli.main(["eval", str(tmp_path / "missing.ckpt"), f"output={folder}"])
    assert exited.value.code == 2
    assert "is a directory: give a file name" in capsys.readouterr().err
    target = tmp_path / "out" / "eval.json"
    monkeypatch.setattr(fileio.os, "fsync", _enospc)
    with pytest.raises(SystemExit) as exited:
        cli.main(["eval", str(ckpt), f"output={target}"])
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    disk_full = f"could not write {target}: No space left on device"
    assert err[-1] == f"error: {disk_full}; free disk space or pick another output=FILE"
    assert not target.exists() and _temporaries(target.parent) == []  # no 0-byte JSON
    monkeypatch.undo()
    assert cli.main(["eval", str(ckpt), f"output={target}"]) == 0
    assert json.loads(target.read_text())["step"] == 2


def test_export_on_a_full_disk_leaves_nothing(tmp_path, saved_run, monkeypatch, capsys):
    pytest.importorskip("transformers")
    import safetensors.torch

    monkeypatch.setattr(safetensors.torch, "save_file", _enospc)
    target = tmp_path / "hf"
    with pytest.raises(SystemExit) as exited:
        cli.main(["export", str(saved_run / "checkpoints" / "last.ckpt"), "--output", str(target)])
    assert exited.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line == (
        f"error: could not write the export to {target}: No space left on device; free disk space or "
        "pick another --output (nothing was left behind)"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_bad_init_from_directory_is_one_line(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"config\.json cannot be read"):
        read_hf_config(tmp_path)
    config = GPTConfig(vocab_size=50257, max_seq_len=32, n_layer=1, n_head=2, d_model=32)
    hf = {
        "model_type": "gpt2",
        "vocab_size": 50257,
        "n_layer": 1,
        "n_head": 2,
        "n_embd": 32,
        "n_positions": 32,
    }
    (tmp_path / "config.json").write_text(json.dumps(hf))
    (tmp_path / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00garbage!")
    with pytest.raises(ConfigError, match=r"model\.safetensors cannot be read .*re-export or re-download"):
        init_from(GPT(config, attn="sdpa"), tmp_path)


def _as_unprivileged(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.run(
        [*SETPRIV, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300, **kwargs
    )


needs_setpriv = pytest.mark.skipif(
    shutil.which("setpriv") is None, reason="setpriv (util-linux) drops root's capabilities"
)


@needs_setpriv
def test_read_only_outputs_are_refused_before_the_work(tmp_path, saved_run):
    read_only = tmp_path / "ro"
    read_only.mkdir()
    read_only.chmod(0o555)
    ckpt = str(saved_run / "checkpoints" / "last.ckpt")
    cases = {
        "eval": [sys.executable, "-m", "pretrain.cli", "eval", ckpt, f"output={read_only / 'e.json'}"],
        "export": [sys.executable, "-m", "pretrain.cli", "export", ckpt, "--output", str(read_only / "hf")],
        "train": [sys.executable, "train.py", *SMALL, f"hydra.run.dir={read_only / 'run'}"],
    }
    not_writable = f"{read_only} is not writable"
    says = {
        "eval": f"error: output={read_only / 'e.json'}: {not_writable}; pick another output=FILE",
        "export": f"error: --output {read_only / 'hf'}: {not_writable}; pick a folder you can write",
        "train": f"error: cannot create the run directory {read_only / 'run'}: {read_only} is not a writable",
    }
    for name, args in cases.items():
        proc = _as_unprivileged(args)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2, (name, proc.stderr[-2000:])
        assert len(lines) == 1 and lines[0].startswith(says[name]), (name, lines)
    assert list(read_only.iterdir()) == []
