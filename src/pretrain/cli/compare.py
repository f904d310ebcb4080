"""`pretrain compare DIRS...`: runs or sweeps side by side (report/compare.py; its options:
report/compare_options.py), a figure and its .md table."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..report.compare_options import add_compare_parser as add_parser
from .output import check_output_file

__all__ = ["add_parser", "run"]


def run(args: argparse.Namespace) -> int:
    from ..errors import WriteError
    from ..report.compare import compare
    from ..report.figure import check_output

    # The plot's path (default: compare.png in the first directory) is checked before the work.
    output = Path(args.output) if args.output else Path(args.dirs[0]) / "compare.png"
    check_output(output)
    if args.output or output.parent.is_dir():  # a missing run directory is compare's to name
        shown = str(output) if args.output else f"{output} (the default)"
        check_output_file(str(output), spelling=f"--output {shown}", example="compare.png")
    try:
        compare(
            [Path(d) for d in args.dirs],
            output=output,
            wandb=args.wandb,
            reference=args.reference,
            at_tokens=args.at_tokens,
            at_seconds=args.at_seconds,
            at_step=args.at_step,
            paired=not args.unpaired,
            timing=not args.no_timing,
            contrast=args.contrast,
        )
    except WriteError:
        raise
    except OSError as error:  # the plot and its .md table are written atomically: nothing half-written
        raise WriteError(
            f"compare: {error.filename or output}: {error.strerror or error}; free disk space or pick "
            "another --output FILE.png"
        ) from None
    return 0
