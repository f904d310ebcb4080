"""The one scoring loop of a model over batches: training's val/loss and `pretrain eval` (evaluate.py)
both sum the cross-entropy of every counted target with it, with a progress line when it takes long."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable

import torch

from ..data.batch import PackedBatch
from ..model import GPT


class ScoringProgress:
    """A line on stderr every `every` seconds while batches are scored (`label: 12/40 batches, 10 s`),
    and one at the end when any was printed: a long validation or eval is never silent."""

    def __init__(self, label: str, total: int | None = None, every: float = 5.0, stream=None):
        self.label, self.total, self.every = label, total, every
        self.stream = stream
        self.started = time.perf_counter()
        self.next_line = self.started + every
        self.printed = False

    def _say(self, done: int) -> None:
        of = f"/{self.total}" if self.total is not None else ""
        seconds = time.perf_counter() - self.started
        print(
            f"{self.label}: {done}{of} batches, {seconds:.0f} s", file=self.stream or sys.stderr, flush=True
        )
        self.printed = True

    def update(self, done: int) -> None:
        if time.perf_counter() >= self.next_line:
            self._say(done)
            self.next_line = time.perf_counter() + self.every

    def close(self, done: int) -> None:
        if self.printed:
            self._say(done)


def score_batches(
    model: GPT, batches: Iterable[PackedBatch], device: torch.device, progress: ScoringProgress | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The one scoring loop (training's val/loss and `pretrain eval`): the summed cross-entropy of
    every counted target of `batches` and their count, both float64 on `device` (each batch's sum
    is taken in the model's dtype, then accumulated in float64). The model is scored in eval mode
    and left in the mode it was in."""
    was_training = model.training
    model.eval()
    nats = torch.zeros((), dtype=torch.float64, device=device)
    targets = torch.zeros((), dtype=torch.float64, device=device)
    done = 0
    try:
        with torch.no_grad():
            for batch in batches:
                nats += model.token_losses(batch.to(device)).sum().double()
                targets += float(batch.num_targets)
                done += 1
                if progress is not None:
                    progress.update(done)
    finally:
        model.train(was_training)
    if progress is not None:
        progress.close(done)
    return nats, targets
