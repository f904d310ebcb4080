"""Lightning without torchmetrics' optional integrations: no transformers, no matplotlib at start-up.

`import lightning` imports torchmetrics (to read its version), and torchmetrics imports transformers
(for BERTScore) and matplotlib (for its plots) whenever they are installed: ~1.8 of the ~6 CPU seconds
of a training run's imports here, for features this project never uses (it logs plain tensors). The
finder below lets torchmetrics' flag module load as usual, then marks those two integrations absent,
so torchmetrics skips their imports. Nothing else changes: transformers is still imported where it is
used (`pretrain export`, hf.py), matplotlib by `pretrain compare`. Installed by pretrain.training's
`__init__`, i.e. before any module of this package imports Lightning; without effect if torchmetrics
was imported earlier.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType

FLAG_MODULE = "torchmetrics.utilities.imports"
# torchmetrics' availability flags of the integrations it would import at start-up.
SKIPPED_FLAGS = (
    "_TRANSFORMERS_AVAILABLE",
    "_TRANSFORMERS_GREATER_EQUAL_4_4",
    "_TRANSFORMERS_GREATER_EQUAL_4_10",
    "_MATPLOTLIB_AVAILABLE",
)


class _SkipOptionalIntegrations(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != FLAG_MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        loader = getattr(spec, "loader", None)
        if spec is None or not isinstance(loader, importlib.abc.Loader):
            return None
        load = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            load(module)
            for flag in SKIPPED_FLAGS:
                if hasattr(module, flag):
                    setattr(module, flag, False)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Put the finder first on sys.meta_path (once)."""
    if not any(isinstance(finder, _SkipOptionalIntegrations) for finder in sys.meta_path):
        sys.meta_path.insert(0, _SkipOptionalIntegrations())
