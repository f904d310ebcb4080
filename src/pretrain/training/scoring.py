"""The one scoring loop of a model over batches: training's val/loss and `pretrain eval` (evaluate.py)
both sum the cross-entropy of every counted target with it, with a progress line when it takes long.

Given each counted target's position in its original document (the pair's input token, 0-based), the
same loop also splits the sums by `POSITION_BUCKETS` (`val/loss_by_position/<bucket>`): what chunking
costs a long document's later tokens. The per-token losses it already computes are bucketed in place,
so neither a second forward pass nor more memory than one batch's."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch

from ..data.batching.batch import IGNORE_INDEX, PackedBatch
from ..model import Decoder


class ScoringProgress:
    """A line on stderr every `every` seconds while batches are scored (`label: 12/40 batches, 10 s`),
    and one at the end when any was printed: a long validation or eval is never silent."""

    def __init__(self, label: str, total: int | None = None, every: float = 5.0, stream=None):
        self.label, self.total, self.every = label, total, every
        self.stream = stream
        self.started = time.perf_counter()
        self.next_line = self.started + every
        self.printed = False
        self.said: int | None = None  # the count the last line gave: the closing line never repeats it
        self.base = 0  # batches of the sets scored before (a mixture's validation sets share one count)

    def _say(self, done: int) -> None:
        of = f"/{self.total}" if self.total is not None else ""
        seconds = time.perf_counter() - self.started
        print(
            f"{self.label}: {done}{of} batches, {seconds:.0f} s", file=self.stream or sys.stderr, flush=True
        )
        self.printed = True
        self.said = done

    def update(self, done: int) -> None:
        if time.perf_counter() >= self.next_line:
            self._say(self.base + done)
            self.next_line = time.perf_counter() + self.every

    def close(self, done: int) -> None:
        self.base += done
        if self.printed and self.said != self.base:
            self._say(self.base)


# Upper bounds (exclusive) of the position buckets; the last bucket is open.
POSITION_EDGES = (64, 256, 1024, 4096)
POSITION_BUCKETS = ("0-63", "64-255", "256-1023", "1024-4095", "4096+")


def position_buckets(positions: np.ndarray) -> np.ndarray:
    """Bucket index (into POSITION_BUCKETS) of each in-document position."""
    return np.searchsorted(np.asarray(POSITION_EDGES), np.asarray(positions, dtype=np.int64), side="right")


@dataclass
class ScoreSums:
    """float64 sums on the scoring device: cross-entropy (nats) and counted targets, in total and
    per position bucket (zeros when the positions were not given)."""

    nats: torch.Tensor  # ()
    targets: torch.Tensor  # ()
    nats_by_position: torch.Tensor  # (len(POSITION_BUCKETS),)
    targets_by_position: torch.Tensor  # (len(POSITION_BUCKETS),)

    def stacked(self) -> torch.Tensor:
        """One flat tensor (one all-reduce for all sums); `from_stacked` undoes it."""
        return torch.cat(
            [self.nats[None], self.targets[None], self.nats_by_position, self.targets_by_position]
        )

    @classmethod
    def from_stacked(cls, flat: torch.Tensor) -> ScoreSums:
        n = len(POSITION_BUCKETS)
        return cls(flat[0], flat[1], flat[2 : 2 + n], flat[2 + n : 2 + 2 * n])

    @property
    def loss(self) -> float | None:
        """Mean cross-entropy per counted target (None without one)."""
        return float(self.nats / self.targets) if self.targets > 0 else None

    def loss_by_position(self) -> dict[str, float]:
        """Mean cross-entropy of each bucket that holds a target (a bucket without one is left out)."""
        pairs = zip(self.nats_by_position.tolist(), self.targets_by_position.tolist(), strict=True)
        return {
            name: nats / count for name, (nats, count) in zip(POSITION_BUCKETS, pairs, strict=True) if count
        }

    def count_by_position(self) -> dict[str, int]:
        counts = self.targets_by_position.tolist()
        return {name: int(count) for name, count in zip(POSITION_BUCKETS, counts, strict=True)}


def _row_buckets(batch: PackedBatch, positions: np.ndarray) -> torch.Tensor:
    """(T,) bucket of every row of `batch`; rows without a counted target go to an extra bucket that
    is dropped. `positions` are the counted targets' in-document positions in row order."""
    counted = np.flatnonzero(batch.targets.numpy() != IGNORE_INDEX)
    if len(counted) != len(positions):
        raise ValueError(f"{len(positions)} positions for a batch of {len(counted)} counted targets")
    rows = np.full(batch.num_tokens, len(POSITION_BUCKETS), dtype=np.int64)
    rows[counted] = position_buckets(positions)
    return torch.from_numpy(rows)


def score_batches(
    model: Decoder,
    batches: Iterable[PackedBatch],
    device: torch.device,
    progress: ScoringProgress | None = None,
    positions: Iterable[np.ndarray] | None = None,
) -> ScoreSums:
    """The one scoring loop (training's val/loss and `pretrain eval`): the summed cross-entropy of
    every counted target of `batches` and their count, float64 on `device` (every token's loss is
    summed in float64, in total as in the buckets: the buckets' count-weighted mean is the loss to
    float64 rounding). `positions`: per batch, the in-document
    position of each counted target in row order (data/batching/evaluation.py's `evaluation_positions`),
    which splits the sums by position bucket. The model is scored in eval mode and left in the mode
    it was in."""
    was_training = model.training
    model.eval()
    buckets = len(POSITION_BUCKETS)
    nats = torch.zeros((), dtype=torch.float64, device=device)
    targets = torch.zeros((), dtype=torch.float64, device=device)
    bucket_nats = torch.zeros(buckets + 1, dtype=torch.float64, device=device)  # + rows without target
    bucket_targets = torch.zeros(buckets + 1, dtype=torch.float64)
    where = iter(positions) if positions is not None else None
    done = 0
    try:
        with torch.no_grad():
            for batch in batches:
                losses = model.token_losses(batch.to(device))
                nats += losses.double().sum()  # per token in float64, as the buckets are
                targets += float(batch.num_targets)
                if where is not None:
                    rows = _row_buckets(batch, next(where))
                    bucket_nats.index_add_(0, rows.to(device, non_blocking=True), losses.double())
                    bucket_targets += torch.bincount(rows, minlength=buckets + 1).double()
                done += 1
                if progress is not None:
                    progress.update(done)
    finally:
        model.train(was_training)
    if progress is not None:
        progress.close(done)
    return ScoreSums(nats, targets, bucket_nats[:buckets], bucket_targets[:buckets].to(device))
