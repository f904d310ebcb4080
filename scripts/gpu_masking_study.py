"""The paired masking study on one GPU, sized to fit one call of a bare GPU box (issues 29, 41 and 53).

A planner over `python train.py`: it trains nothing itself. The study is conf/experiment/masking_gpu.yaml
(experiment=masking_paired's design at GPU scale: prepacked concat windows of 1,024 tokens with the
document mask and without it, a 51M-parameter GPT, bf16, attn=varlen, 4 paired seeds):

1. calibrate: one short `python train.py` per arm (seed 0, a few updates, one validation). Its run
   directory (metrics.csv's train/tokens) and the times its rows appeared give the arm's steady real
   tokens/s, one validation's seconds, and its start-up: everything else the process spent (imports,
   CUDA, the cache check, the windows, the end's checkpoint and plot). Then one `pretrain compare` on
   the two is timed: the study reserves that for its end.
2. plan: every run the same number of updates, as many as fit 90% of the time left once each run is
   charged the second arm's start-up (the first's also holds what happens once: the windows, the
   floors) and its validations; 5% warmup, about 6 validations, as before.
3. run: one `python train.py` per run, seed by seed, the masked arm first. Not one `--multirun`: a run
   that fails or is killed loses only itself, and the planner starts a run only when it still ends
   before the deadline, so a study cut short keeps whole pairs and spends no time on a run it would cut.
   The calibration runs are such processes too, so the start-up they measure is what each run costs.
4. pack: after each run, its directory (config.yaml, metrics.csv, run.json as train.py writes them)
   goes into `--output`/runs.tar.gz, rewritten atomically with study.json (the calibration, the plan,
   the runs); at the end `pretrain compare`'s compare.json on the complete pairs joins the archive.

The carried cache (`make gpu-cache`) is only read. The runs read a copy of it in a temporary
directory, which also receives everything train.py writes beside a cache (its verified record, the
windows, the floors) and the run directories. train.py reads it with cache.carried=true: the source's
identity (the Python and packages of the machine that built it) comes from its manifest.

    PYTHONPATH=src python3 scripts/gpu_masking_study.py --cache gpu-cache --output OUT/masking-gpu
    PYTHONPATH=src python3 scripts/gpu_masking_study.py --cache CACHE --output /tmp/dry --dry-run  # CPU
    python scripts/gpu_masking_study.py --unpack FETCHED/masking-gpu --output masking-gpu  # here, after
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

STARTED = time.monotonic()  # the budget counts from here
ROOT = Path(__file__).resolve().parents[1]

WARMUP_SHARE = 0.05
VALIDATIONS = 6  # per run, and one at its last update: compare averages the last two
SAFETY = 0.9  # of the time left after calibration that the plan may fill
SEEDS = (0, 1, 2, 3)
ARMS = (True, False)  # document_mask, in the order each seed trains them
SECONDS = 420.0  # the default budget: fits 15 minutes of GPU time with its start and a retry
DRY_SECONDS = 120.0  # a dry run's cap on --seconds: its plan is then the minimal one
STARTUP_UPDATES = 3  # each calibration run's first updates, timed with its start-up
CARRY_LIMIT = 45_000_000  # bytes of the carried cache
STUDY_JSON, RUNS_TAR, COMPARE_JSON = "study.json", "runs.tar.gz", "compare.json"
RETURNED_BYTES = 16 * 2**20  # what a GPU box's call returns: a few files of at most 16 MiB
RUN_FILES = ("config.yaml", "metrics.csv", "run.json")
RUN_NAME = re.compile(r"mask(true|false)-seed(\d+)")
REFERENCE = "prepacked document_mask=false"
GRACE = 60.0  # seconds a run stopped by SIGTERM gets to write its checkpoint and run.json


@dataclass(frozen=True)
class Setup:
    """What the study trains: train.py's overrides beyond the experiment, and the plan's constants."""

    overrides: tuple[str, ...]
    tokens_per_update: int  # train.batch_size x data.max_seq_len
    steady_updates: int  # each calibration run's updates after its start-up ones
    validations: int = VALIDATIONS


GPU = Setup(("experiment=masking_gpu",), 32 * 1024, 30)
DRY = Setup(  # a tiny GPT on the CPU: the same path in a few seconds per run
    tuple(
        "experiment=masking_gpu trainer=cpu attn=sdpa model.name=gpt-dry model.n_layer=1 model.n_head=2 "
        "model.d_model=32 data.max_seq_len=32 train.batch_size=2 train.lr=3e-3 "
        "train.eval_microbatch_tokens=1024 train.val_batches=4".split()
    ),
    2 * 32,
    5,
    validations=2,
)


class StudyError(Exception):
    """The study cannot run as asked (a bad input, a budget too small): one line, exit 2."""


def run_name(document_mask: bool, seed: int) -> str:
    return f"mask{str(document_mask).lower()}-seed{seed}"


# --- sizing -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    updates: int
    warmup: int
    val_every: int
    validations: int
    tokens_per_run: int
    startup_seconds: float  # charged once per run
    seconds_per_run: float  # predicted: its start-up, its training and its validations


def validation_steps(updates: int, every: int) -> list[int]:
    """The steps a run validates at: every `every` updates and at its last (as `python train.py`)."""
    return sorted({*range(every, updates + 1, every), updates})


def plan_study(
    *,
    tokens_per_second: float,
    validation_seconds: float,
    startup_seconds: float,
    seconds_left: float,
    tokens_per_update: int,
    runs: int,
    validations: int = VALIDATIONS,
    safety: float = SAFETY,
    at_least_minimum: bool = False,
) -> Plan:
    """The most updates per run that let `runs` runs (each its start-up once, its training at the
    measured steady rate and its validations: every updates // `validations` steps and at its last, so
    `validations` to 2 x `validations`) end within `safety` x `seconds_left`. Fewer than
    2 x `validations` is an error, or with `at_least_minimum` (a dry run: the path, not the budget)
    that many."""

    def predicted(updates: int) -> tuple[int, float]:
        every = max(1, updates // validations)
        count = len(validation_steps(updates, every))
        return (
            every,
            startup_seconds + updates * tokens_per_update / tokens_per_second + count * validation_seconds,
        )

    per_run = safety * seconds_left / runs
    # At least `validations` validations: this many updates is the most that can fit.
    updates = int(
        (per_run - startup_seconds - validations * validation_seconds)
        * tokens_per_second
        // tokens_per_update
    )
    while updates > 0 and predicted(updates)[1] > per_run:
        updates -= 1
    needed = 2 * validations
    if updates < needed and at_least_minimum:
        updates = needed
    if updates < needed:
        raise StudyError(
            f"{seconds_left:.0f} s left fit {max(updates, 0)} updates per run at {tokens_per_second:,.0f} "
            f"real tokens/s (validation {validation_seconds:.1f} s, start-up {startup_seconds:.1f} s), "
            f"fewer than {needed}: give more --seconds"
        )
    every, seconds = predicted(updates)
    return Plan(
        updates=updates,
        warmup=max(1, round(WARMUP_SHARE * updates)),
        val_every=every,
        validations=len(validation_steps(updates, every)),
        tokens_per_run=updates * tokens_per_update,
        startup_seconds=startup_seconds,
        seconds_per_run=seconds,
    )


# --- the inputs, checked before anything is made ---------------------------------------------------


def check_seconds(value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise StudyError(f"--seconds {value:g} must be a finite number of seconds above 0")


def check_output(output: Path) -> None:
    """`output` is new or an empty directory: the study never mixes its files with others'."""
    if output.is_symlink() or (output.exists() and not output.is_dir()):
        raise StudyError(f"--output {output} exists and is not a directory: give a new directory")
    if output.is_dir() and any(output.iterdir()):
        raise StudyError(f"--output {output} exists and is not empty: give a new or empty directory")


