"""A run's summary, `run.json`: written here at the end of a run and read back here (`read_summary`,
for compare and the run record), with `config.yaml` beside it; the report of where everything went and
the command that resumes a stopped run."""

from __future__ import annotations

import json
import re
import shlex
import signal
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import OmegaConf
from rich.console import Console

from ..config import Config
from ..data.measures.audit import composition_audit
from ..errors import WriteError
from ..fileio import write_text_atomic
from .preemption import exit_code
from .rundir import hydra_mode

if TYPE_CHECKING:
    import lightning as L

    from .datamodule import PretrainDataModule
    from .module import PretrainModule
    from .startup import RunSettings

RUN_JSON = "run.json"


def read_summary(run_dir: Path) -> dict:
    """The run.json a run wrote in `run_dir` ({} when it has none)."""
    path = Path(run_dir) / RUN_JSON
    return dict(json.loads(path.read_text())) if path.is_file() else {}


def run_summary(
    run: RunSettings,
    trainer: L.Trainer,
    module: PretrainModule,
    datamodule: PretrainDataModule,
    last: Path,
    stopped_by: signal.Signals | None,
    seconds: float,
) -> dict:
    """What run.json holds: how the run ended, where its outputs are, what it trained and scored."""
    config, output_dir = run.config, run.output_dir
    cache = datamodule.cache
    summary = {
        "status": "preempted" if stopped_by is not None else "completed",
        "signal": stopped_by.name if stopped_by is not None else None,
        "exit_code": exit_code(stopped_by) if stopped_by is not None else 0,
        "output_dir": str(output_dir),
        "checkpoint": str(last) if trainer.is_global_zero and last.exists() else None,
        # A mixture has no one cache: each component's directory and its real tokens instead.
        **(
            {"cache_dir": str(cache.directory) if cache is not None else None}
            if run.mixture is None
            else {
                "cache_dirs": {n: str(c.directory) for n, c in datamodule.caches.items()},
                "mixture_tokens": dict(zip(module.component_names, module.component_tokens, strict=True)),
            }
        ),
        "policy": run.policy.policy,
        "positions": run.policy.data_policy.position_numbering(),  # data.positions: restart | continue
        "attn": run.attn_backend,
        "model": config.model.name,
        "max_seq_len": run.policy.max_seq_len,
        "batch_size": config.train.batch_size,
        "steps": int(trainer.global_step),
        "tokens": int(module.tokens_seen),
        "seconds": round(seconds, 2),
        "metrics": dict(module.last_metrics),
        "is_global_zero": trainer.is_global_zero,
        "max_tokens": config.train.max_tokens,
        # What context-free models score on the validation pairs (data/measures/floors.py): rank zero's.
        "floors": datamodule.floors() if trainer.is_global_zero else None,
        # train.compile: graphs compiled, those after the first step (recompiles), compile seconds.
        "compile": module.compile_stats.as_dict() if module.compile_stats is not None else None,
        "compile_scope": (module.setup_record or {}).get("compile_scope"),  # model (whole trunk) | blocks
        # train.loss_kernel as resolved on this device (liger | chunked), and why auto fell back, if it did.
        "loss_kernel": (module.setup_record or {}).get("loss_kernel"),
        "loss_kernel_fallback": (module.setup_record or {}).get("loss_kernel_fallback"),
        "padded_vocab_size": getattr(module.gpt_config, "padded_vocab_size", None),
        # train.activation_checkpointing: blocks recomputed; trainer=fsdp: kind, ranks, FSDP units.
        "activation_checkpointing": (module.setup_record or {}).get("activation_checkpointing"),
        "sharding": (module.setup_record or {}).get("sharding"),
    }
    if trainer.is_global_zero and datamodule.train_sampler is not None:
        # What the policy did to the corpus (data/measures/audit.py), for `pretrain compare`'s table: the
        # sampler's epoch-0 plan is reused (rank zero's layout, as inspect-data reports it).
        summary["composition"] = composition_audit(
            run.policy, datamodule.train_sampler.split, sampler=datamodule.train_sampler
        )
    return summary


def write_outputs(output_dir: Path, summary: dict, config: Config) -> None:
    """run.json and config.yaml, atomically; a full disk or a permission is one line."""
    try:
        write_text_atomic(output_dir / RUN_JSON, json.dumps(summary, indent=2) + "\n")
        write_text_atomic(
            output_dir / "config.yaml", OmegaConf.to_yaml(OmegaConf.structured(config), resolve=True)
        )
    except OSError as error:
        raise WriteError(
            f"could not write {output_dir / RUN_JSON}: {error.strerror or error}; free disk space "
            f"(the checkpoint {output_dir / 'checkpoints' / 'last.ckpt'} is complete)"
        ) from None


def report(summary: dict, plot: Path | None = None) -> None:
    """Where everything went, on stdout (and the comparison plot, when the run made one)."""
    console = Console(soft_wrap=True)  # paths and commands stay on one line
    output = Path(summary["output_dir"])
    if plot is not None:
        console.print(f"comparison plot: {plot}")
    metrics = summary["metrics"]
    losses = ", ".join(f"{key} {metrics[key]:.3f}" for key in ("train/loss", "val/loss") if key in metrics)
    status = (
        "done" if summary.get("status", "completed") == "completed" else f"stopped by {summary['signal']}"
    )
    console.print(
        f"[bold]{status}[/bold]: {summary['steps']} steps, {summary['tokens']:,} real tokens, {losses}"
    )
    console.print(f"outputs: {output}")
    checkpoint = summary.get("checkpoint")
    if checkpoint and Path(checkpoint).is_file():  # never a line for a file that is not there
        console.print(f"checkpoint: {checkpoint}")
    console.print(f"metrics: {output / 'metrics.csv'}")
    if summary.get("status") == "preempted":
        console.print(f"resume: {resume_command(output)} (exit status {summary['exit_code']})")


def resume_command(output_dir: Path) -> str:
    """The command that continues this run in its own directory from its newest valid checkpoint."""
    overrides: list[str] = []
    if hydra_mode() == "RUN":
        from hydra.core.hydra_config import HydraConfig

        overrides = [
            o
            for o in HydraConfig.get().overrides.task
            # start_over deleted the earlier run's checkpoints once; a resume continues this run's
            if not o.lstrip("+").startswith(("ckpt_path=", "hydra.run.dir=", "start_over="))
        ]
    elif hydra_mode() is None:
        return f"train(config with ckpt_path=auto output_dir={output_dir})"
    words = [
        "python",
        "train.py",
        *overrides,
        f"hydra.run.dir={hydra_quote(str(output_dir))}",
        "ckpt_path=auto",
    ]
    return " ".join(shlex.quote(word) for word in words)


_HYDRA_PLAIN = re.compile(r"[A-Za-z0-9_./+\-:@%~]+")


def hydra_quote(value: str) -> str:
    """`value` as Hydra's override grammar reads it back: quoted when it holds anything but plain
    path characters (spaces, accents, commas, brackets, quotes); the shell quoting goes around it."""
    if _HYDRA_PLAIN.fullmatch(value):
        return value
    # Inside Hydra's quotes a backslash escapes only a quote or the backslashes before a quote (or
    # before the closing one); every other backslash is literal.
    escaped = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", value)
    escaped = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, escaped)
    return f"'{escaped}'"
