"""Packing policies side by side at capacity 4096: pack utilization, padding waste, cross-document
attention, and the best-fit sampler's throughput on one core; epoch plans at scale; validation memory.

Two length distributions: (a) the embedded pydocs corpus (GPT-2 token counts when the package's
source and tokenizer are importable, else characters / 4), (b) synthetic FineWeb-like documents,
12,000 lognormal(mu=6, sigma=1) token counts. Only lengths matter for everything but the
gather-inclusive throughput, which reads random tokens of those lengths.

Plan at scale (`measure_plan`, each in a fresh process): a bestfit epoch plan (the sampler's
shuffle + best fit, buffer 64), a firstfit epoch plan (the shuffle + online first fit, 8 open bins),
the prepacked BFD plan and a vsl epoch plan (the power-of-two decomposition, a sampler's first plan,
then each bucket's shuffle, its units and the natural curriculum's order of whole updates of 8 units)
of synthetic FineWeb-like chunks at max_seq_len 1024, at 10M, 100M, 1B and 10B tokens (also
extrapolated from 1B with the growth below it) for the fast planners, and at 10M and 100M
(extrapolated to 10B) for the pure-Python references (vsl is numpy only: it has none); seconds (wall
and CPU: on a shared machine CPU seconds are the steadier number) and peak memory (tracemalloc:
numpy and numba allocations). `python bench/bench_packing.py --plan 1e10` measures one size alone.
Validation memory (`measure_validation`): peak RSS growth of the tiny model scoring one 8192-token
microbatch, chunked loss vs one whole-batch head.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
import tracemalloc

import numpy as np
import torch
from synthetic import fineweb_like_lengths

from pretrain.config import TrainConfig
from pretrain.data.batching import packing
from pretrain.data.batching.chunking import chunk_table
from pretrain.data.batching.packing import best_fit_decreasing, concat_windows
from pretrain.data.batching.policies import (
    BestfitConfig,
    BestfitPolicy,
    EpochPlan,
    Layout,
    PolicySettings,
    VslConfig,
    VslPolicy,
    bestfit_layout,
    firstfit_layout,
    shuffled,
)
from pretrain.data.batching.policies.layout import chunk_layout
from pretrain.data.batching.samplers import build_sampler
from pretrain.data.tokens import TokenSplit

NAME = "packing"
CAPACITY = 4096
BUFFERS = (1, 8, 64, 256)
PADDED_LENGTHS = (512, 1024, 4096)
EPOCHS = 5  # best-fit utilization: mean over this many shuffles (seeds 0..EPOCHS-1)
TARGET_UTILIZATION = 0.997
TARGET_GAP_POINTS = 0.2
TARGET_TOKENS_PER_S = 50e6
PLAN_TOKENS = (10_000_000, 100_000_000, 1_000_000_000, 10_000_000_000)
REFERENCE_TOKENS = (10_000_000, 100_000_000)
PLAN_SEQ_LEN = 1024
PLAN_BUFFER = 64
OPEN_BINS = 8  # firstfit's default (torchtitan's FirstFitPackIterDataset keeps 8 bins open)
PLAN_METHODS = ("bestfit", "firstfit", "bfd", "vsl")
REFERENCE_METHODS = ("bestfit", "firstfit", "bfd")  # the planners with a pure-Python twin (vsl is numpy)
VSL_BATCH = 8  # vsl's units (of max_seq_len tokens) per microbatch: one update of 8 units per bucket
TARGET_PLAN_SECONDS = 5.0  # per rank, 10B tokens
TARGET_PLAN_MIB = 1024.0
TARGET_VALIDATION_MIB = 1024.0


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
        from pretrain.data.ingest.tokenizer import build_tokenizer, bundled_files

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
    data = BestfitConfig(policy="bestfit", max_seq_len=CAPACITY, packing_buffer=64)
    train = TrainConfig(batch_size=8, microbatch_tokens=None, eval_microbatch_tokens=8192, val_batches=None)
    return PolicySettings.from_config(data, train, seed=0)


def _cross_document_unmasked(layout: Layout) -> float:
    """Share of real tokens that would see another document with data.document_mask=false."""
    config = BestfitConfig(policy="bestfit", max_seq_len=CAPACITY, document_mask=False)
    return BestfitPolicy(config).cross_document_visible_fraction(EpochPlan(layout, None, 1, 0, 0))


def _packing_rows(dataset: str, lengths: np.ndarray) -> tuple[list[dict], dict]:
    table = chunk_table(_offsets(lengths), lengths, CAPACITY)
    tokens = table.total_pairs
    rows, util = [], {}

    def row(method: str, packs: int, real: int, slots: int, **extra) -> dict:
        return {"data": dataset, "method": method, "packs": packs, "util %": 100 * real / slots, **extra}

    lower = math.ceil(tokens / CAPACITY)
    util["lower_bound"] = tokens / (lower * CAPACITY)
    rows.append(row("lower bound", lower, tokens, lower * CAPACITY))
    items, ptr = best_fit_decreasing(table.length, CAPACITY)
    util["bfd"] = tokens / ((len(ptr) - 1) * CAPACITY)
    cross = {"bfd": _cross_document_unmasked(chunk_layout(table, items, ptr))}
    rows.append(
        row(
            "bfd (offline)",
            len(ptr) - 1,
            tokens,
            (len(ptr) - 1) * CAPACITY,
            **{"x-doc %": 100 * cross["bfd"]},
        )
    )
    for buffer in BUFFERS:
        packs = []
        for epoch in range(EPOCHS):
            order = np.random.default_rng([0, epoch]).permutation(len(table))
            layout = bestfit_layout(table, order, buffer)
            packs.append(len(layout))
        mean = float(np.mean(packs))
        util[f"bestfit_{buffer}"] = tokens / (mean * CAPACITY)
        util[f"bestfit_{buffer}_worst"] = tokens / (max(packs) * CAPACITY)
        cross[f"bestfit_{buffer}"] = _cross_document_unmasked(layout)  # the last shuffle's
        extra = {"x-doc %": 100 * cross[f"bestfit_{buffer}"]}
        rows.append(row(f"bestfit b={buffer}", int(round(mean)), tokens, mean * CAPACITY, **extra))
    packs = []
    for epoch in range(EPOCHS):  # the same shuffles as best fit's
        order = np.random.default_rng([0, epoch]).permutation(len(table))
        layout = firstfit_layout(table, order, OPEN_BINS)
        packs.append(len(layout))
    mean = float(np.mean(packs))
    util[f"firstfit_{OPEN_BINS}"] = tokens / (mean * CAPACITY)
    util[f"firstfit_{OPEN_BINS}_worst"] = tokens / (max(packs) * CAPACITY)
    cross[f"firstfit_{OPEN_BINS}"] = _cross_document_unmasked(layout)
    extra = {"x-doc %": 100 * cross[f"firstfit_{OPEN_BINS}"]}
    rows.append(row(f"firstfit k={OPEN_BINS}", int(round(mean)), tokens, mean * CAPACITY, **extra))
    windows = concat_windows(_offsets(lengths), lengths, CAPACITY)
    window_tokens = np.add.reduceat(windows.length, windows.ptr[:-1])
    first_piece = windows.length[windows.ptr[:-1]]
    stream = int(window_tokens.sum())
    cross["concat"] = float((window_tokens - first_piece).sum() / stream)
    rows.append(
        row(
            "concat, no mask",
            len(windows),
            stream,
            len(windows) * CAPACITY,
            **{"x-doc %": 100 * cross["concat"]},
        )
    )
    pairs = lengths - 1
    for width in PADDED_LENGTHS:
        real = int(np.minimum(pairs, width).sum())
        slots = len(lengths) * width
        extra = {"waste %": 100 * (1 - real / slots), "trunc %": 100 * (1 - real / int(pairs.sum()))}
        rows.append(row(f"padded {width}", len(lengths), real, slots, **extra))
    # cross_document: share of real tokens seeing another document with data.document_mask=false
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


def _status_mib(key: str) -> float:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return math.nan


def _rss_mib() -> float:
    """Resident memory now, after resetting the peak (Linux: VmHWM restarts from VmRSS)."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
    except OSError:
        pass
    return _status_mib("VmRSS")


