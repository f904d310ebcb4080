"""A run's fixed costs against a minimal loop (issue 33 items 2-4): a 2-step smoke run's whole process,
launch to its first optimizer step, and its peak RSS, each as project / peer, side by side in one run.

The project: `python train.py experiment=smoke train.max_steps=2 train.val_every_n_steps=2` in a fresh
process (Hydra's RUN mode: it verifies the cache, plans, trains, validates at the last step, writes
last.ckpt, run.json and its comparison plot). The peer: bench/peer_loop.py in a fresh process, a
hand-written loop that imports torch and the model and trains the same GPT on the same batches (the
updates and validation batches a project run trained on, saved once here), validates after the last
update and saves a checkpoint. A third arm is the project with the collector on through its start-up
(bench/collector_on.py): what train.py's start-up collector pause saves. All are warmed once (the
cache, the OS's page cache), then taken in turn for ROUNDS rounds, each arm first in turn (a shared
machine's load hits all alike); each ratio is per round, reported as median [min, max] over the
rounds, with the load average seen.

Launch to first step: from just before the process starts to the moment its line for step 1 reaches
this process (the project's progress line `step 1/2`, flushed; the peer's step event), and the
process's CPU seconds (/proc) by then: on a loaded machine the wall ratio measures the load too. Peak RSS: the
child's ru_maxrss, started from bench/measure_child.py (a small process: Linux carries a parent's
high-water mark into a forked child). Where the time and the extra megabytes go: one more run of
each, the project's under bench/phase_probe.py, with the time, CPU seconds and VmHWM after each
phase; and the imports alone, a ladder of fresh interpreters (torch and the model, + torch._dynamo
that the peer's first optimizer step imports, + Lightning, + Hydra, + the training package).
"""

from __future__ import annotations

import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import lightning as L

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
NAME = "fixed_costs"
ROUNDS = 9  # each of the 3 arms first three times
LADDER_ROUNDS = 2
# Taken in turn each round, each first in turn: the run, the peer, and the run with the collector on
# through its start-up (what src/pretrain/training/startup_collector.py saves).
ARMS = ["project", "peer", "collector on"]
MAX_STEPS = 2
# One validation, after the last update, as the peer does (auto would validate at both steps).
OVERRIDES = [
    "experiment=smoke",
    f"train.max_steps={MAX_STEPS}",
    f"train.val_every_n_steps={MAX_STEPS}",
    "logger=csv",
]
TARGETS = {"whole process": 1.5, "launch to first step": 1.2, "peak RSS": 1.05}
# The phases of both processes (project's probe name, peer's name or None, what it holds), in the
# project's order; each process's own order decides what a phase added to its peak.
PHASES = [
    ("imports", "imports", "torch and the model; the project also Lightning, Hydra, its package"),
    ("config", None, "composed by Hydra (twice: its mode, then the run), checked and typed once"),
    ("model", "model", "the GPT built (the project: inside its LightningModule)"),
    ("cache verified", None, "the cache's manifest and files checked (quick)"),
    ("data", "batches", "project: the cache mapped, plans, validation pairs; peer: the saved batches"),
    ("first batch", None, "Lightning's set-up done, the first update fetched"),
    ("first step", "first step", "the first optimizer update (the peer imports torch._dynamo here)"),
    ("validation", "validation", "the last update and validation after it"),
    ("checkpoint", "checkpoint", "the last checkpoint written"),
    ("released", None, "the training state let go (training/release.py): VmRSS falls"),
    ("plot", None, "the project's comparison plot (matplotlib)"),
    ("end", None, "at exit"),
]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH")) if p)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("HF_DATASETS_OFFLINE", "1")
    env.setdefault("WANDB_MODE", "offline")
    return env


class _Capture(L.Callback):
    """The updates a run trains on and its validation batches, saved for the peer."""

    def __init__(self, path: Path):
        self.path = path
        self.updates: list = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.updates.append(batch.microbatches)

    def on_train_end(self, trainer, pl_module):
        import torch

        settings = pl_module.settings
        torch.save(
            {
                "seed": trainer.datamodule.policy.seed,
                "model": pl_module.hparams["model"],
                "train": {
                    "lr": settings.lr,
                    "betas": list(settings.betas),
                    "weight_decay": settings.weight_decay,
                    "grad_clip": settings.grad_clip,
                    "warmup": settings.warmup,
                    "max_steps": settings.max_steps,
                    "min_lr_ratio": settings.min_lr_ratio,
                },
                "updates": self.updates,
                "validation": list(trainer.datamodule.validation_batches()),
            },
            self.path,
        )