def find_cache(path: Path) -> Path:
    """`path` itself when it holds a manifest, else its one cache directory."""
    if not path.is_dir():
        what = "is not a directory" if path.exists() else "does not exist"
        raise StudyError(f"--cache {path} {what}: give the cache make gpu-cache built")
    if (path / "manifest.json").is_file():
        return path
    found = sorted(p.parent for p in path.glob("*/manifest.json"))
    if len(found) != 1:
        what = "no cache" if not found else f"{len(found)} caches"
        raise StudyError(f"--cache {path}: {what} (give a cache directory, or a folder holding exactly one)")
    return found[0]


def open_carried(path: Path) -> tuple[Path, dict]:
    """The carried cache's directory and manifest, read as train.py reads it (checksum, format,
    structure), every file's size and sha256 checked. Reads only: nothing is written there."""
    from pretrain.data.files import sha256_file
    from pretrain.data.ingest.cache import REBUILD_HINT, manifest_files, read_manifest
    from pretrain.errors import PretrainError

    directory = find_cache(Path(path))
    try:
        manifest = read_manifest(directory)
    except PretrainError as error:
        raise StudyError(f"{str(error).removesuffix('; ' + REBUILD_HINT)}: carry the cache again") from None
    for _, _, entry in manifest_files(manifest):
        file = directory / entry["name"]
        if (
            not file.is_file()
            or file.stat().st_size != entry["bytes"]
            or sha256_file(file) != entry["sha256"]
        ):
            raise StudyError(f"{file} does not match {directory / 'manifest.json'}: carry the cache again")
    return directory, manifest


