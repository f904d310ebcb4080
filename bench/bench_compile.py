"""train.compile on CPU: eager against compiled blocks, per training step, side by side in one run.

Two loops, each eager and compiled, each setting in its own process (a fresh inductor and dynamo
state; the settings alternate over rounds so that background load hits all alike):
- `minimal`: a hand-written loop (GPT.loss, backward, AdamW) on bestfit batches of the tiny GPT,
  4 packs of 512, whose token counts change at every step;
- `llama`: the same loop on llama-tiny.
Per setting: the first step's wall seconds (compile start-up included), then the median wall and CPU
seconds (user + system) per step over the timed steps, graphs compiled and recompiles after step 1.
The GPU numbers (gpt2-small, varlen, bf16) are scripts/gpu_check.py's (bench/results/
gpu_training_setup.json): compile pays on the GPU after a few hundred steps; on CPU the tiny models'
time is in the vocabulary head and attention, which compile leaves alone.
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

NAME = "compile"
CAPACITY = 512
PACKS_PER_BATCH = 4
DOCUMENTS = 96
STEPS = 8
ROUNDS = 2
MODELS = {"minimal": "tiny", "llama": "llama-tiny"}
MODES = ("eager", "compiled")


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _child(loop: str, mode: str, steps: int) -> dict:
    import torch
    from synthetic import packed_batches, synthetic_chunks

    from pretrain.config import load_config, to_config
    from pretrain.model import build_model, config_from_settings
    from pretrain.model.compile import compile_blocks

    torch.manual_seed(0)
    settings = to_config(load_config([f"model={MODELS[loop]}", f"data.max_seq_len={CAPACITY}"]))
    model = build_model(config_from_settings(settings.model), attn="sdpa")
    stats = compile_blocks(model) if mode == "compiled" else None
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    split, table = synthetic_chunks(DOCUMENTS, CAPACITY)
    batches = packed_batches(split, table, CAPACITY, PACKS_PER_BATCH)
    walls, cpus = [], []
    for i in range(steps + 1):
        batch = batches[i % len(batches)]
        wall, cpu = time.perf_counter(), _cpu()
        optimizer.zero_grad(set_to_none=True)
        model.loss(batch, batch.num_targets).backward()
        optimizer.step()
        walls.append(time.perf_counter() - wall)
        cpus.append(_cpu() - cpu)
        if i == 0 and stats is not None:
            stats.first_step_done()
    return {
        "first_step_s": walls[0],
        "wall_per_step": statistics.median(walls[1:]),
        "cpu_per_step": statistics.median(cpus[1:]),
        "tokens": sorted({b.num_tokens for b in batches[: steps + 1]}),
        **({"compile": stats.as_dict()} if stats is not None else {}),
    }


def _spawn(loop: str, mode: str, steps: int) -> dict:
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    out = subprocess.run(
        [sys.executable, __file__, "--child", loop, mode, str(steps)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(steps: int = STEPS, rounds: int = ROUNDS) -> dict:
    runs: dict[tuple[str, str], list[dict]] = {(loop, m): [] for loop in MODELS for m in MODES}
    for _ in range(rounds):
        for key in runs:
            runs[key].append(_spawn(*key, steps))
    rows = []
    for (loop, mode), results in runs.items():
        best = min(results, key=lambda r: r["wall_per_step"])  # the least disturbed round
        rows.append(
            {
                "loop": loop,
                "mode": mode,
                "first step s": round(min(r["first_step_s"] for r in results), 2),
                "wall s/step": round(best["wall_per_step"], 3),
                "cpu s/step": round(best["cpu_per_step"], 3),
                "recompiles": best.get("compile", {}).get("recompiles", "-"),
            }
        )
    by = {(r["loop"], r["mode"]): r for r in rows}
    ratios = {loop: by[loop, "compiled"]["cpu s/step"] / by[loop, "eager"]["cpu s/step"] for loop in MODELS}
    startup = {
        loop: by[loop, "compiled"]["first step s"] - by[loop, "eager"]["first step s"] for loop in MODELS
    }
    return {
        "rows": rows,
        "runs": {f"{loop}/{m}": r for (loop, m), r in runs.items()},
        "compiled_over_eager_cpu_seconds": ratios,
        "compile_startup_seconds": startup,
        "settings": {
            "capacity": CAPACITY,
            "packs_per_batch": PACKS_PER_BATCH,
            "steps": steps,
            "rounds": rounds,
        },
        "summary": [
            f"CPU, bestfit {PACKS_PER_BATCH}x{CAPACITY} (a new token count every step), {steps} steps after "
            f"the first, best of {rounds} rounds, each setting in its own process",
            *(
                f"{loop}: compiled / eager CPU s per step {ratios[loop]:.3f}x; compiling costs "
                f"{startup[loop]:.1f} s more in the first step"
                for loop in MODELS
            ),
        ],
    }


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(_child(sys.argv[2], sys.argv[3], int(sys.argv[4]))))
    else:
        result = run()
        print(json.dumps(result["rows"], indent=1))
        print("\n".join(result["summary"]))
