"""`make gpu-bench`: the product against a torch-only loop and a compiled peer, on one GPU, side by side.

   PYTHONPATH=src python3 scripts/gpu_bench.py --output bench/results/gpu_bench.json [--profile]
   PYTHONPATH=src python3 scripts/gpu_bench.py --dry-run --output /tmp/gpu_bench.json   # CPU, tiny

Three loops train the same model on the same token cache:
 (a) product: `python train.py` in a subprocess (Lightning, Hydra, the run's own metrics.csv);
 (b) torch: no Lightning or Hydra in the loop. The settings are composed from the same overrides
     (pretrain.config.load_config, RunSettings: what train.py builds), the model by build_model and
     set_up_model, the optimizer and schedule by PretrainModule.configure_optimizers (called on a plain
     namespace: no Lightning code runs), every update through run_update, bf16 autocast where the
     trainer is bf16-mixed; the updates come from the same policy sampler with the same seed, so (a)
     and (b) train on identical batches (checked: real tokens and targets of every step, first loss);
 (c) peer: bench/nanogpt_peer.py, an independent nanoGPT-style loop, fed the same cache's tokens as
     contiguous (B, T) rows: it ignores document boundaries, a speed reference, not a correctness peer.
(a)/(b) of real tokens/s is Lightning's (and the run's bookkeeping's) overhead; (c)/(a) how far the
product is from a plain compiled loop. Rows not started within --budget-s are recorded as skipped.
Writes JSON (torch version, device, every row) to --output and a markdown table beside it (.md);
--profile also writes one profiled (b) step as a kernel table (<stem>_profile_<label>.md and .json).
On a GPU box without network: copy this checkout (and its cache) in, run the line above, copy
bench/results/gpu_bench* out; it needs what train.py needs and nothing more.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import gc
import json
import os
import random
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT / "src", ROOT / "bench"):  # the package, and bench/nanogpt_peer.py
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

MFU_FORMULA = (
    "MFU = sum over the step's microbatches of pretrain.model.flops.training_flops(model config, real "
    "segment lengths) / seconds per step / pretrain.model.flops.peak_flops(torch.cuda.get_device_name()); "
    "padded rows count their real tokens, the peer its (B, T) rows as segments of T"
)
PEER_NOTE = (
    "the peer (c) reads the cache's tokens as contiguous (B, T) rows and ignores document boundaries "
    "(attention crosses documents, no target masked): a speed reference, not a correctness peer; it goes "
    "through a step's rows in nanoGPT's gradient-accumulation micro-batches of at most 16,384 tokens"
)
# The product's wrapper: train.py as its own __main__, plus an atexit hook (train.py ends through
# fast_exit.exit_now, which runs atexit handlers) that records the process's CUDA peak memory.
PRODUCT_LAUNCHER = """
import atexit, json, os, runpy, sys
def _peak():
    import torch
    peak = torch.cuda.max_memory_allocated() if torch.cuda.is_initialized() else None
    with open(os.environ["GPU_BENCH_PEAK_FILE"], "w") as handle:
        json.dump({"max_memory_allocated": peak}, handle)
