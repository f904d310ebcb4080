"""End to end (issue 32's done-when): `python train.py model=llama-tiny tokenizer=json
tokenizer.file=<a trained tokenizer.json> data=bestfit attn=sdpa` trains; an interrupted run resumes
exactly; the checkpoint exports as a LlamaForCausalLM directory whose logits and tokenizer are
transformers'; model.init_from loads it back; `pretrain eval` scores it in bits per byte."""

from __future__ import annotations

import csv
import math
import subprocess
import sys
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from helpers import REPO, cli_env, module_cache_root
from helpers.trained_tokenizers import small_bpe

from pretrain.checkpoints.files import load_checkpoint
from pretrain.config import load_config
from pretrain.data import gather_packed
from pretrain.data.ingest.tokenizer_json import resolve_tokenizer
from pretrain.hf import export, init_from
from pretrain.hf.roundtrip import model_weights
from pretrain.model import Llama, build_model, config_from_dict
from pretrain.training.evaluate import evaluate_checkpoint
from pretrain.training.run import train

transformers = pytest.importorskip("transformers")

cache_root = module_cache_root()  # its own: this tokenizer makes another cache


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory) -> Path:
    return small_bpe(tmp_path_factory.mktemp("tokenizer") / "tokenizer.json")


def overrides(tokenizer_file: Path) -> list[str]:
    return [
        "experiment=smoke",
        "model=llama-tiny",
        "tokenizer=json",
        f"tokenizer.file={tokenizer_file}",
        "data=bestfit",
        "attn=sdpa",
        "logger=csv",
        "progress_bar=false",
        "train.max_steps=6",
        "train.checkpoint_every_n_steps=3",
        "train.val_every_n_steps=3",
        "train.deterministic=true",
        "budget.validation_tokens=3000",
    ]


def losses(run_dir: Path) -> dict[str, dict[int, float]]:
    series: dict[str, dict[int, float]] = {}
    with open(run_dir / "metrics.csv", newline="") as handle:
        for row in csv.DictReader(handle):
            for key in ("train/loss", "val/loss"):
                if row.get(key):
                    series.setdefault(key, {})[int(row["step"])] = float(row[key])
    return series


class StopAfter(L.Callback):
    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step >= self.step:
            trainer.should_stop = True


@pytest.fixture(scope="module")
def full_run(tokenizer_file, cache_root, tmp_path_factory) -> Path:
    """The done-when command, through train.py."""
    out = tmp_path_factory.mktemp("full")
    done = subprocess.run(
        [sys.executable, "train.py", *overrides(tokenizer_file), f"hydra.run.dir={out}"],
        cwd=REPO,
        env=cli_env(cache_root, PYTHONPATH=str(REPO / "src")),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_trains_and_resumes_exactly(full_run, tokenizer_file, tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    base = [*overrides(tokenizer_file), "record_batches=true"]
    train(load_config([*base, f"output_dir={first}"]), callbacks=[StopAfter(3)])
    train(load_config([*base, f"output_dir={second}", f"ckpt_path={first / 'checkpoints' / 'last.ckpt'}"]))
    want = losses(full_run)
    got = losses(first)
    for key, values in losses(second).items():
        got.setdefault(key, {}).update(values)
    assert sorted(want["train/loss"]) == list(range(1, 7))
    assert got == want  # bitwise: weights, optimizer, schedule and data order continue exactly
    saved = load_checkpoint(full_run / "checkpoints" / "last.ckpt")["hyper_parameters"]
    assert saved["model"]["arch"] == "llama" and saved["model"]["vocab_size"] == 700
    assert saved["cache_identity"]["tokenizer"]["kind"] == "tokenizer.json"


def test_exports_to_transformers_and_back(full_run, tokenizer_file, tmp_path):
    checkpoint = full_run / "checkpoints" / "last.ckpt"
    directory = export(checkpoint, tmp_path / "llama")
    hf = transformers.LlamaForCausalLM.from_pretrained(directory, local_files_only=True).eval()
    saved = load_checkpoint(checkpoint)
    ours = build_model(config_from_dict(saved["hyper_parameters"]["model"]), attn="sdpa")
    assert isinstance(ours, Llama)
    ours.load_state_dict(model_weights(saved))
    ours.eval()

    # The exported tokenizer is the run's: the same ids as the cache's encoder, the same EOS.
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True)
    files = resolve_tokenizer(load_config(overrides(tokenizer_file)).tokenizer)
    text = "The tokenizer exported with the model, and its EOS."
    ids, _ = files.encoder().encode([text])
    assert hf_tokenizer(text, add_special_tokens=False)["input_ids"] == ids.tolist()
    assert hf_tokenizer.eos_token_id == files.eos_token_id == hf.config.eos_token_id

    # Packed documents: transformers splits them by position_ids; logits equal within 1e-5 in fp32.
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 700, size=600).astype(np.uint32)
    batch = gather_packed(tokens, np.array([0, 150, 300]), np.array([100, 1, 120]), [3], capacity=221)
    with torch.no_grad():
        theirs = hf(input_ids=batch.input_ids[None], position_ids=batch.position_ids[None], use_cache=False)
        torch.testing.assert_close(ours(batch), theirs.logits[0], atol=1e-5, rtol=0)

    # model.init_from: a fresh model of the same size starts from the exported weights.
    fresh = build_model(ours.config, attn="sdpa")
    init_from(fresh, directory)
    assert all(
        torch.equal(a, b)
        for a, b in zip(fresh.state_dict().values(), ours.state_dict().values(), strict=True)
    )


def test_eval_scores_bits_per_byte(full_run):
    result = evaluate_checkpoint(full_run / "checkpoints" / "last.ckpt")
    assert result["targets"] > 0 and result["bytes"] > result["targets"]  # a BPE token is > 1 byte
    assert math.isclose(
        result["bits_per_byte"], result["nats"] / (math.log(2) * result["bytes"]), rel_tol=1e-12
    )
    assert math.isclose(result["loss"], result["nats"] / result["targets"], rel_tol=1e-12)
    assert (result["positions"], result["trained_positions"]) == ("restart", "restart")
