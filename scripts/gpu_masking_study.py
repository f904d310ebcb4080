"""The paired masking study on one GPU, sized to fit one call of a bare GPU box (issue 29).

Prepacked `strategy=concat` windows of 1,024 tokens with the document mask against the same windows
without it; for a given seed both arms start from the same weights and see the same windows in the same
order. A ~50M-parameter GPT, bf16 autocast, `attn=varlen`, 4 paired seeds, AdamW with warmup then cosine
decay to 0.1x, the whole validation split at every validation (compare reads the mean of the last two).

It runs with torch, numpy and this repository's src/ alone: no network, no Hydra, no omegaconf, no
`tokenizers` (tests/test_gpu_masking_study.py runs it with those imports blocked). The cache it reads
is carried to the box (`make gpu-cache` builds it here, at most 45 MB, floors included).

    PYTHONPATH=src python3 scripts/gpu_masking_study.py --cache gpu-cache --output $OUT/masking-gpu
    PYTHONPATH=src python3 scripts/gpu_masking_study.py --cache gpu-cache --output /tmp/dry --dry-run  # CPU

The first `--calibration-seconds` (60) train both arms to measure real tokens/s and time one validation;
the study is then sized to end within `--seconds` (540) of the start: the same number of updates for
every run, as many as the slower arm's measured rate allows. Each run directory (`mask<bool>-seed<n>/`:
metrics.csv, config.yaml, run.json) is written whole when the run ends, in the format `python train.py`
writes, so `pretrain compare OUTPUT --reference 'prepacked document_mask=false'` reads it as it reads
`make study-masking`'s sweep; `study.json` beside them records the calibration, the plan and the times.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
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
CARRY_LIMIT = 45_000_000  # bytes of the carried cache


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
    """The study cannot run as asked (a bad cache, a budget too small): one line, exit 2."""


# --- sizing -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    updates: int
    warmup: int
    val_every: int
    validations: int
    tokens_per_run: int
    seconds_per_run: float  # predicted: training, validations and the run's setup


def validation_steps(updates: int, every: int) -> list[int]:
    """The steps a run validates at: every `every` updates and at its last (as `python train.py`)."""
    return sorted({*range(every, updates + 1, every), updates})


def plan_study(
    *,
    tokens_per_second: float,
    validation_seconds: float,
    setup_seconds: float,
    seconds_left: float,
    tokens_per_update: int,
    runs: int,
    validations: int = VALIDATIONS,
    safety: float = SAFETY,
    at_least_minimum: bool = False,
) -> Plan:
    """The most updates per run that let `runs` runs (each its setup, its training at the measured
    rate and `validations` validations) end within `safety` x `seconds_left`. Fewer than
    2 x `validations` is an error, or with `at_least_minimum` (a dry run: the path, not the budget)
    that many."""
    per_run = safety * seconds_left / runs - setup_seconds - validations * validation_seconds
    updates = int(per_run * tokens_per_second // tokens_per_update)
    needed = 2 * validations
    if updates < needed and at_least_minimum:
        updates = needed
    if updates < needed:
        raise StudyError(
            f"{seconds_left:.0f} s left fit {max(updates, 0)} updates per run at {tokens_per_second:,.0f} "
            f"real tokens/s (validation {validation_seconds:.1f} s), fewer than {needed}: give more "
            "--seconds"
        )
    every = max(1, updates // validations)
    steps = validation_steps(updates, every)
    seconds = setup_seconds + updates * tokens_per_update / tokens_per_second
    return Plan(
        updates=updates,
        warmup=max(1, round(WARMUP_SHARE * updates)),
        val_every=every,
        validations=len(steps),
        tokens_per_run=updates * tokens_per_update,
        seconds_per_run=seconds + len(steps) * validation_seconds,
    )


def lr_factor(step: int, warmup: int, max_steps: int, min_ratio: float = MIN_LR_RATIO) -> float:
    """Linear warmup to 1, then cosine down to `min_ratio` at `max_steps` (training/module.py's)."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, max_steps - warmup))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


# --- the carried cache, read without pretrain.data.ingest.cache (which needs `tokenizers`) ---------------


@dataclass(frozen=True)
class CarriedCache:
    directory: Path
    manifest: dict
    floors: dict | None
    packs: Path | None = None  # where the concat windows are built once for every run (not in the cache)


def find_cache(path: Path) -> Path:
    """`path` itself when it holds a manifest, else its one cache directory."""
    if (path / "manifest.json").is_file():
        return path
    found = sorted(p.parent for p in path.glob("*/manifest.json"))
    if len(found) != 1:
        what = "no cache" if not found else f"{len(found)} caches"
        raise StudyError(f"--cache {path}: {what} (give a cache directory, or a folder holding exactly one)")
    return found[0]


def open_carried(path: Path) -> CarriedCache:
    """The cache's manifest after checking every file's size and sha256, and its floors.json when it
    was computed from these very files (what `make gpu-cache` stores)."""
    from pretrain.data.files import sha256_file

    directory = find_cache(Path(path))
    manifest = json.loads((directory / "manifest.json").read_text())
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
    if record_path.is_file():
        record = json.loads(record_path.read_text())
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
    from pretrain.data.policies import PolicySettings, Strategy
    from pretrain.data.policies.prepacked import PrepackedConfig

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

        from pretrain.data.evaluation import evaluation_chunks, evaluation_units
        from pretrain.data.files import writable_dir
        from pretrain.data.samplers import build_sampler
        from pretrain.model import GPT, GPTConfig

        self.setup, self.document_mask, self.seed = setup, document_mask, seed
        self.device = torch.device(setup.device)
        self.settings = policy_settings(setup, document_mask, seed)
        # The carried cache stays as carried (its size is the budget); the windows go beside the output.
        packs_dir = cache.packs if cache.packs is not None and writable_dir(cache.packs.parent) else None
        self.sampler = build_sampler(self.settings, splits["train"], packs_dir=packs_dir)
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
        from pretrain.data.evaluation import evaluation_batches, evaluation_positions
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


# --- the study ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Calibration:
    tokens_per_second: float  # the slower arm's, real tokens
    by_arm: dict
    validation_seconds: float
    setup_seconds: float
    updates: int
    seconds: float


def calibrate(setup: Setup, cache, splits, seconds: float, clock: Callable[[], float]) -> Calibration:
    """Train each arm for half of `seconds` (seed 0, its first updates after one warm-up update) and
    time one validation: the rates the plan is sized by."""
    started = clock()
    rates, setups, updates = {}, [], 0
    validation_seconds = 0.0
    for index, mask in enumerate((True, False)):
        begun = clock()
        arm = Arm(setup, cache, splits, mask, seed=0)
        arm.step(setup.lr * 0.1)  # kernels chosen and memory allocated: not measured
        setups.append(clock() - begun)
        until = started + seconds * (index + 1) / 2
        measured_tokens, measured_from = 0, clock()
        while True:
            before = arm.tokens
            arm.step(setup.lr * 0.1)
            updates += 1
            measured_tokens += arm.tokens - before
            if clock() >= until:
                break
        rates[f"document_mask={str(mask).lower()}"] = measured_tokens / max(clock() - measured_from, 1e-9)
        if mask:
            begun = clock()
            arm.validate()
            validation_seconds = clock() - begun
        del arm
    return Calibration(
        tokens_per_second=min(rates.values()),
        by_arm=rates,
        validation_seconds=validation_seconds,
        setup_seconds=max(setups),
        updates=updates,
        seconds=clock() - started,
    )


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


def train_run(
    setup: Setup,
    cache: CarriedCache,
    splits: dict,
    plan: Plan,
    document_mask: bool,
    seed: int,
    output: Path,
    deadline: float,
    clock: Callable[[], float],
    audits: dict,
) -> dict | None:
    """One run of the plan, written to output/mask<bool>-seed<n>/; None when the deadline came first.
    `audits`: the composition audit per document_mask (the seed does not change it), filled here."""
    from pretrain.data.audit import composition_audit

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
    name = f"mask{str(document_mask).lower()}-seed{seed}"
    last = {key: value for row in rows for key, value in row.items() if key != "step"}
    summary = {
        "status": "completed",
        "output_dir": str(output / name),
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
    }
    if document_mask not in audits:
        audits[document_mask] = composition_audit(arm.settings, splits["train"], sampler=arm.sampler)
    summary["composition"] = audits[document_mask]
    write_run(output / name, rows, run_config(setup, document_mask, seed, plan, cache), summary)
    return summary


def device_name(setup: Setup) -> str:
    import torch

    if setup.device == "cuda":
        return torch.cuda.get_device_name(0)
    return f"CPU ({os.cpu_count()} cores)"


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
    """Calibrate, plan, then train the pairs seed by seed (a cut at the deadline keeps whole pairs);
    returns study.json's content (also written under `output`). A `dry_run` trains at least the
    minimal plan and is never cut: it checks the path, whatever the machine's speed."""
    import torch

    started = clock() if started is None else started
    deadline = started + seconds
    cut_at = math.inf if dry_run else deadline
    if setup.device == "cuda" and not torch.cuda.is_available():
        raise StudyError("no CUDA device: run it on the GPU box, or --dry-run on this machine")
    output.mkdir(parents=True, exist_ok=True)
    cache = replace(open_carried(cache_path), packs=output / ".packs")
    splits = {name: cache_split(cache, name) for name in ("train", "validation")}
    calibration = calibrate(setup, cache, splits, calibration_seconds, clock)
    seconds_left = deadline - clock()
    plan = plan_study(
        tokens_per_second=calibration.tokens_per_second,
        validation_seconds=calibration.validation_seconds,
        setup_seconds=calibration.setup_seconds,
        seconds_left=seconds_left,
        tokens_per_update=setup.tokens_per_update,
        runs=2 * len(seeds),
        validations=setup.validations,
        at_least_minimum=dry_run,
    )
    identity = cache.manifest["identity"]
    study: dict = {
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
        "seconds_left": seconds_left,
        "plan": asdict(plan),
        "seeds": list(seeds),
        "runs": [],
        "status": "running",
    }
    print(
        f"calibrated: {calibration.tokens_per_second:,.0f} real tokens/s (slower arm), validation "
        f"{calibration.validation_seconds:.1f} s; plan: {plan.updates} updates x "
        f"{setup.tokens_per_update:,} tokens per run, validated every {plan.val_every}",
        flush=True,
    )
    audits: dict = {}
    for seed in seeds:
        pair = []
        for mask in (True, False):
            summary = train_run(setup, cache, splits, plan, mask, seed, output, cut_at, clock, audits)
            if summary is None:
                break
            pair.append(
                {
                    "document_mask": mask,
                    "seed": seed,
                    "seconds": summary["seconds"],
                    "val_loss": summary["metrics"].get("val/loss"),
                }
            )
            print(
                f"mask={str(mask).lower()} seed={seed}: val/loss {summary['metrics'].get('val/loss'):.4f}, "
                f"{summary['seconds']:.0f} s",
                flush=True,
            )
        if len(pair) < 2:  # the deadline came first: whole pairs only, so compare pairs every seed
            for run in pair:
                shutil.rmtree(output / f"mask{str(run['document_mask']).lower()}-seed{seed}")
            study["status"] = f"stopped at the deadline in seed {seed}: {len(study['runs']) // 2} pairs"
            break
        study["runs"] += pair
    else:
        study["status"] = "completed"
    study["seconds"] = round(clock() - started, 1)
    from pretrain.fileio import write_text_atomic

    write_text_atomic(output / "study.json", json.dumps(study, indent=2) + "\n")
    return study


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


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--cache", type=Path, help="the carried cache (make gpu-cache)")
    parser.add_argument("--output", type=Path, help="where the run directories go")
    parser.add_argument("--seconds", type=float, default=540.0, help="the whole study's wall-clock budget")
    parser.add_argument("--calibration-seconds", type=float, default=60.0)
    parser.add_argument("--dry-run", action="store_true", help="a tiny model on the CPU, a short budget")
    parser.add_argument("--check-cache", type=Path, metavar="DIR", help="check a carried cache, then stop")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = arguments()
    args = parser.parse_args(argv)
    try:
        if args.check_cache is not None:
            print(check_carry(args.check_cache))
            return 0
        if args.cache is None or args.output is None:
            parser.error("--cache and --output are required")
        setup = DRY if args.dry_run else GPU
        seconds, calibration = args.seconds, args.calibration_seconds
        if args.dry_run:  # a dry run takes a minute or two, not ten
            seconds, calibration = min(seconds, 120.0), min(calibration, 4.0)
        study = run_study(
            setup,
            args.cache,
            args.output,
            seconds=seconds,
            calibration_seconds=calibration,
            started=STARTED,
            dry_run=args.dry_run,
        )
    except StudyError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(
        f"{study['status']}: {len(study['runs'])} runs in {study['seconds']:.0f} s; "
        f"{args.output / 'study.json'}"
    )
    print(f"next: pretrain compare {args.output} --reference 'prepacked document_mask=false' --no-timing")
    return 0 if study["status"] == "completed" else 1


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    sys.exit(main())
