"""Loggers: CSV always (what `pretrain compare` reads), W&B with logger=wandb.

A W&B run is set up so that its default workspace is the dashboard:

* its name says what it trains, `<policy>-L<max_seq_len>-bs<batch_size>` (`mtok<N>` for
  `train.microbatch_tokens=N`, `-acc<k>` for `train.accumulation=k` > 1), and runs of one multirun
  share a group (`run_group`), so grouping by `data.policy` compares the policies directly;
* every metric is plotted against `train/tokens`, the real tokens seen (`define_metric`; W&B's own
  time axis gives wall clock); `trainer/global_step` stays Lightning's step counter;
* at the start of training `DataStatistics` puts the run's `pretrain inspect-data` statistics (its
  policy and split, without the costly audits) in the run's config as flat keys: `data/<statistic>`
  and, for the nested parts, `data/<part>/<statistic>` (`data/cross_document_visible_fraction`,
  `data/chunk_lengths/median`, `data/validation/documents`);
* at the end `finish_loggers` writes a summary row (`summary/...`) and the comparison plot
  (`compare/plot`, a `wandb.Image`).

Offline without an API key (`wandb sync <run dir>/wandb/offline-run-*` uploads it later).

`metrics.csv` is written row by row as it is logged (`RunCSVLogger`, metrics_file.py): a killed run
keeps every logged step, and a resumed run appends to its run directory's file (`MetricsStart` tells
the logger the step the run starts from).
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import CSVLogger, Logger, WandbLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from ..config import Config, LoggerConfig
from .checks import attention_backend
from .metrics_file import FILE_NAME, STEP, MetricsFile
from .run_record import load_run, run_numbers

log = logging.getLogger(__name__)

TOKEN_AXIS = "train/tokens"
"""The x axis of every W&B chart: real tokens seen (cumulative, all ranks)."""
TOKEN_AXIS_METRICS = ("train/*", "val/*", "lr")
"""Defined against TOKEN_AXIS by name (globs for the train/ and val/ families; `*` catches the rest)."""
PLOT_KEY = "compare/plot"
SUMMARY_PREFIX = "summary/"


def wandb_mode(requested: str | None) -> str:
    """online with a key, otherwise offline (never a failure for a missing key)."""
    if requested:
        return requested
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    has_key = (
        bool(os.environ.get("WANDB_API_KEY"))
        or (Path.home() / ".netrc").is_file()
        and "api.wandb.ai" in (Path.home() / ".netrc").read_text(errors="ignore")
    )
    return "online" if has_key else "offline"


def run_group(logger: LoggerConfig, experiment_name: str) -> str:
    """W&B group: the explicit one, else the multirun's sweep directory, else the experiment name."""
    if logger.group:
        return logger.group
    try:
        from hydra.core.hydra_config import HydraConfig

        hydra_cfg = HydraConfig.get()
        if hydra_cfg.mode is not None and hydra_cfg.mode.name == "MULTIRUN":
            return "/".join(Path(hydra_cfg.sweep.dir).parts[-3:])
    except ValueError:  # not under Hydra
        pass
    return experiment_name


def run_name(config: Config) -> str:
    """`bestfit-L512-bs4`, `padded-L1024-mtok8192-acc4`: what a run trains, readable in a sweep."""
    train = config.train
    size = f"mtok{train.microbatch_tokens}" if train.microbatch_tokens else f"bs{train.batch_size}"
    accumulation = f"-acc{train.accumulation}" if train.accumulation > 1 else ""
    return f"{config.data.policy}-L{config.data.max_seq_len}-{size}{accumulation}"


def define_token_axis(experiment: Any) -> None:
    """Plot every metric against `train/tokens`.

    W&B resolves a logged key by its exact definition first, else by *any* matching glob (it does not
    prefer the longest), so Lightning's `*` -> `trainer/global_step` is overwritten rather than left
    beside `train/*`: every glob here names the same axis. `train/tokens` and `trainer/global_step`
    are defined by name, so no glob applies to them."""
    define = getattr(experiment, "define_metric", None)
    if define is None:
        return
    define(TOKEN_AXIS)
    define("trainer/global_step")
    for name in TOKEN_AXIS_METRICS:
        define(name, step_metric=TOKEN_AXIS, step_sync=True)
    define("*", step_metric=TOKEN_AXIS, step_sync=True, overwrite=True)