atexit.register(_peak)
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path("train.py", run_name="__main__")
"""
GIB = 1024**3


@dataclass(frozen=True)
class Plan:
    """What every row shares; `overrides` gives one row's Hydra overrides."""

    model: str
    trainer: str
    steps: int  # timed (steady-state) steps
    warmup_steps: int  # first steps dropped (compile, allocator warm-up)
    tokens_per_step: int  # batch_size = tokens_per_step // context
    cache_root: Path
    compile: bool | None  # None: train.compile as configured (auto: on CUDA)
    extra: tuple[str, ...] = ()
    peak_tflops: float | None = None

    @property
    def total_steps(self) -> int:
        return self.warmup_steps + self.steps

    def batch_size(self, context: int) -> int:
        return max(1, self.tokens_per_step // context)

    def overrides(self, context: int, policy: str, attn: str) -> list[str]:
        total = self.total_steps
        out = [
            f"trainer={self.trainer}",
            f"model={self.model}",
            f"data={policy}",
            f"attn={attn}",
            f"data.max_seq_len={context}",
            f"train.batch_size={self.batch_size(context)}",
            f"train.max_steps={total}",
            f"train.val_every_n_steps={total}",  # one validation, after the last timed step
            "train.val_batches=1",
            "train.checkpoint_every_n_steps=null",
            "train.log_every_n_steps=1",
            "eval.context=[]",
            "logger=csv",
            "progress_bar=false",
            f"cache_root={self.cache_root}",
        ]
        if self.compile is not None:
            out.append(f"train.compile={str(self.compile).lower()}")
        if self.peak_tflops:
            out.append(f"trainer.peak_tflops={self.peak_tflops}")
        return out + list(self.extra)


@dataclass
class Steps:
    """Per-step measurements of one loop; the steady state drops the first `warmup` steps."""

    seconds: list[float] = field(default_factory=list)  # from the end of the step before (data included)
    real_tokens: list[int] = field(default_factory=list)
    targets: list[int] = field(default_factory=list)
    flops: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)

    def summary(self, warmup: int, peak: float | None) -> dict:
        seconds, real = self.seconds[warmup:], self.real_tokens[warmup:]
        if not seconds:
            return {"status": "failed", "reason": f"no step after the {warmup} warmup steps"}
        total = sum(seconds)
        flops = sum(self.flops[warmup:]) if len(self.flops) == len(self.seconds) else None
        return {
            "steps_timed": len(seconds),
            "ms_per_step": 1e3 * total / len(seconds),
            "real_tokens_per_step": sum(real) / len(real),
            "real_tokens_per_s": sum(real) / total,
            "mfu": flops / total / peak if peak and flops is not None else None,
            "first_loss": self.losses[0] if self.losses else None,
            "last_loss": self.losses[-1] if self.losses else None,
        }


def label(context: int, policy: str, attn: str) -> str:
    return f"{context}_{policy}_{attn}"


def device_sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def fresh_device(device: torch.device) -> None:
    """Forget compiled graphs (each row compiles as a fresh process would) and free cached memory, then
    start the peak-memory count."""
    if hasattr(torch, "_dynamo"):
        torch._dynamo.reset()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_gib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / GIB if device.type == "cuda" else None


# --- the shared settings and data ---------------------------------------------------------------


def run_settings(overrides: list[str]):
    """What train.py builds from these overrides (composed with Hydra's compose API, checked, typed)."""
    from pretrain.config import load_config
    from pretrain.training.startup import RunSettings

    return RunSettings.from_config(load_config(overrides))


def open_cache(run):
    from pretrain.data.ingest.prepare import prepare_cache

    return prepare_cache(run.cache, progress=False)


def update_stream(run, cache) -> Iterator[list]:
    """The run's updates (train.accumulation microbatches each) as its data module serves them: the
    policy's sampler of rank 0 of 1, epoch after epoch (training/datamodule.py's UpdateStream)."""
    from pretrain.data.batching.samplers import build_sampler

    sampler = build_sampler(run.policy, cache.split("train"), rank=0, world_size=1, packs_dir=cache.packs_dir)
    group: list = []
    while True:
        for batch in sampler:
            group.append(batch)
            if len(group) == run.policy.accumulation:
                yield group
                group = []


def update_flops(run, microbatches) -> float:
    """The update's model FLOPs over its real segment lengths, as the product's train/mfu counts them."""
    from pretrain.model.flops import training_flops
    from pretrain.training.module import real_segment_lengths

    return float(sum(training_flops(run.model, real_segment_lengths(mb)) for mb in microbatches))


def planned_steps(run, cache, count: int) -> Steps:
    """The first `count` updates' real tokens, targets and FLOPs (no model: what (a) trains on)."""
    planned = Steps()
    stream = update_stream(run, cache)
    for _ in range(count):
        microbatches = next(stream)
        planned.real_tokens.append(sum(mb.real_tokens for mb in microbatches))
        planned.targets.append(sum(mb.num_targets for mb in microbatches))
        planned.flops.append(update_flops(run, microbatches))
    return planned


# --- (a) the product ----------------------------------------------------------------------------


def read_metrics(path: Path) -> list[dict[str, float]]:
    """metrics.csv's training rows (one per step with train.log_every_n_steps=1), numbers only."""
    rows = []
    with path.open() as handle:
        for row in csv.DictReader(handle):
            if row.get("train/tokens"):
                rows.append({k: float(v) for k, v in row.items() if v not in ("", None)})
    return sorted(rows, key=lambda r: r["step"])


