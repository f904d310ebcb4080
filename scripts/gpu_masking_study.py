"""The paired masking study on one GPU, sized to fit one call of a bare GPU box (issues 29 and 41).

Prepacked `strategy=concat` windows of 1,024 tokens with the document mask against the same windows
without it; for a given seed both arms start from the same weights and see the same windows in the same
order. A ~50M-parameter GPT, bf16 autocast, `attn=varlen`, 4 paired seeds, AdamW with warmup then cosine
decay to 0.1x, the whole validation split at every validation (compare reads the mean of the last two).

It runs with torch, numpy and this repository's src/ alone: no network, no Hydra, no omegaconf, no
`tokenizers` (tests/test_gpu_masking_study.py runs it with those imports blocked). The cache it reads
is carried to the box (`make gpu-cache` builds it here, at most 45 MB, floors included) and is only
read: what the study builds (the concat windows, the run directories) goes to a temporary directory.

    PYTHONPATH=src python3 scripts/gpu_masking_study.py --cache gpu-cache --output $OUT/masking-gpu
    PYTHONPATH=src python3 scripts/gpu_masking_study.py --cache gpu-cache --output /tmp/dry --dry-run  # CPU
    python scripts/gpu_masking_study.py --unpack FETCHED/masking-gpu --output masking-gpu  # here, after

The first `--calibration-seconds` (60) train both arms: each arm's first updates (building it, memory,
kernels) are timed apart as its start-up, the later ones give the steady real tokens/s; one validation
is timed. The study is then sized to end within `--seconds` (420) of the start: the same number of
updates for every run, as many as the slower arm's steady rate allows once each run's start-up is
charged. `--output` receives two files, as a GPU box returns at most 8: `study.json` (the calibration,
the plan, the runs so far) and `runs.tar.gz`, rewritten whole (atomically) after each run, holding the
run directories `mask<bool>-seed<n>/` (metrics.csv, config.yaml, run.json, as `python train.py`
writes them). `--unpack` extracts the complete pairs, which `pretrain compare DIR --reference
'prepacked document_mask=false'` reads as it reads `make study-masking`'s sweep.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

STARTED = time.monotonic()  # the budget counts from here, before torch is imported

# The train group's defaults the study shares with `python train.py` (tests/test_gpu_masking_study.py
# checks them against config.TrainConfig, which this script cannot import without omegaconf).
WEIGHT_DECAY = 0.1
BETAS = (0.9, 0.95)
GRAD_CLIP = 1.0
MIN_LR_RATIO = 0.1
EVAL_PACKING_BUFFER = 64  # train.eval_packing_buffer's default: validation packed as train.py packs it
WARMUP_SHARE = 0.05
VALIDATIONS = 6  # per run, the last at its final update: compare averages the last two
SAFETY = 0.9  # of the time left after calibration that the plan may fill
SEEDS = (0, 1, 2, 3)
ARMS = (True, False)  # document_mask, in the order each seed trains them
SECONDS = (
    420.0  # the default budget: fits 15 minutes of GPU time with its start and a retry (docs/cluster.md)
)
CALIBRATION_SECONDS = 60.0
STARTUP_UPDATES = 3  # each arm's first updates, timed with its start-up, not in its steady rate
STEADY_UPDATES = 5  # the fewest updates an arm's steady rate is measured over
CARRY_LIMIT = 45_000_000  # bytes of the carried cache
STUDY_JSON = "study.json"
RUNS_TAR = "runs.tar.gz"
RETURNED_FILES = 8  # what a GPU box's call returns from $OUT: at most 8 files of 16 MiB each
RETURNED_BYTES = 16 * 2**20
RUN_FILES = ("config.yaml", "metrics.csv", "run.json")
RUN_NAME = re.compile(r"mask(true|false)-seed(\d+)")


@dataclass(frozen=True)
class Setup:
    """What one study trains: the model, the windows, the batch and the optimizer's peak rate."""

    n_layer: int
    n_head: int
    d_model: int
    max_seq_len: int
    batch_size: int
    lr: float
    device: str
    attn: str
    bf16: bool
    model_name: str
    validation_pairs: int | None = None  # None: the whole validation split
    eval_tokens: int = 32_768  # tokens per validation microbatch (train.eval_microbatch_tokens)
    validations: int = VALIDATIONS  # per run

    @property
    def tokens_per_update(self) -> int:
        return self.batch_size * self.max_seq_len


