"""Packing policies side by side at capacity 4096: pack utilization, padding waste, cross-document
attention, and the best-fit sampler's throughput on one core.

Two length distributions: (a) the embedded pydocs corpus (GPT-2 token counts when the package's
source and tokenizer are importable, else characters / 4), (b) synthetic FineWeb-like documents,
12,000 lognormal(mu=6, sigma=1) token counts. Only lengths matter for everything but the
gather-inclusive throughput, which reads random tokens of those lengths.
"""

from __future__ import annotations

import math
import os
import time

import numpy as np
import torch

from pretrain.config import DataConfig, Policy, TrainConfig
from pretrain.data.chunking import chunk_table
from pretrain.data.packing import best_fit_decreasing, concat_windows
from pretrain.data.policies import PolicySettings, bestfit_layout
from pretrain.data.samplers import build_sampler
from pretrain.data.synthetic import fineweb_like_lengths
from pretrain.data.tokens import TokenSplit

NAME = "packing"
CAPACITY = 4096
BUFFERS = (1, 8, 64, 256)
PADDED_LENGTHS = (512, 1024, 4096)
EPOCHS = 5  # best-fit utilization: mean over this many shuffles (seeds 0..EPOCHS-1)
TARGET_UTILIZATION = 0.997
TARGET_GAP_POINTS = 0.2
TARGET_TOKENS_PER_S = 50e6


