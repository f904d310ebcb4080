"""What a first run outside the usual setup is told in one line: train.py without the project's
environment says how to enter it; a new cache root (it will tokenize anew) and a new outputs/ folder
(a run started from another directory) are named."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from helpers import local_overrides, write_jsonl

from pretrain.config import load_config, to_config
from pretrain.data.ingest.cache import CacheSpec
from pretrain.data.ingest.prepare import prepare_cache
from pretrain.training import machine_load

REPO = Path(__file__).resolve().parents[1]


def test_train_py_without_the_environment_says_how_to_enter_it(tmp_path):
    fake = tmp_path / "shadow" / "pretrain"  # a pretrain whose dependencies are missing
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(fake.parent)}
    proc = subprocess.run(
        [sys.executable, str(REPO / "train.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot import 'torch'")
    assert "source .venv/bin/activate" in lines[0] and "make install" in lines[0]


def test_a_run_from_another_directory_names_its_new_outputs_folder(tmp_path, monkeypatch, capsys):
    spec = importlib.util.spec_from_file_location("train_entry", REPO / "train.py")
    assert spec is not None and spec.loader is not None
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(machine_load, "load_per_cpu", lambda: 0.5)  # no busy-machine note here
    train.check_overrides(["experiment=smoke"])
    err = capsys.readouterr().err
    assert err == (
        f"note: new outputs/ folder in {tmp_path} (runs go under the working directory); run from the "
        "project to keep its runs together, or set hydra.run.dir=DIR\n"
    )
    (tmp_path / "outputs").mkdir()
    train.check_overrides(["experiment=smoke"])
    assert capsys.readouterr().err == ""  # an existing folder: nothing to say


def test_a_new_cache_root_is_named_before_it_tokenizes(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("PRETRAIN_CACHE_ROOT", raising=False)
    files = [write_jsonl(tmp_path / "docs.jsonl", [f"document {i} " * 20 for i in range(12)])]
    root = tmp_path / "elsewhere" / "data-cache"
    config = to_config(
        load_config([*local_overrides(files), f"cache_root={root}", "split.validation_fraction=0.3"])
    )
    prepare_cache(CacheSpec.from_config(config), progress=False)
    err = capsys.readouterr().err
    assert f"note: new cache root {root} (a relative cache_root is under the working directory)" in err
    prepare_cache(CacheSpec.from_config(config), progress=False)
    assert "new cache root" not in capsys.readouterr().err  # reused
