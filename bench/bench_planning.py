"""Planning at scale, before and after issue 33: `data=prepacked data.strategy=concat` against the
BFD plan on the same chunks, and the composition audit every `train()` ends with.

Data: 10M chunks of FineWeb-like documents (lognormal lengths, median 500 tokens, sigma 1) at
capacity 2048; lengths only (the split's token array is a zero-stride stand-in: no plan or audit reads
a token). Each measurement is CPU seconds of one call in this process (numba compiled beforehand),
the best of ROUNDS, the variants side by side in one run so that their ratios are what counts on a
shared machine:
- concat plan: the prepacked layout of `strategy=concat` (concat windows, then the layout), now
  (the union of window and document starts placed in linear time) and as before (`np.union1d`,
  which numpy 2.4 computes through a hash table, then `searchsorted` per piece);
- BFD plan: the prepacked layout of `strategy=bfd` (numba best-fit-decreasing);
- the audit: `data.audit.audit_plan` (as `composition_audit` runs it on the sampler's epoch-0 plan)
  of a bestfit plan and of the concat plan, now (each document's first and last unit) and as before
  (`np.unique` over (document, unit) keys). Both forms give the same numbers (checked here too).
`python bench/bench_planning.py --chunks 1e6` runs a smaller size.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import numpy as np
from synthetic import fineweb_like_lengths

from pretrain.data.batching.chunking import chunk_table
from pretrain.data.batching.policies import (
    BestfitConfig,
    BestfitPolicy,
    EpochPlan,
    PrepackedConfig,
    PrepackedPolicy,
    bestfit_layout,
    packs,
    shuffled,
)
from pretrain.data.measures import audit
from pretrain.data.tokens import TokenSplit

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from helpers.reference import union1d_concat_windows, unique_fragmented  # noqa: E402  the tests' reference

NAME = "planning"
CHUNKS = 10_000_000
CAPACITY = 2048
MEDIAN = 500
ROUNDS = 2
TARGET_CONCAT_VS_BFD = 2.0
TARGET_AUDIT_SECONDS = 1.0


def _lengths(chunks: int) -> np.ndarray:
    """FineWeb-like document lengths (median MEDIAN) whose chunks at CAPACITY number `chunks`."""
    lengths = fineweb_like_lengths(int(chunks * 0.97) + 64, seed=0, mu=math.log(MEDIAN))
    counts = np.cumsum(-(-(lengths - 1) // CAPACITY))
    return lengths[: int(np.searchsorted(counts, chunks, side="left")) + 1]


def _split(lengths: np.ndarray) -> TokenSplit:
    offsets = np.zeros(len(lengths), dtype=np.int64)
    np.cumsum(lengths[:-1], out=offsets[1:])
    tokens = np.broadcast_to(np.uint16(0), (int(lengths.sum()),))  # never read
    return TokenSplit(tokens=tokens, offsets=offsets, lengths=lengths)


def _cpu(call, rounds: int = ROUNDS):
    """(best CPU seconds of `rounds` calls, the last result)."""
    best, result = math.inf, None
    for _ in range(rounds):
        started = time.process_time()
        result = call()
        best = min(best, time.process_time() - started)
    return best, result


def measure(chunks: int = CHUNKS) -> dict:
    split = _split(_lengths(chunks))
    table = chunk_table(split.offsets, split.lengths, CAPACITY)
    rng = np.random.default_rng(0)
    concat = PrepackedPolicy(PrepackedConfig(policy="prepacked", max_seq_len=CAPACITY))
    bfd = PrepackedPolicy(PrepackedConfig(policy="prepacked", max_seq_len=CAPACITY, strategy="bfd"))
    bestfit = BestfitPolicy(BestfitConfig(policy="bestfit", max_seq_len=CAPACITY))
    small = _split(split.lengths[:64])
    bfd.layout(small, chunk_table(small.offsets, small.lengths, CAPACITY), rng, None)  # compile first
    bestfit_layout(table, np.arange(64, dtype=np.int32), 64)

    bfd_seconds, _ = _cpu(lambda: bfd.layout(split, table, rng, None))
    concat_seconds, layout = _cpu(lambda: concat.layout(split, table, rng, None))
    new_windows = packs.concat_windows
    packs.concat_windows = union1d_concat_windows  # as before: np.union1d, then searchsorted
    try:
        before_seconds, before = _cpu(lambda: concat.layout(split, table, rng, None), rounds=1)
    finally:
        packs.concat_windows = new_windows
    for field in ("ptr", "ends_document"):
        assert np.array_equal(getattr(before, field), getattr(layout, field)), field
    for field in ("doc", "start", "length"):
        assert np.array_equal(getattr(before.table, field), getattr(layout.table, field)), field
    del before

    plans = {
        "concat": (concat, EpochPlan(layout, None, 1, 0, 0)),
        "bestfit": (
            bestfit,
            EpochPlan(
                bestfit_layout(table, shuffled(np.random.default_rng([0, 0]), len(table)), 64), None, 1, 0, 0
            ),
        ),
    }
    audits = {}
    for name, (policy, plan) in plans.items():
        after, numbers = _cpu(lambda: audit.audit_plan(policy, split, plan))  # noqa: B023
        new = audit.fragmented_documents
        audit.fragmented_documents = unique_fragmented
        try:
            before_audit, old_numbers = _cpu(lambda: audit.audit_plan(policy, split, plan), rounds=1)  # noqa: B023
        finally:
            audit.fragmented_documents = new
        assert old_numbers == numbers, (old_numbers, numbers)
        audits[name] = {"before": before_audit, "after": after, "fragmented": numbers["fragmented_documents"]}
    return {
        "chunks": len(table),
        "documents": len(split),
        "tokens": split.num_tokens,
        "bfd_seconds": bfd_seconds,
        "concat_seconds": concat_seconds,
        "concat_before_seconds": before_seconds,
        "audit": audits,
    }


def run(chunks: int = CHUNKS) -> dict:
    m = measure(chunks)
    label = f"{m['chunks'] / 1e6:,.1f}M chunks"
    rows = [
        {"data": label, "what": "bfd plan", "CPU s": m["bfd_seconds"], "x bfd": 1.0},
        {
            "data": label,
            "what": "concat plan, before (np.union1d)",
            "CPU s": m["concat_before_seconds"],
            "x bfd": m["concat_before_seconds"] / m["bfd_seconds"],
        },
        {
            "data": label,
            "what": "concat plan, now (linear)",
            "CPU s": m["concat_seconds"],
            "x bfd": m["concat_seconds"] / m["bfd_seconds"],
        },
    ]
    for name, a in m["audit"].items():
        rows.append({"data": label, "what": f"audit of {name}, before (np.unique)", "CPU s": a["before"]})
        rows.append(
            {
                "data": label,
                "what": f"audit of {name}, now",
                "CPU s": a["after"],
                "before / now": a["before"] / a["after"],
            }
        )
    ratio = m["concat_seconds"] / m["bfd_seconds"]
    audit_max = max(a["after"] for a in m["audit"].values())
    summary = [
        f"concat plan at {label}: {m['concat_seconds']:.2f} CPU s = {ratio:.2f}x the BFD plan "
        f"({m['bfd_seconds']:.2f} s; target <= {TARGET_CONCAT_VS_BFD:.0f}x), before "
        f"{m['concat_before_seconds']:.2f} s = {m['concat_before_seconds'] / m['bfd_seconds']:.1f}x "
        f"({m['concat_before_seconds'] / m['concat_seconds']:.1f}x slower than now)",
        *(
            f"audit of the {name} plan at {label}: {a['after']:.2f} CPU s "
            f"(target <= {TARGET_AUDIT_SECONDS:.0f}), "
            f"before {a['before']:.2f} s ({a['before'] / a['after']:.1f}x)"
            for name, a in m["audit"].items()
        ),
    ]
    return {
        "rows": rows,
        "summary": summary,
        "measured": m,
        "targets": {"concat_vs_bfd": TARGET_CONCAT_VS_BFD, "audit_seconds": TARGET_AUDIT_SECONDS},
        "verdicts": {
            "concat_within_2x_bfd": ratio <= TARGET_CONCAT_VS_BFD,
            "audit_within_1s": audit_max <= TARGET_AUDIT_SECONDS,
        },
        "settings": {"capacity": CAPACITY, "median_length": MEDIAN, "rounds": ROUNDS},
    }


if __name__ == "__main__":
    size = int(float(sys.argv[2])) if len(sys.argv) == 3 and sys.argv[1] == "--chunks" else CHUNKS
    print(json.dumps(run(size), indent=2, default=float))
