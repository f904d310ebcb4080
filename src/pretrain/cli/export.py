"""`pretrain export CKPT --output DIR`: a Hugging Face model directory from a checkpoint (hf/roundtrip.py);
prints the directory."""

from __future__ import annotations

import argparse

from .output import add_output


def add_parser(sub) -> None:
    export = sub.add_parser("export", help="a Hugging Face GPT2LMHeadModel directory from a checkpoint")
    export.add_argument("checkpoint", help="a .ckpt written by python train.py")
    add_output(export, "the new model directory", required=True)


def run(args: argparse.Namespace) -> int:
    from ..hf.roundtrip import export

    directory = export(args.checkpoint, args.output)
    print(directory)
    return 0