def product_row(
    plan: Plan, overrides: list[str], run_dir: Path, planned: Steps, peak: float | None, timeout: float
) -> dict:
    """`python train.py` with these overrides in `run_dir` (killed after `timeout` seconds); its steady
    steps from metrics.csv."""
    run_dir.mkdir(parents=True, exist_ok=True)
    peak_file = run_dir / "gpu_bench_peak.json"
    env = dict(os.environ, GPU_BENCH_PEAK_FILE=str(peak_file))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    command = [sys.executable, "-c", PRODUCT_LAUNCHER, *overrides, f"hydra.run.dir={run_dir}"]
    log = run_dir / "product.log"
    started = time.perf_counter()
    row: dict = {
        "command": "python train.py " + " ".join([*overrides, f"hydra.run.dir={run_dir}"]),
        "run_dir": str(run_dir),
    }
    with log.open("w") as handle:
        try:
            done = subprocess.run(
                command, cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            return {**row, "status": "failed", "reason": f"killed after {timeout:.0f} s (--row-timeout-s)"}
    row["wall_s"] = time.perf_counter() - started
    if done.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-12:]
        return {**row, "status": "failed", "reason": f"exit {done.returncode}: " + " | ".join(tail)}
    metrics = read_metrics(run_dir / "metrics.csv")
    steps = Steps()
    previous = 0.0
    for m in metrics:
        real = m["train/tokens"] - previous
        previous = m["train/tokens"]
        steps.real_tokens.append(int(round(real)))
        steps.targets.append(int(m.get("train/num_targets", 0)))
        steps.losses.append(m.get("train/loss", float("nan")))
        # The product's own step wall time: from the end of the step before (data and Lightning's
        # hooks included) to this step's end, as train/tokens_per_sec measures it.
        steps.seconds.append(real / m["train/tokens_per_sec"])
    if len(planned.flops) >= len(steps.seconds):
        steps.flops = planned.flops[: len(steps.seconds)]
    row.update(steps.summary(plan.warmup_steps, peak))
    logged = [m["train/mfu"] for m in metrics[plan.warmup_steps :] if "train/mfu" in m]
    row["product_logged_mfu"] = sum(logged) / len(logged) if logged else None
    row["step_seconds_ms"] = 1e3 * float(
        np.mean([m["train/step_seconds"] for m in metrics[plan.warmup_steps :]] or [float("nan")])
    )
    row["same_batches_as_planned"] = (
        steps.real_tokens == planned.real_tokens[: len(steps.real_tokens)]
        and steps.targets == planned.targets[: len(steps.targets)]
    )
    row["losses"] = steps.losses
    row["real_tokens"] = steps.real_tokens
    row["targets"] = steps.targets
    try:
        recorded = json.loads(peak_file.read_text()).get("max_memory_allocated")
    except (OSError, ValueError):
        recorded = None
    row["peak_memory_gib"] = recorded / GIB if recorded else None
    run_json = json.loads((run_dir / "run.json").read_text())
    row["compile"] = run_json.get("compile")
    row.setdefault("status", "ok")
    return row


# --- (b) the torch-only loop --------------------------------------------------------------------


def build_torch_loop(run, device: torch.device):
    """The model, optimizer and schedule as train.py's run builds them, without Lightning."""
    from pretrain.model import build_model
    from pretrain.training.model_setup import set_up_model
    from pretrain.training.module import PretrainModule

    seed = run.config.seed
    random.seed(seed)  # what Lightning's seed_everything seeds before the module builds the model
    np.random.seed(seed)
    torch.manual_seed(seed)
    model = build_model(run.model, attn=run.attn_backend, attn_compile=run.config.attn.compile_mode)
    model.to(device)
    setup = set_up_model(model, run.config.train, device)
    # The product's own configure_optimizers, on a namespace with the attributes it reads.
    configured = PretrainModule.configure_optimizers(
        SimpleNamespace(settings=run.config.train, model=model, device=device)  # type: ignore[arg-type]
    )
    return model, setup, configured["optimizer"], configured["lr_scheduler"]["scheduler"]


