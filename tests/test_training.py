"""Training: exact resume, the token-weighted update, DDP disjointness, start-up checks."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from helpers import SHARED_CACHE, module_cache_root

from pretrain.config import load_config
from pretrain.data import TokenSplit, gather_packed
from pretrain.data.batching.chunking import chunk_table
from pretrain.model import GPT, GPTConfig
from pretrain.training.run import train
from pretrain.training.update import run_update

REPO = Path(__file__).resolve().parents[1]


cache_root = module_cache_root(SHARED_CACHE)  # one cache for the whole module


def compose(out: Path, *overrides: str):
    return load_config(
        ["experiment=smoke", f"output_dir={out}", "progress_bar=false", "logger=csv", *overrides]
    )


def read_metrics(run_dir: Path) -> dict[str, dict[int, float]]:
    series: dict[str, dict[int, float]] = {}
    with open(run_dir / "metrics.csv", newline="") as handle:
        for row in csv.DictReader(handle):
            for key, value in row.items():
                if key not in ("step", "epoch") and value:
                    series.setdefault(key, {})[int(row["step"])] = float(value)
    return series


def read_batches(run_dir: Path, rank: int = 0) -> list[dict]:
    path = run_dir / f"batches.rank{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


class StopAfter(L.Callback):
    """Simulates an interruption: stop once `step` optimizer steps are done."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step >= self.step:
            trainer.should_stop = True


@pytest.mark.parametrize("policy", ["bestfit", "padded"])
def test_resume_twice_equals_uninterrupted_run(tmp_path, cache_root, policy):
    common = [
        "record_batches=true",
        f"data={policy}",
        "train.checkpoint_every_n_steps=4",
        "train.deterministic=true",
    ]
    full = tmp_path / "full"
    train(compose(full, *common))

    first = tmp_path / "first"
    train(compose(first, *common), callbacks=[StopAfter(4)])
    second = tmp_path / "second"
    train(
        # last.ckpt: step 4's checkpoint (no second file for one step)
        compose(second, *common, f"ckpt_path={first / 'checkpoints' / 'last.ckpt'}"),
        callbacks=[StopAfter(8)],
    )
    third = tmp_path / "third"
    train(compose(third, *common, f"ckpt_path={second / 'checkpoints' / 'last.ckpt'}"))

    want = read_batches(full)
    got = read_batches(first)[:4] + read_batches(second)[:4] + read_batches(third)
    assert [b["step"] for b in got] == list(range(12))
    assert [b["digest"] for b in got] == [b["digest"] for b in want]

    full_metrics = read_metrics(full)
    resumed = {}
    for run in (first, second, third):
        for key, values in read_metrics(run).items():
            resumed.setdefault(key, {}).update(values)
    # Bitwise: model, optimizer, schedule and data order all continue exactly.
    assert resumed["train/loss"] == full_metrics["train/loss"]
    assert resumed["val/loss"] == full_metrics["val/loss"]
    assert resumed["train/tokens"] == full_metrics["train/tokens"]


def _packs(seed: int = 0):
    """Eight packs of unequal token counts (so microbatch-mean and token-weighted losses differ)."""
    rng = np.random.default_rng(seed)
    split = TokenSplit.from_lengths(rng.integers(3, 40, size=40), seed=seed, vocab=97)
    table = chunk_table(split.offsets, split.lengths, 16)
    packs, i = [], 0
    for size in (1, 2, 3, 1, 4, 2, 1, 3):
        packs.append((table.start[i : i + size], table.length[i : i + size]))
        i += size
    return split, packs


def _microbatches(split, packs, per_microbatch: int):
    out = []
    for k in range(0, len(packs), per_microbatch):
        group = packs[k : k + per_microbatch]
        starts = np.concatenate([s for s, _ in group])
        lengths = np.concatenate([length for _, length in group])
        out.append(gather_packed(split.tokens, starts, lengths, [len(s) for s, _ in group], 16))
    return out


def _tiny_model() -> GPT:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50257, n_layer=2, n_head=2, d_model=16, max_seq_len=16), attn="sdpa")
    return model.double()


def _grads(model) -> dict[str, torch.Tensor]:
    return {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}