GPU = Setup(8, 8, 512, 1024, 32, 1.0e-3, "cuda", "varlen", True, "gpt-51m")
DRY = Setup(
    1,
    2,
    32,
    32,
    2,
    3.0e-3,
    "cpu",
    "sdpa",
    False,
    "gpt-dry",
    validation_pairs=2048,
    eval_tokens=1024,
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
    measured steady rate and `validations` validations) end within `safety` x `seconds_left`. The
    start-up's own updates are counted again at the steady rate (a few updates of slack). Fewer than
    2 x `validations` is an error, or with `at_least_minimum` (a dry run: the path, not the budget)
    that many."""
    per_run = safety * seconds_left / runs - startup_seconds - validations * validation_seconds
    updates = int(per_run * tokens_per_second // tokens_per_update)
    needed = 2 * validations
    if updates < needed and at_least_minimum:
        updates = needed
    if updates < needed:
        raise StudyError(
            f"{seconds_left:.0f} s left fit {max(updates, 0)} updates per run at {tokens_per_second:,.0f} "
            f"real tokens/s (validation {validation_seconds:.1f} s, start-up {startup_seconds:.1f} s), "
            f"fewer than {needed}: give more --seconds"
        )
    every = max(1, updates // validations)
    steps = validation_steps(updates, every)
    seconds = startup_seconds + updates * tokens_per_update / tokens_per_second
    return Plan(
        updates=updates,
        warmup=max(1, round(WARMUP_SHARE * updates)),
        val_every=every,
        validations=len(steps),
        tokens_per_run=updates * tokens_per_update,
        startup_seconds=startup_seconds,
        seconds_per_run=seconds + len(steps) * validation_seconds,
    )


def lr_factor(step: int, warmup: int, max_steps: int, min_ratio: float = MIN_LR_RATIO) -> float:
    """Linear warmup to 1, then cosine down to `min_ratio` at `max_steps` (training/module.py's)."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, max_steps - warmup))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


# --- the inputs, checked before anything is made ---------------------------------------------------


def check_seconds(option: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise StudyError(f"{option} {value:g} must be a finite number of seconds above 0")


def check_budget(seconds: float, calibration_seconds: float) -> None:
    """Both budgets finite and positive, the calibration inside the study's."""
    check_seconds("--seconds", seconds)
    check_seconds("--calibration-seconds", calibration_seconds)
    if calibration_seconds >= seconds:
        raise StudyError(
            f"--calibration-seconds {calibration_seconds:g} must be below --seconds {seconds:g} "
            "(the study's whole budget)"
        )


def check_output(output: Path) -> None:
    """`output` is new or an empty directory: the study never mixes its files with others'."""
    if output.is_symlink() or (output.exists() and not output.is_dir()):
        raise StudyError(f"--output {output} exists and is not a directory: give a new directory")
    if output.is_dir() and any(output.iterdir()):
        raise StudyError(f"--output {output} exists and is not empty: give a new or empty directory")


def check_apart(output: Path, cache: Path) -> None:
    """Nothing is written into the carried cache: `output` is neither inside it nor holding it."""
    out, carried = output.resolve(), cache.resolve()
    if out == carried or carried in out.parents or out in carried.parents:
        raise StudyError(f"--output {output} overlaps the cache {cache}: the cache is only read")


def read_object(path: Path) -> dict:
    """The JSON object in `path`, or a StudyError naming what is wrong with it."""
    try:
        value = json.loads(path.read_bytes())
    except (OSError, ValueError) as error:
        raise StudyError(f"{path} is not readable JSON ({error}): carry the cache again") from None
    if not isinstance(value, dict):
        raise StudyError(f"{path} holds a {type(value).__name__}, not a JSON object: carry the cache again")
    return value


MANIFEST_KEYS = (
    "token_dtype",
    "identity.source.kind",
    "identity.tokenizer.name",
    "identity.tokenizer.revision",
    "identity.split",
    "identity.budget",
)
SPLIT_KEYS = ("documents", "tokens", "files")


def lookup(mapping: dict, dotted: str):
    """mapping[a][b]... for `a.b...`; KeyError naming the dotted key when a level is missing."""
    value = mapping
    for key in dotted.split("."):
        if not isinstance(value, dict) or key not in value:
            raise KeyError(dotted)
        value = value[key]
    return value


def check_manifest(manifest: dict, path: Path) -> None:
    """The keys the study reads, with the types it reads them as; one line naming the first that is not."""
    from pretrain.data.ingest.writer import split_files, token_dtype

    try:
        for dotted in MANIFEST_KEYS:
            lookup(manifest, dotted)
        for split in ("train", "validation"):
            for key in SPLIT_KEYS:
                lookup(manifest, f"splits.{split}.{key}")
            for kind, name in split_files(split).items():
                entry = lookup(manifest, f"splits.{split}.files.{kind}")
                if not isinstance(entry, dict) or entry.get("name") != name:
                    raise ValueError(f"splits.{split}.files.{kind} must name {name}")
                if not isinstance(entry.get("bytes"), int) or not isinstance(entry.get("sha256"), str):
                    raise ValueError(f"splits.{split}.files.{kind} needs its bytes and sha256")
            if not all(isinstance(manifest["splits"][split][k], int) for k in ("documents", "tokens")):
                raise ValueError(f"splits.{split}.documents and .tokens must be integers")
        token_dtype(manifest["token_dtype"])
    except KeyError as missing:
        raise StudyError(f"{path} lacks {missing.args[0]}: carry the cache again") from None
    except (TypeError, ValueError) as error:
        raise StudyError(f"{path}: {error}: carry the cache again") from None


# --- the carried cache, read without pretrain.data.ingest.cache (which needs `tokenizers`) ---------------


@dataclass(frozen=True)
class CarriedCache:
    directory: Path
    manifest: dict
    floors: dict | None
    packs: Path | None = None  # where the concat windows are built once for every run (not in the cache)


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


def open_carried(path: Path) -> CarriedCache:
    """The cache's manifest after checking its keys and every file's size and sha256, and its
    floors.json when it was computed from these very files (what `make gpu-cache` stores). Reads only."""
    from pretrain.data.files import sha256_file

    directory = find_cache(Path(path))
    manifest = read_object(directory / "manifest.json")
    check_manifest(manifest, directory / "manifest.json")
    files = {}
    for split in ("train", "validation"):
        for entry in manifest["splits"][split]["files"].values():
            file = directory / entry["name"]
            if (
                not file.is_file()
                or file.stat().st_size != entry["bytes"]
                or sha256_file(file) != entry["sha256"]
            ):
                raise StudyError(
                    f"{file} does not match {directory / 'manifest.json'}: carry the cache again"
                )
            files[entry["name"]] = entry["sha256"]
    floors = None
    record_path = directory / "floors.json"
    if record_path.exists():
        record = read_object(record_path)
        source = record.get("computed_from") or {}
        if (source.get("key"), source.get("files")) == (manifest.get("key"), files):
            floors = {k: v for k, v in record.items() if k != "computed_from"}
    return CarriedCache(directory, manifest, floors)


def cache_split(cache: CarriedCache, name: str):
    import numpy as np

    from pretrain.data.index import read_index_array
    from pretrain.data.ingest.writer import split_files
    from pretrain.data.tokens import DocumentIds, TokenSplit

    names = split_files(name)
    documents = int(cache.manifest["splits"][name]["documents"])
    offsets, lengths = read_index_array(cache.directory / names["index_npy"], documents)
    dtype = np.dtype(cache.manifest["token_dtype"]).newbyteorder("<")
    path = cache.directory / names["bin"]
    tokens = np.memmap(path, dtype=dtype, mode="r") if path.stat().st_size else np.zeros(0, dtype)
    ids = DocumentIds(cache.directory / names["index"], documents)
    return TokenSplit(tokens=tokens, offsets=offsets, lengths=lengths, ids=ids, name=name)


# --- one arm ------------------------------------------------------------------------------------------


def policy_settings(setup: Setup, document_mask: bool, seed: int):
    from pretrain.data.batching.policies import PolicySettings, Strategy
    from pretrain.data.batching.policies.prepacked import PrepackedConfig

    data = PrepackedConfig(
        policy="prepacked",  # type: ignore[arg-type]
        max_seq_len=setup.max_seq_len,
        strategy=Strategy.concat,
        document_mask=document_mask,
    )
    return PolicySettings(
        data=data,
        seed=seed,
        batch_size=setup.batch_size,
        eval_microbatch_tokens=setup.eval_tokens,
        eval_packing_buffer=EVAL_PACKING_BUFFER,
        val_batches=None,
        accumulation=1,
    )


def run_config(setup: Setup, document_mask: bool, seed: int, plan: Plan, cache: CarriedCache) -> dict:
    """The run's config.yaml: the keys `python train.py` writes that this study sets (config.to_config
    fills in the rest), so compare groups, labels and pairs the runs as it does the CPU study's."""
    identity = cache.manifest["identity"]
    return {
        "experiment_name": "masking_gpu",
        "seed": seed,
        "source": {"kind": identity["source"]["kind"]},
        "tokenizer": {key: identity["tokenizer"][key] for key in ("name", "revision")},
        "split": dict(identity["split"]),
        "budget": dict(identity["budget"]),
        "data": {
            "policy": "prepacked",
            "max_seq_len": setup.max_seq_len,
            "long_docs": "chunk",
            "packing_buffer": 64,
            "document_mask": document_mask,
            "strategy": "concat",
        },
        "attn": {"backend": setup.attn},
        "logger": {"kind": "csv"},
        "model": {
            "name": setup.model_name,
            "n_layer": setup.n_layer,
            "n_head": setup.n_head,
            "d_model": setup.d_model,
            "max_seq_len": setup.max_seq_len,
        },
        "trainer": {
            "accelerator": "gpu" if setup.device == "cuda" else "cpu",
            "devices": 1,
            "strategy": "auto",
            "precision": precision(setup),
        },
        "train": {
            "batch_size": setup.batch_size,
            "accumulation": 1,
            "eval_microbatch_tokens": setup.eval_tokens,
            "max_steps": plan.updates,
            "max_tokens": None,
            "lr": setup.lr,
            "warmup_steps": plan.warmup,
            "min_lr_ratio": MIN_LR_RATIO,
            "weight_decay": WEIGHT_DECAY,
            "betas": list(BETAS),
            "grad_clip": GRAD_CLIP,
            "val_every_n_steps": plan.val_every,
            "val_batches": None,
            "checkpoint_every_n_steps": None,
            "log_every_n_steps": 1,
        },
    }


def precision(setup: Setup) -> str:
    return "bf16-mixed" if setup.bf16 else "32-true"


class Arm:
    """One run's model, optimizer, train sampler and validation pairs."""

    def __init__(self, setup: Setup, cache: CarriedCache, splits: dict, document_mask: bool, seed: int):
        import torch

        from pretrain.data.batching.evaluation import evaluation_chunks, evaluation_units
        from pretrain.data.batching.samplers import build_sampler
        from pretrain.model import GPT, GPTConfig

        self.setup, self.document_mask, self.seed = setup, document_mask, seed
        self.device = torch.device(setup.device)
        self.settings = policy_settings(setup, document_mask, seed)
        # The carried cache is only read: the windows are built once into the study's temporary folder.
        self.sampler = build_sampler(self.settings, splits["train"], packs_dir=cache.packs)
        self.validation = splits["validation"]
        self.chunks = evaluation_chunks(self.validation, setup.max_seq_len, setup.validation_pairs)
        self.units = evaluation_units(self.settings, self.chunks)
        torch.manual_seed(seed)  # the same weights for both arms of a seed
        config = GPTConfig(50257, setup.n_layer, setup.n_head, setup.d_model, setup.max_seq_len)
        self.model = GPT(config, attn=setup.attn, attn_compile=False).to(self.device)
        decay = [p for p in self.model.parameters() if p.ndim >= 2]
        rest = [p for p in self.model.parameters() if p.ndim < 2]
        groups = [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": rest, "weight_decay": 0.0}]
        self.optimizer = torch.optim.AdamW(groups, lr=setup.lr, betas=BETAS)
        self.batches = self._endless()
        self.tokens = 0

    def _endless(self):
        while True:
            yield from self.sampler

    def autocast(self):
        import contextlib

        import torch

        if self.setup.bf16:
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def step(self, lr: float) -> dict:
        """One optimizer update at `lr`; its metrics."""
        import torch

        from pretrain.training.update import run_update

        batch = next(self.batches).to(self.device, non_blocking=True)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        started = time.perf_counter()
        with self.autocast():
            result = run_update(self.model, [batch])
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), GRAD_CLIP)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        self.tokens += result.real_tokens
        return {
            "train/loss": result.loss,
            "train/tokens": float(self.tokens),
            "train/tokens_per_sec": result.real_tokens / max(seconds, 1e-9),
            "train/padding_waste": 1.0 - result.real_tokens / result.computed_tokens,
            "train/pack_utilization": result.real_tokens / max(result.capacity_slots, 1),
            "train/num_targets": float(result.num_targets),
            "train/step_seconds": seconds,
            "train/data_seconds": 0.0,
            "lr": lr,
        }

    def validate(self) -> dict:
        """val/loss over the validation pairs and by position bucket (training's val/loss metrics)."""
        from pretrain.data.batching.evaluation import evaluation_batches, evaluation_positions
        from pretrain.training.scoring import score_batches

        batches = evaluation_batches(self.settings, self.validation, self.chunks, self.units)
        positions = evaluation_positions(self.settings, self.validation, self.chunks, self.units)
        with self.autocast():
            sums = score_batches(self.model, batches, self.device, positions=positions)
        metrics = {"val/loss": sums.loss}
        counts = sums.count_by_position()
        for bucket, loss in sums.loss_by_position().items():
            metrics[f"val/loss_by_position/{bucket}"] = loss
            metrics[f"val/targets_by_position/{bucket}"] = float(counts[bucket])
        return metrics


# --- calibration --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Calibration:
    tokens_per_second: float  # the slower arm's steady rate, real tokens
    by_arm: dict  # each arm's steady rate
    startup_seconds: dict  # each arm's: built, then its first STARTUP_UPDATES updates
    startup_per_run: float  # what the plan charges each run once: the later arm's start-up
    startup_updates: int
    validation_seconds: float
    audit_seconds: float  # both arms' composition audits (once per study)
    updates: int  # the steady updates measured
    seconds: float


def measure_arm(setup: Setup, cache, splits, mask: bool, until: float, clock: Callable[[], float]):
    """Seed 0's arm: its start-up (built, then its first STARTUP_UPDATES updates), then its steady
    rate until `until` (STEADY_UPDATES at least). (arm, start-up seconds, real tokens/s, steady updates)."""
    begun = clock()
    arm = Arm(setup, cache, splits, mask, seed=0)
    for _ in range(STARTUP_UPDATES):
        arm.step(setup.lr * 0.1)
    startup = clock() - begun
    tokens, updates, measured_from = arm.tokens, 0, clock()
    while True:
        arm.step(setup.lr * 0.1)
        updates += 1
        now = clock()
        if updates >= STEADY_UPDATES and now >= until:
            break
    rate = (arm.tokens - tokens) / max(clock() - measured_from, 1e-9)
    return arm, startup, rate, updates


def calibrate(setup: Setup, cache, splits, seconds: float, clock: Callable[[], float], audits: dict):
    """Each arm of seed 0 until its half of `seconds` has passed: its start-up timed apart, then its
    steady rate; one validation timed; each arm's composition audit put into `audits` (the seed does
    not change it). Each run is charged the later arm's start-up: the first arm's also holds what the
    process does once (CUDA context, kernels loaded on first use, the windows packed)."""
    from pretrain.data.measures.audit import composition_audit

    started = clock()
    rates, startups, updates, validation, audit = {}, {}, 0, 0.0, 0.0
    for index, mask in enumerate(ARMS):
        until = started + seconds * (index + 1) / len(ARMS)
        arm, startup, rate, measured = measure_arm(setup, cache, splits, mask, until, clock)
        key = f"document_mask={str(mask).lower()}"
        rates[key], startups[key], updates = rate, startup, updates + measured
        if index == 0:
            begun = clock()
            arm.validate()
            validation = clock() - begun
        begun = clock()
        audits[mask] = composition_audit(arm.settings, splits["train"], sampler=arm.sampler)
        audit += clock() - begun
        del arm
    return Calibration(
        tokens_per_second=min(rates.values()),
        by_arm=rates,
        startup_seconds=startups,
        startup_per_run=startups[f"document_mask={str(ARMS[-1]).lower()}"],
        startup_updates=STARTUP_UPDATES,
        validation_seconds=validation,
        audit_seconds=audit,
        updates=updates,
        seconds=clock() - started,
    )


# --- what the study writes ------------------------------------------------------------------------------


def write_run(directory: Path, rows: list[dict], config: dict, summary: dict) -> None:
    """metrics.csv, config.yaml (JSON is YAML) and run.json into a fresh `directory`, renamed into
    place whole: an interrupted run leaves no directory that compare would read."""
    from pretrain.fileio import write_text_atomic
    from pretrain.training.metrics_file import MetricsFile

    partial = directory.with_name(directory.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    metrics = MetricsFile(partial / "metrics.csv")
    metrics.start(0)
    metrics.append(rows)
    write_text_atomic(partial / "config.yaml", json.dumps(config, indent=2) + "\n")
    write_text_atomic(partial / "run.json", json.dumps(summary, indent=2) + "\n")
    if directory.exists():
        shutil.rmtree(directory)
    os.replace(partial, directory)


def pack_runs(runs_dir: Path, names: list[str], archive: Path) -> int:
    """The finished runs `names` (directories under `runs_dir`) into the gzipped tar `archive`,
    rewritten whole under a temporary name, then renamed: whenever the study is killed, the archive
    holds every run it had finished. Returns its size in bytes (a warning above what a box returns)."""
    from pretrain.fileio import atomic_write

    with atomic_write(archive) as handle, tarfile.open(fileobj=handle, mode="w:gz") as tar:
        for name in names:
            for file in RUN_FILES:
                tar.add(runs_dir / name / file, arcname=f"{name}/{file}")
    size = archive.stat().st_size
    if size > RETURNED_BYTES:
        print(
            f"warning: {archive} holds {size / 2**20:.1f} MiB, over the 16 MiB a GPU call returns", flush=True
        )
    return size


def write_study(output: Path, study: dict) -> None:
    from pretrain.fileio import write_text_atomic

    write_text_atomic(output / STUDY_JSON, json.dumps(study, indent=2) + "\n")


# --- the study ----------------------------------------------------------------------------------------


def train_run(
    setup: Setup,
    cache: CarriedCache,
    splits: dict,
    plan: Plan,
    document_mask: bool,
    seed: int,
    runs_dir: Path,
    deadline: float,
    clock: Callable[[], float],
    audits: dict,
) -> dict | None:
    """One run of the plan, written to runs_dir/mask<bool>-seed<n>/; None when the deadline came
    first. `audits`: the composition audit per document_mask (calibrate's)."""
    begun = clock()
    arm = Arm(setup, cache, splits, document_mask, seed)
    rows: list[dict] = []
    every = set(validation_steps(plan.updates, plan.val_every))
    for step in range(plan.updates):
        metrics = arm.step(setup.lr * lr_factor(step, plan.warmup, plan.updates))
        done = step + 1
        if done in every:
            metrics.update(arm.validate())
        rows.append({"step": done, **metrics})
        if clock() > deadline:
            return None
    name = run_name(document_mask, seed)
    last = {key: value for row in rows for key, value in row.items() if key != "step"}
    summary = {
        "status": "completed",
        "output_dir": name,  # in the study's runs.tar.gz, then wherever --unpack puts it
        "cache_dir": str(cache.directory),
        "cache_key": cache.manifest.get("key"),
        "policy": "prepacked",
        "attn": setup.attn,
        "model": setup.model_name,
        "parameters": arm.model.num_parameters(),
        "precision": precision(setup),
        "max_seq_len": setup.max_seq_len,
        "batch_size": setup.batch_size,
        "steps": plan.updates,
        "tokens": arm.tokens,
        "seconds": round(clock() - begun, 2),
        "metrics": last,
        "floors": cache.floors,
        "composition": audits[document_mask],
    }
    write_run(runs_dir / name, rows, run_config(setup, document_mask, seed, plan, cache), summary)
    return summary


def device_name(setup: Setup) -> str:
    import torch

    if setup.device == "cuda":
        return torch.cuda.get_device_name(0)
    return f"CPU ({os.cpu_count()} cores)"


def check_inputs(
    setup: Setup, cache_path: Path, output: Path, seconds: float, calibration_seconds: float
) -> CarriedCache:
    """Every check the study can make before it makes anything: the budgets, the output, the cache
    (its manifest, files and floors) and the device. Each failure is one StudyError line."""
    check_budget(seconds, calibration_seconds)
    check_output(output)
    check_apart(output, Path(cache_path))
    cache = open_carried(Path(cache_path))
    if setup.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise StudyError("no CUDA device: run it on the GPU box, or --dry-run on this machine")
    return cache


def study_record(setup: Setup, cache: CarriedCache, calibration: Calibration, plan: Plan, **more) -> dict:
    """study.json's content before the first run: the device, the cache, the calibration, the plan."""
    import torch

    identity = cache.manifest["identity"]
    return {
        "device": device_name(setup),
        "torch": torch.__version__,
        "setup": asdict(setup),
        "cache": {
            "directory": str(cache.directory),
            "key": cache.manifest.get("key"),
            "source": identity["source"].get("kind"),
            "train_tokens": cache.manifest["splits"]["train"]["tokens"],
            "validation_tokens": cache.manifest["splits"]["validation"]["tokens"],
        },
        "calibration": asdict(calibration),
        **more,
        "plan": asdict(plan),
        "archive": {"file": RUNS_TAR, "runs": [], "bytes": 0},
        "runs": [],
        "status": "running",
    }


def train_pairs(study: dict, setup: Setup, cache, splits, plan: Plan, work: Path, output: Path, **timing):
    """The pairs seed by seed (`timing`: deadline, clock, audits). Each finished run goes into
    output/runs.tar.gz and study.json at once. The deadline stops the study in the run it cuts; a pair
    left without its second run keeps its first in the archive (`--unpack` leaves it out)."""
    done: list[str] = []
    for seed in study["seeds"]:
        for mask in ARMS:
            summary = train_run(setup, cache, splits, plan, mask, seed, work, **timing)
            if summary is None:
                study["status"] = f"stopped at the deadline in seed {seed}: {len(done) // 2} pairs"
                return
            done.append(run_name(mask, seed))
            size = pack_runs(work, done, output / RUNS_TAR)
            study["archive"] = {"file": RUNS_TAR, "runs": list(done), "bytes": size}
            loss = summary["metrics"].get("val/loss")
            study["runs"].append(
                {"document_mask": mask, "seed": seed, "seconds": summary["seconds"], "val_loss": loss}
            )
            write_study(output, study)
            print(f"{done[-1]}: val/loss {loss:.4f}, {summary['seconds']:.0f} s", flush=True)
    study["status"] = "completed"


def run_study(
    setup: Setup,
    cache_path: Path,
    output: Path,
    *,
    seconds: float,
    calibration_seconds: float,
    seeds: tuple[int, ...] = SEEDS,
    clock: Callable[[], float] = time.monotonic,
    started: float | None = None,
    dry_run: bool = False,
) -> dict:
    """Check the inputs, calibrate, plan, then train the pairs seed by seed; returns study.json's
    content. `output` receives study.json and runs.tar.gz only; the windows and run directories are
    built in a temporary directory, removed at the end. A `dry_run` trains at least the minimal plan
    and is never cut: it checks the path, whatever the machine's speed."""
    started = clock() if started is None else started
    cache = check_inputs(setup, cache_path, output, seconds, calibration_seconds)
    with tempfile.TemporaryDirectory(prefix="masking-study-") as work:
        cache = replace(cache, packs=Path(work) / "packs")
        splits = {name: cache_split(cache, name) for name in ("train", "validation")}
        audits: dict = {}
        calibration = calibrate(setup, cache, splits, calibration_seconds, clock, audits)
        seconds_left = started + seconds - clock()
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
        budget = {"seconds": seconds, "calibration_seconds": calibration_seconds}
        study = study_record(setup, cache, calibration, plan, budget=budget, seconds_left=seconds_left)
        study["seeds"] = list(seeds)
        output.mkdir(parents=True, exist_ok=True)
        write_study(output, study)
        print(
            f"calibrated: {calibration.tokens_per_second:,.0f} real tokens/s (slower arm, steady), "
            f"start-up {calibration.startup_per_run:.1f} s per run, validation "
            f"{calibration.validation_seconds:.1f} s; plan: {plan.updates} updates x "
            f"{setup.tokens_per_update:,} tokens per run, validated every {plan.val_every}",
            flush=True,
        )
        deadline = math.inf if dry_run else started + seconds
        try:
            timing = {"deadline": deadline, "clock": clock, "audits": audits}
            train_pairs(study, setup, cache, splits, plan, Path(work) / "runs", output, **timing)
        except BaseException as error:  # a signal, an interrupt, a crash: study.json says so
            study["status"] = f"interrupted after {len(study['runs'])} runs ({type(error).__name__})"
            raise
        finally:
            study["seconds"] = round(clock() - started, 1)
            write_study(output, study)
    return study


# --- here, after the call -------------------------------------------------------------------------------


def archive_runs(members: list[tarfile.TarInfo], archive: Path) -> dict[str, set[str]]:
    """The files of each run in the archive; a member that is not a run directory or one of a run's
    plain files (a link, `..`, another name) is refused before anything is extracted."""
    runs: dict[str, set[str]] = {}
    for member in members:
        parts = member.name.split("/")
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
    """The complete pairs of fetched/runs.tar.gz into `destination` (new or empty), with the study's
    study.json: what `pretrain compare` reads. Extracted beside it, then renamed into place. Returns
    (the runs extracted, the runs left in the archive: unpaired, compare would not test them paired)."""
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
            for name in kept:
                (partial / name).mkdir(parents=True)
                for file in RUN_FILES:
                    (partial / name / file).write_bytes(tar.extractfile(f"{name}/{file}").read())  # type: ignore[union-attr]
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
    cache = open_carried(path)
    if cache.floors is None:
        raise StudyError(f"{cache.directory} has no floors.json for its files: build it with make gpu-cache")
    size = sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())
    if size > CARRY_LIMIT:
        raise StudyError(
            f"{path} holds {size / 1e6:.1f} MB, over the {CARRY_LIMIT / 1e6:.0f} MB a GPU call carries: "
            "set budget.train_tokens to cap it"
        )
    splits = cache.manifest["splits"]
    tokens = sum(int(s["tokens"]) for s in splits.values())
    return (
        f"carried cache {cache.directory}: {tokens:,} tokens "
        f"({splits['validation']['tokens']:,} validation), "
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
    parser.add_argument(
        "--calibration-seconds",
        type=float,
        help=f"of --seconds (default {CALIBRATION_SECONDS:g}; 4 in a dry run)",
    )
    parser.add_argument("--dry-run", action="store_true", help="a tiny model on the CPU, a short budget")
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
        print(f"next: pretrain compare {args.output} --reference 'prepacked document_mask=false' --no-timing")
        return 0
    check_seconds("--seconds", args.seconds)
    if args.calibration_seconds is not None:  # as given, before a dry run caps it
        check_budget(args.seconds, args.calibration_seconds)
    calibration = CALIBRATION_SECONDS if args.calibration_seconds is None else args.calibration_seconds
    setup, seconds = DRY if args.dry_run else GPU, args.seconds
    if args.dry_run:  # a dry run takes two minutes at most, not seven
        seconds, calibration = min(seconds, 120.0), min(calibration, 4.0)
    check_budget(seconds, calibration)
    study = run_study(
        setup,
        args.cache,
        args.output,
        seconds=seconds,
        calibration_seconds=calibration,
        started=STARTED,
        dry_run=args.dry_run,
    )
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
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    signal.signal(signal.SIGTERM, terminated)
    sys.exit(main())
