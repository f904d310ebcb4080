"""Every benchmark `make bench` runs imports against today's package and has the shape bench/run.py
relies on (a refactor that moves a name breaks `make bench`, which no other tier runs)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))
import run as bench_run  # noqa: E402  (bench/run.py, found through the path above)

MODULES = bench_run.benchmarks()


def test_benchmarks_are_found():
    assert len(MODULES) >= 10 and all(p.name.startswith("bench_") for p in MODULES)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.stem)
def test_benchmark_imports_with_its_name_and_run(path: Path):
    spec = importlib.util.spec_from_file_location(f"_bench_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.NAME == bench_run.name_of(path)
    assert callable(module.run)


def test_an_unknown_benchmark_is_refused_naming_the_choices():
    done = subprocess.run(
        [sys.executable, str(BENCH / "run.py"), "no_such_bench"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2
    assert "no benchmark no_such_bench" in done.stderr and "fixed_costs" in done.stderr