def test_update_loss_is_token_weighted_whatever_the_accumulation_split():
    split, packs = _packs()
    results, grads = [], []
    for per_microbatch in (8, 4, 2):  # 1 x 8, 2 x 4, 4 x 2 (accumulation x packs)
        model = _tiny_model()
        results.append(run_update(model, _microbatches(split, packs, per_microbatch)))
        grads.append(_grads(model))

    # Reference: one big batch, mean over all real targets.
    model = _tiny_model()
    whole = _microbatches(split, packs, 8)[0]
    expected = (model.token_losses(whole).sum() / whole.num_targets).item()
    assert results[0].num_targets == whole.num_targets == sum(int(length.sum()) for _, length in packs)
    for result, grad in zip(results, grads, strict=True):
        assert result.loss == pytest.approx(expected, rel=1e-12)
        for name in grads[0]:
            torch.testing.assert_close(grad[name], grads[0][name], rtol=1e-10, atol=1e-12)

    # Teeth: the microbatch-mean that Lightning's accumulation would give is different here.
    mbs = _microbatches(split, packs, 2)
    naive = np.mean([(model.token_losses(mb).sum() / mb.num_targets).item() for mb in mbs])
    assert abs(naive - expected) > 1e-4


def _rank_worker(rank: int, world: int, init_file: str, out_dir: str):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    split, packs = _packs()
    mine = packs[rank::world]
    model = _tiny_model()

    def all_reduce_sum(t):
        dist.all_reduce(t)
        return t

    result = run_update(model, _microbatches(split, mine, 2), all_reduce_sum=all_reduce_sum, world_size=world)
    for p in model.parameters():  # what DDP does to gradients: average over ranks
        dist.all_reduce(p.grad)
        p.grad /= world
    if rank == 0:
        torch.save(
            {"loss": result.loss, "num_targets": result.num_targets, "grads": _grads(model)},
            Path(out_dir) / "ddp.pt",
        )
    dist.destroy_process_group()


