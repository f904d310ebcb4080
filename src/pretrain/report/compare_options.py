"""`pretrain compare`'s command-line options (the parser the CLI adds; report.compare does the work)."""

from __future__ import annotations


def add_compare_parser(sub) -> None:
    """`pretrain compare DIR...` and its options."""
    compare = sub.add_parser(
        "compare",
        help="what packing bought: loss, waste and truncation of runs side by side; runs that differ "
        "only in seed form one arm (mean, std, n)",
    )
    compare.add_argument("dirs", nargs="+", help="run directories or multirun directories")
    compare.add_argument(
        "--output",
        metavar="PATH",
        help="image file for the plot: .png, .pdf, .svg, ... (default: compare.png in the first "
        "directory); the tables (.md), every number (.json) and the contrast figure (-contrast) go "
        "beside it (or output=PATH)",
    )
    compare.add_argument(
        "--wandb",
        action="store_true",
        help="also log the tables and plot into one W&B run of the runs' group (offline without a key)",
    )
    compare.add_argument(
        "--reference",
        metavar="ARM",
        help="the arm the others are compared with, by its label in the table (default: the first padded "
        "arm, else the first arm); its level is also the contrasts' reference",
    )
    compare.add_argument(
        "--contrast",
        metavar="KEY",
        help="the factor whose levels are contrasted within each combination of the other keys the "
        "runs vary, seeds paired inside it (default: data.policy when it varies), e.g. "
        "--contrast data.document_mask",
    )
    _add_interpolation_options(compare)
    compare.add_argument(
        "--unpaired",
        action="store_true",
        help="Welch's t test for every arm; by default arms that ran the same seeds are compared "
        "seed by seed (paired t)",
    )
    compare.add_argument(
        "--no-timing",
        action="store_true",
        help="a figure without times, for publishing from a shared machine: loss against optimizer steps "
        "instead of seconds, no tokens/s bars (the tables keep them)",
    )


def _add_interpolation_options(compare) -> None:
    """compare's `--at-tokens`, `--at-seconds`, `--at-step`: where val loss is interpolated."""
    compare.add_argument(
        "--at-tokens",
        type=float,
        metavar="N",
        help="real-token count at which val loss is interpolated (default: the most every run validated at)",
    )
    compare.add_argument(
        "--at-seconds",
        type=float,
        metavar="S",
        help="training seconds at which val loss is interpolated "
        "(default: the longest every run validated at)",
    )
    compare.add_argument(
        "--at-step",
        type=float,
        metavar="N",
        help="optimizer step at which val loss is interpolated "
        "(default: the last step every run validated at)",
    )