def check_inputs(cache: Path, output: Path, gpu: bool) -> tuple[Path, dict]:
    """Every check before anything is made: the output, its distance from the cache, the cache, the GPU."""
    check_output(output)
    out, carried = output.resolve(), Path(cache).resolve()
    if out == carried or carried in out.parents or out in carried.parents:
        raise StudyError(f"--output {output} overlaps the cache {cache}: the cache is only read")
    directory, manifest = open_carried(cache)
    if gpu:
        import torch

        if not torch.cuda.is_available():
            raise StudyError("no CUDA device: run it on the GPU box, or --dry-run on this machine")
    return directory, manifest


# --- the cache train.py reads: a copy, under the key this machine computes ------------------------------


def cache_overrides(manifest: dict) -> list[str]:
    """The source, split and budget the carried cache was built with, as train.py overrides, and
    cache.carried=true: train.py takes the source's identity from the manifest (the machine that built
    it had another Python and other packages) and checks everything else."""
    identity = manifest["identity"]
    values = [f"source={identity['source']['kind']}"]
    for group in ("split", "budget"):
        for key, value in sorted(identity.get(group, {}).items()):
            values.append(f"{group}.{key}={'null' if value is None else json.dumps(value)}")
    return [*values, "cache.carried=true"]


def stage_cache(directory: Path, manifest: dict, root: Path, overrides: list[str]) -> dict:
    """A copy of the carried cache under `root`, under its own key, where `python train.py
    overrides...` (cache.carried=true) finds it; what study.json records."""
    from pretrain.config.compose import load_config, to_config
    from pretrain.data.ingest.cache import CacheSpec
    from pretrain.errors import PretrainError

    target = root / manifest["key"]
    target.mkdir(parents=True)
    for file in directory.iterdir():  # the files, not the verified record, locks or windows
        if file.is_file() and not file.name.startswith(".") and file.suffix != ".lock":
            shutil.copyfile(file, target / file.name)
    before = os.environ.get("PRETRAIN_CACHE_ROOT")
    os.environ["PRETRAIN_CACHE_ROOT"] = str(root)  # what the runs get (run_env): the env wins over cache_root
    try:
        spec = CacheSpec.from_config(to_config(load_config(overrides)))
    except PretrainError as error:  # e.g. another tokenizer than this study's
        raise StudyError(
            f"train.py cannot use this cache ({error}): carry the one make gpu-cache built"
        ) from None
    finally:
        if before is None:
            del os.environ["PRETRAIN_CACHE_ROOT"]
        else:
            os.environ["PRETRAIN_CACHE_ROOT"] = before
    if spec.key != manifest["key"]:  # cannot happen: carried_identity returns the one cache it found
        raise StudyError(f"train.py names another cache ({spec.key}) than the carried {manifest['key']}")
    return {"directory": str(directory), "key": manifest["key"], "source": manifest["identity"]["source"]}


# --- one train.py process -------------------------------------------------------------------------------


@dataclass
class Launched:
    returncode: int
    seconds: float  # the process's wall time
    row_times: dict[int, float]  # step -> when its metrics.csv row was first seen (process start = 0)
    cut: bool  # stopped at the deadline


