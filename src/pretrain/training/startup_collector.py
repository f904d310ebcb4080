"""The cyclic garbage collector during a run's start-up: paused, then the start-up's objects frozen.

A run imports ~2,900 modules (torch, torch._dynamo, sympy, Lightning, Hydra) and composes its config
with OmegaConf's deep copies; every full collection in that time walks the whole, still growing
heap: with it on, launch to first step takes 1.2x as long (bench/bench_fixed_costs.py, the
"collector paused / on" rows). train.py pauses the collector in its first lines (`pause`); once the
run's settings are known (its imports and config done, before any cache is built or batch made)
`resume` moves everything alive into the permanent generation (`gc.freeze`) and turns the
collector back on, so later collections, in the cache build and the training loop alike, walk only
what was made after it. What start-up left as cyclic garbage stays (a few MB to ~20 MB: the bench's
peak RSS row beside it). A multirun resumes before it composes its jobs' configs (their garbage is
a sweep's, not a start-up's). Nothing happens unless `pause` was called: `train()` from a test, or a
notebook, keeps the collector as it was.
"""

from __future__ import annotations

import gc

_paused = False


def pause() -> None:
    """Stop automatic collections until `resume` (train.py's first lines)."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def resume() -> None:
    """Freeze what start-up made and collect again as usual (only after this module's own `pause`)."""
    global _paused
    if _paused:
        _paused = False
        gc.freeze()
        gc.enable()
