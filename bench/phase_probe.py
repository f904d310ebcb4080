"""`python bench/phase_probe.py OUT.json train.py [overrides]`: train.py as usual, with the process's
resident set size (VmRSS), high-water mark (VmHWM) in MB, CPU seconds and time recorded after each
phase of the run (peer_loop.mark), into OUT.json at exit: bench_fixed_costs.py names where a run's
time and extra megabytes go with it.

Phases, in the order a run passes them: `imports` (what the run imports before it composes its
config: Lightning, Hydra, the training package), `config` (composed, typed, checked: RunSettings),
`model` (the Lightning module and its GPT built), `cache verified`, `data` (the data module's setup:
the cache mapped, the sampler's plans, the validation pairs), `first batch` (Lightning's set-up
done, the first update fetched), `first step` (the first optimizer update: AdamW's state),
`validation`, `checkpoint` (last.ckpt written), `released` (the training state let go), `plot` (the
comparison plot), `end`. The probe wraps those methods; it changes nothing they do.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import json
import runpy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peer_loop import mark  # noqa: E402

PHASES: dict[str, dict[str, float]] = {"start": mark()}


def _after(owner, name: str, phase: str, once: bool = True) -> None:
    """Record `phase` each time (or the first time) `owner.name` returns."""
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        result = original(*args, **kwargs)
        if not once or phase not in PHASES:
            PHASES[phase] = mark()
        return result

    setattr(owner, name, wrapper)


def main(out: str, script: str, argv: list[str]) -> None:
    # As train.py has it: the collector paused before any import (startup_collector.py), then
    # pretrain.training first, which installs training/lean_imports.py before Lightning.
    importlib.import_module("pretrain.training.startup_collector").pause()
    importlib.import_module("pretrain.training.run")
    import lightning as L

    import pretrain.report.compare as compare
    from pretrain.training import fit as fit_module
    from pretrain.training.datamodule import PretrainDataModule
    from pretrain.training.module import PretrainModule
    from pretrain.training.startup import RunSettings

    PHASES["imports"] = mark()
    _after(RunSettings, "from_config", "config")
    _after(PretrainModule, "__init__", "model")
    _after(PretrainDataModule, "prepare_data", "cache verified")
    _after(PretrainDataModule, "setup", "data")
    _after(PretrainModule, "on_train_batch_start", "first batch")
    _after(PretrainModule, "training_step", "first step")
    _after(PretrainModule, "validation_metrics", "validation", once=False)
    _after(L.Trainer, "save_checkpoint", "checkpoint", once=False)
    _after(fit_module, "release_training_state", "released")
    _after(compare, "plot_run", "plot")

    def write() -> None:
        PHASES["end"] = mark()
        Path(out).write_text(json.dumps(PHASES, indent=1) + "\n")

    atexit.register(write)
    sys.argv = [script, *argv]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
