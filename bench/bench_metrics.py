"""metrics.csv written at every log step: what one row costs as the file grows, against rewriting the
file at every step (the O(n^2) way) and Lightning's CSVLogger (flushing every step, and its default of
every 100 steps, which a kill can cost up to 99 rows); and what a resume's one-time take-over costs.

Rows have the 10 columns a CPU run logs without validation (step, lr and eight train/ metrics).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from lightning.pytorch.loggers import CSVLogger

from pretrain.training.metrics_file import MetricsFile, _csv_text

NAME = "metrics"
SIZES = (0, 10_000, 100_000)  # rows already in the file
ROWS = 500  # rows timed at each size
KEYS = [
    "lr",
    "train/data_seconds",
    "train/loss",
    "train/num_targets",
    "train/pack_utilization",
    "train/padding_waste",
    "train/step_seconds",
    "train/tokens",
    "train/tokens_per_sec",
]


def row(step: int) -> dict:
    return {"step": step, **{key: 1.0 / (step + i + 1) for i, key in enumerate(KEYS)}}


def prefill(path: Path, rows: int) -> None:
    columns = sorted(["step", *KEYS])
    path.write_text(_csv_text(columns, (row(s) for s in range(1, rows + 1)), header=True))


def time_ours(directory: Path, size: int) -> float:
    path = directory / "metrics.csv"
    prefill(path, size)
    metrics = MetricsFile(path)
    metrics.start(size)  # a resume at step `size`: its one-time take-over is timed separately
    started = time.perf_counter()
    for step in range(size + 1, size + ROWS + 1):
        metrics.append([row(step)])
    return (time.perf_counter() - started) / ROWS


def time_rewrite(directory: Path, size: int, rows: int) -> float:
    """Rewriting the whole file at every step (timed on fewer rows: it is the slow way)."""
    path = directory / "rewrite.csv"
    columns = sorted(["step", *KEYS])
    kept = [row(s) for s in range(1, size + 1)]
    started = time.perf_counter()
    for step in range(size + 1, size + rows + 1):
        kept.append(row(step))
        path.write_text(_csv_text(columns, kept, header=True))
    return (time.perf_counter() - started) / rows


def time_lightning(directory: Path, size: int, flush_every: int) -> float:
    logger = CSVLogger(
        save_dir=str(directory / f"lightning{flush_every}"),
        name="",
        version="",
        flush_logs_every_n_steps=flush_every,
    )
    logger.experiment.metrics_keys = sorted(["step", *KEYS])
    prefill(Path(logger.experiment.metrics_file_path), size)
    started = time.perf_counter()
    for step in range(size + 1, size + ROWS + 1):
        values = row(step)
        values.pop("step")
        logger.log_metrics(values, step=step)
    logger.save()
    return (time.perf_counter() - started) / ROWS


def time_take_over(directory: Path, size: int) -> float:
    path = directory / "resume.csv"
    prefill(path, size)
    started = time.perf_counter()
    MetricsFile(path).start(max(0, size - 50))  # keeps all but the last 50 rows
    return time.perf_counter() - started


def run() -> dict:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in SIZES:
            directory = Path(tmp) / str(size)
            directory.mkdir()
            rewrite_rows = {0: 100, 10_000: 10}.get(size, 3)
            rows.append(
                {
                    "rows in file": size,
                    "ours: µs/row (on disk at once)": round(time_ours(directory, size) * 1e6, 1),
                    "rewrite every step: µs/row": round(time_rewrite(directory, size, rewrite_rows) * 1e6, 1),
                    "Lightning flush every step: µs/row": round(time_lightning(directory, size, 1) * 1e6, 1),
                    "Lightning default (every 100): µs/row": round(
                        time_lightning(directory, size, 100) * 1e6, 1
                    ),
                    "resume take-over: ms": round(time_take_over(directory, size) * 1e3, 1),
                }
            )
    return {
        "rows": rows,
        "settings": {"columns": len(KEYS) + 1, "timed_rows": ROWS},
        "note": "a training step of the tiny model on CPU takes ~0.3-1 s; one row costs microseconds",
    }