def _capture(tmp: Path) -> Path:
    from pretrain.config import load_config
    from pretrain.training.run import train

    path = tmp / "batches.pt"
    train(load_config([*OVERRIDES, f"output_dir={tmp / 'capture'}"]), callbacks=[_Capture(path)])
    return path


def _cpu_seconds(pid_file: Path) -> float | None:
    """User + system CPU seconds so far of the process whose pid the file holds (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid_file.read_text().strip()}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def _spawn(command: list[str], first_step: str, stderr: Path) -> dict:
    """Run `command` (through measure_child.py: its own peak RSS); wall seconds to its exit and to its
    first stdout line that contains `first_step`, CPU seconds, peak RSS in MB."""
    measured = stderr.with_suffix(".measured.json")
    lines: list[tuple[float, str]] = []
    with open(stderr, "w") as err:
        child = subprocess.Popen(
            [sys.executable, str(BENCH / "measure_child.py"), str(measured), *command],
            cwd=ROOT,
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
        assert child.stdout is not None
        first_cpu = None
        for line in child.stdout:
            lines.append((time.time(), line))  # the same clock as measure_child's `started`
            if first_cpu is None and first_step in line:
                first_cpu = _cpu_seconds(Path(f"{measured}.pid"))
        child.wait()
    if child.returncode:
        raise RuntimeError(f"{command} exited {child.returncode}: {stderr.read_text()[-3000:]}")
    result = json.loads(measured.read_text())
    first = next((t for t, line in lines if first_step in line), None)
    assert first is not None, f"no {first_step!r} line in {[line for _, line in lines]}"
    result["first_step"] = first - result["started"]
    result["first_step_cpu"] = first_cpu
    result["stdout"] = [line for _, line in lines]
    return result


def _project(run_dir: Path, probe: bool = False, collector_on: bool = False) -> dict:
    entry = [str(BENCH / "phase_probe.py"), str(run_dir / "phases.json")] if probe else []
    entry = [str(BENCH / "collector_on.py")] if collector_on else entry
    command = [sys.executable, *entry, "train.py", *OVERRIDES, f"hydra.run.dir={run_dir}"]
    result = _spawn(command, f"step 1/{MAX_STEPS}", run_dir.with_suffix(".stderr"))
    with open(run_dir / "metrics.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    result["validated_at"] = [int(r["step"]) for r in rows if r.get("val/loss")]
    result["steps"] = max(int(r["step"]) for r in rows)
    if probe:
        result["phases"] = json.loads((run_dir / "phases.json").read_text())
    return result


def _peer(batches: Path, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, str(BENCH / "peer_loop.py"), str(batches), str(out)]
    result = _spawn(command, '"step": 1', out.with_suffix(".stderr"))
    done = json.loads(result["stdout"][-1])
    result["phases"] = done["phases"]
    return result


# Each rung imports what the one before did, and more; the last is what train.py imports to its first step.
LADDER = [
    ("torch + the model", "import torch; from pretrain.model import GPT"),
    ("+ torch._dynamo (the peer's first optimizer.step imports it)", "import torch._dynamo"),
    ("+ Lightning (lean imports: training/lean_imports.py)", "import pretrain.training; import lightning"),
    ("+ Hydra, OmegaConf", "import hydra, omegaconf"),
    (
        "+ the training package and train.py (a run's imports)",
        "import pretrain.training.run, pretrain.training.module, pretrain.report.compare, train",
    ),
]


def _ladder(rounds: int) -> list[dict]:
    """Per rung: VmHWM and CPU seconds after its imports in a fresh interpreter (the fewest CPU
    seconds of `rounds`, the largest VmHWM)."""
    results: list[list[dict]] = [[] for _ in LADDER]
    for _ in range(rounds):
        statement = "import sys; sys.argv = ['train.py']"
        for i, (_, imports) in enumerate(LADDER):
            statement += f"; {imports}"
            code = f"import json, sys; sys.path.insert(0, {str(BENCH)!r}); from peer_loop import mark\n"
            code += f"{statement}\nprint(json.dumps(mark()))"
            out = subprocess.run(
                [sys.executable, "-c", code], cwd=ROOT, env=_env(), capture_output=True, text=True, check=True
            )
            results[i].append(json.loads(out.stdout.strip().splitlines()[-1]))
    rows, before = [], {"VmHWM": 0.0, "cpu": 0.0}
    for (name, _), runs in zip(LADDER, results, strict=True):
        best = {"VmHWM": max(r["VmHWM"] for r in runs), "cpu": min(r["cpu"] for r in runs)}
        rows.append(
            {
                "rung": name,
                "peak_mb": round(best["VmHWM"], 1),
                "added_mb": round(best["VmHWM"] - before["VmHWM"], 1),
                "cpu_s": round(best["cpu"], 2),
                "added_cpu_s": round(best["cpu"] - before["cpu"], 2),
            }
        )
        before = best
    return rows


def _ladder_rows(ladder: list[dict]) -> list[dict]:
    return [
        {
            "measure": f"imports: {r['rung']}",
            "project": f"{r['cpu_s']:.2f} cpu s ({r['added_cpu_s']:+.2f}), peak {r['peak_mb']:.0f} MB "
            f"({r['added_mb']:+.0f})",
            "note": "a fresh interpreter; each rung adds its imports to the ones above",
        }
        for r in ladder
    ]


def _collector_rows(pairs: list[dict]) -> list[dict]:
    """What the start-up collector pause buys: the project as it runs against the same project with
    the collector on through start-up (bench/collector_on.py), in the same rounds."""
    rows = []
    for measure, key in (("launch to first step", "first_step"), ("peak RSS", "peak_rss_mb")):
        paused = [p["project"][key] for p in pairs]
        on = [p["collector on"][key] for p in pairs]
        rows.append(
            {
                "measure": f"collector paused / on through start-up: {measure}",
                "project": round(statistics.median(paused), 2),
                "peer": round(statistics.median(on), 2),
                "project / peer": _spread([a / b for a, b in zip(paused, on, strict=True)]),
                "note": "peer column here: the project with the collector on (bench/collector_on.py)",
            }
        )
    return rows


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f}, {max(values):.2f}]"


def _added(phases: dict[str, dict]) -> dict[str, float]:
    """What each phase added to the process's peak RSS, in the order the process recorded them."""
    added, before = {}, 0.0
    for name, memory in phases.items():
        hwm = memory.get("VmHWM", before)
        added[name], before = hwm - before, hwm
    return added


