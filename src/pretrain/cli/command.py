"""The `pretrain` command: prepare, verify, inspect-data, compare, eval, export, lm-eval.

One convention for outputs: every subcommand that writes a file takes `--output PATH` and `output=PATH`
alike (the Hydra-style spelling sits naturally among overrides). A usage error shows the usage of the
subcommand it concerns.

Errors a user can fix (`pretrain.errors.PretrainError` and Hydra's config errors) are printed in one
line with exit status 2; anything else keeps its traceback. Ctrl-C (exit 130) and SIGTERM (exit 143,
errors.py) unwind through every cleanup: nothing half-written stays.
"""

from __future__ import annotations

import argparse
import sys

from ..errors import Terminated, exit_on_user_error, sigterm_unwinds
from . import compare, export, inspect_data, lm_eval, prepare, verify
from . import eval as eval_checkpoint

SUBCOMMANDS = {
    "prepare": prepare,
    "verify": verify,
    "inspect-data": inspect_data,
    "compare": compare,
    "eval": eval_checkpoint,
    "export": export,
    "lm-eval": lm_eval,
}
"""Each subcommand's module: `add_parser(sub)` declares its arguments, `run(args)` does it (heavy
imports inside run, so `pretrain --help` stays quick)."""

OUTPUT_SPELLING = "output="
"""`output=PATH` among the arguments means `--output PATH` (not a config key: no schema has `output`)."""


VALUE_OPTIONS = (
    *("--output", "--reference", "--contrast", "--at-tokens", "--at-seconds", "--at-step"),
    *("--tasks", "--limit", "--seed", "--tasks-dir", "--batch-size", "--examples"),
)
"""Options followed by their value: `_options_last` moves the pair together."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pretrain", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for module in SUBCOMMANDS.values():
        module.add_parser(sub)
    return parser


def _options_last(argv: list[str]) -> list[str]:
    """After the subcommand: `output=PATH` becomes `--output=PATH` (both spellings mean the same) and
    the options move behind the positionals, so `eval CKPT data=padded --output e.json attn=sdpa`
    keeps every override (argparse stops filling `overrides` at the first option)."""
    if not argv or argv[0].startswith("-"):
        return argv
    positionals, options = [], []
    items = iter(argv[1:])
    for item in items:
        if item in VALUE_OPTIONS:  # its value moves with it (an arm's label may hold `=` and spaces)
            value = next(items, None)  # none: argparse says "expected one argument"
            options.append(item if value is None else f"{item}={value}")
        elif item.startswith(OUTPUT_SPELLING):
            options.append(f"--{item}")
        elif item.startswith("-"):
            options.append(item)
        else:
            positionals.append(item)
    return [argv[0], *positionals, *options]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The parsed command line; a usage error names the subcommand's usage, not the top level's."""
    argv = _options_last(list(sys.argv[1:] if argv is None else argv))
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # argparse would report these with the top-level usage
        subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        subparsers.choices[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        with exit_on_user_error(), sigterm_unwinds():  # SIGTERM, as Ctrl-C, leaves nothing half-written
            return SUBCOMMANDS[args.command].run(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Terminated as stopped:
        print("terminated", file=sys.stderr)
        return stopped.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