class TokenAxisWandbLogger(WandbLogger):
    """Lightning's WandbLogger with the token axis defined right after the run starts (before any
    metric is logged): Lightning's own defaults (`*` against `trainer/global_step`) come first."""

    _token_axis_defined = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # Lightning always passes `anonymous` to wandb.init (None unless asked for), and W&B warns that
        # the setting "has no effect" whenever the key is there: leave it out.
        self._wandb_init.pop("anonymous", None)

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        experiment = super().experiment
        if not self._token_axis_defined:
            define_token_axis(experiment)
            self._token_axis_defined = True
        return experiment


class MetricsWriter(ExperimentWriter):
    """Lightning's CSV experiment writer with metrics.csv written by `MetricsFile`: each logged row at
    once, appended; an existing file is taken over by `start` instead of deleted."""

    def __init__(self, log_dir: str) -> None:
        super().__init__(log_dir)
        self.file = MetricsFile(Path(log_dir) / FILE_NAME)

    def _check_log_dir_exists(self) -> None:
        """Lightning deletes an existing metrics.csv here; `start` keeps what a resume continues."""

    def start(self, start_step: int) -> None:
        notice = self.file.start(start_step)
        if notice:  # a warning when rows were dropped, else news
            log.log(logging.WARNING if self.file.dropped else logging.INFO, notice)

    def log_metrics(self, metrics_dict: dict[str, float], step: int | None = None) -> None:
        super().log_metrics(metrics_dict, step)
        self.save()

    def save(self) -> None:
        if not self.metrics:
            return
        if not self.file.started:
            # No MetricsStart callback: the first logged step is the first one this run trained.
            self.start(max(0, int(self.metrics[0][STEP]) - 1))
        rows, self.metrics = self.metrics, []
        self.file.append(rows)


class RunCSVLogger(CSVLogger):
    """metrics.csv in the run directory itself, on disk at every log step (see MetricsWriter)."""

    def __init__(self, save_dir: str | Path):
        super().__init__(save_dir=str(save_dir), name="", version="")

    @property
    @rank_zero_experiment
    def experiment(self) -> MetricsWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = MetricsWriter(log_dir=self.log_dir)
        assert isinstance(self._experiment, MetricsWriter)
        return self._experiment

    @rank_zero_only
    def start(self, start_step: int) -> None:
        """The run trains from `start_step` on (0, or the step of the checkpoint it resumed from)."""
        self.experiment.start(start_step)


class MetricsStart(Callback):
    """Tells the CSV logger the step training starts from (after a checkpoint is restored, before the
    first update): a resume keeps the rows up to its checkpoint's step and appends after them."""

    def on_train_start(self, trainer, pl_module) -> None:
        for logger in trainer.loggers:
            if isinstance(logger, RunCSVLogger):
                logger.start(int(trainer.global_step))


def build_loggers(config: Config, output_dir: Path) -> list[Logger]:
    loggers: list[Logger] = [RunCSVLogger(output_dir)]
    logger = config.logger
    if logger.kind == "wandb":
        tags = [
            *logger.tags,
            f"policy:{config.data.policy}",
            f"attn:{attention_backend(config.attn, config.trainer)}",  # the resolved one, never attn:auto
            f"model:{config.model.name}",
        ]
        loggers.append(
            TokenAxisWandbLogger(
                name=run_name(config),
                project=logger.project,
                entity=logger.entity,
                group=run_group(logger, config.experiment_name),
                tags=tags,
                save_dir=str(output_dir),
                mode=wandb_mode(logger.mode),
                config=asdict(config),
            )
        )
    return loggers


def flat_statistics(stats: dict, prefix: str = "data") -> dict[str, Any]:
    """`{"padding_waste": x, "chunk_lengths": {"median": m}}` -> `{"data/padding_waste": x,
    "data/chunk_lengths/median": m}`: flat W&B config keys, slash-separated like the metric names
    (dotted names are how W&B shows nested config, such as `data.policy`)."""
    flat: dict[str, Any] = {}
    for key, value in stats.items():
        if isinstance(value, dict):
            flat.update(flat_statistics(value, f"{prefix}/{key}"))
        else:
            flat[f"{prefix}/{key}"] = value
    return flat


