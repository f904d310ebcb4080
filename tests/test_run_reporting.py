"""What a run reports: a val/loss that compares models (same pairs for every policy and world size),
plain progress lines off a terminal, step-time accounting and MFU."""

from __future__ import annotations

import csv

import lightning as L
import numpy as np
import pytest
import torch
from helpers import SHARED_CACHE, module_cache_root, split_of

from pretrain.config import load_config, to_config
from pretrain.data.batching.chunking import chunk_table
from pretrain.data.batching.evaluation import evaluation_batches, evaluation_chunks
from pretrain.data.batching.policies import PolicySettings
from pretrain.data.ingest.cache import CacheSpec
from pretrain.data.tokens import TokenSplit
from pretrain.model import GPT, GPTConfig
from pretrain.model.flops import parameter_count, peak_flops, training_flops
from pretrain.training.datamodule import PretrainDataModule
from pretrain.training.progress import StepProgressBar, TextProgress, progress_callbacks, progress_line
from pretrain.training.run import train

POLICIES = {
    "padded": ["data=padded"],
    "padded-longest": ["data=padded", "data.pad_to=longest"],
    "prepacked": ["data=prepacked", "data.document_mask=false"],
    "bfd": ["data=prepacked", "data.strategy=bfd"],
    "bestfit": ["data=bestfit"],
}


cache_root = module_cache_root(SHARED_CACHE)  # one cache for the whole module


def settings_for(*overrides: str) -> tuple[PolicySettings, CacheSpec]:
    config = to_config(load_config(["experiment=smoke", *overrides]))
    return PolicySettings.from_config(config.data, config.train, config.seed), CacheSpec.from_config(config)


def validation_sums(model: GPT, datamodule: PretrainDataModule) -> tuple[float, int]:
    nats, targets = 0.0, 0
    with torch.no_grad():
        for batch in datamodule.validation_batches():
            nats += float(model.token_losses(batch).double().sum())
            targets += batch.num_targets
    return nats, targets


def test_val_loss_of_one_model_is_the_same_under_every_policy(cache_root):
    """No training: one model, the validation pairs of each policy's data module."""
    torch.manual_seed(0)
    model = GPT(
        GPTConfig(vocab_size=50257, n_layer=2, n_head=2, d_model=32, max_seq_len=128), attn="sdpa"
    ).eval()
    results = {}
    for name, overrides in POLICIES.items():
        policy, spec = settings_for(*overrides, "train.val_batches=8", "train.eval_microbatch_tokens=512")
        datamodule = PretrainDataModule(spec, policy)
        datamodule.setup()
        results[name] = validation_sums(model, datamodule)
    nats, targets = results["bestfit"]
    assert targets > 1000
    for name, (other_nats, other_targets) in results.items():
        assert other_targets == targets, name
        assert other_nats / other_targets == pytest.approx(nats / targets, abs=1e-6), name


def test_validation_pairs_are_whole_first_documents_split_over_ranks():
    rng = np.random.default_rng(0)
    split = TokenSplit.from_lengths(rng.integers(2, 300, size=40), seed=1, name="validation")
    everything = chunk_table(split.offsets, split.lengths, 64)
    assert len(evaluation_chunks(split, 64)) == len(everything)
    budget = 2000
    chosen = evaluation_chunks(split, 64, budget)
    documents = np.unique(chosen.doc)
    assert np.array_equal(documents, np.arange(len(documents)))  # the first documents, whole
    pairs = split.lengths[: len(documents)] - 1
    assert pairs.sum() <= budget < pairs.sum() + split.lengths[len(documents)] - 1
    assert chosen.length.sum() == pairs.sum()
    for world in (2, 3):
        shares = [evaluation_chunks(split, 64, budget, rank=r, world_size=world) for r in range(world)]
        starts = np.sort(np.concatenate([s.start for s in shares]))
        assert np.array_equal(starts, np.sort(chosen.start))  # disjoint, and together all of them
    # One document longer than the budget is still scored (never an empty validation).
    assert len(evaluation_chunks(split_of([list(range(1, 500))], name="validation"), 64, 10)) == 8


def test_val_loss_is_the_same_for_any_world_size(cache_root):
    torch.manual_seed(1)
    model = GPT(
        GPTConfig(vocab_size=50257, n_layer=1, n_head=2, d_model=16, max_seq_len=128), attn="sdpa"
    ).eval()
    policy, spec = settings_for("data=padded", "train.val_batches=2", "train.eval_microbatch_tokens=512")
    datamodule = PretrainDataModule(spec, policy)
    datamodule.setup()
    single = validation_sums(model, datamodule)
    split = datamodule.cache.split("validation")
    total_nats, total_targets = 0.0, 0
    for rank in range(3):
        table = evaluation_chunks(split, 128, 2 * 512, rank=rank, world_size=3)
        with torch.no_grad():
            for batch in evaluation_batches(policy, split, table):
                total_nats += float(model.token_losses(batch).double().sum())
                total_targets += batch.num_targets
    assert total_targets == single[1]
    assert total_nats == pytest.approx(single[0], rel=1e-9)


class InitialWeights(L.Callback):
    def on_fit_start(self, trainer, pl_module):
        self.weights = {k: v.detach().clone() for k, v in pl_module.model.state_dict().items()}


