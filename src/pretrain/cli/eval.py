"""`pretrain eval CKPT [OVERRIDES] [--output eval.json]`: a checkpoint's validation loss, perplexity and
bits per byte (training/evaluate.py), as a table and optionally as JSON."""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.table import Table

from .output import add_output, check_output_file, write_output


def add_parser(sub) -> None:
    evaluate = sub.add_parser("eval", help="validation loss, perplexity and bits per byte of a checkpoint")
    evaluate.add_argument("checkpoint", help="a .ckpt written by python train.py")
    evaluate.add_argument(
        "overrides", nargs="*", help="overrides on the checkpoint's config, e.g. data=padded"
    )
    add_output(evaluate, "also write the result as JSON to this file")


def run(args: argparse.Namespace) -> int:
    checkpoint, output = args.checkpoint, args.output
    from ..training.evaluate import evaluate_checkpoint

    path = check_output_file(output) if output else None  # before minutes of evaluation
    result = evaluate_checkpoint(checkpoint, args.overrides)
    table = Table(
        title=f"eval: {checkpoint} (step {result['step']}, policy {result['policy']}, positions "
        f"{result['positions']}: each validation chunk from 0; trained with {result['trained_positions']})"
    )
    table.add_column("statistic")
    table.add_column("value", justify="right")
    rows = [("", result), *((f"{name}.", part) for name, part in result.get("components", {}).items())]
    for prefix, values in rows:  # a mixture: each component's rows after the overall ones
        for key in ("loss", "perplexity", "bits_per_byte", "targets", "documents", "bytes"):
            value = values[key]
            table.add_row(prefix + key, f"{value:,.4f}" if isinstance(value, float) else f"{value:,}")
    Console().print(table)
    if path is not None:
        write_output(path, json.dumps(result, indent=2) + "\n")
        print(path)
    return 0
