"""The entry points: the `pretrain` command (command.py, one module per subcommand), train.py's checks
before Hydra starts (launch_checks.py, sweep.py), its quick exit (fast_exit.py), and the Hydra app of
multi-task prepare (prepare_tasks.py).

`pretrain.cli:main` is the console script; it imports the subcommands only when called, so train.py
importing `pretrain.cli.launch_checks` pays for none of them.
"""

from __future__ import annotations

import warnings
from importlib import import_module

_MOVED_NAMES = {
    "build_parser": "command",
    "parse_args": "command",
    "counts_table": "prepare",
    "component_configs": "prepare",
    "verification_table": "verify",
}
"""Names of the old single-module cli.py (before 0.2) -> the module holding them now."""


def main(argv: list[str] | None = None) -> int:
    """`pretrain ...`: parse the command line and run its subcommand; returns the exit status."""
    from .command import main as run

    return run(argv)


def __getattr__(name: str):
    if name not in _MOVED_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    new = f"{__name__}.{_MOVED_NAMES[name]}"
    warnings.warn(
        f"`pretrain.cli.{name}` moved to `{new}.{name}`; the old path stops working in the next release",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(import_module(new), name)
