"""Start-up imports: a training run does not pay for integrations it does not use."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OPTIONAL = ["transformers", "matplotlib", "wandb", "datasets", "scipy"]
# torchmetrics' flags for the integrations it imports at start-up when they are installed.
FLAGS = (
    "import torchmetrics.utilities.imports as f\n"
    "flags = [bool(f._TRANSFORMERS_AVAILABLE), bool(f._MATPLOTLIB_AVAILABLE)]"
)


def _fresh(statement: str) -> dict:
    """After `statement` in a fresh interpreter: which of OPTIONAL and lightning are loaded, and
    torchmetrics' two flags (this test process has imported who knows what)."""
    names = [*OPTIONAL, "lightning"]
    report = f"print(json.dumps([{{m: m in sys.modules for m in {names!r}}}, flags]))"
    code = f"import json, sys\n{statement}\n{FLAGS}\n{report}"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    loaded, flags = json.loads(out.stdout.strip().splitlines()[-1])
    return {"loaded": loaded, "flags": flags}


def test_training_imports_lightning_without_transformers_matplotlib_wandb_or_scipy():
    seen = _fresh("import pretrain.training.run, pretrain.training.module, pretrain.training.loggers")
    assert seen["loaded"].pop("lightning")
    assert not any(seen["loaded"].values()), seen["loaded"]
    assert seen["flags"] == [False, False]  # torchmetrics loaded with both integrations marked absent


def test_torchmetrics_is_untouched_without_pretrain_training():
    # Both integrations are installed here (the hf and dev extras): plain torchmetrics sees them,
    # and imports scipy (scipy.signal, for an audio metric's dependency) as it starts.
    plain = _fresh("")
    assert plain["flags"] == [True, True]
    assert plain["loaded"]["scipy"]
