"""How busy this machine's CPUs are: the 1-minute load average per CPU (a run's `sys/load_per_cpu`,
the note `python train.py` prints at launch, compare's UNRELIABLE time rows) and the level above which
the CPUs count as contended. Standard library only: the launch reads it before anything heavy."""

from __future__ import annotations

import os

CONTENDED = 1.5
"""A load per CPU above this shares the CPUs with other work (a run's own threads make about 1): its
times measure the machine's load as much as the run (compare marks such runs, the launch says so)."""


def load_per_cpu() -> float | None:
    """The 1-minute load average over `os.cpu_count()`; None where the system has no load average."""
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except (OSError, AttributeError):
        return None
