"""The cost of the framework around a llama-tiny step on CPU: `train()` (Lightning, the token-weighted
update, the LR schedule, gradient clipping, metrics, checkpoint bookkeeping) against a minimal
hand-written loop (the model's loss over the batch's targets, backward, AdamW) over the same model
(llama-tiny, its own loss head) and the same batches in the same order (the run's own sampler).

Per round each side trains STEPS updates of one bestfit microbatch with one torch thread, timed by the
main thread's CPU clock (`time.thread_time`: on a machine shared with other jobs, wall time measures
their load, not this code): the framework's step from one step's end to the next (data fetch,
Lightning's loop, metrics and logging included), the loop's per update. The first WARMUP steps of each
are left out. Ratio = framework / loop per-step median, per round; the spread is over rounds. The
issue's target: within 1.2x.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

import lightning as L
import torch

from pretrain.config import load_config, to_config
from pretrain.data.batching.policies import PolicySettings
from pretrain.data.batching.samplers import build_sampler
from pretrain.data.ingest.cache import CacheSpec
from pretrain.data.ingest.prepare import prepare_cache
from pretrain.model import build_model, config_from_settings
from pretrain.training.run import train
from pretrain.training.startup import with_tokenizer_vocab

NAME = "llama"
STEPS = 10
WARMUP = 2
ROUNDS = 3
TARGET = 1.2
OVERRIDES = [
    "experiment=smoke",
    "model=llama-tiny",
    "data=bestfit",
    "attn=sdpa",
    "data.max_seq_len=256",
    "train.batch_size=4",
    f"train.max_steps={STEPS}",
    "train.val_every_n_steps=1000",
    "train.checkpoint_every_n_steps=1000",
    "progress_bar=false",
    "logger=csv",
]


class StepClock(L.Callback):
    """The main thread's CPU seconds from one step's end to the next: the whole loop body of the
    framework (data fetch, update, optimizer, schedule, metrics, logging) and nothing of other
    processes on a shared machine."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_train_batch_end(self, *args) -> None:
        self.ends.append(time.thread_time())


def framework_steps(out: Path) -> list[float]:
    """CPU seconds per update of `train()` (end of one step to the end of the next)."""
    clock = StepClock()
    train(load_config([*OVERRIDES, f"output_dir={out}"]), callbacks=[clock])
    return [b - a for a, b in zip(clock.ends, clock.ends[1:], strict=False)][WARMUP - 1 :]


def loop_steps(batches) -> list[float]:
    """Seconds per update of the minimal loop over `batches` (the run's first STEPS, in order)."""
    config = with_tokenizer_vocab(to_config(load_config(OVERRIDES)))
    torch.manual_seed(config.seed)  # as the run builds its model
    model = build_model(config_from_settings(config.model), attn="sdpa")
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.train.lr, weight_decay=0.0)
    seconds = []
    for batch in batches:
        started = time.thread_time()
        model.loss(batch, batch.num_targets).backward()  # the model's own loss: only the loop differs
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        seconds.append(time.thread_time() - started)
    return seconds[WARMUP:]


def run() -> dict:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # all compute in the main thread, so that its CPU clock sees all of it
    try:
        return _measure()
    finally:
        torch.set_num_threads(threads)


def _measure() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("PRETRAIN_CACHE_ROOT", str(Path(tmp) / "cache"))
        config = to_config(load_config(OVERRIDES))
        split = prepare_cache(CacheSpec.from_config(config), progress=False).split("train")
        settings = PolicySettings.from_config(config.data, config.train, config.seed)
        sampler = build_sampler(settings, split)
        batches = [batch for _, batch in zip(range(STEPS), sampler, strict=False)]
        rounds = []
        for i in range(ROUNDS):
            framework = statistics.median(framework_steps(Path(tmp) / f"run{i}"))
            loop = statistics.median(loop_steps(batches))
            rounds.append({"round": i, "framework s/step": framework, "loop s/step": loop})
    for row in rounds:
        row["ratio"] = row["framework s/step"] / row["loop s/step"]
        row["framework s/step"] = round(row["framework s/step"], 4)
        row["loop s/step"] = round(row["loop s/step"], 4)
        row["ratio"] = round(row["ratio"], 3)
    ratios = [r["ratio"] for r in rounds]
    median = statistics.median(ratios)
    verdict = "PASS" if median <= TARGET else "FAIL"
    tokens = sum(b.real_tokens for b in batches) / len(batches)
    return {
        "rows": rounds,
        "ratio_median": median,
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "verdict": verdict,
        "target": TARGET,
        "settings": {"steps": STEPS, "warmup": WARMUP, "rounds": ROUNDS, "real_tokens_per_step": tokens},
        "summary": [
            f"llama-tiny, CPU, bestfit 4 x 256 (~{tokens:.0f} real tokens a step), {STEPS} steps, first "
            f"{WARMUP} left out, {ROUNDS} alternating rounds",
            f"train() / minimal loop per-step time: median {median:.3f}x (min {min(ratios):.3f}, max "
            f"{max(ratios):.3f}); target <= {TARGET}: {verdict}",
        ],
    }
