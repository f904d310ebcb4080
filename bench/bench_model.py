"""Padding-free packing vs padded rows: forward+backward real tokens/s of the tiny GPT on CPU (sdpa).

Both policies see the same chunks of the same synthetic documents (FineWeb-like lognormal lengths),
so they train on the same real tokens; the padded policy also computes its pad rows. The ideal
speedup is padded computed rows / real tokens; the target is measured >= 0.8 x ideal.
The document, chunk and packing helpers are shared with scripts/gpu_check.py.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from pretrain.data import PackedBatch, TokenSplit, chunk_table, gather_packed, gather_padded
from pretrain.model import GPT, GPTConfig

NAME = "model"
CAPACITY = 512  # pack capacity = padded row width = data.max_seq_len
ROWS_PER_BATCH = 8  # padded rows or packs per microbatch
DOCUMENTS = 24
ROUNDS = 2  # timed passes per policy (batches interleaved across policies); the fastest counts
TARGET = 0.8  # measured speedup >= TARGET x ideal


def fineweb_like_lengths(count: int, seed: int = 0, mu: float = 6.0, sigma: float = 1.0) -> np.ndarray:
    """Document lengths in tokens (EOS included, >= 2): lognormal like FineWeb's, median ~400."""
    rng = np.random.default_rng(seed)
    return np.maximum(2, np.rint(rng.lognormal(mu, sigma, size=count))).astype(np.int64)


def first_fit_decreasing(lengths: np.ndarray, capacity: int) -> list[list[int]]:
    """Indices of items per pack, each pack's lengths summing to <= capacity (a stand-in for bestfit)."""
    packs: list[list[int]] = []
    room: list[int] = []
    for i in np.argsort(-np.asarray(lengths), kind="stable"):
        n = int(lengths[i])
        slot = next((p for p, free in enumerate(room) if free >= n), None)
        if slot is None:
            packs.append([])
            room.append(capacity)
            slot = len(packs) - 1
        packs[slot].append(int(i))
        room[slot] -= n
    return packs


def synthetic_chunks(documents: int, capacity: int, seed: int = 0):
    """A random-token split of FineWeb-like documents and its chunks (<= capacity inputs each)."""
    split = TokenSplit.from_lengths(fineweb_like_lengths(documents, seed), seed=seed)
    return split, chunk_table(split.offsets, split.lengths, capacity)


def padded_batches(split: TokenSplit, table, capacity: int, rows: int) -> list[PackedBatch]:
    """MiniMind-style rows: one chunk per row of `capacity` columns, pads computed."""
    return [
        gather_padded(split.tokens, table.start[i : i + rows], table.length[i : i + rows], row_width=capacity)
        for i in range(0, len(table), rows)
    ]


def packed_batches(split: TokenSplit, table, capacity: int, packs_per_batch: int) -> list[PackedBatch]:
    """The same chunks packed first-fit-decreasing, `packs_per_batch` packs per padding-free batch."""
    packs = first_fit_decreasing(table.length, capacity)
    batches = []
    for i in range(0, len(packs), packs_per_batch):
        group = packs[i : i + packs_per_batch]
        order = np.array([c for pack in group for c in pack])
        batches.append(
            gather_packed(
                split.tokens, table.start[order], table.length[order], [len(p) for p in group], capacity
            )
        )
    return batches


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
    model = GPT(GPTConfig.preset("tiny", max_seq_len=CAPACITY), attn="sdpa")
    split, table = synthetic_chunks(DOCUMENTS, CAPACITY)
    policies = {
        "padded": padded_batches(split, table, CAPACITY, ROWS_PER_BATCH),
        "packed (ffd)": packed_batches(split, table, CAPACITY, ROWS_PER_BATCH),
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
            f"sdpa forward alone, {attn['segments']} segments / {attn['tokens']} tokens: one call per segment "
            f"{attn['per_segment_seconds']:.3f} s, bucketed ({attn['sdpa_calls_bucketed']} calls) "
            f"{attn['bucketed_seconds']:.3f} s",
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
