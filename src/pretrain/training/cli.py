"""What `train.py` runs under Hydra: train, then tell the user where everything went."""

from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console


def train_main(cfg) -> dict | None:
    from hydra.core.hydra_config import HydraConfig

    from ..cli import user_errors
    from .run import train

    try:
        summary = train(cfg)
    except user_errors() as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    if not summary["is_global_zero"]:
        return summary
    console = Console(stderr=True)
    output = Path(summary["output_dir"])
    if HydraConfig.get().mode.name == "RUN":
        from .compare import compare

        plot = compare([output], output=output / "compare.png", quiet=True)
        console.print(f"comparison plot: {plot}")
    metrics = summary["metrics"]
    console.print(
        f"[bold]done[/bold]: {summary['steps']} steps, {summary['tokens']:,} real tokens, "
        f"train/loss {metrics.get('train/loss', float('nan')):.3f}, val/loss {metrics.get('val/loss', float('nan')):.3f}"
    )
    console.print(f"outputs: {output}\ncheckpoint: {summary['checkpoint']}\nmetrics: {output / 'metrics.csv'}")
    return summary
