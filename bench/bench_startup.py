"""Start-up before the first step: the imports a training run pays, and the numba kernels' compile.

Imports: fresh interpreters, `-X importtime`, the variants taken in turn for several rounds (a shared
machine's load hits all alike), the fastest round counting. `lean` is what a run imports now
(pretrain.training installs training/lean_imports.py before Lightning); `integrations on` imports
torchmetrics first, so that it loads transformers and matplotlib as it did before. Per variant: wall
and CPU seconds, the cumulative import time of the heaviest packages, and which optional packages
got loaded. Kernels: `python -m pretrain.data.batching.packing_kernels` with an empty NUMBA_CACHE_DIR (a first
run that compiles, as before `make install` compiled them ahead) and then again (the cache loaded).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

NAME = "startup"
ROUNDS = 3
SRC = Path(__file__).resolve().parents[1] / "src"
TRAINING = "import pretrain.training.run, pretrain.training.module, pretrain.training.loggers"
VARIANTS = {
    "training, lean": TRAINING,
    "training, integrations on": f"import torchmetrics; {TRAINING}",
    "pretrain CLI": "import pretrain.cli.command",  # the parser and every subcommand (cli/ loads lazily)
}
WATCHED = [
    "lightning",
    "torch",
    "torchmetrics",
    "transformers",
    "matplotlib",
    "sympy",
    "torch._dynamo",
    "wandb",
    "scipy",
]
OPTIONAL = ["transformers", "matplotlib", "scipy", "sympy", "torch._dynamo", "wandb"]


def _env(**extra: str) -> dict[str, str]:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH")) if p)
    )
    env.update(extra)
    return env


def _import_once(statement: str) -> dict:
    code = (
        "import json, resource, sys, time\n"
        "wall = time.perf_counter()\n"
        f"{statement}\n"
        "usage = resource.getrusage(resource.RUSAGE_SELF)\n"
        "print(json.dumps({'wall': time.perf_counter() - wall, 'cpu': usage.ru_utime + usage.ru_stime,\n"
        f"                 'loaded': [m for m in {OPTIONAL!r} if m in sys.modules]}}))\n"
    )
    child = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        env=_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(child.stdout.strip().splitlines()[-1])
    cumulative: dict[str, float] = {}
    for line in child.stderr.splitlines():  # "import time: self [us] | cumulative | name"
        match = re.match(r"import time:\s+(\d+) \|\s+(\d+) \| (\s*)(\S+)", line)
        # A package's outermost line (its own, or its first submodule's when the package's line is
        # missing, as torchmetrics' is when imported through importlib by Lightning).
        if not match:
            continue
        for name in WATCHED:
            if match.group(4) == name or match.group(4).startswith(name + "."):
                cumulative[name] = max(cumulative.get(name, 0.0), int(match.group(2)) / 1e6)
    result["cumulative"] = cumulative
    return result


def _kernels(cache_dir: str) -> float:
    child = subprocess.run(
        [sys.executable, "-m", "pretrain.data.batching.packing_kernels"],
        env=_env(NUMBA_CACHE_DIR=cache_dir),
        capture_output=True,
        text=True,
        check=True,
    )
    ready = re.search(r"ready in ([\d.]+) s", child.stdout)
    assert ready, child.stdout
    return float(ready.group(1))


def run(rounds: int = ROUNDS) -> dict:
    runs: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    for _ in range(rounds):
        for name, statement in VARIANTS.items():
            runs[name].append(_import_once(statement))
    rows = []
    for name, results in runs.items():
        best = min(results, key=lambda r: r["cpu"])
        rows.append(
            {
                "what": f"import: {name}",
                "wall s": round(best["wall"], 2),
                "cpu s": round(best["cpu"], 2),
                **{
                    f"{m} s": round(best["cumulative"].get(m, 0.0), 2)
                    for m in ("torch", "lightning", "torchmetrics", "transformers")
                },
                "optional loaded": ", ".join(best["loaded"]) or "-",
            }
        )
    with tempfile.TemporaryDirectory() as cache:
        cold, warm = _kernels(cache), _kernels(cache)
    rows.append({"what": "numba kernels: first run, empty cache (compile)", "wall s": round(cold, 2)})
    rows.append({"what": "numba kernels: cache compiled ahead (load)", "wall s": round(warm, 2)})
    lean, before = rows[0]["cpu s"], rows[1]["cpu s"]
    return {
        "rows": rows,
        "runs": runs,
        "kernels": {"compile_seconds": cold, "cached_seconds": warm},
        "summary": [
            f"fresh interpreters, fastest of {rounds} rounds (by CPU seconds); wall includes waiting on a "
            "shared machine",
            f"training imports: lean {lean:.2f} CPU s vs integrations on {before:.2f} CPU s "
            f"({before / lean:.2f}x); numba kernels: compile {cold:.1f} s vs cached {warm:.1f} s",
        ],
    }


if __name__ == "__main__":
    for row in run()["rows"]:
        print(row)