def _pydocs_lengths() -> tuple[np.ndarray, str]:
    """Token counts (EOS included) of the pydocs documents, and how they were measured."""
    try:
        from pretrain.data.sources import pydocs_documents

        texts = [doc.text for doc in pydocs_documents()]
        origin = "pretrain.data.sources.pydocs_documents"
    except ImportError:
        import pydoc_data.topics

        texts = list(pydoc_data.topics.topics.values())
        origin = "pydoc_data.topics"
    try:
        from pretrain.data.tokenizer import build_tokenizer, bundled_files

        tokenizer = build_tokenizer(bundled_files(), special_tokens=False)
        counts = [len(e.ids) for e in tokenizer.encode_batch(texts)]
        how = f"{origin}, GPT-2 tokens (bundled tokenizer) + EOS"
    except Exception:  # no tokenizer files: approximate
        counts = [max(1, len(t) // 4) for t in texts]
        how = f"{origin}, characters / 4 + EOS (no tokenizer)"
    return np.array(counts, dtype=np.int64) + 1, how


def _offsets(lengths: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)


def _settings() -> PolicySettings:
    """Best fit at CAPACITY: 8 packs per batch from a buffer of 64 chunks, seed 0."""
    data = DataConfig(policy=Policy.bestfit, max_seq_len=CAPACITY)
    train = TrainConfig(
        batch_size=8, microbatch_tokens=None, packing_buffer=64, eval_microbatch_tokens=8192, val_batches=None
    )
    return PolicySettings.from_config(data, train, seed=0)


def _packing_rows(dataset: str, lengths: np.ndarray) -> tuple[list[dict], dict]:
    table = chunk_table(_offsets(lengths), lengths, CAPACITY)
    tokens = table.total_pairs
    rows, util = [], {}

    def row(method: str, packs: int, real: int, slots: int, **extra) -> dict:
        return {"data": dataset, "method": method, "packs": packs, "util %": 100 * real / slots, **extra}

    lower = math.ceil(tokens / CAPACITY)
    util["lower_bound"] = tokens / (lower * CAPACITY)
    rows.append(row("lower bound", lower, tokens, lower * CAPACITY))
    _, ptr = best_fit_decreasing(table.length, CAPACITY)
    util["bfd"] = tokens / ((len(ptr) - 1) * CAPACITY)
    rows.append(row("bfd (offline)", len(ptr) - 1, tokens, (len(ptr) - 1) * CAPACITY))
    for buffer in BUFFERS:
        packs = []
        for epoch in range(EPOCHS):
            order = np.random.default_rng([0, epoch]).permutation(len(table))
            packs.append(len(bestfit_layout(table, order, buffer)))
        mean = float(np.mean(packs))
        util[f"bestfit_{buffer}"] = tokens / (mean * CAPACITY)
        util[f"bestfit_{buffer}_worst"] = tokens / (max(packs) * CAPACITY)
        rows.append(row(f"bestfit b={buffer}", int(round(mean)), tokens, mean * CAPACITY))
    windows = concat_windows(_offsets(lengths), lengths, CAPACITY)
    window_tokens = np.add.reduceat(windows.length, windows.ptr[:-1])
    first_piece = windows.length[windows.ptr[:-1]]
    stream = int(window_tokens.sum())
    cross = float((window_tokens - first_piece).sum() / stream)
    rows.append(
        row("concat, no mask", len(windows), stream, len(windows) * CAPACITY, **{"x-doc %": 100 * cross})
    )
    pairs = lengths - 1
    for width in PADDED_LENGTHS:
        real = int(np.minimum(pairs, width).sum())
        slots = len(lengths) * width
        extra = {"waste %": 100 * (1 - real / slots), "trunc %": 100 * (1 - real / int(pairs.sum()))}
        rows.append(row(f"padded {width}", len(lengths), real, slots, **extra))
    return rows, {"chunks": len(table), "pairs": tokens, "utilization": util, "cross_document": cross}


def _throughput(dataset: str, lengths: np.ndarray, repeats: int = 5) -> tuple[list[dict], dict]:
    """Best-fit sampler, buffer 64, capacity 4096, one core: packing metadata of whole epochs, then
    whole epochs of batches gathered from a random-token split of the same lengths."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _measure(dataset, lengths, repeats)
    finally:
        torch.set_num_threads(threads)


def _measure(dataset: str, lengths: np.ndarray, repeats: int) -> tuple[list[dict], dict]:
    split = TokenSplit.from_lengths(lengths, seed=1)
    sampler = build_sampler(_settings(), split)
    pairs = sampler.table.total_pairs
    metadata = []
    for epoch in range(1, repeats + 1):  # epoch 0 was planned by the constructor
        started = time.perf_counter()
        sampler.plan(epoch)
        metadata.append(time.perf_counter() - started)
    gathered, real = [], 0
    for _ in range(2):
        sampler._plans.clear()
        started = time.perf_counter()
        real = sum(batch.real_tokens for batch in sampler)
        gathered.append(time.perf_counter() - started)
    meta_rate = pairs / float(np.median(metadata))
    gather_rate = real / min(gathered)
    row = {
        "data": dataset,
        "method": "bestfit b=64 speed",
        "Mtok/s": meta_rate / 1e6,
        "+gather": gather_rate / 1e6,
    }
    return [row], {"metadata_tokens_per_s": meta_rate, "with_gather_tokens_per_s": gather_rate}


def run() -> dict:
    pydocs, how = _pydocs_lengths()
    datasets = {"pydocs": pydocs, "synth": fineweb_like_lengths(12_000, seed=0)}
    rows, details = [], {}
    for name, lengths in datasets.items():
        packing_rows, info = _packing_rows(name, lengths)
        speed_rows, speed = _throughput(name, lengths)
        rows += packing_rows + speed_rows
        details[name] = {
            "documents": len(lengths),
            "tokens": int(lengths.sum()),
            "mean_length": float(lengths.mean()),
            "median_length": float(np.median(lengths)),
            **info,
            **speed,
        }
    details["pydocs"]["lengths_from"] = how
    details["synth"]["lengths_from"] = "lognormal(mu=6, sigma=1) tokens, 12,000 documents, seed 0"
    verdicts, summary = {}, []
    for name, info in details.items():
        u = info["utilization"]
        gap = 100 * (u["bfd"] - u["bestfit_64"])
        util_rows = {k: round(100 * v, 4) for k, v in u.items()}
        info["utilization_pct"] = util_rows
        verdicts[name] = {
            "bestfit64_utilization_ok": u["bestfit_64"] >= TARGET_UTILIZATION,
            "bestfit64_within_0.2_points_of_bfd": gap <= TARGET_GAP_POINTS,
            "metadata_throughput_ok": info["metadata_tokens_per_s"] >= TARGET_TOKENS_PER_S,
        }
        summary.append(
            f"{name}: bestfit@64 {100 * u['bestfit_64']:.3f}% (target >= {100 * TARGET_UTILIZATION:.1f}%), "
            f"bfd {100 * u['bfd']:.3f}%, gap {gap:.3f} points (target <= {TARGET_GAP_POINTS}), "
            f"lower bound {100 * u['lower_bound']:.3f}%, "
            f"metadata {info['metadata_tokens_per_s'] / 1e6:,.0f}M tok/s (target >= 50M), "
            f"with gather {info['with_gather_tokens_per_s'] / 1e6:,.0f}M tok/s"
        )
    summary.append(f"pydocs lengths: {how}")
    return {
        "rows": rows,
        "summary": summary,
        "datasets": details,
        "targets": {
            "bestfit64_utilization": TARGET_UTILIZATION,
            "bestfit64_gap_to_bfd_points": TARGET_GAP_POINTS,
            "metadata_tokens_per_s": TARGET_TOKENS_PER_S,
        },
        "verdicts": verdicts,
        "settings": {
            "capacity": CAPACITY,
            "buffers": BUFFERS,
            "epochs_averaged": EPOCHS,
            "cpus": os.cpu_count(),
        },
    }


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=2, default=float))