def _peak_rss_mib() -> float:
    """Peak resident memory since the last `_rss_mib()`."""
    return _status_mib("VmHWM")


def plan_lengths(num_tokens: int, seed: int = 0) -> np.ndarray:
    """FineWeb-like document lengths adding up to about `num_tokens` (the first documents whose
    running total stays within it)."""
    mean = math.exp(6.0 + 0.5)  # lognormal(mu=6, sigma=1)
    lengths = fineweb_like_lengths(int(num_tokens / mean * 1.05) + 16, seed=seed)
    return lengths[: max(1, int(np.searchsorted(np.cumsum(lengths), num_tokens, side="right")))]


def measure_plan(
    num_tokens: int,
    max_seq_len: int = PLAN_SEQ_LEN,
    buffer: int = PLAN_BUFFER,
    method: str = "bestfit",
    reference: bool = False,
) -> dict:
    """One epoch plan of synthetic FineWeb-like chunks of `num_tokens` tokens (in this process;
    `measure_plan_isolated` runs it in a fresh one, so that the compile time is a start-up's).

    `method`: "bestfit" (what a bestfit rank does every epoch: the seeded int32 shuffle, then best
    fit from a `buffer`-chunk buffer through that order), "firstfit" (the same shuffle, then online
    first fit with OPEN_BINS bins open), "bfd" (the prepacked strategy's best-fit-decreasing, built
    once) or "vsl" (a sampler's first vsl plan: the decomposition into power-of-two pieces, then the
    epoch's units and their natural-curriculum order of whole updates of VSL_BATCH units; "packs"
    counts its units, and the bytes kept include the piece table).
    `reference`: the pure-Python reference planners instead.
    Returns seconds (wall), cpu_seconds, pack_seconds (packing alone), peak_mib (tracemalloc peak
    of a second, traced run: numpy and numba allocations; None for the reference, whose Python
    objects would take minutes to trace), compile_seconds (importing numba and compiling the kernels
    or loading them from its cache), chunks, packs, tokens,
    plan_bytes_per_chunk (the arrays a plan keeps) and table_bytes_per_chunk (the chunk table)."""
    lengths = plan_lengths(num_tokens)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    table = chunk_table(offsets, lengths, max_seq_len)
    del offsets, lengths
    compile_started = time.perf_counter()
    kernels = None if reference else packing.numba_kernels()
    if kernels is not None:  # compile (or load the cached machine code) before timing
        best_fit_decreasing(table.length[:64], max_seq_len)
        bestfit_layout(table, np.arange(min(64, len(table)), dtype=np.int32), buffer)
        firstfit_layout(table, np.arange(min(64, len(table)), dtype=np.int32), OPEN_BINS)
    compile_seconds = time.perf_counter() - compile_started
    if reference:
        os.environ["PRETRAIN_NO_NUMBA"] = "1"

    def plan() -> tuple[float, int, int]:
        packed = time.perf_counter()
        if method in ("bestfit", "firstfit"):
            order = shuffled(np.random.default_rng([0, 1]), len(table))
            packed = time.perf_counter()
            if method == "bestfit":
                layout = bestfit_layout(table, order, buffer)
            else:
                layout = firstfit_layout(table, order, OPEN_BINS)
            return time.perf_counter() - packed, len(layout), layout.nbytes
        if method == "vsl":
            policy = VslPolicy(VslConfig(policy="vsl", max_seq_len=max_seq_len))
            unused = TokenSplit.from_lengths(np.array([2]), seed=0)  # vsl's layout reads the table only
            layout = policy.layout(unused, table, np.random.default_rng([0, 1]), None)
            order = policy.unit_order(layout, np.random.default_rng([0, 1]), VSL_BATCH)
            seconds = time.perf_counter() - packed
            assert order is not None
            pieces = layout.table
            table_bytes = pieces.doc.nbytes + pieces.start.nbytes + pieces.length.nbytes
            kept = layout.nbytes + order.nbytes + table_bytes
            return seconds, len(layout), kept
        items, ptr = best_fit_decreasing(table.length, max_seq_len)
        return time.perf_counter() - packed, len(ptr) - 1, items.nbytes + ptr.nbytes

    if method not in PLAN_METHODS:
        raise ValueError(f"method must be one of {', '.join(PLAN_METHODS)}, got {method!r}")
    if reference:
        os.environ["PRETRAIN_NO_NUMBA"] = "1"
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        pack_seconds, packs, kept = plan()  # timed untraced (tracemalloc slows Python code down)
        seconds, cpu_seconds = time.perf_counter() - wall, time.process_time() - cpu
        peak = None
        if not reference:  # the reference's Python objects would take minutes to trace
            tracemalloc.start()
            try:
                plan()
                peak = tracemalloc.get_traced_memory()[1] / 2**20
            finally:
                tracemalloc.stop()
    finally:
        os.environ.pop("PRETRAIN_NO_NUMBA", None)
    chunks = len(table)
    return {
        "method": method,
        "planner": "reference" if reference else ("numba" if kernels is not None else "reference (no numba)"),
        "tokens": int(table.total_pairs),
        "chunks": chunks,
        "packs": packs,
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "pack_seconds": pack_seconds,
        "compile_seconds": compile_seconds,
        "peak_mib": peak,
        "plan_bytes_per_chunk": kept / chunks,
        "table_bytes_per_chunk": (table.doc.nbytes + table.start.nbytes + table.length.nbytes) / chunks,
    }


