"""Config faults (issue 17, items 6 and 9): settings that would train badly are refused by the schema
with their valid range; composition errors of `python train.py` and `pretrain` are one `error:` line
with exit 2 and leave no run directory; the resume command survives any run directory name."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import SHARED_CACHE, TINY_RUN, module_cache_root

from pretrain import cli
from pretrain.config import load_config, to_config
from pretrain.errors import ConfigError
from pretrain.training.run import train
from pretrain.training.summary import hydra_quote

cache_root = module_cache_root(SHARED_CACHE)
REPO = Path(__file__).resolve().parents[1]
DATA_OPTIONS = ", ".join(sorted(p.stem for p in (REPO / "conf" / "data").glob("*.yaml")))  # one line


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("train.min_lr_ratio=-1", "train.min_lr_ratio=-1.0 must be in [0.0, 1.0]"),
        ("train.min_lr_ratio=1.5", "train.min_lr_ratio=1.5 must be in [0.0, 1.0]"),
        ("train.weight_decay=-0.1", "train.weight_decay=-0.1 must be >= 0.0"),
        ("train.grad_clip=-1", "train.grad_clip=-1.0 must be > 0, or null for no clipping"),
        ("train.warmup_steps=500", "train.warmup_steps=500 must be <= train.max_steps=200"),
        (
            "train.batch_size=null train.microbatch_tokens=100",
            "train.microbatch_tokens=100 is less than one row of data.max_seq_len=512",
        ),
        ("train.betas=[0.9]", "train.betas=[0.9] must be two numbers in [0, 1)"),
        ("train.betas=[0.9,1.0]", "train.betas=[0.9, 1.0] must be two numbers in [0, 1)"),
        ("model.vocab_size=1000", "model.vocab_size=1000 must be >= 50257"),
        ("trainer.devices=0", "trainer.devices=0 must be a count >= 1, -1 (all), auto or a list"),
        ("trainer.num_nodes=0", "trainer.num_nodes=0 must be >= 1"),
        ("seed=-1", "seed=-1 must be in [0, 4294967295]"),
        ("train.accumulation=0", "train.accumulation must be a positive integer, got 0"),
    ],
)
def test_settings_that_would_train_badly_are_refused_with_their_range(override, says):
    with pytest.raises(ConfigError) as error:
        to_config(load_config(override.split()))
    assert str(error.value).startswith(says)


def test_the_edges_of_each_range_are_accepted():
    config = to_config(
        load_config(
            ["train.min_lr_ratio=0", "train.weight_decay=0", "train.grad_clip=null", "train.warmup_steps=200"]
        )
    )
    assert config.train.min_lr_ratio == 0 and config.train.grad_clip is None
    assert to_config(load_config(["train.min_lr_ratio=1", "trainer.devices=-1", "seed=0"])).seed == 0


def test_a_batch_larger_than_an_epoch_is_refused_naming_its_size(tmp_path, cache_root):
    out = tmp_path / "run"
    with pytest.raises(
        ConfigError,
        match=r"train\.batch_size=100000 is more than an epoch of the train split, which has [\d,]+ packs: "
        r"set train\.batch_size<=\d+",
    ):
        train(load_config([*TINY_RUN, "progress_bar=false", f"output_dir={out}", "train.batch_size=100000"]))
    assert not out.exists()  # nothing trained: no run directory left


def _train_py(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.run(
        [sys.executable, "train.py", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )


def test_train_py_composition_errors_are_one_line_exit_2_and_make_no_directory(tmp_path):
    cases = {
        "train.lr=abc": "error: Error merging override train.lr=abc",
        "nosuchkey=1": "error: Could not override 'nosuchkey'",
        "data=foo": f"error: data=foo: no such option; choose one of {DATA_OPTIONS}",
        "train.min_lr_ratio=-1": "error: train.min_lr_ratio=-1.0 must be in [0.0, 1.0]",
        "attn=flex": "error: attn=flex cannot train on CPU",  # the backend check comes before Lightning too
    }
    if not torch.cuda.is_available():  # and the device checks (the default trainer=auto is the CPU here)
        cases["trainer=gpu"] = (
            "error: trainer.accelerator=gpu but this machine has no CUDA device; use trainer=auto"
        )
        cases["attn=varlen"] = "error: attn=varlen needs a CUDA GPU (the flash varlen kernel)"
    for override, says in cases.items():
        run = tmp_path / override.replace("=", "-")
        proc = _train_py(override, f"hydra.run.dir={run}")
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2, (override, proc.stderr[-2000:])
        assert len(lines) == 1 and lines[0].startswith(says), (override, lines)
        assert not run.exists()


def test_pretrain_lists_the_options_of_a_group_in_one_line(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["inspect-data", "data=foo", "output=x.json"])
    assert exited.value.code == 2
    assert capsys.readouterr().err == f"error: data=foo: no such option; choose one of {DATA_OPTIONS}\n"


@pytest.mark.parametrize(
    "name", ["plain", "with space", "accentué", "it's,[odd]=x", "back\\slash", "end\\", "q\\'x"]
)
def test_the_resume_command_quotes_for_hydra_and_the_shell(tmp_path, name):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    directory = str(tmp_path / name)
    word = f"hydra.run.dir={hydra_quote(directory)}"
    (as_the_shell_passes_it,) = shlex.split(shlex.quote(word))
    (override,) = OverridesParser.create().parse_overrides([as_the_shell_passes_it])
    assert override.value() == directory
