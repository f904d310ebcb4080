"""The metrics that tell the composition arms apart: validation loss by position in the document,
`train/attention_cost` per step, and `train.max_tokens` (runs compared at equal real tokens)."""

from __future__ import annotations

import csv
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from helpers import POLICIES, TINY_RUN, module_cache_root, settings_of, split_of

from pretrain.config import load_config
from pretrain.data import gather_packed
from pretrain.data.batching.batch import IGNORE_INDEX
from pretrain.data.batching.evaluation import evaluation_batches, evaluation_positions, evaluation_units
from pretrain.data.batching.policies import split_chunks
from pretrain.data.measures.audit import batch_attention_cost
from pretrain.errors import ConfigError
from pretrain.model import GPT, GPTConfig
from pretrain.training.evaluate import evaluate
from pretrain.training.module import update_attention_cost
from pretrain.training.run import train
from pretrain.training.scoring import POSITION_BUCKETS, position_buckets, score_batches

cache_root = module_cache_root()

# Pairs per document: 10 (all in 0-63), 100 (64 + 36), 300 (64 + 192 + 44) and 4200 (every bucket).
PAIRS = (10, 100, 300, 4200)
# A document's token at position p is p + 1 (never EOS), so an input token says its own position.
SPLIT = split_of([range(1, pairs + 1) for pairs in PAIRS], name="validation")
EXPECTED_COUNTS = {
    "0-63": 10 + 64 + 64 + 64,
    "64-255": 36 + 192 + 192,
    "256-1023": 44 + 768,
    "1024-4095": 3072,
    "4096+": 4200 - 4096,
}


def _settings(policy: str):
    return settings_of(
        load_config(["experiment=smoke", f"data={policy}", "data.max_seq_len=128", "train.batch_size=2"])
    )


def _tiny_model() -> GPT:
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=50257, max_seq_len=128, n_layer=1, n_head=2, d_model=16)
    return GPT(config, attn="sdpa").eval()


def test_position_buckets_edges():
    positions = [0, 63, 64, 255, 256, 1023, 1024, 4095, 4096, 100_000]
    assert position_buckets(np.array(positions)).tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert POSITION_BUCKETS == ("0-63", "64-255", "256-1023", "1024-4095", "4096+")


@pytest.mark.parametrize("policy", POLICIES)
def test_positions_are_each_target_rows_place_in_its_document(policy):
    """The validation chunks know their document start: each counted row's in-document position,
    in row order, whatever order the policy lays the chunks in."""
    settings = _settings(policy)
    table = split_chunks(SPLIT, settings.max_seq_len)
    units = evaluation_units(settings, table)
    batches = list(evaluation_batches(settings, SPLIT, table, units))
    positions = list(evaluation_positions(settings, SPLIT, table, units))
    assert len(batches) == len(positions) > 1
    for batch, where in zip(batches, positions, strict=True):
        counted = batch.targets.numpy() != IGNORE_INDEX
        assert len(where) == batch.num_targets == counted.sum()
        np.testing.assert_array_equal(batch.input_ids.numpy()[counted] - 1, where)  # token p+1 at p
    every = np.concatenate(positions)
    counts = np.bincount(position_buckets(every), minlength=len(POSITION_BUCKETS))
    assert dict(zip(POSITION_BUCKETS, counts.tolist(), strict=True)) == EXPECTED_COUNTS
    np.testing.assert_array_equal(np.sort(every), np.sort(np.concatenate([np.arange(p) for p in PAIRS])))


def test_loss_by_position_is_the_per_token_loss_bucketed_and_averages_to_the_loss():
    settings = _settings("bestfit")
    model = _tiny_model()
    table = split_chunks(SPLIT, settings.max_seq_len)
    units = evaluation_units(settings, table)
    batches = list(evaluation_batches(settings, SPLIT, table, units))
    sums = score_batches(
        model, batches, torch.device("cpu"), positions=evaluation_positions(settings, SPLIT, table, units)
    )
    # Independently: every counted token's loss, bucketed by its input token (= position + 1).
    expected_nats = np.zeros(len(POSITION_BUCKETS))
    with torch.no_grad():
        for batch in batches:
            losses = model.token_losses(batch).double().numpy()
            counted = batch.targets.numpy() != IGNORE_INDEX
            buckets = position_buckets(batch.input_ids.numpy()[counted] - 1)
            np.add.at(expected_nats, buckets, losses[counted])
    counts = sums.count_by_position()
    assert counts == EXPECTED_COUNTS
    by_position = sums.loss_by_position()
    for index, bucket in enumerate(POSITION_BUCKETS):
        assert by_position[bucket] == pytest.approx(expected_nats[index] / counts[bucket], rel=1e-9)
    weighted = sum(by_position[b] * counts[b] for b in POSITION_BUCKETS) / sum(counts.values())
    assert weighted == pytest.approx(sums.loss, rel=1e-12)  # every token summed in float64
    assert sum(counts.values()) == int(sums.targets) == sum(PAIRS)