def torch_row(
    run, cache, plan: Plan, device: torch.device, peak: float | None, profile: Path | None
) -> tuple[dict, dict | None]:
    """(b): the same updates through run_update in a plain loop; one more step profiled if asked."""
    from torch.profiler import record_function

    from pretrain.training.update import run_update

    fresh_device(device)
    started = time.perf_counter()
    model, setup, optimizer, scheduler = build_torch_loop(run, device)
    model.train()
    bf16 = str(run.config.trainer.precision).startswith("bf16") and device.type == "cuda"
    grad_clip = run.config.train.grad_clip
    stream = update_stream(run, cache)
    marking = [False]  # the phases are marked in the profiled step only: the timed ones run bare

    def mark(name: str):
        return record_function(name) if marking[0] else contextlib.nullcontext()

    def step() -> list:
        with mark(PHASE_DATA):
            microbatches = [mb.to(device) for mb in next(stream)]  # as Lightning moves an Update
        autocast = torch.autocast("cuda", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
        with mark(PHASE_UPDATE), autocast:
            result = run_update(model, microbatches)
        with mark(PHASE_OPTIMIZER):
            if grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
        return [result, microbatches]

    steps = Steps()
    last = time.perf_counter()
    for index in range(plan.total_steps):
        result, microbatches = step()
        now = time.perf_counter()  # not synchronized: the product's step end is not either
        steps.seconds.append(now - last)
        last = now
        steps.real_tokens.append(result.real_tokens)
        steps.targets.append(result.num_targets)
        steps.losses.append(result.loss)
        steps.flops.append(update_flops(run, microbatches))
        if index == 0 and setup.get("compile") is not None:
            setup["compile"].first_step_done()
    device_sync(device)
    row = steps.summary(plan.warmup_steps, peak)
    row.update(
        status=row.get("status", "ok"),
        losses=steps.losses,
        real_tokens=steps.real_tokens,
        targets=steps.targets,
        peak_memory_gib=peak_memory_gib(device),
        compile=setup["compile"].as_dict() if setup.get("compile") is not None else None,
        setup={k: v for k, v in setup.items() if k != "compile"},  # loss kernel, compile scope
    )
    marking[0] = True
    profiled = profile_step(step, device) if profile is not None else None
    row["wall_s"] = time.perf_counter() - started
    return row, profiled  # the model and optimizer go with this frame; the next row frees their memory


# --- (c) the nanoGPT-style peer -----------------------------------------------------------------


def peer_row(run, cache, plan: Plan, context: int, device: torch.device, peak: float | None) -> dict:
    """(c): the peer at this context, as many (B, T) tokens per step as the others compute, the model's
    sizes; its MFU counts the same model FLOPs (the product's config) over rows of T."""
    from nanogpt_peer import NANOGPT_VOCAB, PeerConfig, train_peer

    from pretrain.model.flops import training_flops

    fresh_device(device)
    started = time.perf_counter()
    rows = plan.batch_size(context)
    m = run.model
    config = PeerConfig(
        block_size=context,
        vocab_size=max(NANOGPT_VOCAB, m.vocab_size),
        n_layer=m.n_layer,
        n_head=m.n_head,
        n_embd=m.d_model,
        bias=getattr(m, "bias", True),
    )
    compile = plan.compile if plan.compile is not None else device.type == "cuda"
    out = train_peer(cache.split("train").tokens, config, rows, plan.total_steps, device, compile=compile)
    steps = Steps(
        seconds=out["step_seconds"],
        real_tokens=[rows * context] * plan.total_steps,
        flops=[training_flops(run.model, np.full(rows, context))] * plan.total_steps,
        losses=out["losses"],
    )
    row = steps.summary(plan.warmup_steps, peak)
    row.update(
        status=row.get("status", "ok"),
        losses=steps.losses,
        rows=rows,
        micro_batches=out["micro_batches"],
        vocab_size=config.vocab_size,
        compiled=compile,
        peak_memory_gib=peak_memory_gib(device),
        wall_s=time.perf_counter() - started,
    )
    fresh_device(device)
    return row


# --- --profile: where each millisecond of one (b) step goes -------------------------------------

CATEGORIES: tuple[tuple[str, re.Pattern], ...] = (
    ("loss", re.compile(r"cross_entropy|nll_loss|log_softmax|logsumexp|loss", re.I)),
    ("attention", re.compile(r"attention|attn|flash|fmha|sdpa|flex|varlen", re.I)),
    ("optimizer", re.compile(r"adam|multi_tensor|foreach", re.I)),
    (
        "matmul",
        re.compile(
            r"aten::(mm|addmm|bmm|baddbmm|matmul|linear)\b|triton_tem_fused_(addmm|mm|bmm)|gemm|gemv|cublas|"
            r"cutlass|xmma|nvjet",
            re.I,
        ),
    ),
    (
        "elementwise",
        re.compile(
            r"elementwise|vectorized|unrolled|reduce_kernel|CatArray|triton_(poi|per|red)|layer_norm|gelu|"
            r"embedding|softmax|index|aten::(add|mul|div|sub|copy|fill|cat|where|neg|pow|sqrt|exp|tanh|"
            r"clone|zero|sum|mean|addcmul|addcdiv|lerp|linalg_vector_norm|_to_copy|_foreach)(?![a-z])",
            re.I,
        ),
    ),
)
# The loop's phases, marked with record_function: what runs under PHASE_OPTIMIZER (gradient clipping,
# AdamW, the schedule) counts as optimizer whatever its kernels are called.
PHASE_DATA, PHASE_UPDATE, PHASE_OPTIMIZER = "gpu_bench/data", "gpu_bench/update", "gpu_bench/optimizer"


def category(name: str, phase: str | None = None) -> str:
    """A kernel's or op's bucket: optimizer under the optimizer phase, other for the batch's copy to the
    device and any memcpy/memset, else the first pattern its name (kernel name and launching op)
    matches, else `other`."""
    if phase == PHASE_OPTIMIZER:
        return "optimizer"
    if phase == PHASE_DATA or re.search(r"memcpy|memset", name, re.I):
        return "other"
    for bucket, pattern in CATEGORIES:
        if pattern.search(name):
            return bucket
    return "other"


def _phase(event) -> str | None:
    while event is not None:
        if event.name in (PHASE_DATA, PHASE_UPDATE, PHASE_OPTIMIZER):
            return event.name
        event = event.cpu_parent
    return None


def timed_events(events, on_device: bool) -> tuple[list[tuple[str, str, float]], float]:
    """(name, category, microseconds) of every unit of work once, and the device time no CPU op
    launched (counted as other). On a GPU the kernels, each attributed to the op that launched it; on
    the CPU each op's self time."""
    from torch.autograd import DeviceType

    out: list[tuple[str, str, float]] = []
    for event in events:
        if event.device_type != DeviceType.CPU or getattr(event, "is_async", False):
            continue
        if on_device:
            for kernel in event.kernels:
                out.append(
                    (kernel.name, category(f"{kernel.name} {event.name}", _phase(event)), kernel.duration)
                )
        elif event.self_cpu_time_total > 0:  # the phases' own self time: the loop's Python between ops
            out.append((event.name, category(event.name, _phase(event)), float(event.self_cpu_time_total)))
    unlinked = 0.0
    if on_device:
        device_total = sum(
            e.time_range.end - e.time_range.start for e in events if e.device_type == DeviceType.CUDA
        )
        unlinked = max(0.0, device_total - sum(us for _, _, us in out))
    return out, unlinked


def profile_step(step: Callable[[], object], device: torch.device) -> dict:
    """One step under torch.profiler: every kernel's time on a GPU (every CPU op's self time on the
    CPU), once, by name and by category, against the step's wall time."""
    from torch.profiler import ProfilerActivity, profile

    on_device = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_device else [])
    device_sync(device)
    with profile(activities=activities) as profiler:
        started = time.perf_counter()
        step()
        device_sync(device)
        wall = time.perf_counter() - started
    timed, unlinked = timed_events(profiler.events(), on_device)
    by_name: dict[tuple[str, str], list[float]] = {}
    for name, bucket, us in timed:
        entry = by_name.setdefault((name, bucket), [0, 0.0])
        entry[0] += 1
        entry[1] += us
    if unlinked > 0:
        by_name[("(device time no op launched)", "other")] = [1, unlinked]
    total_us = sum(us for _, us in by_name.values())
    by_category: dict[str, float] = {name: 0.0 for name, _ in CATEGORIES}
    by_category["other"] = 0.0
    for (_, bucket), (_, us) in by_name.items():
        by_category[bucket] += us / 1e3
    ranked = sorted(by_name.items(), key=lambda item: -item[1][1])
    return {
        "source": "CUDA kernels (device time)" if on_device else "CPU ops (self CPU time)",
        "wall_ms": wall * 1e3,
        "total_ms": total_us / 1e3,
        "busy_fraction": total_us / 1e3 / (wall * 1e3) if wall > 0 else None,
        "by_category_ms": by_category,
        "events": len(by_name),
        "top": [
            {
                "name": name,
                "category": bucket,
                "calls": int(calls),
                "total_ms": us / 1e3,
                "mean_us": us / max(calls, 1),
                "share": us / total_us if total_us else 0.0,
            }
            for (name, bucket), (calls, us) in ranked[:40]
        ],
    }


