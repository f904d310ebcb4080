"""The package's layering (pyproject's [tool.importlinter] contracts) holds, and would catch a breach."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(
    not LINT_IMPORTS.exists(), reason="import-linter is not installed (dev extra)"
)


def lint_imports(src: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(src)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_contracts_are_kept():
    result = lint_imports(ROOT / "src", ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 3 kept, 0 broken." in result.stdout


def test_an_upward_import_and_a_cycle_break_the_contracts(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(ROOT / "src" / "pretrain", src / "pretrain", ignore=shutil.ignore_patterns("__pycache__"))
    # data importing training: upward across layers, and a cycle between the two subpackages.
    (src / "pretrain" / "data" / "upward.py").write_text("from ..training import run\n")
    result = lint_imports(src, tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Contracts: 1 kept, 2 broken." in result.stdout
    assert "pretrain.data.upward -> pretrain.training.run" in result.stdout


PACKAGE = ROOT / "src" / "pretrain"
MAX_LOOSE_TOP_LEVEL = 5
DATA_SHARED = {"__init__", "files", "index", "tokens", "gpt2", "leaks"}
"""data/'s loose modules: what both phases read (the split files, GPT-2's ids, the verbatim-leak finder
that ingest's decontamination and inspect-data share); every other module sits in a phase folder."""


def test_the_top_level_holds_folders_and_a_few_leaves():
    loose = sorted(p.stem for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert len(loose) <= MAX_LOOSE_TOP_LEVEL, loose
    kinds = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())
    assert {"cli", "hf", "data", "model", "training"} <= set(kinds)


def test_data_keeps_its_run_time_path_in_phase_folders():
    loose = {p.stem for p in (PACKAGE / "data").glob("*.py")}
    assert loose == DATA_SHARED
    phases = {p.name for p in (PACKAGE / "data").iterdir() if (p / "__init__.py").is_file()}
    assert phases == {"ingest", "sources", "batching", "measures"}