def test_world_size_two_equals_world_size_one(tmp_path):
    mp.spawn(_rank_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    got = torch.load(tmp_path / "ddp.pt")
    split, packs = _packs()
    model = _tiny_model()
    # One process sees the same packs in a different order: the sum is order-independent.
    single = run_update(model, _microbatches(split, packs[0::2] + packs[1::2], 2))
    assert got["num_targets"] == single.num_targets
    assert got["loss"] == pytest.approx(single.loss, rel=1e-12)
    for name, grad in _grads(model).items():
        torch.testing.assert_close(got["grads"][name], grad, rtol=1e-10, atol=1e-12)


@pytest.mark.slow
def test_ddp_two_cpu_ranks_see_disjoint_packs(tmp_path, cache_root):
    out = tmp_path / "ddp"
    env = {**os.environ, "PRETRAIN_CACHE_ROOT": str(cache_root)}
    cmd = [
        sys.executable,
        "train.py",
        "experiment=smoke",
        "trainer=ddp",
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "trainer.precision=32-true",
        "record_batches=true",
        "progress_bar=false",
        "train.max_steps=4",
        f"hydra.run.dir={out}",
    ]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = {rank: read_batches(out, rank) for rank in (0, 1)}
    assert len(seen[0]) == len(seen[1]) == 4
    chunks = {
        rank: [c for b in batches for mb in b["chunks"] for pack in [mb] for c in pack]
        for rank, batches in seen.items()
    }
    assert chunks[0] and chunks[1]
    assert not set(chunks[0]) & set(chunks[1])
    metrics = read_metrics(out)
    # Both ranks' real targets count in every update: 2 ranks x batch_size 4 packs x 128.
    assert set(metrics["train/num_targets"].values()) == {2 * 4 * 128}


def test_bad_configs_fail_before_heavy_work(tmp_path, cache_root):
    cases = {
        "data.max_seq_len=4097": "data.max_seq_len",
        "data.max_seq_len=1": "data.max_seq_len",
        "train.microbatch_tokens=1024": "set only one of train.batch_size and train.microbatch_tokens",
        "attn=varlen": "attn=varlen needs a CUDA GPU",
        "attn=flex": "attn=sdpa",
    }
    for override, message in cases.items():
        with pytest.raises(ValueError, match=message.replace(".", r"\.")):
            train(compose(tmp_path / "bad", override))
    assert not (tmp_path / "bad" / "metrics.csv").exists()


def test_checkpoint_from_another_model_or_context_is_refused(tmp_path, cache_root):
    run = tmp_path / "run"
    train(compose(run, "train.max_steps=2", "train.checkpoint_every_n_steps=2"))
    ckpt = run / "checkpoints" / "last.ckpt"
    with pytest.raises(ValueError, match="data.max_seq_len=128"):
        train(compose(tmp_path / "b", f"ckpt_path={ckpt}", "data.max_seq_len=64"))
    with pytest.raises(ValueError, match="model"):
        train(compose(tmp_path / "c", f"ckpt_path={ckpt}", "model.n_layer=2"))
    with pytest.raises(ValueError, match="cache"):
        train(compose(tmp_path / "d", f"ckpt_path={ckpt}", "split.seed=7"))


@pytest.mark.parametrize(("every", "validated"), [(2, [2, 4]), (3, [3, 4])])
def test_the_last_step_validates_once_whether_or_not_it_is_a_validation_step(
    tmp_path, cache_root, monkeypatch, every, validated
):
    """Validation runs in the step that reaches train.max_steps (for the final val/loss) and at
    every val_every_n_steps; a last step that is both validates once, and nothing validates after
    training."""
    from pretrain.training.module import PretrainModule

    steps: list[int] = []
    original = PretrainModule.validation_metrics

    def counted(self):
        steps.append(int(self.trainer.global_step))
        return original(self)

    monkeypatch.setattr(PretrainModule, "validation_metrics", counted)
    out = tmp_path / "run"
    summary = train(compose(out, "train.max_steps=4", f"train.val_every_n_steps={every}"))
    assert steps == validated
    assert sorted(read_metrics(out)["val/loss"]) == validated
    assert summary["metrics"]["val/loss"] == read_metrics(out)["val/loss"][4]


class _KeepModule(L.Callback):
    """Holds the run's LightningModule and optimizer past fit, as a user's callback may."""

    def on_train_end(self, trainer, pl_module):
        self.module, self.optimizer = pl_module, trainer.optimizers[0]


def test_a_single_runs_plot_is_drawn_after_its_training_state_is_released(tmp_path, cache_root, monkeypatch):
    from pretrain.training import fit, startup

    kept, seen = _KeepModule(), {}

    def plot(directory: Path) -> Path:
        module, optimizer = kept.module, kept.optimizer
        seen["devices"] = {p.device.type for p in module.parameters()}
        seen["optimizer state"] = len(optimizer.state)
        seen["on disk"] = sorted(p.name for p in directory.iterdir())
        return directory / "compare.png"

    monkeypatch.setattr(fit, "hydra_mode", lambda: "RUN")  # a single run under Hydra plots
    monkeypatch.setattr(startup, "_output_dir", lambda configured: Path(configured))
    out = tmp_path / "run"
    summary = train(compose(out, "train.max_steps=2"), callbacks=[kept], plot_run=plot)
    assert seen["devices"] == {"meta"}  # the weights' storage is freed
    assert seen["optimizer state"] == 0  # so are AdamW's moments
    assert {"run.json", "config.yaml", "metrics.csv", "checkpoints"} <= set(seen["on disk"])
    assert summary["metrics"]["val/loss"] > 0  # the summary was taken before
    assert json.loads((out / "run.json").read_text())["steps"] == 2


def test_a_multirun_job_leaves_its_plot_to_compare_also_with_wandb(tmp_path, cache_root, monkeypatch):
    from pretrain.training import fit, startup

    for name in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        (tmp_path / name).mkdir()
        monkeypatch.setenv(name, str(tmp_path / name))
    monkeypatch.setenv("WANDB_MODE", "offline")
    drawn: list[Path] = []
    monkeypatch.setattr(fit, "hydra_mode", lambda: "MULTIRUN")
    monkeypatch.setattr(startup, "_output_dir", lambda configured: Path(configured))
    out = tmp_path / "job"
    train(compose(out, "train.max_steps=2", "logger=wandb"), plot_run=lambda d: drawn.append(d) or d)
    assert drawn == []
    assert (out / "run.json").is_file()