def profile_markdown(title: str, profiled: dict) -> str:
    lines = [
        f"# {title}",
        "",
        f"One training step of the torch-only loop (b), {profiled['source']}: "
        f"{profiled['total_ms']:.2f} ms summed over {profiled['events']} distinct events in a step of "
        f"{profiled['wall_ms']:.2f} ms wall ({100 * (profiled['busy_fraction'] or 0):.1f}% busy).",
        "",
        "| category | ms | share |",
        "|---|---:|---:|",
    ]
    total = profiled["total_ms"] or 1.0
    for name, ms in profiled["by_category_ms"].items():
        lines.append(f"| {name} | {ms:.3f} | {100 * ms / total:.1f}% |")
    lines += [
        "",
        "| # | name | category | calls | ms | mean us | share |",
        "|---:|---|---|---:|---:|---:|---:|",
    ]
    for i, row in enumerate(profiled["top"], start=1):
        name = row["name"].replace("|", "\\|")
        if len(name) > 90:
            name = name[:87] + "..."
        lines.append(
            f"| {i} | `{name}` | {row['category']} | {row['calls']} | {row['total_ms']:.3f} | "
            f"{row['mean_us']:.1f} | {100 * row['share']:.1f}% |"
        )
    return "\n".join(lines) + "\n"


