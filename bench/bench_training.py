"""Training throughput on CPU: padded vs prepacked (concat) vs bestfit, side by side in one run.

Tiny model, same data, same constant learning rate; each policy trains until it has seen the same
budget of real tokens, then all are evaluated on the same validation batches (bestfit packs of the
validation split, so padding and truncation cannot flatter anyone).
"""

from __future__ import annotations

import csv
import os
import statistics
import tempfile
from pathlib import Path

import lightning as L
import torch

from pretrain.config import load_config, to_config
from pretrain.data.batching.evaluation import evaluation_batches, evaluation_chunks, validation_pairs
from pretrain.data.batching.policies import PolicySettings
from pretrain.data.ingest.cache import CacheSpec
from pretrain.data.ingest.prepare import prepare_cache
from pretrain.training.module import PretrainModule
from pretrain.training.run import train

NAME = "training"
TOKEN_BUDGET = 24_576
MAX_SEQ_LEN = 256
BATCH_SIZE = 4
POLICIES = {
    "padded": ["data=padded"],
    "prepacked (concat)": ["data=prepacked", "data.strategy=concat"],
    "bestfit": ["data=bestfit"],
}


class StopAtTokens(L.Callback):
    def __init__(self, budget: int):
        self.budget = budget
        self.steps = 0

    def on_train_batch_end(self, trainer, module, *args):
        if module.tokens_seen >= self.budget:
            self.steps = trainer.global_step
            trainer.should_stop = True


def _overrides(out: Path) -> list[str]:
    return [
        "experiment=smoke",
        f"output_dir={out}",
        "progress_bar=false",
        f"data.max_seq_len={MAX_SEQ_LEN}",
        f"train.batch_size={BATCH_SIZE}",
        "train.max_steps=1000",
        "train.val_every_n_steps=1000",
        "train.warmup_steps=3",
        "train.min_lr_ratio=1.0",
        "train.checkpoint_every_n_steps=1000",
    ]


@torch.no_grad()
def _validation_loss(model: torch.nn.Module, batches) -> float:
    model.eval()
    total, count = 0.0, 0
    for batch in batches:
        total += float(model.loss(batch, denominator=1))
        count += batch.num_targets
    return total / count


def _trained_model(checkpoint: Path) -> torch.nn.Module:
    saved = torch.load(checkpoint, map_location="cpu", weights_only=False)
    module = PretrainModule(**saved["hyper_parameters"])
    module.load_state_dict(saved["state_dict"])
    return module.model


def run() -> dict:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("PRETRAIN_CACHE_ROOT", str(Path(tmp) / "cache"))
        val = to_config(
            load_config(
                ["experiment=smoke", "data=bestfit", f"data.max_seq_len={MAX_SEQ_LEN}", "train.val_batches=8"]
            )
        )
        val_split = prepare_cache(CacheSpec.from_config(val), progress=False).split("validation")
        val_settings = PolicySettings.from_config(val.data, val.train, val.seed)
        # The same pairs training's val/loss scores (policy-independent): 8 x 1024 of the first documents.
        val_table = evaluation_chunks(val_split, MAX_SEQ_LEN, validation_pairs(val_settings))
        val_batches = list(evaluation_batches(val_settings, val_split, val_table))
        for label, policy in POLICIES.items():
            out = Path(tmp) / label.split()[0]
            stop = StopAtTokens(TOKEN_BUDGET)
            train(load_config([*_overrides(out), *policy]), callbacks=[stop])
            with open(out / "metrics.csv", newline="") as handle:
                metrics = [r for r in csv.DictReader(handle) if r.get("train/tokens_per_sec")]
            steady = metrics[2:] or metrics  # the first steps include start-up
            speeds = [float(r["train/tokens_per_sec"]) for r in steady]
            waste = [float(r["train/padding_waste"]) for r in metrics]
            rows.append(
                {
                    "policy": label,
                    "steps": stop.steps,
                    "real tokens": int(float(metrics[-1]["train/tokens"])),
                    "real tokens/s (median)": round(statistics.median(speeds), 1),
                    "padding waste": round(statistics.mean(waste), 4),
                    "train loss (last)": round(float(metrics[-1]["train/loss"]), 4),
                    "val loss (shared batches)": round(
                        _validation_loss(_trained_model(out / "checkpoints" / "last.ckpt"), val_batches), 4
                    ),
                }
            )
    base = rows[0]["real tokens/s (median)"]
    for row in rows:
        row["speedup vs padded"] = round(row["real tokens/s (median)"] / base, 2)
    return {
        "rows": rows,
        "settings": {
            "token_budget": TOKEN_BUDGET,
            "max_seq_len": MAX_SEQ_LEN,
            "batch_size": BATCH_SIZE,
            "model": "tiny",
        },
        "summary": [
            f"each policy trained to {TOKEN_BUDGET:,} real tokens "
            f"(tiny model, CPU, max_seq_len {MAX_SEQ_LEN})"
        ],
    }
