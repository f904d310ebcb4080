"""`pretrain lm-eval CKPT --tasks NAMES`: lm-evaluation-harness on a checkpoint, offline.

The checkpoint is exported to a temporary Hugging Face directory (hf.export: the same weights, to
1e-10 in logits), the project's tasks are written from its cache's validation split (task_files.py)
and the harness runs them, and any of its own tasks, on the export. The result names the
checkpoint (path, step, sha256, model, policy), and goes into its run's run.json as
`downstream.<task>.<metric>` (with `downstream_source`), where `pretrain compare` reads it.

An exported directory (a folder with config.json) is run as it is: on the harness's own tasks, or on
the project's from a folder an earlier `pretrain lm-eval CKPT --tasks-dir DIR` wrote (any model,
a public GPT-2 among them, then scores the same examples as that run).
"""

from __future__ import annotations

import json
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import ConfigError
from .harness import downstream_metrics, lm_eval_version, own_tasks, run_harness, task_manager
from .task_files import BPB, TASKS, TaskFiles, TaskSource, write_task_files


@dataclass(frozen=True)
class LmEvalRequest:
    checkpoint: str
    tasks: tuple[str, ...]
    limit: int | None = None
    seed: int = 0
    batch_size: int = 16
    tasks_dir: Path | None = None  # keep the generated task files here (default: a temporary folder)
    examples: int = 1000  # examples written per project task (bpb: whole documents to this many chunks)