def data_statistics(policy, cache, sampler=None) -> dict[str, Any]:
    """The `pretrain inspect-data` statistics of this policy on the cache's splits (without the costly
    overlap and leak audits), flattened; `sampler`: the run's own train sampler, reused."""
    from ..data.measures.stats import inspect_split

    train, validation = cache.split("train"), cache.split("validation")
    stats = inspect_split(policy, train, validation, packs_dir=cache.packs_dir, audits=False, sampler=sampler)
    return flat_statistics(stats)


class DataStatistics(Callback):
    """Puts the run's inspect-data statistics in the W&B run's config when training starts (rank zero,
    W&B runs only; a no-op otherwise). Needs the data module's `policy` and its set-up `cache`."""

    def on_train_start(self, trainer, pl_module) -> None:
        loggers = [logger for logger in trainer.loggers if isinstance(logger, WandbLogger)]
        if not loggers or not trainer.is_global_zero:
            return
        datamodule = getattr(trainer, "datamodule", None)
        if datamodule is not None and getattr(datamodule, "mixture", None) is not None:
            flat = flat_statistics(datamodule.statistics())  # the mixed epoch, data/mixture/<name>/...
        elif datamodule is None or getattr(datamodule, "cache", None) is None:
            return
        else:
            flat = data_statistics(datamodule.policy, datamodule.cache, datamodule.train_sampler)
        for logger in loggers:
            logger.log_hyperparams(flat)


def summary_row(summary: dict) -> dict[str, float | int | str]:
    """The run's row of `pretrain compare`'s table (median tokens/s, mean padding waste, pack
    utilization and attention cost, read back from metrics.csv; the composition audit's fragmented
    documents and cross-document visible tokens), plus steps and seconds and the run's floors
    (`floor/{unigram,bigram,bigram_kn}_{nats,bits_per_byte}`, measures/floors.py), keyed `summary/...`."""
    metrics = summary.get("metrics", {})
    row: dict[str, Any] = {
        "policy": summary.get("policy"),
        "max_seq_len": summary.get("max_seq_len"),
        "batch_size": summary.get("batch_size"),
        "steps": summary.get("steps"),
        "seconds": summary.get("seconds"),
        "real_tokens": summary.get("tokens"),
        "train_loss": metrics.get("train/loss"),
        "val_loss": metrics.get("val/loss"),
        "tokens_per_sec": metrics.get("train/tokens_per_sec"),
        "padding_waste": metrics.get("train/padding_waste"),
        "pack_utilization": metrics.get("train/pack_utilization"),
        "attention_cost": metrics.get("train/attention_cost"),
        "fragmented_documents": (summary.get("composition") or {}).get("fragmented_documents"),
        "cross_document_visible": (summary.get("composition") or {}).get("cross_document_visible_fraction"),
    }
    floors = summary.get("floors") or {}
    for model in (
        "unigram",
        "bigram",
        "bigram_kn",
    ):  # summary/floor/<model>_<unit>: the run's floors (data/measures/floors.py)
        for unit in ("nats", "bits_per_byte"):
            row[f"floor/{model}_{unit}"] = (floors.get(model) or {}).get(unit)
    output_dir = summary.get("output_dir")
    if output_dir and (Path(output_dir) / "metrics.csv").is_file():
        # The run's aggregates as the comparison table has them; the final values stay exact.
        numbers = run_numbers(load_run(Path(output_dir)))
        means = ("tokens_per_sec", "padding_waste", "pack_utilization", "attention_cost")
        row.update({key: numbers[key] for key in means})
    return {
        SUMMARY_PREFIX + key: value
        for key, value in row.items()
        if value is not None and not (isinstance(value, float) and math.isnan(value))
    }


def finish_loggers(trainer, summary: dict | None = None, plot: Path | str | None = None) -> None:
    """Close W&B runs (the next job of a multirun in this process must start its own run), after
    writing the summary row of `summary` (train(cfg)'s run summary) and logging the comparison `plot`."""
    for logger in trainer.loggers:
        if isinstance(logger, WandbLogger) and trainer.is_global_zero:
            experiment = logger.experiment
            if summary is not None:
                experiment.summary.update(summary_row(summary))
            if plot is not None and Path(plot).is_file():
                import wandb

                experiment.log({PLOT_KEY: wandb.Image(str(plot))})
            experiment.finish()
