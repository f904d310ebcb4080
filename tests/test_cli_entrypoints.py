"""The user-facing entry points as a user runs them: `python train.py`, `pretrain inspect-data`, and the
command line's one convention for outputs (`--output PATH` or `output=PATH`, every subcommand)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import DESIGN_KEYS, POLICIES

from pretrain.cli.command import parse_args

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
    # what the run chose, once: smoke asks for trainer=cpu, attn=auto picks sdpa there
    assert proc.stdout.count("device: CPU, precision 32-true, attention sdpa (auto)") == 1
    assert not (out / "train.log").exists()  # nothing was logged: Hydra's log file is never opened
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
    assert "attn=varlen needs a CUDA GPU" in proc.stderr and "attn=auto" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("policy", POLICIES)
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
    # The floors (data/measures/floors.py) are on every validation pair: the ones `pretrain eval` scores.
    floors = stats["floors"]
    assert floors["validation_pairs"] == stats["validation"]["prediction_pairs"] > 0
    assert 0 < floors["bigram"]["nats"] < floors["unigram"]["nats"] and 0 < floors["bigram"]["lambda"] < 1
    if policy == "padded":
        assert stats["padding_waste"] > 0 and stats["truncated_pairs"] > 0
    else:
        assert stats["padding_waste"] == 0 and stats["truncated_pairs"] == 0
    assert proc.stdout.strip().splitlines()[-1] == str(output.resolve())


def test_inspect_data_without_output_prints_its_table_and_writes_nothing(tmp_path, env):
    proc = subprocess.run(
        [sys.executable, "-m", "pretrain.cli", "inspect-data", "data=padded", "data.max_seq_len=128"],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(REPO / "src")},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "inspect-data: policy padded, max_seq_len 128" in proc.stdout
    assert "truncated_pairs" in proc.stdout and "padding_waste" in proc.stdout
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["inspect-data", "data=padded", "output=s.json"], ("inspect-data", "s.json")),
        (["inspect-data", "--output", "s.json", "data=padded"], ("inspect-data", "s.json")),
        (["eval", "c.ckpt", "data=padded", "output=e.json", "attn=sdpa"], ("eval", "e.json")),
        (["eval", "c.ckpt", "data=padded", "--output", "e.json", "attn=sdpa"], ("eval", "e.json")),
        (["export", "c.ckpt", "output=hf"], ("export", "hf")),
        (["export", "c.ckpt", "--output=hf"], ("export", "hf")),
        (["compare", "a", "output=x.png", "b"], ("compare", "x.png")),
        (["compare", "a", "b", "--output", "x.png"], ("compare", "x.png")),
    ],
)
def test_every_subcommand_takes_output_in_both_spellings(argv, expected):
    args = parse_args(argv)
    assert (args.command, args.output) == expected
    # output= is never left among the overrides (no config key is called output)
    assert not any(item.startswith("output=") for item in getattr(args, "overrides", []))
    if args.command == "eval":
        assert args.overrides == ["data=padded", "attn=sdpa"]
    if args.command == "compare":
        assert args.dirs == ["a", "b"]


def test_inspect_data_and_eval_need_no_output():
    assert parse_args(["inspect-data"]).output is None
    assert parse_args(["eval", "c.ckpt"]).output is None


@pytest.mark.parametrize(
    ("argv", "usage", "message"),
    [
        (["eval", "c.ckpt", "--bogus"], "usage: pretrain eval ", "unrecognized arguments: --bogus"),
        (["export", "c.ckpt"], "usage: pretrain export ", "the following arguments are required: --output"),
        (["eval", "c.ckpt", "--output"], "usage: pretrain eval ", "--output: expected one argument"),
        (["compare"], "usage: pretrain compare ", "the following arguments are required: dirs"),
        (["inspect-data", "--wandb"], "usage: pretrain inspect-data ", "unrecognized arguments: --wandb"),
    ],
)
def test_a_usage_error_shows_the_subcommands_usage(argv, usage, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_args(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert err.startswith(usage) and message in err
