"""What a run pays after its last step (issue 33): the validation at max_steps, the final checkpoint
(`last.ckpt`), the composition audit and the comparison plot a single run draws, as shares of the
run's wall time, side by side in one run.

A smoke run (tiny model, `experiment=smoke`, max_steps 6, validation and checkpoints every 3 steps,
CSV logger) trains through `train()` in this process with the plot on (as under Hydra's RUN mode),
once to warm the caches and imports, then ROUNDS times measured; each phase is timed by wrapping it
(validation_metrics, Trainer.save_checkpoint, composition_audit, plot_run), the fastest round
counting. `validated_at` lists the optimizer steps that validated: the last step validates once,
also when it is a val_every_n_steps step.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import lightning as L

from pretrain.config import load_config
from pretrain.report.compare import plot_run
from pretrain.training import fit as fit_file
from pretrain.training import module as module_file
from pretrain.training import run as run_file
from pretrain.training import startup as startup_file
from pretrain.training import summary as summary_file

NAME = "finish"
ROUNDS = 2
MAX_STEPS = 6
OVERRIDES = [
    "experiment=smoke",
    "progress_bar=false",
    "logger=csv",
    f"train.max_steps={MAX_STEPS}",
    "train.val_every_n_steps=3",
    "train.checkpoint_every_n_steps=3",
]


def _one_run(out: Path) -> dict:
    timed: dict[str, list] = {"validation": [], "checkpoints": [], "audit": [], "plot": []}
    validation_metrics = module_file.PretrainModule.validation_metrics
    save_checkpoint = L.Trainer.save_checkpoint
    composition_audit = summary_file.composition_audit
    hydra_mode, output_dir = fit_file.hydra_mode, startup_file._output_dir

    def validation(self):
        started = time.perf_counter()
        metrics = validation_metrics(self)
        timed["validation"].append((int(self.trainer.global_step), time.perf_counter() - started))
        return metrics

    def save(self, filepath, *args, **kwargs):
        started = time.perf_counter()
        save_checkpoint(self, filepath, *args, **kwargs)
        timed["checkpoints"].append((Path(filepath).name, time.perf_counter() - started))

    def audit(*args, **kwargs):
        started = time.perf_counter()
        result = composition_audit(*args, **kwargs)
        timed["audit"].append(time.perf_counter() - started)
        return result

    def plot(directory: Path) -> Path:
        started = time.perf_counter()
        path = plot_run(directory)
        timed["plot"].append(time.perf_counter() - started)
        return path

    module_file.PretrainModule.validation_metrics = validation  # type: ignore[method-assign]
    L.Trainer.save_checkpoint = save  # type: ignore[method-assign]
    summary_file.composition_audit = audit
    fit_file.hydra_mode = lambda: "RUN"  # a single run under Hydra draws its plot
    startup_file._output_dir = lambda configured: Path(configured)
    try:
        started = time.perf_counter()
        run_file.train(load_config([*OVERRIDES, f"output_dir={out}"]), plot_run=plot)
        wall = time.perf_counter() - started
    finally:
        module_file.PretrainModule.validation_metrics = validation_metrics  # type: ignore[method-assign]
        L.Trainer.save_checkpoint = save_checkpoint  # type: ignore[method-assign]
        summary_file.composition_audit = composition_audit
        fit_file.hydra_mode, startup_file._output_dir = hydra_mode, output_dir
    last = dict(timed["checkpoints"]).get("last.ckpt", 0.0)
    final_validation = sum(s for step, s in timed["validation"] if step == MAX_STEPS)
    return {
        "wall": wall,
        "validated_at": [step for step, _ in timed["validation"]],
        "final_validation": final_validation,
        "last_checkpoint": last,
        "audit": sum(timed["audit"]),
        "plot": sum(timed["plot"]),
    }


def run(rounds: int = ROUNDS) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        _one_run(Path(tmp) / "warm")  # the cache, numba's kernels, first imports
        measured = [_one_run(Path(tmp) / f"run{i}") for i in range(rounds)]
    best = min(measured, key=lambda m: m["wall"])
    wall = best["wall"]
    phases = {
        "validation at max_steps": best["final_validation"],
        "last.ckpt": best["last_checkpoint"],
        "composition audit": best["audit"],
        "comparison plot": best["plot"],
    }
    rows = [{"phase": "whole run (train())", "seconds": wall, "share of the run": 1.0}]
    rows += [{"phase": name, "seconds": s, "share of the run": s / wall} for name, s in phases.items()]
    fixed = sum(phases.values())
    rows.append({"phase": "all four", "seconds": fixed, "share of the run": fixed / wall})
    summary = [
        f"smoke run of {MAX_STEPS} steps: {wall:.2f} s; after the last step it pays "
        + ", ".join(f"{name} {s:.2f} s ({s / wall:.0%})" for name, s in phases.items())
        + f"; validated at steps {best['validated_at']} (the last step once)"
    ]
    return {"rows": rows, "summary": summary, "rounds": measured, "settings": {"overrides": OVERRIDES}}


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=2, default=float))