def test_evaluate_reports_loss_and_targets_by_position_the_same_for_every_policy():
    token_bytes = np.ones(50257, dtype=np.int64)
    model = _tiny_model()
    results = {
        policy: evaluate(model, SPLIT, _settings(policy), token_bytes) for policy in ("padded", "bestfit")
    }
    padded, bestfit = results["padded"], results["bestfit"]
    assert padded.targets_by_position == bestfit.targets_by_position == EXPECTED_COUNTS
    for bucket in POSITION_BUCKETS:
        assert bestfit.loss_by_position[bucket] == pytest.approx(padded.loss_by_position[bucket], abs=1e-5)
    weighted = sum(padded.loss_by_position[b] * EXPECTED_COUNTS[b] for b in POSITION_BUCKETS)
    assert weighted / padded.targets == pytest.approx(padded.loss, rel=1e-12)  # `pretrain eval`'s loss


def test_update_attention_cost_is_the_token_weighted_batch_cost():
    tokens = np.arange(1000, dtype=np.uint32)
    one = gather_packed(tokens, np.array([0, 100]), np.array([30, 10]), [2], 64)  # one pack, 2 segments
    two = gather_packed(tokens, np.array([200, 300, 400]), np.array([60, 5, 20]), [1, 2], 64)
    assert batch_attention_cost(one) == (30**2 + 10**2) / 40
    assert update_attention_cost([one]) == batch_attention_cost(one)
    expected = (30**2 + 10**2 + 60**2 + 5**2 + 20**2) / (40 + 85)
    assert update_attention_cost([one, two]) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("value", ["0", "-5"])
def test_max_tokens_below_one_is_one_config_error(value):
    with pytest.raises(ConfigError, match=rf"train\.max_tokens={value} must be >= 1"):
        settings_of(load_config(["experiment=smoke", f"train.max_tokens={value}"]))


class UpdateCosts(L.Callback):
    """Each update's real tokens and batch_attention_cost, as the data module served them."""

    def __init__(self):
        self.tokens: list[int] = []
        self.costs: list[float] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.tokens.append(sum(mb.real_tokens for mb in batch.microbatches))
        self.costs.append(batch_attention_cost(batch.microbatches[0]))  # accumulation 1


def _metrics(run_dir: Path) -> list[dict[str, float]]:
    with open(run_dir / "metrics.csv", newline="") as handle:
        return [{k: float(v) for k, v in row.items() if v} for row in csv.DictReader(handle)]


@pytest.mark.parametrize("policy", POLICIES)
def test_max_tokens_stops_at_the_update_that_reaches_it(tmp_path, cache_root, policy):
    budget = 300
    costs = UpdateCosts()
    overrides = [
        *TINY_RUN,
        f"data={policy}",
        f"output_dir={tmp_path / 'run'}",
        "progress_bar=false",
        "train.max_steps=50",
        "train.warmup_steps=1",
        "train.val_every_n_steps=50",
        "train.checkpoint_every_n_steps=50",
        "train.log_every_n_steps=1",
        f"train.max_tokens={budget}",
    ]
    summary = train(load_config(overrides), callbacks=[costs])
    rows = _metrics(tmp_path / "run")
    steps = [row for row in rows if "train/loss" in row]
    assert summary["steps"] == len(steps) == len(costs.tokens) < 50
    seen = np.cumsum(costs.tokens)
    assert seen[-1] == summary["tokens"] == steps[-1]["train/tokens"] >= budget  # reached...
    assert seen[-2] < budget  # ...by the last update, not earlier
    assert summary["tokens"] - budget < costs.tokens[-1]  # passed by less than one update
    # train/attention_cost per step: the audit's per-batch value of what was served.
    logged = [row["train/attention_cost"] for row in steps]
    np.testing.assert_allclose(logged, costs.costs, rtol=1e-9)
    # The stop validates, split by position: the count-weighted mean is val/loss.
    last = rows[-1]
    assert "val/loss" in last and last["step"] == summary["steps"]
    buckets = [b for b in POSITION_BUCKETS if f"val/loss_by_position/{b}" in last]
    assert buckets and buckets[0] == "0-63"
    counts = [last[f"val/targets_by_position/{b}"] for b in buckets]
    weighted = sum(last[f"val/loss_by_position/{b}"] * n for b, n in zip(buckets, counts, strict=True))
    assert weighted / sum(counts) == pytest.approx(last["val/loss"], rel=1e-6)
    assert summary["composition"]["attention_cost"] > 0 and summary["max_tokens"] == budget
