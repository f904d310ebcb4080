"""Modules that moved in 0.2 (docs/layout.md) keep their 0.1 import paths for one release: each old path
imports, warns with a DeprecationWarning naming the new one, and is the very module of the new path (one
module object: a registry, a monkeypatch, an isinstance see the same thing through either name)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import REPO

import pretrain

POLICY_MODULES = ("base", "bestfit", "curriculum", "firstfit", "layout", "packs", "padded", "prepacked")
POLICY_MODULES += ("registry", "settings", "vsl")
OLD_PATHS = {
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
    **{f"pretrain.data.{m}": f"pretrain.data.batching.{m}" for m in ("chunking", "exchanges", "packing")},
    **{f"pretrain.data.{m}": f"pretrain.data.batching.{m}" for m in ("packing_kernels", "concat", "batch")},
    **{f"pretrain.data.{m}": f"pretrain.data.batching.{m}" for m in ("samplers", "mixture", "evaluation")},
    "pretrain.data.policies": "pretrain.data.batching.policies",
    **{f"pretrain.data.policies.{m}": f"pretrain.data.batching.policies.{m}" for m in POLICY_MODULES},
    **{f"pretrain.data.{m}": f"pretrain.data.measures.{m}" for m in ("audit", "stats", "floors")},
}
"""Every 0.1 module path that moved, with where it lives now (written out: the promise to users)."""

OLD_NAMES = {
    "pretrain.cli": {"build_parser": "command", "parse_args": "command", "counts_table": "prepare"},
    "pretrain.hf": {
        "model_weights": "roundtrip",
        "to_hf_state_dict": "gpt2",
        "gpt2_config": "gpt2.hf_config",
    },
}
"""Names of the single-module cli.py and hf.py, now packages, with their new homes (a sample of each kind)."""

_IMPORT_EVERY_OLD_PATH = """
import importlib, json, sys, warnings
old_paths, old_names = json.loads(sys.argv[1]), json.loads(sys.argv[2])
found = {}
for old, new in old_paths.items():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    found[old] = {
        "same": module is importlib.import_module(new),
        "warnings": [(w.category.__name__, str(w.message)) for w in caught],
    }
for package, names in old_names.items():
    for name, home in names.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            value = getattr(importlib.import_module(package), name)
        module, _, attribute = home.partition(".")
        now = getattr(importlib.import_module(f"{package}.{module}"), attribute or name)
        found[f"{package}.{name}"] = {
            "same": value is now,
            "warnings": [(w.category.__name__, str(w.message)) for w in caught],
        }
print(json.dumps(found))
"""


def _run(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=REPO, check=False
    )


def test_the_finder_knows_exactly_the_moved_paths():
    """A module that moves adds its old path to pretrain.MOVED_MODULES and here; the new paths exist
    on disk and the old ones do not (the finder never shadows a real module)."""
    resolved = {old: pretrain.new_module_path(old) for old in OLD_PATHS}
    assert resolved == OLD_PATHS
    package = REPO / "src"
    for old, new in OLD_PATHS.items():
        here = package.joinpath(*new.split("."))
        assert here.with_suffix(".py").is_file() or (here / "__init__.py").is_file(), new
        gone = package.joinpath(*old.split("."))
        assert not gone.with_suffix(".py").exists() and not (gone / "__init__.py").exists(), old
    assert pretrain.new_module_path("pretrain.data.tokens") is None  # unmoved: imported as it is
    assert pretrain.new_module_path("pretrain.data.packing_plans") is None  # a prefix is not a module


def test_every_old_path_imports_warns_and_is_the_new_module():
    result = _run("-c", _IMPORT_EVERY_OLD_PATH, json.dumps(OLD_PATHS), json.dumps(OLD_NAMES))
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert len(found) == len(OLD_PATHS) + sum(len(names) for names in OLD_NAMES.values())
    for old, seen in found.items():
        assert seen["same"], old
        deprecations = [message for kind, message in seen["warnings"] if kind == "DeprecationWarning"]
        assert len(deprecations) == 1, (old, seen["warnings"])
        assert f"`{old}` moved to `pretrain." in deprecations[0] and "next release" in deprecations[0]
    assert "`pretrain.data.policies` moved to `pretrain.data.batching.policies`" in str(
        found["pretrain.data.policies"]["warnings"]
    )


def test_a_moved_packages_modules_load_once():
    """Importing a policy module by its old path gives the registry's own class, not a second copy."""
    code = (
        "import warnings; warnings.simplefilter('ignore')\n"
        "from pretrain.data.policies.bestfit import BestfitPolicy as old\n"
        "from pretrain.data.batching.policies.registry import REGISTRY\n"
        "import sys\n"
        "print(REGISTRY['bestfit'] is old, sum(m.endswith('policies.bestfit') for m in sys.modules))"
    )
    result = _run("-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "2"]  # two names, one module object


@pytest.mark.parametrize("old", ["pretrain.prepare_tasks"])
def test_python_dash_m_runs_the_moved_module(old):
    """`python -m pretrain.prepare_tasks` (docs of 0.1) still runs the multi-task prepare app."""
    result = _run("-W", "always::DeprecationWarning", "-m", old, "--help")
    assert result.returncode == 0, result.stderr
    assert "prepare_tasks is powered by Hydra" in result.stdout or "== Config ==" in result.stdout
    assert f"`{old}` moved to `pretrain.cli.prepare_tasks`" in result.stderr