def launch(command: list[str], env: dict, work: Path, log: Path, watch: Path | None, deadline: float):
    """Run `command` in `work`, its output into `log`; watch `watch` (a metrics.csv) for new rows;
    SIGTERM at `deadline` (the run stops after its update), SIGKILL GRACE seconds later."""
    begun = time.monotonic()
    times: dict[int, float] = {}
    size, cut = -1, False
    with open(log, "w") as out:
        process = subprocess.Popen(command, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            while process.poll() is None:
                time.sleep(0.01)
                now = time.monotonic()
                if watch is not None and watch.is_file() and watch.stat().st_size != size:
                    size = watch.stat().st_size
                    for step in logged_steps(watch):
                        times.setdefault(step, now - begun)
                if now > deadline and not cut:
                    process.send_signal(signal.SIGTERM)
                    cut = True
                if now > deadline + GRACE:
                    process.kill()
        finally:
            if process.poll() is None:
                process.kill()
            process.wait()
    return Launched(process.returncode, time.monotonic() - begun, times, cut)


def logged_steps(metrics: Path) -> list[int]:
    return [int(row["step"]) for row in read_rows(metrics)]


def read_rows(metrics: Path) -> list[dict]:
    """metrics.csv's complete rows, the non-empty cells as floats (a line cut mid-write left out)."""
    try:
        text = metrics.read_text()
    except OSError:
        return []
    lines = text.splitlines(keepends=True)
    complete = [line for line in lines if line.endswith("\n")]
    rows = list(csv.DictReader(complete))
    return [{k: float(v) for k, v in row.items() if v not in ("", None)} for row in rows if row.get("step")]


def train_command(setup: Setup, cache_root: Path, run_dir: Path, *more: str) -> list[str]:
    return [
        sys.executable,
        str(ROOT / "train.py"),
        *setup.overrides,
        *more,
        f"cache_root={cache_root}",
        f"hydra.run.dir={run_dir}",
        "progress_bar=false",
    ]


def child_env(work: Path) -> dict:
    """train.py's environment: src/ importable, the copied cache, every state file in `work`."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    env["PRETRAIN_CACHE_ROOT"] = str(work / "cache")
    env["PRETRAIN_STATE_DIR"] = str(work / "state")
    for name, folder in [("MPLCONFIGDIR", "matplotlib"), ("TORCHINDUCTOR_CACHE_DIR", "inductor")]:
        env[name] = str(work / folder)
    env["TRITON_CACHE_DIR"] = str(work / "triton")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def log_tail(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(no output)"


# --- calibration --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Calibration:
    tokens_per_second: float  # the slower arm's steady rate, real tokens
    by_arm: dict  # each arm's steady rate
    startup_seconds: dict  # each arm's: the process less its steady updates and its validation
    startup_per_run: float  # what the plan charges each run once: the later arm's start-up
    startup_updates: int
    validation_seconds: float
    compare_seconds: float  # `pretrain compare` on the two runs: reserved for the study's end
    updates: int  # the steady updates measured
    seconds: float
    device: str  # train.py's `device:` line (the planner itself never opens the GPU)


def measure(rows: list[dict], launched: Launched) -> tuple[float, float, float]:
    """(steady real tokens/s, validation seconds, start-up seconds) of a calibration run. An update's
    time is the time between its rows after the first STARTUP_UPDATES, before a validation: all train.py
    spends per update (its logging too), not only train/step_seconds. A validation is the time its row
    came late. The start-up is the rest of the process's time."""
    by_step, times = {int(row["step"]): row for row in rows}, launched.row_times
    last, validated = max(by_step), sorted(s for s, row in by_step.items() if "val/loss" in row)
    end = min([*validated, last + 1]) - 1  # the last row before the first validation
    if STARTUP_UPDATES in times and end in times and end > STARTUP_UPDATES:
        per_update = (times[end] - times[STARTUP_UPDATES]) / (end - STARTUP_UPDATES)
    else:  # rows not seen apart (a very short run): the updates' own time
        steady = [row for step, row in by_step.items() if step > STARTUP_UPDATES]
        per_update = sum(r["train/step_seconds"] + r.get("train/data_seconds", 0.0) for r in steady) / len(
            steady
        )
    tokens = by_step[last]["train/tokens"] - by_step[STARTUP_UPDATES]["train/tokens"]
    late = [times[s] - times[s - 1] - per_update for s in validated if s in times and s - 1 in times]
    validation = max(0.0, sum(late) / len(late)) if late else 0.0
    startup = launched.seconds - (last - STARTUP_UPDATES) * per_update - len(validated) * validation
    return tokens / (last - STARTUP_UPDATES) / max(per_update, 1e-9), validation, max(0.0, startup)


def calibrate(setup: Setup, work: Path, cache_root: Path, base: list[str], deadline: float) -> Calibration:
    """Each arm of seed 0 for STARTUP_UPDATES + setup.steady_updates updates, validated once at the
    end; then `pretrain compare` on the two, timed."""
    updates = STARTUP_UPDATES + setup.steady_updates
    rates, startups, validation, runs = {}, {}, 0.0, []
    begun = time.monotonic()
    for mask in ARMS:
        run_dir = work / "calibration" / run_name(mask, 0)
        schedule = [
            f"train.max_steps={updates}",
            f"train.val_every_n_steps={updates}",
            "train.warmup_steps=1",
        ]
        command = train_command(setup, cache_root, run_dir, *base, "seed=0", f"data.document_mask={mask}")
        log = work / f"calibration-{run_name(mask, 0)}.log"
        launched = launch(
            [*command, *schedule], child_env(work), work, log, run_dir / "metrics.csv", deadline
        )
        if launched.returncode != 0:
            raise StudyError(f"calibration run {run_dir.name} exited {launched.returncode}: {log_tail(log)}")
        key = f"document_mask={str(mask).lower()}"
        rates[key], arm_validation, startups[key] = measure(read_rows(run_dir / "metrics.csv"), launched)
        validation = max(validation, arm_validation)
        runs.append(run_dir)
        device = next((line for line in log.read_text().splitlines() if line.startswith("device: ")), "")
    compared = time.monotonic()
    compare(runs, work / "calibration-compare.png", work)
    return Calibration(
        tokens_per_second=min(rates.values()),
        by_arm=rates,
        startup_seconds=startups,
        startup_per_run=startups[f"document_mask={str(ARMS[-1]).lower()}"],
        startup_updates=STARTUP_UPDATES,
        validation_seconds=validation,
        compare_seconds=time.monotonic() - compared,
        updates=len(ARMS) * setup.steady_updates,
        seconds=time.monotonic() - begun,
        device=device.removeprefix("device: "),
    )


def compare(runs: list[Path], figure: Path, work: Path) -> Path:
    """`pretrain compare RUN... --reference REFERENCE --no-timing`; its compare.json."""
    command = [sys.executable, "-m", "pretrain.cli", "compare", *map(str, runs), "--reference", REFERENCE]
    log = work / f"{figure.stem}.log"
    with open(log, "w") as out:
        done = subprocess.run(
            [*command, "--no-timing", "--output", str(figure)], cwd=work, env=child_env(work), stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    if done.returncode != 0:
        raise StudyError(f"pretrain compare exited {done.returncode}: {log_tail(log)}")
    return figure.with_suffix(".json")


# --- what the study writes ------------------------------------------------------------------------------


def pack_runs(runs_dir: Path, names: list[str], compared: Path | None, archive: Path) -> int:
    """The finished runs `names` (directories under `runs_dir`) and compare.json into the gzipped tar
    `archive`, rewritten whole under a temporary name, then renamed: whenever the study is killed, the
    archive holds every run it had finished. Its size in bytes (a warning above what a box returns)."""
    from pretrain.fileio import atomic_write

    with atomic_write(archive) as handle, tarfile.open(fileobj=handle, mode="w:gz") as tar:
        for name in names:
            for file in RUN_FILES:
                tar.add(runs_dir / name / file, arcname=f"{name}/{file}")
        if compared is not None and compared.is_file():
            tar.add(compared, arcname=COMPARE_JSON)
    size = archive.stat().st_size
    if size > RETURNED_BYTES:
        print(f"warning: {archive} holds {size / 2**20:.1f} MiB, over the 16 MiB a call returns", flush=True)
    return size


def write_study(output: Path, study: dict) -> None:
    from pretrain.fileio import write_text_atomic

    write_text_atomic(output / STUDY_JSON, json.dumps(study, indent=2) + "\n")


def completed(run_dir: Path) -> bool:
    """train.py finished the run: its three files are there and run.json says completed."""
    if not all((run_dir / file).is_file() for file in RUN_FILES):
        return False
    return json.loads((run_dir / "run.json").read_text()).get("status") == "completed"


# --- the study ----------------------------------------------------------------------------------------


def run_pairs(study: dict, setup: Setup, plan: Plan, work: Path, output: Path, base: list[str], **at) -> None:
    """The pairs seed by seed, each run a `python train.py`; each finished run goes into runs.tar.gz and
    study.json at once. `at`: deadline (the end of the budget, less compare's reserve) and clock. A run
    is started only when its predicted time still fits; one cut at the deadline is left out."""
    schedule = [
        f"train.max_steps={plan.updates}",
        f"train.warmup_steps={plan.warmup}",
        f"train.val_every_n_steps={plan.val_every}",
    ]
    try:
        study["status"] = run_in_order(study, setup, plan, work, output, [*base, *schedule], **at)
    finally:  # study.json says at once why the study stopped
        write_study(output, study)


def run_in_order(study: dict, setup: Setup, plan: Plan, work: Path, output: Path, overrides, **at) -> str:
    deadline, clock = at["deadline"], at["clock"]
    runs_dir, done = work / "runs", study["archive"]["runs"]
    for seed in study["seeds"]:
        for mask in ARMS:
            name = run_name(mask, seed)
            if clock() + plan.seconds_per_run > deadline:
                return f"stopped at the deadline in seed {seed}: {len(done) // 2} pairs"
            command = train_command(setup, work / "cache", runs_dir / name, *overrides, f"seed={seed}")
            command.append(f"data.document_mask={str(mask).lower()}")
            log = work / f"{name}.log"
            launched = launch(command, child_env(work), work, log, None, deadline)
            if launched.cut or not completed(runs_dir / name):
                why = "cut at the deadline" if launched.cut else f"exited {launched.returncode}"
                study["failure"] = {"run": name, "exit": launched.returncode, "last_line": log_tail(log)}
                return f"{name} {why}: {len(done) // 2} pairs"
            shutil.rmtree(runs_dir / name / "checkpoints", ignore_errors=True)  # scratch: disk, not output
            done.append(name)
            study["archive"]["bytes"] = pack_runs(runs_dir, done, None, output / RUNS_TAR)
            loss = json.loads((runs_dir / name / "run.json").read_text())["metrics"].get("val/loss")
            study["runs"].append(
                {"document_mask": mask, "seed": seed, "seconds": round(launched.seconds, 1), "val_loss": loss}
            )
            write_study(output, study)
            print(f"{name}: val/loss {loss:.4f}, {launched.seconds:.0f} s", flush=True)
    return "completed"


def run_study(
    setup: Setup,
    cache: Path,
    output: Path,
    *,
    seconds: float,
    seeds: tuple[int, ...] = SEEDS,
    clock: Callable[[], float] = time.monotonic,
    started: float | None = None,
    dry_run: bool = False,
) -> dict:
    """Check the inputs, stage the cache, calibrate, plan, run the pairs, compare; returns study.json's
    content. `output` receives study.json and runs.tar.gz only; everything else is made in a temporary
    directory, removed at the end. A `dry_run` trains at least the minimal plan and is never cut."""
    started = clock() if started is None else started
    directory, manifest = check_inputs(cache, output, gpu=not dry_run)
    with tempfile.TemporaryDirectory(prefix="masking-study-") as scratch:
        work = Path(scratch)
        base = cache_overrides(manifest)
        carried = stage_cache(directory, manifest, work / "cache", [*setup.overrides, *base])
        end = math.inf if dry_run else started + seconds
        calibration = calibrate(setup, work, work / "cache", base, end)
        seconds_left = started + seconds - clock() - calibration.compare_seconds
        plan = plan_study(
            tokens_per_second=calibration.tokens_per_second,
            validation_seconds=calibration.validation_seconds,
            startup_seconds=calibration.startup_per_run,
            seconds_left=seconds_left,
            tokens_per_update=setup.tokens_per_update,
            runs=len(ARMS) * len(seeds),
            validations=setup.validations,
            at_least_minimum=dry_run,
        )
        study = {
            "device": calibration.device,
            "overrides": [*setup.overrides, *base],
            "cache": {**carried, "splits": {k: v["tokens"] for k, v in manifest["splits"].items()}},
            "budget": {"seconds": seconds},
            "seconds_left": seconds_left,
            "calibration": asdict(calibration),
            "plan": asdict(plan),
            "seeds": list(seeds),
            "archive": {"file": RUNS_TAR, "runs": [], "bytes": 0},
            "runs": [],
            "status": "running",
        }
        output.mkdir(parents=True, exist_ok=True)
        write_study(output, study)
        print(
            f"calibrated: {calibration.tokens_per_second:,.0f} real tokens/s (slower arm, steady), "
            f"start-up {calibration.startup_per_run:.1f} s per run, validation "
            f"{calibration.validation_seconds:.1f} s, compare {calibration.compare_seconds:.1f} s; plan: "
            f"{plan.updates} updates x {setup.tokens_per_update:,} tokens per run, validated every "
            f"{plan.val_every}",
            flush=True,
        )
        try:
            deadline = end - calibration.compare_seconds
            run_pairs(study, setup, plan, work, output, base, deadline=deadline, clock=clock)
            pairs = paired(set(study["archive"]["runs"]))
            if pairs:  # compare.json of the complete pairs joins the archive
                compared = compare([work / "runs" / n for n in pairs], work / "compare.png", work)
                size = pack_runs(work / "runs", study["archive"]["runs"], compared, output / RUNS_TAR)
                study["archive"].update(bytes=size, compare=COMPARE_JSON)
        except BaseException as error:  # a signal, an interrupt, a crash: study.json says so
            study["status"] = f"interrupted after {len(study['runs'])} runs ({type(error).__name__})"
            raise
        finally:
            study["seconds"] = round(clock() - started, 1)
            write_study(output, study)
    return study


# --- here, after the call -------------------------------------------------------------------------------


def archive_runs(members: list[tarfile.TarInfo], archive: Path) -> dict[str, set[str]]:
    """The files of each run in the archive; a member that is not compare.json, a run directory or one
    of a run's plain files (a link, `..`, another name) is refused before anything is extracted."""
    runs: dict[str, set[str]] = {}
    for member in members:
        parts = member.name.split("/")
        if member.isfile() and member.name == COMPARE_JSON:
            continue
        if member.isdir() and len(parts) == 1 and RUN_NAME.fullmatch(parts[0]):
            continue
        if not (
            member.isfile() and len(parts) == 2 and RUN_NAME.fullmatch(parts[0]) and parts[1] in RUN_FILES
        ):
            raise StudyError(f"{archive} holds {member.name!r}, which no study writes: fetch it again")
        runs.setdefault(parts[0], set()).add(parts[1])
    return runs


def paired(complete: set[str]) -> list[str]:
    """The runs of `complete` whose seed has both arms complete."""
    seeds = {int(RUN_NAME.fullmatch(name).group(2)) for name in complete}  # type: ignore[union-attr]
    pairs = [[run_name(mask, seed) for mask in ARMS] for seed in sorted(seeds)]
    return sorted(name for pair in pairs if set(pair) <= complete for name in pair)


def unpack(fetched: Path, destination: Path) -> tuple[list[str], list[str]]:
    """The complete pairs of fetched/runs.tar.gz into `destination` (new or empty), with study.json and
    the box's compare.json: what `pretrain compare` reads. Extracted beside it, then renamed into place.
    Returns (the runs extracted, the runs left in the archive: unpaired, compare would not pair them)."""
    archive = Path(fetched) / RUNS_TAR
    check_output(destination)
    if not archive.is_file():
        raise StudyError(f"{archive} does not exist: give the folder the study wrote (its --output)")
    partial = destination.with_name(destination.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        with tarfile.open(archive, "r:gz") as tar:
            runs = archive_runs(tar.getmembers(), archive)
            kept = paired({name for name, files in runs.items() if files == set(RUN_FILES)})
            if not kept:
                raise StudyError(f"{archive} holds no complete pair of runs: nothing to compare")
            names = [f"{name}/{file}" for name in kept for file in RUN_FILES]
            names += [COMPARE_JSON] if COMPARE_JSON in tar.getnames() else []
            for member in names:
                (partial / member).parent.mkdir(parents=True, exist_ok=True)
                (partial / member).write_bytes(tar.extractfile(member).read())  # type: ignore[union-attr]
    except (tarfile.TarError, OSError, EOFError) as error:
        shutil.rmtree(partial, ignore_errors=True)
        raise StudyError(f"{archive} is not a readable tar.gz ({error}): fetch it again") from None
    except StudyError:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    if (Path(fetched) / STUDY_JSON).is_file():
        shutil.copyfile(Path(fetched) / STUDY_JSON, partial / STUDY_JSON)
    if destination.is_dir():
        destination.rmdir()  # empty: check_output said so
    os.replace(partial, destination)
    return kept, sorted(set(runs) - set(kept))


def check_carry(path: Path) -> str:
    """The line `make gpu-cache` ends with: the cache verifies, has its floors and fits the carry."""
    directory, manifest = open_carried(path)
    if not (directory / "floors.json").is_file():
        raise StudyError(f"{directory} has no floors.json: build it with make gpu-cache")
    size = sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())
    if size > CARRY_LIMIT:
        raise StudyError(
            f"{path} holds {size / 1e6:.1f} MB, over the {CARRY_LIMIT / 1e6:.0f} MB copied to a GPU box: "
            "set budget.train_tokens to cap it"
        )
    splits = manifest["splits"]
    tokens = sum(int(s["tokens"]) for s in splits.values())
    return (
        f"carried cache {directory}: {tokens:,} tokens ({splits['validation']['tokens']:,} validation), "
        f"{size / 1e6:.1f} MB of {CARRY_LIMIT / 1e6:.0f}, floors included"
    )


# --- the command line -----------------------------------------------------------------------------------


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2 (argparse would print its usage first)
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)


def arguments() -> argparse.ArgumentParser:
    parser = Parser(description=(__doc__ or "").split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--cache", type=Path, help="run the study on this carried cache (make gpu-cache)")
    mode.add_argument(
        "--unpack", type=Path, metavar="DIR", help="extract DIR/runs.tar.gz's pairs into --output"
    )
    mode.add_argument("--check-cache", type=Path, metavar="DIR", help="check a carried cache, then stop")
    parser.add_argument("--output", type=Path, help="a new or empty directory: the study's, or --unpack's")
    parser.add_argument("--seconds", type=float, default=SECONDS, help="the whole study's wall-clock budget")
    parser.add_argument("--dry-run", action="store_true", help="a tiny model on the CPU, a minimal plan")
    return parser


def dispatch(args: argparse.Namespace) -> int:
    if args.check_cache is not None:
        print(check_carry(args.check_cache))
        return 0
    if args.cache is None and args.unpack is None:
        raise StudyError("give --cache DIR (the study), --unpack DIR or --check-cache DIR")
    if args.output is None:
        raise StudyError("--output is required: a new or empty directory")
    if args.unpack is not None:
        kept, left = unpack(args.unpack, args.output)
        print(f"unpacked {len(kept)} runs ({len(kept) // 2} pairs) into {args.output}")
        if left:
            print(f"left in {args.unpack / RUNS_TAR} (no complete pair): {' '.join(left)}")
        print(f"next: pretrain compare {args.output} --reference '{REFERENCE}' --no-timing")
        return 0
    check_seconds(args.seconds)
    seconds = min(args.seconds, DRY_SECONDS) if args.dry_run else args.seconds
    setup = DRY if args.dry_run else GPU
    study = run_study(setup, args.cache, args.output, seconds=seconds, started=STARTED, dry_run=args.dry_run)
    runs = study["archive"]["runs"]
    print(f"{study['status']}: {len(runs)} runs in {study['seconds']:.0f} s; {args.output / RUNS_TAR}")
    print(f"next, where it is fetched: scripts/gpu_masking_study.py --unpack {args.output} --output DIR")
    return 0 if study["status"] == "completed" else 1


def main(argv: list[str] | None = None) -> int:
    try:
        args = arguments().parse_args(argv)
    except SystemExit as exit:  # --help, or a usage error already printed in one line
        return int(exit.code or 0)
    try:
        return dispatch(args)
    except StudyError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def terminated(signum: int, frame) -> None:
    """SIGTERM (a call's timeout) as an exit: study.json says the study was interrupted."""
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    signal.signal(signal.SIGTERM, terminated)
    sys.exit(main())
