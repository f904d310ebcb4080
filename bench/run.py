"""`make bench`: run every bench/bench_*.py (or those named), write bench/results/<name>.json, print tables.

Each benchmark module defines `NAME` and `run() -> dict` with at least `rows` (a list of flat dicts,
printed as a table) and anything else worth keeping in the JSON (targets, verdicts, settings).
"""

from __future__ import annotations

import importlib.util
import json
import platform
import sys
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

BENCH_DIR = Path(__file__).resolve().parent
RESULTS = BENCH_DIR / "results"


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def benchmarks() -> list[Path]:
    """Every bench/bench_<name>.py, in name order; each defines NAME = "<name>" and run()."""
    return sorted(BENCH_DIR.glob("bench_*.py"))


def name_of(path: Path) -> str:
    return path.stem.removeprefix("bench_")


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def print_table(console: Console, title: str, rows: list[dict]) -> None:
    table = Table(title=title)
    columns = list(dict.fromkeys(k for row in rows for k in row))
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*(_fmt(row.get(c, "")) for c in columns))
    console.print(table)


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(BENCH_DIR))
    RESULTS.mkdir(parents=True, exist_ok=True)
    wanted = set(argv)
    console = Console(width=None if sys.stdout.isatty() else 180)
    paths = benchmarks()
    unknown = wanted - {p.stem for p in paths} - {name_of(p) for p in paths}
    if unknown:
        names = ", ".join(name_of(p) for p in paths)
        print(f"error: no benchmark {', '.join(sorted(unknown))}; choose from {names}", file=sys.stderr)
        return 2
    for path in paths:
        if wanted and name_of(path) not in wanted and path.stem not in wanted:
            continue  # only the named ones are imported: one benchmark's imports cannot stop another
        module = _load(path)
        name = module.NAME
        console.rule(f"[bold]{name}")
        started = time.perf_counter()
        result = module.run()
        result.setdefault("meta", {}).update(
            seconds=round(time.perf_counter() - started, 2),
            torch=torch.__version__,
            python=platform.python_version(),
            machine=platform.machine(),
            cpus=torch.get_num_threads(),
        )
        (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2, default=float) + "\n")
        print_table(console, name, result["rows"])
        for line in result.get("summary", []):
            console.print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