# --- the table ----------------------------------------------------------------------------------


def comparisons(rows: list[dict]) -> list[dict]:
    """(a)/(b) and (c)/(a) of real tokens/s per (context, policy, attn), and whether (a) and (b)
    trained on the same batches (real tokens and targets of every step, first loss)."""
    by_key = {(r["loop"], r["context"], r.get("policy"), r.get("attn")): r for r in rows}
    out = []
    for r in rows:
        if r["loop"] != "product":
            continue
        key = (r["context"], r["policy"], r["attn"])
        b = by_key.get(("torch", *key), {})
        c = by_key.get(("peer", r["context"], None, None), {})
        a_tps, b_tps, c_tps = (x.get("real_tokens_per_s") for x in (r, b, c))
        n = min(len(r.get("real_tokens", [])), len(b.get("real_tokens", [])))
        same = (
            n > 0 and r["real_tokens"][:n] == b["real_tokens"][:n] and r["targets"][:n] == b["targets"][:n]
            if b
            else None
        )
        first_a, first_b = r.get("first_loss"), b.get("first_loss")
        out.append(
            {
                "label": label(*key),
                "context": r["context"],
                "policy": r["policy"],
                "attn": r["attn"],
                "product_over_torch": a_tps / b_tps if a_tps and b_tps else None,
                "peer_over_product": c_tps / a_tps if a_tps and c_tps else None,
                "same_batches": same,
                "first_loss_diff": abs(first_a - first_b)
                if first_a is not None and first_b is not None
                else None,
            }
        )
    return out


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def markdown(result: dict) -> str:
    lines = [
        "# gpu-bench: the product against a torch-only loop and a compiled peer",
        "",
        f"torch {result['torch']}, device {result['device']}, model {result['settings']['model']}, "
        f"{result['settings']['steps']} timed steps after {result['settings']['warmup_steps']} warmup, "
        f"~{result['settings']['tokens_per_step']:,} tokens per step"
        + (" (dry run: CPU, fp32, no compile)." if result["dry_run"] else "."),
        "",
        "| loop | context | policy | attn | status | real tok/s | MFU | peak GiB | ms/step | (a)/(b) "
        "| (c)/(a) |",
        "|---|---:|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    ratios = {c["label"]: c for c in result["comparisons"]}
    for r in result["rows"]:
        key = label(r["context"], r.get("policy"), r.get("attn"))
        c = ratios.get(key, {}) if r["loop"] == "product" else {}
        status = r["status"] if r["status"] != "failed" else f"failed: {r.get('reason', '')[:60]}"
        lines.append(
            f"| {r['loop']} | {r['context']} | {r.get('policy') or '-'} | {r.get('attn') or '-'} "
            f"| {status} | "
            f"{_fmt(r.get('real_tokens_per_s'), ',.0f')} | {_fmt(r.get('mfu'), '.3f')} | "
            f"{_fmt(r.get('peak_memory_gib'), '.2f')} | {_fmt(r.get('ms_per_step'), '.1f')} | "
            f"{_fmt(c.get('product_over_torch'), '.3f')} | {_fmt(c.get('peer_over_product'), '.3f')} |"
        )
    lines += ["", "- " + MFU_FORMULA + ".", "- " + PEER_NOTE + "."]
    lines += [f"- {note}" for note in result["notes"]]
    same = [c for c in result["comparisons"] if c["same_batches"] is not None]
    if same:
        lines.append(
            "- (a) and (b) on identical batches (real tokens and targets of every step): "
            + ", ".join(f"{c['label']} {c['same_batches']}" for c in same)
            + "; first-step loss |a - b|: "
            + ", ".join(f"{c['label']} {_fmt(c['first_loss_diff'], '.2e')}" for c in same)
        )
    return "\n".join(lines) + "\n"


# --- the run ------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "gpu_bench.json")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="CPU, model=tiny, context 128, sdpa, no compile, the chunked loss",
    )
    parser.add_argument("--budget-s", type=float, default=420.0, help="rows not started by then are skipped")
    parser.add_argument("--row-timeout-s", type=float, default=600.0, help="a product run killed after this")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per row (20; dry run 2)")
    parser.add_argument("--warmup-steps", type=int, default=None, help="steps dropped first (5; dry run 1)")
    parser.add_argument("--tokens-per-step", type=int, default=None, help="35 x 4096 (dry run 4 x 128)")
    parser.add_argument("--contexts", default=None, help="comma-separated (4096,1024; dry run 128)")
    parser.add_argument("--policies", default="bestfit,padded")
    parser.add_argument("--attns", default=None, help="comma-separated (varlen,sdpa,flex; dry run sdpa)")
    parser.add_argument("--model", default=None, help="conf/model option (gpt2-small; dry run tiny)")
    parser.add_argument("--cache-root", type=Path, default=ROOT / "data-cache")
    parser.add_argument("--work-dir", type=Path, default=None, help="the product's run directories")
    parser.add_argument(
        "--override", action="append", default=[], help="one more Hydra override, e.g. source=pkgdocs"
    )
    parser.add_argument(
        "--peak-tflops", type=float, default=None, help="the device's bf16 peak, if not known"
    )
    parser.add_argument(
        "--profile",
        nargs="*",
        default=None,
        metavar="LABEL",
        help="one profiled (b) step: of the first (b) row, or of the rows named (4096_bestfit_varlen, all)",
    )
    return parser.parse_args(argv)


