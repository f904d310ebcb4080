"""Variable-sequence-length curricula: in which order the updates of an epoch visit the length buckets.

A curriculum gets the number of whole updates each bucket holds (bucket 0 the shortest length) and
returns one bucket id per update, in epoch order; bucket b appears exactly `blocks[b]` times. All three
are seeded by the epoch's generator, so every rank computes the same schedule.

* `natural`: a uniform shuffle of all updates, i.e. each update draws a bucket in proportion to the
  tokens it has left (Pouransari et al. 2024; OLMo-core's `VSLNaturalCurriculum`).
* `grow_p2`: `cycles` cycles, each of one sub-cycle per possible bucket; a bucket's updates are spread
  evenly over the cycles and, inside a cycle, over its sub-cycles with odds 2^(e-1) that make the first
  sub-cycles mostly short and the last mostly long (OLMo-core's `VSLGrowP2Curriculum`, same odds);
  each sub-cycle is shuffled.
* `uniform`: rounds of one update from every bucket that has one left, each round shuffled: every
  bucket equally often until it is empty.
"""

from __future__ import annotations

from enum import StrEnum

import numpy as np


class Curriculum(StrEnum):
    """`data.curriculum` (data=vsl): which bucket each optimizer update draws from."""

    natural = "natural"
    grow_p2 = "grow_p2"
    uniform = "uniform"


def even_split(count: int, parts: int) -> np.ndarray:
    """`count` split into `parts` near-equal integers, the larger first (OLMo-core's
    divide_into_buckets): 10 in 4 -> 3, 3, 2, 2."""
    base, extra = divmod(count, parts)
    return np.array([base + (i < extra) for i in range(parts)], dtype=np.int64)


def proportional_split(count: int, weights: np.ndarray) -> np.ndarray:
    """`count` split in proportion to `weights` by rounding the running total: the parts add up to
    `count` exactly (OLMo-core rounds each part and gives the last one the rest)."""
    cumulative = np.rint(np.cumsum(weights) / np.sum(weights) * count).astype(np.int64)
    return np.diff(cumulative, prepend=0)


def grow_p2_odds(bucket: int, buckets: int) -> np.ndarray:
    """Odds of `bucket` (0 = shortest of `buckets`) in each sub-cycle of a grow_p2 cycle, as
    OLMo-core's `VSLGrowP2Curriculum._get_bucket_odds_for_cycle`: the shortest bucket's odds halve
    from 2^(n-1) sub-cycle after sub-cycle, the longest's double from 1 up to 2^(n-1)."""
    start = buckets - bucket
    exponents = [
        start + sub if start + sub <= buckets else start - ((start + sub) % buckets) for sub in range(buckets)
    ]
    return np.array([2 ** (e - 1) for e in exponents], dtype=np.float64)


def _shuffled_repeat(rng: np.random.Generator, counts: np.ndarray) -> np.ndarray:
    schedule = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    rng.shuffle(schedule)
    return schedule


def schedule(curriculum: Curriculum, blocks: np.ndarray, rng: np.random.Generator, cycles: int) -> np.ndarray:
    """Bucket id of every update of the epoch, in order: bucket b appears `blocks[b]` times. `blocks`
    has one entry per possible bucket (shortest first), empty ones included: grow_p2's odds depend
    on how many lengths there are, not on which of them this split happens to fill."""
    blocks = np.asarray(blocks, dtype=np.int64)
    curriculum = Curriculum(curriculum)
    if curriculum == Curriculum.natural:
        return _shuffled_repeat(rng, blocks)
    if curriculum == Curriculum.uniform:
        rounds = np.concatenate([np.arange(n, dtype=np.float64) for n in blocks] or [np.zeros(0)])
        order = np.argsort(rounds + rng.random(len(rounds)), kind="stable")  # by round, shuffled inside
        return np.repeat(np.arange(len(blocks), dtype=np.int64), blocks)[order]
    buckets = len(blocks)
    odds = [grow_p2_odds(b, buckets) for b in range(buckets)]
    per_cycle = [even_split(int(n), cycles) for n in blocks]
    parts = []
    for cycle in range(cycles):
        # counts[b, s]: updates of bucket b in sub-cycle s of this cycle
        counts = np.stack([proportional_split(int(per_cycle[b][cycle]), odds[b]) for b in range(buckets)])
        parts += [_shuffled_repeat(rng, counts[:, sub]) for sub in range(buckets)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
