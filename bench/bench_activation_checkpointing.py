"""train.activation_checkpointing: peak memory of a training step with and without recomputing blocks.

Each setting runs in its own process (a fresh allocator and high-water mark): a GPT (12 blocks of width
512, GPT-2's vocabulary, fp32; on CUDA GPT-2 small) takes forward + backward steps on one bestfit batch
of 4 packs of 1024 tokens (16 on CUDA; synthetic FineWeb-like documents, the document mask on). Per
setting:
- `saved MB`: what the autograd graph keeps for the backward (every tensor it saves, counted by a
  saved-tensors hook): exact, and the quantity activation checkpointing cuts;
- `peak MB`: the step's peak memory above what was resident before it: on CPU the process's peak RSS
  (ru_maxrss) minus its RSS before the first step; on CUDA (`--cuda`) max_memory_allocated minus
  memory_allocated before it. Both CPU peaks hold the loss head's vocabulary-sized buffers (~1.6 GB
  at 4096 tokens, model/loss.py), which no block recomputation touches;
- `cpu s/step` (CPU) or `s/step` (CUDA): the median of the steps after the first: the recomputation
  costs about one more forward of the blocks.
The loss of both settings is the same to the last bit (the recomputation replays the forward).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

NAME = "activation_checkpointing"
SETTINGS = ("plain", "recompute")
CPU_MODEL = {"n_layer": 12, "d_model": 512, "n_head": 8}
CUDA_MODEL = {"n_layer": 12, "d_model": 768, "n_head": 12}  # GPT-2 small
CAPACITY = 1024
STEPS = 2


def _rss_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _step(model, batch) -> tuple[float, int]:
    """One forward + backward; the loss and the bytes saved for the backward."""
    import torch

    saved = 0

    def pack(tensor):
        nonlocal saved
        saved += tensor.numel() * tensor.element_size()
        return tensor

    model.zero_grad(set_to_none=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = model.loss(batch, batch.num_targets)
    loss.backward()
    return loss.item(), saved


def _child(setting: str, device: str, packs: int) -> dict:
    import torch
    from synthetic import packed_batches, synthetic_chunks

    from pretrain.model import GPT, GPTConfig
    from pretrain.model.activation_checkpointing import apply_activation_checkpointing

    torch.manual_seed(0)
    dims = CUDA_MODEL if device == "cuda" else CPU_MODEL
    config = GPTConfig(vocab_size=50257, max_seq_len=CAPACITY, **dims)
    model = GPT(config, attn="sdpa").to(device)
    if setting == "recompute":
        apply_activation_checkpointing(model)
    split, table = synthetic_chunks(400, CAPACITY)
    batch = packed_batches(split, table, CAPACITY, packs)[0].to(device)
    cuda = device == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated() / 2**20 if cuda else _rss_mb()
    seconds = []
    for _ in range(STEPS):
        started = time.perf_counter() if cuda else time.process_time()
        loss, saved = _step(model, batch)
        if cuda:
            torch.cuda.synchronize()
        seconds.append((time.perf_counter() if cuda else time.process_time()) - started)
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else _peak_rss_mb()
    return {
        "setting": setting,
        "device": device,
        "tokens": int(batch.num_tokens),
        "loss": loss,
        "saved_mb": saved / 2**20,
        "peak_mb": peak - before,
        "seconds_per_step": statistics.median(seconds[1:]),
        "model": dims,
    }


def _spawn(setting: str, device: str, packs: int) -> dict:
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    command = [sys.executable, __file__, "--child", setting, device, str(packs)]
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(device: str = "cpu", packs: int = 4) -> dict:
    results = {setting: _spawn(setting, device, packs) for setting in SETTINGS}
    unit = "cpu s/step" if device == "cpu" else "s/step"
    rows = [
        {
            "setting": r["setting"],
            "tokens": r["tokens"],
            "saved MB": round(r["saved_mb"], 1),
            "peak MB": round(r["peak_mb"], 1),
            unit: round(r["seconds_per_step"], 3),
            "loss": round(r["loss"], 6),
        }
        for r in results.values()
    ]
    plain, recompute = results["plain"], results["recompute"]
    return {
        "rows": rows,
        "runs": results,
        "peak_ratio": recompute["peak_mb"] / plain["peak_mb"],
        "time_ratio": recompute["seconds_per_step"] / plain["seconds_per_step"],
        "same_loss": recompute["loss"] == plain["loss"],
        "summary": [
            f"{device}, GPT {plain['model']}, {plain['tokens']} tokens per step: activation checkpointing "
            f"keeps {recompute['saved_mb']:.0f} MB for the backward instead of {plain['saved_mb']:.0f} MB; "
            f"peak {recompute['peak_mb']:.0f} MB instead of {plain['peak_mb']:.0f} MB "
            f"({recompute['peak_mb'] / plain['peak_mb']:.2f}x), "
            f"{recompute['seconds_per_step'] / plain['seconds_per_step']:.2f}x the time per step; "
            f"same loss: {recompute['loss'] == plain['loss']}",
        ],
    }


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(_child(sys.argv[2], sys.argv[3], int(sys.argv[4]))))
    elif sys.argv[1:2] == ["--cuda"]:  # the GPU box: `python bench/bench_activation_checkpointing.py --cuda`
        result = run("cuda", packs=16)
        print(json.dumps(result, indent=2, default=float))
    else:
        result = run()
        print(json.dumps(result, indent=2, default=float))
