"""The user-facing entry points as a user runs them: `python train.py` and `pretrain inspect-data`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import DESIGN_KEYS

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict:
    cache = tmp_path_factory.mktemp("cache")
    return {
        **os.environ,
        "PRETRAIN_CACHE_ROOT": str(cache),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
    }


def _run(args: list[str], env: dict, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def test_train_py_runs_and_reports_where_outputs_went(tmp_path, env):
    out = tmp_path / "run"
    proc = _run(
        [
            sys.executable,
            "train.py",
            "experiment=smoke",
            "train.max_steps=3",
            "progress_bar=false",
            f"hydra.run.dir={out}",
        ],
        env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in (
        "metrics.csv",
        "run.json",
        "compare.png",
        "compare.md",
        "checkpoints/last.ckpt",
        ".hydra/config.yaml",
    ):
        assert (out / name).exists(), name
    assert f"outputs: {out}" in proc.stdout  # where everything went: stdout, not stderr
    assert f"outputs: {out}" not in proc.stderr
    assert "GPU available" not in proc.stderr + proc.stdout and "TPU available" not in proc.stderr
    summary = json.loads((out / "run.json").read_text())
    assert summary["steps"] == 3 and summary["policy"] == "bestfit" and summary["attn"] == "sdpa"
    # smoke: 4 packs of 128 per step, all real tokens
    assert summary["tokens"] == 3 * 4 * 128


def test_train_py_bad_config_exits_2_with_the_fix(tmp_path, env):
    proc = _run(
        [sys.executable, "train.py", "experiment=smoke", "attn=varlen", f"hydra.run.dir={tmp_path / 'x'}"],
        env,
    )
    assert proc.returncode == 2
    assert "attn=varlen runs only on CUDA" in proc.stderr and "attn=sdpa" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("policy", ["padded", "prepacked", "bestfit"])
def test_inspect_data_writes_every_design_key(tmp_path, env, policy):
    output = tmp_path / f"{policy}.json"
    proc = _run(
        [sys.executable, "-m", "pretrain.cli", "inspect-data", f"data={policy}", f"output={output}"], env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    stats = json.loads(output.read_text())
    assert DESIGN_KEYS <= set(stats)
    assert stats["train_validation_overlap"] == 0
    assert stats["prediction_pairs"] == stats["raw_tokens"] - stats["documents"]
    if policy == "padded":
        assert stats["padding_waste"] > 0 and stats["truncated_pairs"] > 0
    else:
        assert stats["padding_waste"] == 0 and stats["truncated_pairs"] == 0
    assert proc.stdout.strip().splitlines()[-1] == str(output.resolve())


def test_inspect_data_without_output_is_a_clear_error(env):
    proc = _run([sys.executable, "-m", "pretrain.cli", "inspect-data"], env)
    assert proc.returncode == 2 and "output=FILE" in proc.stderr