def test_same_seed_same_initial_weights_whatever_the_policy_and_metrics_are_timed(cache_root, tmp_path):
    captured = {}
    for name in ("padded", "bestfit"):
        callback = InitialWeights()
        out = tmp_path / name
        overrides = ["experiment=smoke", f"output_dir={out}", "progress_bar=false", "train.max_steps=2"]
        train(load_config([*overrides, *POLICIES[name], "trainer.peak_tflops=0.5"]), callbacks=[callback])
        captured[name] = callback.weights
        with open(out / "metrics.csv", newline="") as handle:
            rows = [r for r in csv.DictReader(handle) if r["train/loss"]]
        assert {"train/step_seconds", "train/data_seconds", "train/mfu"} <= set(rows[0])
        for row in rows:
            step, data = float(row["train/step_seconds"]), float(row["train/data_seconds"])
            assert step > 0 and data >= 0
            # mfu x peak x seconds = this step's model FLOPs: 6N per real token plus attention on
            # segments of at most max_seq_len = 128 tokens.
            seconds = float(row["train/num_targets"]) / float(row["train/tokens_per_sec"])
            flops = float(row["train/mfu"]) * 0.5e12 * seconds
            config = GPTConfig(vocab_size=50257, n_layer=4, n_head=4, d_model=128, max_seq_len=128)
            tokens = float(row["train/num_targets"])
            low = 6 * parameter_count(config) * tokens
            assert low < flops <= low + 12 * 4 * 128 * 128 * tokens + 1
    for key, value in captured["padded"].items():
        assert torch.equal(value, captured["bestfit"][key]), key


def test_no_mfu_on_cpu_without_a_peak(cache_root, tmp_path):
    out = tmp_path / "cpu"
    overrides = [
        "experiment=smoke",
        f"output_dir={out}",
        "progress_bar=false",
        "train.max_steps=1",
        "train.warmup_steps=0",
    ]
    summary = train(load_config(overrides))
    assert "train/mfu" not in summary["metrics"] and "train/step_seconds" in summary["metrics"]
    assert peak_flops(None) is None and peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_flops("NVIDIA H100 PCIe") == 756e12 and peak_flops("cpu", 2.0) == 2e12


def test_training_flops_by_hand():
    config = GPTConfig(vocab_size=100, n_layer=2, n_head=2, d_model=8, max_seq_len=16)
    with torch.device("meta"):
        model = GPT(config)
    assert parameter_count(config) == model.num_parameters(exclude_position_embeddings=True)
    # Two segments of 3 and 5 tokens: 6 N x 8 tokens + 12 x 2 layers x 8 wide x (9 + 25).
    assert training_flops(config, np.array([3, 5])) == 6 * parameter_count(config) * 8 + 12 * 2 * 8 * 34


def test_progress_line_and_which_progress_is_shown():
    metrics = {
        "train/loss": 6.12345,
        "val/loss": 6.2,
        "train/tokens_per_sec": 1234.4,
        "train/padding_waste": 0.123,
    }
    line = progress_line(40, 200, metrics, elapsed=30.0)
    assert (
        line
        == "step 40/200 | loss 6.1235 | val 6.2000 | 1,234 tok/s | waste 12.3% | 0m30s elapsed, ETA 2m00s"
    )
    assert "ETA 1h15m" in progress_line(1, 151, metrics, elapsed=30.0)
    assert [type(c) for c in progress_callbacks(True, 5, interactive=True)] == [StepProgressBar]
    assert [type(c) for c in progress_callbacks(True, 5, interactive=False)] == [TextProgress]
    assert progress_callbacks(False, 5, interactive=False) == []


def test_text_progress_off_a_terminal(cache_root, tmp_path, capsys):
    out = tmp_path / "text"
    overrides = ["experiment=smoke", f"output_dir={out}", "progress_bar=true", "train.max_steps=4"]
    train(load_config([*overrides, "train.log_every_n_steps=2"]))  # pytest's stdout is not a terminal
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    assert [line.split(" | ")[0] for line in lines] == ["step 2/4", "step 4/4"]
    assert "tok/s" in lines[0] and "ETA" in lines[0] and "val " in lines[1]  # validation at the last step


def test_scoring_says_how_far_it_is_when_it_takes_long(capsys):
    """Validation and `pretrain eval` share one scoring loop; a slow one prints a progress line."""
    import io

    from pretrain.model import GPT, GPTConfig
    from pretrain.training.evaluate import ScoringProgress, score_batches

    stream = io.StringIO()
    progress = ScoringProgress("eval", total=3, every=0.0, stream=stream)
    model = GPT(GPTConfig(vocab_size=50257, max_seq_len=32, n_layer=1, n_head=2, d_model=16), attn="sdpa")
    batches = [_random_batch(seed) for seed in range(3)]
    model.train()
    sums = score_batches(model, batches, torch.device("cpu"), progress)
    nats, targets = sums.nats, sums.targets
    assert model.training  # left in the mode it was in
    assert int(targets) == sum(b.num_targets for b in batches)
    expected = sum(float(model.eval().token_losses(b).sum()) for b in batches)
    assert float(nats) == pytest.approx(expected, rel=1e-6)
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("eval: 1/3 batches, ") and lines[-1].startswith("eval: 3/3 batches, ")


def _random_batch(seed: int):
    from pretrain.data.batching.batch import gather_packed

    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 50256, size=40).astype(np.uint16)
    return gather_packed(tokens, np.array([0, 20]), np.array([12, 10]), np.array([2]), 32)


def test_scoring_progress_never_repeats_a_line_and_counts_on_over_sets():
    """The closing line is printed only when it says something new (no second `3/3` under the bar);
    a mixture's validation sets share one count."""
    import io

    from pretrain.training.evaluate import ScoringProgress

    stream = io.StringIO()
    progress = ScoringProgress("validation", every=0.0, stream=stream)
    for done in (1, 2):
        progress.update(done)
    progress.close(2)  # the heartbeat already said 2
    progress.update(1)  # the second set's first batch: 3 in all
    progress.close(1)
    said = [line.split(",")[0] for line in stream.getvalue().splitlines()]
    assert said == ["validation: 1 batches", "validation: 2 batches", "validation: 3 batches"]
