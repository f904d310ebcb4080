"""pretrain: config-driven GPT pretraining on a verified token cache with padding-free packed batches.

Modules moved in 0.2 (docs/layout.md) keep their old import paths for one release: importing one (or
running it with `python -m`) warns with a DeprecationWarning and gives the module at its new path, the
same object, so a monkeypatch or an isinstance check through either name sees one module.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from importlib.machinery import ModuleSpec
from types import CodeType, ModuleType
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from importlib.abc import Loader

__version__ = "0.1.0"

MOVED_MODULES = {
    "pretrain.prepare_tasks": "pretrain.cli.prepare_tasks",
    "pretrain.launch_checks": "pretrain.cli.launch_checks",
    "pretrain.sweep": "pretrain.cli.sweep",
    "pretrain.fast_exit": "pretrain.cli.fast_exit",
    "pretrain.startup_collector": "pretrain.training.startup_collector",
    "pretrain.evaluate": "pretrain.training.evaluate",
    "pretrain.stop_signals": "pretrain.errors",
    "pretrain.machine_load": "pretrain.training.machine_load",
    "pretrain.hf_llama": "pretrain.hf.llama",
    "pretrain.gpt2": "pretrain.data.gpt2",
    "pretrain.checkpoint_files": "pretrain.checkpoints.files",
    "pretrain.sharded_checkpoint": "pretrain.checkpoints.sharded",
    "pretrain.data.chunking": "pretrain.data.batching.chunking",
    "pretrain.data.exchanges": "pretrain.data.batching.exchanges",
    "pretrain.data.packing": "pretrain.data.batching.packing",
    "pretrain.data.packing_kernels": "pretrain.data.batching.packing_kernels",
    "pretrain.data.concat": "pretrain.data.batching.concat",
    "pretrain.data.batch": "pretrain.data.batching.batch",
    "pretrain.data.samplers": "pretrain.data.batching.samplers",
    "pretrain.data.mixture": "pretrain.data.batching.mixture",
    "pretrain.data.evaluation": "pretrain.data.batching.evaluation",
    "pretrain.data.policies": "pretrain.data.batching.policies",  # and every module in it
    "pretrain.data.audit": "pretrain.data.measures.audit",
    "pretrain.data.stats": "pretrain.data.measures.stats",
    "pretrain.data.floors": "pretrain.data.measures.floors",
}
"""Old module path -> its path now (a package's entry covers the modules inside it)."""


def new_module_path(old: str) -> str | None:
    """Where the module once at `old` lives now; None when `old` did not move."""
    for moved_from, moved_to in MOVED_MODULES.items():
        if old == moved_from or old.startswith(moved_from + "."):
            return moved_to + old[len(moved_from) :]
    return None


def _moved_warning(old: str, new: str) -> str:
    return f"`{old}` moved to `{new}`; the old path stops working in the next release: import `{new}`"


class _MovedModuleLoader:
    """Imports the module's new path and puts it in sys.modules under the old name too (a loader by
    protocol: importlib.abc would cost every `import pretrain` ~15 ms of importlib.resources)."""

    def __init__(self, new: str):
        self.new = new

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return None  # a placeholder: exec_module swaps in the real module

    def exec_module(self, module: ModuleType) -> None:
        warnings.warn(_moved_warning(module.__name__, self.new), DeprecationWarning, stacklevel=2)
        sys.modules[module.__name__] = importlib.import_module(self.new)  # what the import returns

    def get_source(self, fullname: str) -> str:
        """`python -m <old path>`: runs the new module as __main__, after saying where it went."""
        return (
            "import runpy, warnings\n"
            f"warnings.warn({_moved_warning(fullname, self.new)!r}, DeprecationWarning)\n"
            f"runpy.run_module({self.new!r}, run_name='__main__', alter_sys=True)\n"
        )

    def get_code(self, fullname: str) -> CodeType:
        return compile(self.get_source(fullname), f"<moved: {fullname}>", "exec")

    def is_package(self, fullname: str) -> bool:
        return False


class _MovedModuleFinder:
    """Finds the old paths of MOVED_MODULES. First in sys.meta_path: a moved package's old name would
    otherwise find its modules through the new package's __path__ and load them twice."""

    def find_spec(self, fullname, path=None, target=None) -> ModuleSpec | None:
        if not fullname.startswith("pretrain."):  # every other import of the process passes here first
            return None
        new = new_module_path(fullname)
        if new is None:
            return None
        return ModuleSpec(fullname, cast("Loader", _MovedModuleLoader(new)))


if not any(isinstance(finder, _MovedModuleFinder) for finder in sys.meta_path):
    sys.meta_path.insert(0, _MovedModuleFinder())
