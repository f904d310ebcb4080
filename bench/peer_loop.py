"""The peer of bench_fixed_costs.py: a minimal hand-written training loop over the same model and batches.

`python bench/peer_loop.py BATCHES.pt OUT_DIR` imports torch and the model (pretrain.model, which
imports pretrain.data.batching.batch for the batch type), loads the batches a project run trained on (saved by
bench_fixed_costs.py: every update's microbatches and the validation batches), builds the same GPT
with the run's seed, and does what the project's run does with them: AdamW updates normalised by
each update's real targets (warmup and cosine as the run's schedule), the validation loss after the
last update, and a checkpoint of the model and optimizer. No Lightning, no Hydra, no cache, no
planning: everything a run does besides this is the project's fixed cost.

On stdout, one JSON line per event: `{"event": "step", "step": n}` after each optimizer step (the
parent timestamps the line as it arrives), then `{"event": "done", "phases": {...}}` with the
resident set size (VmRSS) and its high-water mark (VmHWM) in MB after each phase, and when.
"""

from __future__ import annotations

import json
import math
import resource
import sys
import time


def mark() -> dict[str, float]:
    """Where this process stands: `t` (time.monotonic()), `cpu` (its user + system seconds so far), and
    VmRSS and VmHWM in MB (Linux; left out elsewhere)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    try:
        with open("/proc/self/status") as handle:
            fields = dict(line.split(":", 1) for line in handle if line.startswith(("VmRSS", "VmHWM")))
    except OSError:
        fields = {}
    memory = {name: int(value.split()[0]) / 1024 for name, value in fields.items()}
    return {"t": time.monotonic(), "cpu": usage.ru_utime + usage.ru_stime, **memory}


def main(batches_path: str, out_dir: str) -> None:
    phases: dict[str, dict[str, float]] = {"start": mark()}
    import torch

    from pretrain.model import GPT, GPTConfig

    phases["imports"] = mark()
    saved = torch.load(batches_path, weights_only=False)
    phases["batches"] = mark()
    torch.manual_seed(saved["seed"])
    model = GPT(GPTConfig(**saved["model"]), attn="sdpa")
    phases["model"] = mark()
    t = saved["train"]
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": t["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
        lr=t["lr"],
        betas=tuple(t["betas"]),
    )
    warmup, steps, floor = t["warmup"], t["max_steps"], t["min_lr_ratio"]

    def factor(step: int) -> float:
        if warmup > 0 and step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, steps - warmup))
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    model.train()
    for step, microbatches in enumerate(saved["updates"], start=1):
        denominator = sum(mb.num_targets for mb in microbatches)
        for mb in microbatches:
            model.loss(mb, denominator=denominator).backward()
        if t["grad_clip"]:
            torch.nn.utils.clip_grad_norm_(model.parameters(), t["grad_clip"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        schedule.step()
        if step == 1:
            phases["first step"] = mark()
        print(json.dumps({"event": "step", "step": step}), flush=True)
    phases["training"] = mark()
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for batch in saved["validation"]:
            total += float(model.loss(batch, denominator=1))
            count += batch.num_targets
    phases["validation"] = mark()
    torch.save(
        {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": len(saved["updates"])},
        f"{out_dir}/last.pt",
    )
    phases["checkpoint"] = mark()
    print(json.dumps({"event": "done", "val_loss": total / max(count, 1), "phases": phases}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
