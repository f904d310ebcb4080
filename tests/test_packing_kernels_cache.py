"""The numba packing kernels' disk cache: used when a folder is writable, skipped (with one warning)
in a read-only install whose user has no writable cache folder either, the kernels still running."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHILD = """
import json, logging, numpy as np
logging.basicConfig(level=logging.WARNING)
from pretrain.data.batching import packing
from pretrain.data.batching import packing_kernels
from pretrain.data.batching.chunking import chunk_table
table = chunk_table(np.array([0, 5, 12]), np.array([5, 7]), 3)
print(json.dumps({"cached": packing_kernels.CACHED, "kernels": packing.numba_kernels() is not None,
                  "lengths": table.length.tolist(), "module": packing_kernels.__file__}))
"""


def _run(tmp_path: Path, package: Path, home: Path, read_only: bool) -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "PRETRAIN_NO_NUMBA")}
    env.update(PYTHONPATH=str(package), HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"))
    command = [sys.executable, "-c", CHILD]
    locked = [package, *package.rglob("*"), home] if read_only else []
    if read_only and os.geteuid() == 0:  # root ignores permissions: drop the capabilities that let it
        if not shutil.which("setpriv"):
            pytest.skip("running as root without setpriv: a read-only install cannot be made")
        caps = "-dac_override,-dac_read_search,-fowner"
        command = ["setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}", *command]
    for path in locked:
        path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    try:
        child = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    finally:
        for path in locked:
            path.chmod(path.stat().st_mode | stat.S_IWUSR)
    assert child.returncode == 0, child.stderr[-3000:]
    return json.loads(child.stdout.strip().splitlines()[-1]), child.stderr


def _install(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the package without any numba cache files, and an empty home."""
    package = tmp_path / "site"
    shutil.copytree(
        ROOT / "src" / "pretrain", package / "pretrain", ignore=shutil.ignore_patterns("__pycache__")
    )
    home = tmp_path / "home"
    home.mkdir()
    return package, home


def test_read_only_install_without_a_cache_folder_compiles_uncached_with_one_warning(tmp_path):
    package, home = _install(tmp_path)
    result, stderr = _run(tmp_path, package, home, read_only=True)
    assert result == {
        "cached": False,
        "kernels": True,  # still compiled: not the pure-Python planners
        "lengths": [3, 1, 3, 3],
        "module": str(package / "pretrain" / "data" / "batching" / "packing_kernels.py"),
    }
    assert stderr.count("numba cannot cache the packing kernels") == 1 and "NUMBA_CACHE_DIR" in stderr
    assert not list(package.rglob("*.nbi")) and not list(home.rglob("*.nbi"))  # nothing written


def test_a_writable_install_caches_beside_the_module(tmp_path):
    package, home = _install(tmp_path)
    result, stderr = _run(tmp_path, package, home, read_only=False)
    assert result["cached"] and result["kernels"] and result["lengths"] == [3, 1, 3, 3]
    assert "numba cannot cache" not in stderr
    cached = package / "pretrain" / "data" / "batching" / "__pycache__"
    assert list(cached.glob("packing_kernels.chunk_table_kernel-*.nbi"))
