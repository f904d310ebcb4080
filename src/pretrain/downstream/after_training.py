"""`eval.downstream`: `pretrain lm-eval` on a run's last.ckpt when its training completes.

Checked at launch (check_downstream: lm-eval installed, the project's tasks not asked of a mixture,
the harness's own task names known), so hours of training never end in "lm-eval is not installed".
Run on rank 0 after the run's summary is written; its metrics join run.json's `downstream`, where
`pretrain compare` reads them. A run stopped early (preempted, interrupted) is not scored: its requeue
scores the finished one. SIGTERM while scoring ends it (exit 143) with the run complete and the
command that scores it later printed.
"""

from __future__ import annotations

import importlib.util
import math

from ..config import Config
from ..errors import ConfigError

# Imported at every launch (launch_checks.check_job): the harness and the task writer (numpy,
# tokenizers, the chunker) only once eval.downstream names a task.


def check_downstream(config: Config) -> None:
    """The launch-time checks of `eval.downstream` (nothing imported or built when it is empty)."""
    tasks = list(config.eval.downstream or [])
    if not tasks:
        return
    from .harness import INSTALL_HINT, own_tasks

    if importlib.util.find_spec("lm_eval") is None:
        raise ConfigError(
            f"eval.downstream={tasks} needs lm-evaluation-harness (lm-eval), which is not installed: "
            f"{INSTALL_HINT}; or set eval.downstream=[]"
        )
    if own_tasks(tasks) and config.mixture:
        raise ConfigError(
            f"eval.downstream={tasks}: the project's tasks read one cache's validation split and this "
            "run mixes sources; keep only the harness's own tasks, or set eval.downstream=[]"
        )
    hub = [name for name in tasks if name not in own_tasks(tasks)]
    if hub:
        from .harness import task_manager

        task_manager(
            None, hub, option="eval.downstream entry"
        )  # an unknown name is one line now, not after training


def evaluate_after_training(checked, summary: dict) -> dict | None:
    """Score the finished run's last checkpoint on `eval.downstream` (rank 0 of a completed run);
    prints one line per task and returns `pretrain lm-eval`'s result, or None when there is nothing
    to do. `checked`: what train() was given (the config, its settings, or Hydra's DictConfig)."""
    config = _config(checked)
    tasks = tuple(config.eval.downstream or ())
    checkpoint = summary.get("checkpoint")
    if not tasks or summary.get("exit_code") or not summary.get("is_global_zero", True) or not checkpoint:
        return None
    from ..errors import Terminated, sigterm_unwinds
    from .command import LmEvalRequest, run_lm_eval

    command = f"pretrain lm-eval {checkpoint} --tasks {','.join(tasks)}"
    print(f"downstream: {command}", flush=True)
    _leave_process_group()
    try:
        with sigterm_unwinds():  # preempted while scoring: its temporary files go, the run stays complete
            result = run_lm_eval(LmEvalRequest(str(checkpoint), tasks, limit=config.eval.downstream_limit))
    except Terminated:
        print(
            f"downstream: stopped by SIGTERM; the run is complete: score it later with {command}", flush=True
        )
        raise SystemExit(Terminated.exit_code) from None
    for line in summary_lines(result["downstream"]):
        print(f"downstream: {line}")
    if result.get("run_json"):
        print(f"downstream: recorded in {result['run_json']}")
    return result


def _leave_process_group() -> None:
    """Rank 0 scores alone after the other ranks exited: the training's process group (if Lightning
    left it up) is let go here, so nothing in the harness waits on it."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _config(checked) -> Config:
    from omegaconf import DictConfig

    from ..config import to_config
    from ..training.startup import RunSettings

    if isinstance(checked, RunSettings):
        return checked.config
    return to_config(checked) if isinstance(checked, DictConfig) else checked


def _number(value: float) -> str:
    return f"{value:,.0f}" if float(value).is_integer() and abs(value) >= 10 else f"{value:.4g}"


def summary_lines(metrics: dict[str, dict[str, float]]) -> list[str]:
    """One line per task: its scores (recall: the distractor's cost and the passage's gain, paired,
    with their 95% intervals)."""
    from .task_files import RECALL, RECALL_VARIANTS

    lines = []
    for task, values in metrics.items():
        if task in RECALL_VARIANTS and RECALL in metrics:  # summed up in pretrain_recall's line
            continue
        if task == RECALL:
            lines.append(
                f"{task}: acc {values['acc']:.4f}, with a distractor {values['acc_distractor']:.4f}; answer "
                f"log-likelihood: distractor - plain {_paired_text(values, 'loglikelihood_difference')}"
                + (
                    f", passage gain {_paired_text(values, 'loglikelihood_passage_gain')}"
                    if "loglikelihood_passage_gain" in values
                    else ""
                )
                + f" over {values['examples']:.0f} paired examples"
            )
            continue
        shown = {k: v for k, v in values.items() if not k.endswith("_stderr") and math.isfinite(v)}
        lines.append(f"{task}: " + ", ".join(f"{k} {_number(v)}" for k, v in shown.items()))
    return lines


def _paired_text(values: dict[str, float], name: str) -> str:
    low, high = values.get(f"{name}_low"), values.get(f"{name}_high")
    interval = f" [{low:+.4f}, {high:+.4f}]" if low is not None and high is not None else ""
    return f"{values[name]:+.4f}{interval}"
