"""One CPU training step of the tiny GPT: the head's workspace vs the plain autograd head, each under
glibc's default allocator and under an allocator tuned to keep freed memory, side by side in one run.

Each of the four settings trains in its own process (GLIBC_TUNABLES is read at process start), the
settings taken in turn for several rounds so that background load on a shared machine hits all alike.
A step is forward + backward + AdamW on a bestfit microbatch (4 packs of 512, ~2k real tokens,
GPT-2's 50,257 vocabulary). Per step: wall and CPU seconds (user + system, and the system share),
minor page faults (`getrusage`); per process: peak RSS. The target: with the workspace, the default
allocator is within 10% of the tuned one, and peak RSS is no higher than the autograd head's.
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

NAME = "step"
CAPACITY = 512
PACKS_PER_BATCH = 4
DOCUMENTS = 64
WARMUP_STEPS = 2
STEPS = 5
ROUNDS = 2
TARGET = 1.10  # default-allocator step time / tuned-allocator step time, with the workspace
# Keep freed memory in the process: no mmap'd chunks (they are unmapped on free), no trimming of the heap top.
TUNED = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967295"
HEADS = ("workspace", "autograd")
ALLOCATORS = ("default", "tuned")


def _child(head: str, steps: int) -> dict:
    """Train `steps` timed steps in this process; per-step medians and the process's peak RSS."""
    import torch
    from synthetic import packed_batches, synthetic_chunks

    from pretrain.config import load_config, to_config
    from pretrain.model import GPT, GPTConfig
    from pretrain.model.loss import token_cross_entropy

    torch.manual_seed(0)
    settings = to_config(load_config(["model=tiny", f"data.max_seq_len={CAPACITY}"]))
    model = GPT(GPTConfig.from_settings(settings.model), attn="sdpa")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    split, table = synthetic_chunks(DOCUMENTS, CAPACITY)
    batches = packed_batches(split, table, CAPACITY, PACKS_PER_BATCH)
    samples = []
    for i in range(WARMUP_STEPS + steps):
        batch = batches[i % len(batches)]
        before = resource.getrusage(resource.RUSAGE_SELF)
        wall = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        # GPT.loss with the head chosen: the workspace (the default) or the plain autograd one.
        losses = token_cross_entropy(
            model.hidden_states(batch), model.wte.weight, batch.targets, workspace=head == "workspace"
        )
        (losses.sum() / batch.num_targets).backward()
        optimizer.step()
        wall = time.perf_counter() - wall
        after = resource.getrusage(resource.RUSAGE_SELF)
        if i >= WARMUP_STEPS:
            user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
            samples.append(
                {
                    "tokens": batch.real_tokens,
                    "wall": wall,
                    "cpu": user + system,
                    "system": system,
                    "faults": after.ru_minflt - before.ru_minflt,
                }
            )
    tokens = sum(s["tokens"] for s in samples)
    return {
        "best_step_tok_per_s": max(s["tokens"] / s["wall"] for s in samples),
        "tok_per_s": tokens / sum(s["wall"] for s in samples),
        "tok_per_cpu_s": tokens / sum(s["cpu"] for s in samples),
        "wall_per_step": statistics.median(s["wall"] for s in samples),
        "cpu_per_step": statistics.median(s["cpu"] for s in samples),
        "system_share": sum(s["system"] for s in samples) / sum(s["cpu"] for s in samples),
        "faults_per_step": statistics.median(s["faults"] for s in samples),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def _spawn(head: str, allocator: str, steps: int) -> dict:
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    env.pop("GLIBC_TUNABLES", None)
    if allocator == "tuned":
        env["GLIBC_TUNABLES"] = TUNED
    out = subprocess.run(
        [sys.executable, __file__, "--child", head, str(steps)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(steps: int = STEPS, rounds: int = ROUNDS) -> dict:
    runs: dict[tuple[str, str], list[dict]] = {(h, a): [] for h in HEADS for a in ALLOCATORS}
    for _ in range(rounds):
        for key in runs:
            runs[key].append(_spawn(*key, steps))
    rows = []
    for (head, allocator), results in runs.items():
        best = max(results, key=lambda r: r["tok_per_s"])  # the least disturbed round
        rows.append(
            {
                "head": head,
                "allocator": allocator,
                "tok/s": round(best["tok_per_s"], 1),
                "tok/s best step": round(max(r["best_step_tok_per_s"] for r in results), 1),
                "tok/cpu-s": round(best["tok_per_cpu_s"], 1),
                "wall s/step": round(best["wall_per_step"], 3),
                "cpu s/step": round(best["cpu_per_step"], 3),
                "system share": round(best["system_share"], 3),
                "faults/step": int(best["faults_per_step"]),
                "peak RSS MB": round(max(r["peak_rss_mb"] for r in results)),
            }
        )
    by = {(r["head"], r["allocator"]): r for r in rows}
    # Best single steps: the least disturbed by other processes on a shared machine.
    ratio = by["workspace", "tuned"]["tok/s best step"] / by["workspace", "default"]["tok/s best step"]
    speedup = by["workspace", "default"]["tok/s best step"] / by["autograd", "default"]["tok/s best step"]
    cpu_ratio = by["workspace", "default"]["cpu s/step"] / by["workspace", "tuned"]["cpu s/step"]
    rss_ok = by["workspace", "default"]["peak RSS MB"] <= by["autograd", "default"]["peak RSS MB"]
    verdict = "PASS" if ratio <= TARGET and rss_ok else "FAIL"
    return {
        "rows": rows,
        "runs": {f"{h}/{a}": r for (h, a), r in runs.items()},
        "tuned_over_default_with_workspace": ratio,
        "default_over_tuned_cpu_seconds_with_workspace": cpu_ratio,
        "workspace_over_autograd_default_allocator": speedup,
        "verdict": verdict,
        "target": {"tuned_over_default": TARGET, "peak_rss": "workspace <= autograd (default allocator)"},
        "settings": {
            "capacity": CAPACITY,
            "packs_per_batch": PACKS_PER_BATCH,
            "steps": steps,
            "rounds": rounds,
        },
        "summary": [
            f"tiny GPT, CPU, bestfit {PACKS_PER_BATCH}x{CAPACITY}, {steps} steps after {WARMUP_STEPS} "
            f"warm-up, best of {rounds} rounds; tuned = GLIBC_TUNABLES={TUNED}",
            f"workspace head: tuned / default allocator {ratio:.3f}x (best step, target <= {TARGET}), "
            f"default / tuned CPU s per step {cpu_ratio:.3f}x; "
            f"workspace / autograd head under the default allocator {speedup:.2f}x; "
            f"peak RSS workspace <= autograd: {rss_ok}: {verdict}",
        ],
    }


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(_child(sys.argv[2], int(sys.argv[3]))))
    else:
        result = run()
        print(json.dumps(result["rows"], indent=1))
        print("\n".join(result["summary"]))
