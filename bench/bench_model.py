"""Padding-free packing vs padded rows: forward+backward real tokens/s of the tiny GPT on CPU (sdpa).

Both policies see the same chunks of the same synthetic documents (FineWeb-like lognormal lengths),
so they train on the same real tokens; the padded policy also computes its pad rows. The ideal
speedup is padded computed rows / real tokens; the target is measured >= 0.8 x ideal.
The documents, chunks and batches come from bench/synthetic.py (shared with scripts/gpu_check.py).
"""

from __future__ import annotations

import time

import numpy as np
import torch
from synthetic import fineweb_like_lengths, packed_batches, padded_batches, synthetic_chunks

from pretrain.config import load_config, to_config
from pretrain.data import PackedBatch
from pretrain.model import GPT, GPTConfig

NAME = "model"
CAPACITY = 512  # pack capacity = padded row width = data.max_seq_len
ROWS_PER_BATCH = 8  # padded rows or packs per microbatch
DOCUMENTS = 24
ROUNDS = 2  # timed passes per policy (batches interleaved across policies); the fastest counts
TARGET = 0.8  # measured speedup >= TARGET x ideal


def train_step(model: GPT, batch: PackedBatch, denominator: int) -> float:
    """Seconds for one forward+backward."""
    started = time.perf_counter()
    model.loss(batch, denominator).backward()
    return time.perf_counter() - started


def interleaved_pass(model: GPT, policies: dict[str, list[PackedBatch]]) -> dict[str, float]:
    """Seconds per policy for one pass over its batches, the policies' batches taken in turn so that
    background load on a shared machine hits both alike."""
    seconds = dict.fromkeys(policies, 0.0)
    denominators = {name: sum(b.num_targets for b in batches) for name, batches in policies.items()}
    for i in range(max(len(batches) for batches in policies.values())):
        for name, batches in policies.items():
            if i < len(batches):
                seconds[name] += train_step(model, batches[i], denominators[name])
    model.zero_grad(set_to_none=True)
    return seconds


def attention_only(segments: int = 400, repeats: int = 3) -> dict:
    """sdpa forward over hundreds of lognormal segments: one call per segment vs the bucket plan."""
    import torch.nn.functional as F

    from pretrain.model.attention import plan_sdpa, sdpa_attention

    lengths = np.clip(fineweb_like_lengths(segments, seed=3, mu=4.0), 1, CAPACITY)
    q, k, v = (torch.randn(int(lengths.sum()), 4, 32) for _ in range(3))

    def per_segment():
        starts = np.cumsum(lengths) - lengths
        views = [
            [x[s : s + n].transpose(0, 1) for x in (q, k, v)] for s, n in zip(starts, lengths, strict=True)
        ]
        return torch.cat(
            [F.scaled_dot_product_attention(*qkv, is_causal=True).transpose(0, 1) for qkv in views]
        )

    def bucketed():
        return sdpa_attention(q, k, v, plan_sdpa(lengths, "cpu"))

    seconds = {}
    with torch.no_grad():
        torch.testing.assert_close(per_segment(), bucketed())  # same result, also warms both up
        for name, fn in (("per_segment", per_segment), ("bucketed", bucketed)):
            started = time.perf_counter()
            for _ in range(repeats):
                fn()
            seconds[name] = (time.perf_counter() - started) / repeats
    return {
        "segments": segments,
        "tokens": int(lengths.sum()),
        "sdpa_calls_bucketed": len(plan_sdpa(lengths, "cpu").buckets),
        **{f"{k}_seconds": v for k, v in seconds.items()},
    }


def run() -> dict:
    torch.manual_seed(0)
    settings = to_config(load_config(["model=tiny", f"data.max_seq_len={CAPACITY}"]))
    model = GPT(GPTConfig.from_settings(settings.model), attn="sdpa")
    split, table = synthetic_chunks(DOCUMENTS, CAPACITY)
    policies = {
        "padded": padded_batches(split, table, CAPACITY, ROWS_PER_BATCH),
        "packed (bfd)": packed_batches(split, table, CAPACITY, ROWS_PER_BATCH),
    }
    interleaved_pass(model, {name: batches[:1] for name, batches in policies.items()})  # warm-up
    best = dict.fromkeys(policies, float("inf"))
    for _ in range(ROUNDS):
        for name, seconds in interleaved_pass(model, policies).items():
            best[name] = min(best[name], seconds)

    real = int(table.length.sum())
    rows = []
    for name, batches in policies.items():
        computed = sum(b.num_tokens for b in batches)
        assert sum(b.real_tokens for b in batches) == real
        rows.append(
            {
                "policy": name,
                "attn": "sdpa",
                "batches": len(batches),
                "computed_rows": computed,
                "real_tokens": real,
                "padding_waste": 1 - real / computed,
                "seconds": best[name],
                "real_tokens_per_s": real / best[name],
            }
        )
    padded, packed = rows
    ideal = padded["computed_rows"] / packed["computed_rows"]
    measured = packed["real_tokens_per_s"] / padded["real_tokens_per_s"]
    packed["speedup"], packed["ideal_speedup"] = measured, ideal
    verdict = "PASS" if measured >= TARGET * ideal else "FAIL"
    attn = attention_only()
    return {
        "rows": rows,
        "summary": [
            f"tiny GPT, CPU, attn=sdpa, {len(table)} chunks of {DOCUMENTS} lognormal(6, 1) documents, "
            f"capacity {CAPACITY}, {ROWS_PER_BATCH} rows/packs per microbatch, best of {ROUNDS} passes",
            f"ideal speedup (padded computed rows / real tokens) {ideal:.2f}x; measured {measured:.2f}x "
            f"= {measured / ideal:.2f} of ideal (target >= {TARGET}): {verdict}",
            f"sdpa forward alone, {attn['segments']} segments / {attn['tokens']} tokens: "
            f"one call per segment {attn['per_segment_seconds']:.3f} s, "
            f"bucketed ({attn['sdpa_calls_bucketed']} calls) {attn['bucketed_seconds']:.3f} s",
        ],
        "attention_only": attn,
        "target": {"measured_over_ideal": TARGET},
        "measured_over_ideal": measured / ideal,
        "verdict": verdict,
        "settings": {
            "capacity": CAPACITY,
            "rows_per_batch": ROWS_PER_BATCH,
            "documents": DOCUMENTS,
            "chunks": len(table),
            "threads": torch.get_num_threads(),
        },
    }