def make_plan(args: argparse.Namespace) -> tuple[Plan, list[int], list[str], list[str]]:
    dry = args.dry_run

    def pick(value, normal, dry_value):
        return value if value is not None else (dry_value if dry else normal)

    contexts = [int(c) for c in pick(args.contexts, "4096,1024", "128").split(",")]
    attns = pick(args.attns, "varlen,sdpa,flex", "sdpa").split(",")
    policies = args.policies.split(",")
    plan = Plan(
        model=pick(args.model, "gpt2-small", "tiny"),
        trainer="cpu" if dry else "gpu",
        steps=pick(args.steps, 20, 2),
        warmup_steps=pick(args.warmup_steps, 5, 1),
        tokens_per_step=pick(args.tokens_per_step, 35 * 4096, 4 * 128),
        cache_root=args.cache_root.resolve(),
        compile=False if dry else None,
        # The CPU's loss path: under TRITON_INTERPRET=1 (the test suite's) auto would pick the fused
        # Triton kernel, interpreted at about a minute a step.
        extra=(("train.loss_kernel=chunked",) if dry else ()) + tuple(args.override),
        peak_tflops=args.peak_tflops,
    )
    return plan, contexts, policies, attns


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan, contexts, policies, attns = make_plan(args)
    device = torch.device("cpu" if args.dry_run else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu-bench: no CUDA device here; --dry-run runs the same rows on the CPU", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    from pretrain.model.flops import peak_flops

    peak = peak_flops(name if device.type == "cuda" else None, args.peak_tflops)
    work = (args.work_dir or ROOT / "outputs" / "gpu_bench" / time.strftime("%Y-%m-%d_%H-%M-%S")).resolve()
    deadline = time.monotonic() + args.budget_s
    started = time.perf_counter()
    result: dict = {
        "torch": torch.__version__,
        "device": name,
        "dry_run": bool(args.dry_run),
        "peak_tflops": peak / 1e12 if peak else None,
        "mfu_formula": MFU_FORMULA,
        "peer_note": PEER_NOTE,
        "settings": {
            "model": plan.model,
            "trainer": plan.trainer,
            "steps": plan.steps,
            "warmup_steps": plan.warmup_steps,
            "tokens_per_step": plan.tokens_per_step,
            "contexts": contexts,
            "policies": policies,
            "attns": attns,
            "budget_s": args.budget_s,
            "cache_root": str(plan.cache_root),
            "overrides": list(plan.extra),
            "work_dir": str(work),
        },
        "notes": [
            "real tokens/s and ms/step over the steady steps (the first warmup steps dropped), each step "
            "timed from the end of the one before (data and the loop's own work included)",
            "(a)/(b): the product's real tokens/s over the torch-only loop's (Lightning's overhead); "
            "(c)/(a): the peer's over the product's",
            "peak memory: torch.cuda.max_memory_allocated, per row ((a): its whole process, the final "
            "validation included)",
        ],
        "rows": [],
        "comparisons": [],
        "profiles": [],
        "complete": False,  # true once every row is measured or skipped
    }
    wanted = set(args.profile or [])
    profile_first = args.profile is not None and not wanted

    def over_budget() -> bool:
        return time.monotonic() > deadline

    def save() -> None:
        """JSON and table after every row: a run stopped from outside keeps the rows it finished."""
        result["comparisons"] = comparisons(result["rows"])
        result["seconds"] = time.perf_counter() - started
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=2) + "\n")
        args.output.with_suffix(".md").write_text(markdown(result))

    def add(row: dict) -> None:
        result["rows"].append(row)
        save()
        shown = {
            k: v for k, v in row.items() if k in ("real_tokens_per_s", "mfu", "ms_per_step", "first_loss")
        }
        extra = row.get("reason", "")
        print(f"{row['loop']:8s} {row['label']:24s} {row['status']:8s} {shown} {extra}".rstrip(), flush=True)

    cache = None
    for context in contexts:
        peer_done = False
        for attn in attns:
            for policy in policies:
                key = label(context, policy, attn)
                base = {"context": context, "policy": policy, "attn": attn, "label": key}
                overrides = plan.overrides(context, policy, attn)
                if over_budget():
                    for loop in ("product", "torch"):
                        add({"loop": loop, **base, "status": "skipped", "reason": "budget"})
                else:
                    try:
                        run = run_settings(overrides)
                        cache = cache or open_cache(run)
                        planned = planned_steps(run, cache, plan.total_steps)
                    except Exception as error:  # a refused combination: both loops fail alike
                        for loop in ("product", "torch"):
                            add({"loop": loop, **base, "status": "failed", "reason": f"settings: {error}"})
                        continue
                    measured = product_row(plan, overrides, work / key, planned, peak, args.row_timeout_s)
                    add({"loop": "product", **base, **measured})
                    if over_budget():
                        add({"loop": "torch", **base, "status": "skipped", "reason": "budget"})
                    else:
                        profile = (
                            key in wanted or "all" in wanted or (profile_first and not result["profiles"])
                        )
                        stem = args.output.with_suffix("")
                        target = stem.parent / f"{stem.name}_profile_{key}" if profile else None
                        try:
                            row, profiled = torch_row(run, cache, plan, device, peak, target)
                        except Exception as error:
                            fresh_device(device)
                            row, profiled = (
                                {"status": "failed", "reason": f"{type(error).__name__}: {error}"},
                                None,
                            )
                        fresh_device(device)  # (b)'s cached memory back before the next product process
                        add({"loop": "torch", **base, **row})
                        if profiled is not None and target is not None:
                            target.parent.mkdir(parents=True, exist_ok=True)
                            profiled["label"] = key
                            target.with_suffix(".json").write_text(json.dumps(profiled, indent=2) + "\n")
                            title = f"gpu-bench profile: {key} on {name}"
                            target.with_suffix(".md").write_text(profile_markdown(title, profiled))
                            result["profiles"].append(str(target.with_suffix(".md")))
                if peer_done:
                    continue
                peer_done = True  # the peer once per context, after that context's first pair
                peer_base = {"context": context, "policy": None, "attn": None, "label": f"{context}_peer"}
                if over_budget() or cache is None:
                    why = "budget" if over_budget() else "no cache"
                    add({"loop": "peer", **peer_base, "status": "skipped", "reason": why})
                    continue
                try:
                    peer = peer_row(run_settings(overrides), cache, plan, context, device, peak)
                except Exception as error:
                    fresh_device(device)
                    peer = {"status": "failed", "reason": f"{type(error).__name__}: {error}"}
                add({"loop": "peer", **peer_base, **peer})
    result["complete"] = True
    save()
    print(markdown(result))
    print(f"wrote {args.output} and {args.output.with_suffix('.md')}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