def parse_tasks(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
    if not names:
        raise ConfigError(f"--tasks {text!r} names no task; e.g. --tasks {','.join(TASKS)}")
    return names


def _check_counts(request: LmEvalRequest) -> None:
    counts = {"--limit": request.limit, "--batch-size": request.batch_size, "--examples": request.examples}
    for option, value in counts.items():
        if value is not None and value < 1:
            raise ConfigError(f"{option} {value}: give a positive number, e.g. {option} 200")
    if request.seed < 0:
        raise ConfigError(f"--seed {request.seed}: give a seed of 0 or more")


def _is_export(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file()


def run_lm_eval(request: LmEvalRequest) -> dict:
    """The harness's metrics on the checkpoint, with its identity; written to its run.json too."""
    version = lm_eval_version()  # before minutes of work: is it installed at all
    _check_counts(request)
    path = Path(request.checkpoint)
    exported = _is_export(path)
    files: TaskFiles | None = None
    with tempfile.TemporaryDirectory(prefix="pretrain-lm-eval-") as scratch:
        if exported:
            model_dir, identity, max_length = path, {"export": str(path.resolve())}, None
            include = _written_tasks(request, path)
        else:
            from ..hf.roundtrip import export

            checkpoint, config = _load(path)
            identity = _identity(path, checkpoint, config)
            max_length = int(config.data.max_seq_len)
            if own_tasks(request.tasks):
                source = _task_source(checkpoint, config, request.seed)
                files = write_task_files(
                    request.tasks_dir or Path(scratch) / "tasks", source, request.examples
                )
            include = files.directory if files else None
        manager = task_manager(include, request.tasks)  # unknown names: one line before the export
        if not exported:
            model_dir = export(path, Path(scratch) / "export")
        device = "cuda" if torch.cuda.is_available() else "cpu"
        output = run_harness(
            model_dir, request.tasks, manager, max_length, request.limit, request.batch_size, device
        )
        metrics = downstream_metrics(output)
        if files is not None and BPB in metrics:
            metrics[BPB].update(
                _bpb_reference(checkpoint, config, source, files, request.limit, metrics[BPB])
            )
    result = {
        "checkpoint": identity,
        "tasks": list(request.tasks),
        "limit": request.limit,
        "seed": request.seed,
        "lm_eval_version": version,
        "examples": dict(files.examples) if files else {},
        "downstream": metrics,
        "harness_results": output.get("results", {}),
    }
    if not exported:
        result["run_json"] = record_in_run(path, result)
    if result.get("run_json"):
        from .wandb_record import log_downstream

        result["wandb"] = log_downstream(Path(result["run_json"]).parent, metrics)
    return result


def _written_tasks(request: LmEvalRequest, export_dir: Path) -> Path | None:
    """For an export: the folder of project tasks written earlier (`--tasks-dir` of a checkpoint's
    run), which scores any model on the same examples; None when only the harness's tasks are asked."""
    ours = own_tasks(request.tasks)
    if not ours:
        return request.tasks_dir
    folder = request.tasks_dir
    missing = [task for task in ours if folder is None or not (folder / f"{task}.yaml").is_file()]
    if missing:
        where = f"--tasks-dir {folder} has no {', '.join(missing)}" if folder else "no --tasks-dir given"
        raise ConfigError(
            f"{', '.join(ours)} are written from a checkpoint's validation split ({where}): give the "
            f".ckpt the export {export_dir} was made from, or the --tasks-dir a checkpoint's "
            "`pretrain lm-eval --tasks-dir DIR` wrote, or only the harness's own tasks"
        )
    return folder


def _load(path: Path):
    """The checkpoint (its record verified) and its resolved config."""
    from ..checkpoints.files import load_trainer_checkpoint
    from ..training.evaluate import saved_config

    checkpoint = load_trainer_checkpoint(path)
    return checkpoint, saved_config(checkpoint)


def _identity(path: Path, checkpoint: dict, config) -> dict:
    """What names the scored weights: path, step, the checkpoint record's sha256, model, policy."""
    from ..checkpoints.files import recorded_sha256

    return {
        "path": str(path.resolve()),
        "step": int(checkpoint.get("global_step", 0)),
        "sha256": recorded_sha256(path),
        "model": str(config.model.name),
        "policy": str(config.data.policy),
        "max_seq_len": int(config.data.max_seq_len),
        "seed": int(config.seed),
    }


def _task_source(checkpoint: dict, config, seed: int) -> TaskSource:
    """The validation split of the checkpoint's cache and the tokenizer its export ships."""
    from ..data.batching.mixture import MixtureSpec
    from ..data.ingest.cache import CacheSpec
    from ..data.ingest.prepare import prepare_cache
    from ..data.ingest.tokenizer import EOS_TEXT, build_tokenizer, token_byte_lengths
    from ..data.ingest.tokenizer_json import TokenizerJson
    from ..model import config_from_dict

    if MixtureSpec.from_config(config) is not None:
        raise ConfigError(
            "the project's tasks read one cache's validation split, and this checkpoint trained on a "
            "mixture: score it with the harness's own tasks, or export it and evaluate each source"
        )
    spec = CacheSpec.from_config(config)
    files = spec.tokenizer_files
    if isinstance(files, TokenizerJson):
        tokenizer, eos_text = files.build(), files.eos_text
    else:
        tokenizer, eos_text = build_tokenizer(files), EOS_TEXT
    vocab_size = config_from_dict(checkpoint["hyper_parameters"]["model"]).vocab_size
    return TaskSource(
        split=prepare_cache(spec).split("validation"),
        tokenizer=tokenizer,
        eos_text=eos_text,
        token_bytes=token_byte_lengths(files, vocab_size),
        max_seq_len=int(config.data.max_seq_len),
        seed=seed,
    )


def _bpb_reference(
    checkpoint: dict, config, source: TaskSource, files: TaskFiles, limit: int | None, harness: dict
) -> dict:
    """The project's own scoring (training's and `pretrain eval`'s loop) of the chunks the harness
    scored: its bits per byte, their difference, and the documents and pairs behind them."""
    from ..data.batching.chunking import ChunkTable
    from ..data.batching.evaluation import block_batches
    from ..training.evaluate import load_decoder
    from ..training.scoring import score_batches

    chunks = files.bpb_chunks[:limit] if limit is not None else files.bpb_chunks
    if not chunks:
        return {"documents": 0, "targets": 0}
    doc, start, length, sizes = (np.array(column, dtype=np.int64) for column in zip(*chunks, strict=True))
    split = source.split  # the split the tasks were written from (verified once)
    table = ChunkTable(doc=doc, start=start, length=length, max_seq_len=int(config.data.max_seq_len))
    model = load_decoder(checkpoint, config, str(files.directory))
    sums = score_batches(model, block_batches(split, table, 8 * table.max_seq_len), torch.device("cpu"))
    size = int(sizes.sum())
    reference = float(sums.nats) / math.log(2) / size if size else math.nan
    return {
        "reference_bits_per_byte": reference,
        "difference": harness["bits_per_byte"] - reference,
        "documents": len(set(doc.tolist())),
        "documents_left_out": files.bpb_left_out,
        "targets": int(sums.targets),
        "bytes": size,
    }


def record_in_run(path: Path, result: dict) -> str | None:
    """Merge the metrics into the run.json of the run the checkpoint belongs to (<run>/checkpoints/),
    atomically; None when the checkpoint is not inside a run directory that has one."""
    from ..fileio import write_text_atomic
    from ..training.summary import RUN_JSON, read_summary

    run_dir = path.resolve().parent.parent
    run_json = run_dir / RUN_JSON
    if path.resolve().parent.name != "checkpoints" or not run_json.is_file():
        return None
    summary = read_summary(run_dir)
    summary["downstream"] = {**summary.get("downstream", {}), **result["downstream"]}
    summary["downstream_source"] = {
        "checkpoint": result["checkpoint"],
        "limit": result["limit"],
        "seed": result["seed"],
        "lm_eval_version": result["lm_eval_version"],
    }
    write_text_atomic(run_json, json.dumps(summary, indent=2) + "\n")
    return str(run_json)


def summary_rows(result: dict) -> list[tuple[str, str]]:
    """(task.metric, value) rows for the printed table."""
    rows = []
    for task, metrics in result["downstream"].items():
        for metric, value in metrics.items():
            rows.append((f"{task}.{metric}", f"{value:.4f}" if isinstance(value, float) else str(value)))
    return rows
