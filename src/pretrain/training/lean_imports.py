"""Lightning without torchmetrics' optional integrations: no transformers, matplotlib or scipy at start-up.

`import lightning` imports torchmetrics (to read its version, and for `Metric` in its logging), and
torchmetrics imports transformers (for BERTScore) and matplotlib (for its plots) whenever they are
installed, and `scipy.signal` (only to add `scipy.signal.hamming` back for an audio metric's
dependency, SRMRpy): ~1.8 and ~1.0 of a training run's imports here (bench/bench_startup.py), for
features this project never uses (it logs plain tensors). The finder below lets torchmetrics load as
usual, except that its flag module marks those integrations absent and its package `__init__` sees
scipy as not installed, so torchmetrics skips their imports. Nothing else changes: transformers is
still imported where it is used (`pretrain export`, hf/roundtrip.py), matplotlib and scipy by `pretrain
compare`. Installed by pretrain.training's `__init__`, i.e. before any module of this package imports
Lightning; without effect if torchmetrics was imported earlier.

Not cut, because the minimal loop pays them too: torch._dynamo and sympy (Lightning imports
torch._dynamo for `OptimizedModule`, but torch's own `Optimizer.step` imports it at the first update).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType

FLAG_MODULE = "torchmetrics.utilities.imports"
PACKAGE = "torchmetrics"
# torchmetrics' availability flags of the integrations it would import at start-up (`_SCIPI_AVAILABLE`,
# sic, guards only the scipy.signal.hamming patch of its audio packages).
SKIPPED_FLAGS = (
    "_TRANSFORMERS_AVAILABLE",
    "_TRANSFORMERS_GREATER_EQUAL_4_4",
    "_TRANSFORMERS_GREATER_EQUAL_4_10",
    "_MATPLOTLIB_AVAILABLE",
    "_SCIPI_AVAILABLE",
)
# What torchmetrics' own `__init__` asks `package_available` for and imports when it is installed.
HIDDEN_FROM_INIT = ("scipy",)


def _mark_absent(load: Callable[[ModuleType], None]) -> Callable[[ModuleType], None]:
    def exec_module(module: ModuleType) -> None:
        load(module)
        for flag in SKIPPED_FLAGS:
            if hasattr(module, flag):
                setattr(module, flag, False)

    return exec_module


def _hide_from_init(load: Callable[[ModuleType], None]) -> Callable[[ModuleType], None]:
    """torchmetrics' `__init__` run with `package_available` saying no for HIDDEN_FROM_INIT (it binds
    the name from lightning_utilities when it starts; both are restored when it is done)."""

    def exec_module(module: ModuleType) -> None:
        from lightning_utilities.core import imports

        available = imports.package_available

        def package_available(name: str) -> bool:
            return name not in HIDDEN_FROM_INIT and available(name)

        imports.package_available = package_available  # type: ignore[assignment]
        try:
            load(module)
        finally:
            imports.package_available = available
            if getattr(module, "package_available", None) is package_available:
                module.package_available = available  # type: ignore[attr-defined]

    return exec_module


WRAPPED = {FLAG_MODULE: _mark_absent, PACKAGE: _hide_from_init}


class _SkipOptionalIntegrations(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        wrap = WRAPPED.get(fullname)
        if wrap is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        loader = getattr(spec, "loader", None)
        if spec is None or not isinstance(loader, importlib.abc.Loader):
            return None
        loader.exec_module = wrap(loader.exec_module)  # type: ignore[method-assign,assignment]
        return spec


def install() -> None:
    """Put the finder first on sys.meta_path (once)."""
    if not any(isinstance(finder, _SkipOptionalIntegrations) for finder in sys.meta_path):
        sys.meta_path.insert(0, _SkipOptionalIntegrations())
