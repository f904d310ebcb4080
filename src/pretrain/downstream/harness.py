"""lm-evaluation-harness on an exported model: its Hugging Face model class (`hf`), the project's own
task folder beside the harness's registry, and its results read back as flat
`{task: {metric: value}}` (the shape run.json's `downstream` and `pretrain compare` use).

The harness scores each request as one unpadded-left, right-padded row from position 0 (no packing),
so the exported config's `use_cache` does not change a score here (docs/checkpoints.md: it matters
only for packed rows with restarting position_ids).
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path

from ..errors import ConfigError
from .task_files import BPB, RECALL, RECALL_CUE_ONLY, RECALL_DISTRACTOR, RECALL_PLAIN, RECALL_VARIANTS, TASKS

INSTALL_HINT = "install it with pip install -e '.[eval]' (make install does)"


def lm_eval_version() -> str:
    try:
        import lm_eval
    except ImportError:
        raise ConfigError(f"lm-evaluation-harness (lm-eval) is not installed: {INSTALL_HINT}") from None
    return str(lm_eval.__version__)


def own_tasks(names: Sequence[str]) -> list[str]:
    return [name for name in names if name in TASKS]


def task_manager(tasks_dir: Path | None, names: Sequence[str], option: str = "--tasks"):
    """The harness's task registry: the project's folder, and the harness's own tasks only when a
    name needs them (indexing its thousands of YAMLs costs seconds)."""
    from lm_eval.tasks import TaskManager

    hub = [name for name in names if name not in TASKS]
    manager = TaskManager(include_path=str(tasks_dir) if tasks_dir else None, include_defaults=bool(hub))
    unknown = [name for name in hub if name not in manager.all_tasks]
    if unknown:
        raise ConfigError(
            f"{option} {','.join(unknown)}: no such lm-eval task; choose the project's "
            f"{', '.join(TASKS)} or a task `lm_eval ls tasks` lists"
        )
    return manager


def run_harness(
    model_dir: Path,
    names: Sequence[str],
    manager,
    max_length: int | None,
    limit: int | None,
    batch_size: int,
    device: str,
) -> dict:
    """simple_evaluate's output (samples kept: the paired recall difference needs them). A hub task's
    dataset that cannot be downloaded is one line."""
    import lm_eval
    import transformers

    _quiet_harness()
    transformers.logging.set_verbosity_error()  # "longer than the maximum": the harness cuts it itself
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        with contextlib.redirect_stdout(io.StringIO()), one_process():  # its "bootstrapping" prints
            return lm_eval.simple_evaluate(
                model="hf",
                model_args={
                    "pretrained": str(model_dir),
                    "dtype": "float32",
                    # the chunk length the checkpoint trained with (an export alone: its config's positions)
                    **({"max_length": max_length} if max_length else {}),
                },
                tasks=list(names),
                task_manager=manager,
                limit=limit,
                batch_size=batch_size,
                device=device,
                log_samples=True,
                # no bootstrap: it forks a multiprocessing pool from a process with torch's threads,
                # which deadlocked a sweep's job; standard errors come from the samples (sample_stderrs)
                bootstrap_iters=0,
            )
    except (ConnectionError, OSError) as error:
        hub = [name for name in names if name not in TASKS]
        if not hub:
            raise
        raise ConfigError(
            f"lm-eval could not load the data of {', '.join(hub)} ({type(error).__name__}: "
            f"{str(error).splitlines()[0][:160]}): hub tasks need the Hugging Face hub; run them where "
            f"the network is, or choose the offline {', '.join(TASKS)}"
        ) from None


LAUNCHER_VARIABLES = (
    *("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT"),
    *("PMI_SIZE", "PMI_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"),
    "MV2_COMM_WORLD_SIZE",
)
"""What a launcher (torchrun, srun, Lightning's DDP) leaves in the environment of rank 0: accelerate,
which the harness's hf model starts, would read them as a multi-process job and wait for ranks that
have already exited."""


@contextlib.contextmanager
def one_process():
    """The harness runs as one process: the launcher's variables hidden while it runs, then restored."""
    saved = {name: os.environ.pop(name) for name in LAUNCHER_VARIABLES if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


class _DropMessages(logging.Filter):
    """Drops the harness's advice that suits its hub tasks, not these (custom datasets' --metadata)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Custom kwargs can be passed" not in record.getMessage()


def _quiet_harness() -> None:
    logging.getLogger("lm_eval").setLevel(logging.WARNING)  # its INFO lines, under Hydra's root logger
    logger = logging.getLogger("lm_eval.api.task")
    if not any(isinstance(f, _DropMessages) for f in logger.filters):
        logger.addFilter(_DropMessages())


def flat_results(output: dict) -> dict[str, dict[str, float]]:
    """`{task: {metric: value}}` from the harness's results ("acc,none" -> "acc", stderrs kept as
    "acc_stderr"; "N/A" dropped), groups without metrics left out."""
    flat: dict[str, dict[str, float]] = {}
    for task, values in output.get("results", {}).items():
        metrics = {}
        for key, value in values.items():
            metric, _, _filter = key.partition(",")
            if _ and isinstance(value, int | float) and not isinstance(value, bool):
                metrics[metric] = float(value)
        if metrics:
            flat[task] = metrics
    return flat


def recall_contrast(samples: dict) -> dict[str, float]:
    """pretrain_recall's variants paired example by example (the same prompt with and without another
    document before it, and its cue alone): accuracy and log-likelihood of the answer in each, and
    two paired differences with 95% t intervals over the examples: `*_difference` = distractor -
    plain (what another document costs), `*_passage_gain` = plain - cue only (what reading the passage
    gives; about 0 for a model that predicts the word without it)."""
    plain = _responses(samples, RECALL_PLAIN)
    other = _responses(samples, RECALL_DISTRACTOR)
    alone = _responses(samples, RECALL_CUE_ONLY)
    shared = sorted(set(plain) & set(other) & (set(alone) if alone else set(plain)))
    out: dict[str, float] = {"examples": float(len(shared))}
    for name, column in (("acc", 1), ("loglikelihood", 0)):
        a = [float(plain[i][column]) for i in shared]
        b = [float(other[i][column]) for i in shared]
        out[name] = _mean(a)
        out[f"{name}_distractor"] = _mean(b)
        out.update(_paired(f"{name}_difference", a, b))
        if alone:
            c = [float(alone[i][column]) for i in shared]
            out[f"{name}_cue_only"] = _mean(c)
            out.update(_paired(f"{name}_passage_gain", c, a))
    return out


def _responses(samples: dict, task: str) -> dict:
    return {s["doc_id"]: s["filtered_resps"][0] for s in samples.get(task, [])}


def _paired(name: str, a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    """The mean of b - a (paired) as `name`, with its 95% t interval as `name_low`, `name_high`."""
    from scipy import stats

    differences = [y - x for x, y in zip(a, b, strict=True)]
    mean = _mean(differences)
    out = {name: mean}
    if len(differences) > 1:  # no spread (every example moved alike): the interval is the point
        same = max(differences) == min(differences)
        interval = (mean, mean) if same else stats.ttest_1samp(differences, 0).confidence_interval(0.95)
        out[f"{name}_low"], out[f"{name}_high"] = float(interval[0]), float(interval[1])
    return out


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def sample_stderrs(output: dict) -> dict[str, dict[str, float]]:
    """`{task: {"acc_stderr": se}}`: the standard error of each per-example mean metric (accuracy), sd /
    sqrt(n) over the logged samples, as the harness's closed form would give it."""
    from statistics import stdev

    out: dict[str, dict[str, float]] = {}
    for task, samples in output.get("samples", {}).items():
        for metric in ("acc", "acc_norm"):
            values = [float(s[metric]) for s in samples if isinstance(s.get(metric), int | float)]
            if len(values) > 1:
                out.setdefault(task, {})[f"{metric}_stderr"] = stdev(values) / math.sqrt(len(values))
    return out


def downstream_metrics(output: dict) -> dict[str, dict[str, float]]:
    """What run.json's `downstream` holds: the harness's flat results (with the stderrs of mean
    metrics from the samples), pretrain_recall's entry holding the paired contrast of its variants."""
    flat = flat_results(output)
    for task, stderrs in sample_stderrs(output).items():
        if task in flat:
            flat[task].update(stderrs)
    if any(task in flat for task in RECALL_VARIANTS):
        flat[RECALL] = recall_contrast(output.get("samples", {}))
    if BPB in flat:
        flat[BPB] = {"bits_per_byte": flat[BPB]["bits_per_byte"]}
    return flat