def measure_plan_isolated(num_tokens: int, **kwargs) -> dict:
    """`measure_plan` in a fresh Python process (clean RSS, no memory left from earlier runs)."""
    args = json.dumps({"num_tokens": num_tokens, **kwargs})
    done = subprocess.run(
        [sys.executable, __file__, "--measure-plan", args], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_validation(tokens: int = 8192, max_seq_len: int = 1024, whole_batch: bool = False) -> dict:
    """Peak RSS growth (MiB) of the tiny model (GPT-2 vocabulary) scoring one `tokens`-token validation
    microbatch without gradients, as training's validation does; `whole_batch` puts the head over
    the whole microbatch at once (the path before the chunked loss). Meaningful in a fresh process."""
    from pretrain.data.batching.batch import gather_packed
    from pretrain.data.tokens import GPT2_VOCAB_SIZE
    from pretrain.model import GPT, GPTConfig
    from pretrain.model.loss import eval_chunk_rows, token_cross_entropy

    torch.manual_seed(0)
    config = GPTConfig(vocab_size=GPT2_VOCAB_SIZE, n_layer=4, n_head=4, d_model=128, max_seq_len=max_seq_len)
    model = GPT(config, attn="sdpa").eval()
    packs = max(1, tokens // max_seq_len)
    split = TokenSplit.from_lengths(np.full(packs, max_seq_len + 1), seed=0)
    batch = gather_packed(
        split.tokens, split.offsets, np.full(packs, max_seq_len), np.ones(packs, np.int64), max_seq_len
    )
    rss_before = _rss_mib()
    started = time.perf_counter()
    with torch.no_grad():
        if whole_batch:
            rows = batch.num_tokens
            targets = batch.targets
            loss = token_cross_entropy(model.hidden_states(batch), model.wte.weight, targets, chunk_rows=rows)
            loss = loss.sum() / batch.num_targets
        else:
            rows = eval_chunk_rows(GPT2_VOCAB_SIZE)
            loss = model.loss(batch, denominator=batch.num_targets)
    return {
        "tokens": batch.num_tokens,
        "loss_chunk_rows": min(rows, batch.num_tokens),
        "peak_rss_growth_mib": max(0.0, _peak_rss_mib() - rss_before),
        "seconds": time.perf_counter() - started,
        "loss": float(loss),
    }


def _isolated(flag: str, **kwargs) -> dict:
    done = subprocess.run(
        [sys.executable, __file__, flag, json.dumps(kwargs)], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _plan_at_scale() -> tuple[list[dict], dict]:
    results: dict = {"fast": {}, "reference": {}}
    rows = []
    for method in PLAN_METHODS:
        fast = [measure_plan_isolated(n, method=method) for n in PLAN_TOKENS]
        slow = [
            measure_plan_isolated(n, method=method, reference=True)
            for n in (REFERENCE_TOKENS if method in REFERENCE_METHODS else ())
        ]
        # Growth per 10x tokens at each step, and 10B extrapolated from 1B with the last growth
        # below it (what a run without the 10B measurement would predict), beside the measurement.
        growth = [big["seconds"] / small["seconds"] for small, big in zip(fast, fast[1:], strict=False)]
        cpu_growth = [
            big["cpu_seconds"] / small["cpu_seconds"] for small, big in zip(fast, fast[1:], strict=False)
        ]
        one_b, ten_b = fast[-2], fast[-1]
        extrapolated = {
            "tokens": 10_000_000_000,
            "seconds": one_b["seconds"] * growth[-2] * 10_000_000_000 / (10 * one_b["tokens"]),
            "peak_mib": one_b["peak_mib"] * (one_b["peak_mib"] / fast[-3]["peak_mib"]),
        }
        ref_growth = slow[-1]["seconds"] / slow[-2]["seconds"] if slow else None
        reference_10b = (
            slow[-1]["seconds"] * ref_growth ** math.log10(10_000_000_000 / slow[-1]["tokens"])
            if slow and ref_growth
            else None
        )
        results["fast"][method] = {
            "measured": fast,
            "growth_per_10x": growth,
            "cpu_growth_per_10x": cpu_growth,
            "extrapolated_10B_from_1B": extrapolated,
            "measured_10B": ten_b,
        }
        results["reference"][method] = {
            "measured": slow,
            "growth_per_10x": ref_growth,
            "extrapolated_10B_seconds": reference_10b,
        }
        for r in fast + slow:
            rows.append(
                {
                    "data": f"plan {r['tokens'] / 1e6:,.0f}M tok",
                    "method": f"{method} ({r['planner']})",
                    "packs": r["packs"],
                    "chunks": r["chunks"],
                    "seconds": r["seconds"],
                    "CPU s": r["cpu_seconds"],
                    "peak MiB": r["peak_mib"],
                    "B/chunk kept": r["plan_bytes_per_chunk"],
                }
            )
        rows.append(
            {
                "data": "plan 10B tok (extrapolated from 1B)",
                "method": f"{method} (numba)",
                "seconds": extrapolated["seconds"],
                "peak MiB": extrapolated["peak_mib"],
            }
        )
    return rows, results


def _validation_memory() -> tuple[list[dict], dict]:
    chunked = _isolated("--measure-validation")
    whole = _isolated("--measure-validation", whole_batch=True)
    rows = [
        {
            "data": "validation 8192 tok",
            "method": f"tiny, head over {r['loss_chunk_rows']} rows",
            "peak MiB": r["peak_rss_growth_mib"],
            "seconds": r["seconds"],
        }
        for r in (chunked, whole)
    ]
    return rows, {"chunked": chunked, "whole_batch": whole}


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
    plan_rows, plan_at_scale = _plan_at_scale()
    validation_rows, validation_memory = _validation_memory()
    rows += plan_rows + validation_rows
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
            f"firstfit@{OPEN_BINS} {100 * u[f'firstfit_{OPEN_BINS}']:.3f}%, "
            f"metadata {info['metadata_tokens_per_s'] / 1e6:,.0f}M tok/s (target >= 50M), "
            f"with gather {info['with_gather_tokens_per_s'] / 1e6:,.0f}M tok/s"
        )
    summary.append(f"pydocs lengths: {how}")
    for method, info in plan_at_scale["fast"].items():
        at_10b = info["measured_10B"]
        reference = plan_at_scale["reference"][method]
        verdicts[f"{method}_plan_10B"] = {
            "seconds_ok": at_10b["seconds"] <= TARGET_PLAN_SECONDS,
            "cpu_seconds_ok": at_10b["cpu_seconds"] <= TARGET_PLAN_SECONDS,
            "memory_ok": at_10b["peak_mib"] <= TARGET_PLAN_MIB,
        }
        growth = ", ".join(f"x{g:.1f}" for g in info["growth_per_10x"])
        summary.append(
            f"{method} plan at 10B tokens ({at_10b['chunks']:,} chunks): {at_10b['seconds']:.2f} s "
            f"(CPU {at_10b['cpu_seconds']:.2f} s; target <= {TARGET_PLAN_SECONDS:.0f}), "
            f"{at_10b['peak_mib']:,.0f} MiB peak (target <= {TARGET_PLAN_MIB:,.0f}), "
            f"{at_10b['plan_bytes_per_chunk']:.1f} B/chunk kept; "
            f"numba load {at_10b['compile_seconds']:.2f} s; "
            f"growth per 10x tokens from 10M: {growth} (1B extrapolated to 10B: "
            f"{info['extrapolated_10B_from_1B']['seconds']:.1f} s)"
            + (
                f"; pure-Python reference at 10B: {reference['extrapolated_10B_seconds']:.0f} s "
                "(extrapolated from 100M)"
                if reference["extrapolated_10B_seconds"] is not None
                else ""
            )
        )
    chunked, whole = validation_memory["chunked"], validation_memory["whole_batch"]
    verdicts["validation_memory"] = {"peak_ok": chunked["peak_rss_growth_mib"] <= TARGET_VALIDATION_MIB}
    summary.append(
        "validation of one 8192-token microbatch (tiny model): peak "
        f"+{chunked['peak_rss_growth_mib']:,.0f} MiB with the chunked loss "
        f"({chunked['loss_chunk_rows']} rows a chunk; target <= "
        f"{TARGET_VALIDATION_MIB:,.0f}), +{whole['peak_rss_growth_mib']:,.0f} MiB with one whole-batch head"
    )
    return {
        "rows": rows,
        "summary": summary,
        "datasets": details,
        "targets": {
            "bestfit64_utilization": TARGET_UTILIZATION,
            "bestfit64_gap_to_bfd_points": TARGET_GAP_POINTS,
            "metadata_tokens_per_s": TARGET_TOKENS_PER_S,
            "plan_seconds_10B": TARGET_PLAN_SECONDS,
            "plan_peak_mib_10B": TARGET_PLAN_MIB,
            "validation_peak_mib": TARGET_VALIDATION_MIB,
        },
        "verdicts": verdicts,
        "plan_at_scale": plan_at_scale,
        "validation_memory": validation_memory,
        "settings": {
            "capacity": CAPACITY,
            "buffers": BUFFERS,
            "epochs_averaged": EPOCHS,
            "cpus": os.cpu_count(),
        },
    }


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--measure-plan":
        print(json.dumps(measure_plan(**json.loads(sys.argv[2])), default=float))
    elif len(sys.argv) == 3 and sys.argv[1] == "--measure-validation":
        print(json.dumps(measure_validation(**json.loads(sys.argv[2])), default=float))
    elif len(sys.argv) == 3 and sys.argv[1] == "--plan":  # e.g. --plan 10000000000
        for method in PLAN_METHODS:
            print(json.dumps(measure_plan_isolated(int(float(sys.argv[2])), method=method), default=float))
    else:
        print(json.dumps(run(), indent=2, default=float))