def _phase_rows(project: dict, peer: dict) -> list[dict]:
    """Per phase, for each process that has it: seconds from launch, CPU seconds, VmRSS, and VmHWM
    with what the phase added to it."""
    rows, mine, theirs = [], project["phases"], peer["phases"]
    mine_added, theirs_added = _added(mine), _added(theirs)
    for name, peer_name, what in PHASES:
        row: dict = {"measure": f"phase: {name}"}
        for who, phases, added, key, launched in (
            ("project", mine, mine_added, name, project["started_monotonic"]),
            ("peer", theirs, theirs_added, peer_name, peer["started_monotonic"]),
        ):
            at = phases.get(key) if key else None
            row[who] = (
                ""
                if at is None
                else f"{at['t'] - launched:.2f} s, {at['cpu']:.2f} cpu s, RSS {at.get('VmRSS', 0):.0f} MB, "
                f"peak {at.get('VmHWM', 0):.0f} MB ({added[key]:+.0f})"
            )
        row["note"] = what
        rows.append(row)
    return rows


def run(rounds: int = ROUNDS) -> dict:
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        os.environ["PRETRAIN_CACHE_ROOT"] = str(tmp / "cache")
        batches = _capture(tmp)  # also builds the cache
        _project(tmp / "warm-project")
        _peer(batches, tmp / "warm-peer")
        pairs = []
        for i in range(rounds):
            order = ARMS[i % len(ARMS) :] + ARMS[: i % len(ARMS)]  # each arm first in turn
            measured = {}
            for who in order:
                if who == "project":
                    measured[who] = _project(tmp / f"project{i}")
                elif who == "collector on":
                    measured[who] = _project(tmp / f"collector{i}", collector_on=True)
                else:
                    measured[who] = _peer(batches, tmp / f"peer{i}")
            measured["load"] = os.getloadavg()[0]
            loads.append(measured["load"])
            pairs.append(measured)
        probed = _project(tmp / "probe", probe=True)
        peer_phases = _peer(batches, tmp / "peer-phases")
    ratios = {
        "whole process": [p["project"]["wall"] / p["peer"]["wall"] for p in pairs],
        "launch to first step": [p["project"]["first_step"] / p["peer"]["first_step"] for p in pairs],
        "peak RSS": [p["project"]["peak_rss_mb"] / p["peer"]["peak_rss_mb"] for p in pairs],
        "CPU seconds": [p["project"]["cpu"] / p["peer"]["cpu"] for p in pairs],
        "CPU seconds to first step": [
            p["project"]["first_step_cpu"] / p["peer"]["first_step_cpu"]
            for p in pairs
            if p["project"]["first_step_cpu"] and p["peer"]["first_step_cpu"]
        ],
    }
    ratios = {measure: values for measure, values in ratios.items() if values}  # /proc may be missing
    units = {
        "whole process": "wall s",
        "launch to first step": "wall s",
        "peak RSS": "MB",
        "CPU seconds": "s",
        "CPU seconds to first step": "s",
    }
    keys = {
        "whole process": "wall",
        "launch to first step": "first_step",
        "peak RSS": "peak_rss_mb",
        "CPU seconds": "cpu",
        "CPU seconds to first step": "first_step_cpu",
    }
    rows = []
    for measure, values in ratios.items():
        key = keys[measure]
        target = TARGETS.get(measure)
        rows.append(
            {
                "measure": f"{measure} ({units[measure]})",
                "project": round(statistics.median(p["project"][key] or 0.0 for p in pairs), 2),
                "peer": round(statistics.median(p["peer"][key] or 0.0 for p in pairs), 2),
                "project / peer": _spread(values),
                "target": f"<= {target}" if target else "",
                "verdict": ("PASS" if statistics.median(values) <= target else "FAIL") if target else "",
            }
        )
    validated = [p["project"]["validated_at"] for p in pairs]
    rows += _collector_rows(pairs)
    rows += _phase_rows(probed, peer_phases)
    ladder = _ladder(LADDER_ROUNDS)
    rows += _ladder_rows(ladder)
    peak_extra = statistics.median(p["project"]["peak_rss_mb"] - p["peer"]["peak_rss_mb"] for p in pairs)
    imports_extra = sum(r["added_mb"] for r in ladder[2:])
    summary = [
        f"{rounds} interleaved rounds (each arm first in turn), 2 CPU cores shared; load average "
        f"(1 min) {min(loads):.2f}-{max(loads):.2f} during the rounds; ratios are median [min, max] of "
        "the per-round project / peer",
        *(f"{m}: {_spread(v)} (target <= {TARGETS[m]})" for m, v in ratios.items() if m in TARGETS),
        f"peak RSS: the project holds {peak_extra:.0f} MB more than the peer (median); its imports beyond "
        f"torch, the model and torch._dynamo (which the peer imports at its first step) take "
        f"{imports_extra:.0f} MB: "
        + ", ".join(f"{r['rung']} {r['added_mb']:.0f} MB" for r in ladder[2:])
        + "; the rest is the run's own state (config, Lightning's trainer and loggers, data module)",
        f"the project validated at steps {validated[0]} in every round: "
        f"{all(v == validated[0] for v in validated)} "
        f"(the last step once: {validated[0].count(MAX_STEPS) == 1})",
    ]
    return {
        "rows": rows,
        "summary": summary,
        "ratios": ratios,
        "targets": TARGETS,
        "loads": loads,
        "rounds": [
            {
                who: {k: v for k, v in m.items() if k != "stdout"} if isinstance(m, dict) else m
                for who, m in p.items()
            }
            for p in pairs
        ],
        "phases": {"project": probed["phases"], "peer": peer_phases["phases"]},
        "import_ladder": ladder,
        "settings": {"overrides": OVERRIDES, "rounds": rounds},
    }


if __name__ == "__main__":
    result = run(int(sys.argv[1]) if len(sys.argv) > 1 else ROUNDS)
    print(json.dumps(result["rows"], indent=1))
    print("\n".join(result["summary"]))
