"""`pretrain lm-eval CKPT --tasks NAMES`: lm-evaluation-harness on a checkpoint or an export
(downstream/, docs/evaluation.md)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from .output import add_output, check_output_file, write_output


def add_parser(sub) -> None:
    """`pretrain lm-eval CKPT --tasks NAMES` and its options (docs/evaluation.md)."""
    lm_eval = sub.add_parser(
        "lm-eval", help="lm-evaluation-harness on a checkpoint: the project's offline tasks or the harness's"
    )
    lm_eval.add_argument("checkpoint", help="a .ckpt written by python train.py, or an exported directory")
    lm_eval.add_argument(
        "--tasks",
        required=True,
        help="comma-separated: pretrain_cloze, pretrain_recall, pretrain_bpb, or lm-eval tasks (hub data)",
    )
    lm_eval.add_argument("--limit", type=int, metavar="N", help="at most N examples per task")
    lm_eval.add_argument("--seed", type=int, default=0, help="the seed the project's tasks are drawn with")
    lm_eval.add_argument("--batch-size", type=int, default=16, metavar="N", help="requests per forward")
    lm_eval.add_argument(
        "--examples", type=int, default=1000, metavar="N", help="examples written per project task"
    )
    lm_eval.add_argument(
        "--tasks-dir", metavar="DIR", help="keep the generated task files here (lm_eval --include_path DIR)"
    )
    add_output(lm_eval, "also write the result as JSON to this file")


def run(args: argparse.Namespace) -> int:
    from ..downstream.command import LmEvalRequest, parse_tasks, run_lm_eval, summary_rows

    path = check_output_file(args.output, "--output FILE", "lm-eval.json") if args.output else None
    request = LmEvalRequest(
        checkpoint=args.checkpoint,
        tasks=parse_tasks(args.tasks),
        limit=args.limit,
        seed=args.seed,
        batch_size=args.batch_size,
        tasks_dir=Path(args.tasks_dir) if args.tasks_dir else None,
        examples=args.examples,
    )
    result = run_lm_eval(request)
    identity = result["checkpoint"]
    where = f"step {identity['step']}, policy {identity['policy']}" if "step" in identity else "export"
    table = Table(title=f"lm-eval {result['lm_eval_version']}: {args.checkpoint} ({where})")
    table.add_column("task.metric")
    table.add_column("value", justify="right")
    for name, value in summary_rows(result):
        table.add_row(name, value)
    Console().print(table)
    if result.get("run_json"):
        print(f"recorded in {result['run_json']} (downstream)")
    if result.get("wandb"):
        print(f"and in the run's W&B summary (downstream/...): {result['wandb']}")
    if path is not None:
        write_output(path, json.dumps(result, indent=2, default=str) + "\n")
        print(path)
    return 0
