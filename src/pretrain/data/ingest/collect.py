"""Consuming encoded parts strictly in source order: exact dedup on the digests, the budgets (whole
documents in source order until each split's budget is met) and the writes. Cheap work on arrays, in
the building process, so the cache is byte-identical for any number of workers or tasks."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .encode import Encoded
from .writer import SplitWriter


@dataclass
class BuildStats:
    read: int = 0
    duplicates: int = 0
    empty: int = 0
    over_budget: int = 0
    special_text: int = 0  # task=sft: conversations left out (a message holds a special token's text)
    cross_checked: int = 0
    encoder: str = ""
    num_proc: int = 1
    tasks: int = 1
    worker_peak_rss_mib: float | None = None


class Collector:
    """Dedup, budgets and writes, document by document in source order."""

    def __init__(self, writers: dict[str, SplitWriter], stats: BuildStats):
        self.writers, self.stats = writers, stats
        self.seen: set[bytes] = set()  # 32 bytes a document: the only memory that grows

    @property
    def done(self) -> bool:
        return all(w.full for w in self.writers.values())

    def add(self, part: Encoded) -> bool:
        """Take one encoded part; True once both budgets are met (read no further)."""
        if self.done:
            return True
        stats, seen = self.stats, self.seen
        writers = (self.writers["train"], self.writers["validation"])
        budgets = [w.budget for w in writers]
        totals = [w.tokens for w in writers]
        full = [w.full for w in writers]
        n = len(part.lengths)
        keep = np.zeros(n, dtype=bool)
        lengths, validation, digests = part.lengths.tolist(), part.validation.tolist(), part.digests
        processed, stopped = n, False
        for j in range(n):
            digest = digests[32 * j : 32 * j + 32]
            if digest in seen:
                stats.duplicates += 1
                continue
            seen.add(digest)
            s = int(validation[j])
            if full[s]:
                stats.over_budget += 1
                continue
            keep[j] = True
            totals[s] += lengths[j]
            budget = budgets[s]
            if budget is not None and totals[s] >= budget:
                full[s] = True
                if full[1 - s]:
                    processed, stopped = j + 1, True
                    break
        rows = int(part.doc_rows[processed - 1]) + 1 if stopped else part.rows
        stats.read += rows
        stats.empty += rows - processed
        if part.special_text and not stopped:  # left out by the chat encoder, not blank
            stats.empty -= part.special_text
            stats.special_text += part.special_text
        for s, writer in enumerate(writers):
            chosen = keep & (part.validation == bool(s))
            count = int(chosen.sum())
            if not count:
                continue
            if count == n:
                tokens, mask = part.tokens, part.mask
            else:
                rows_kept = np.repeat(chosen, part.lengths)
                tokens = part.tokens[rows_kept]
                mask = part.mask[rows_kept] if part.mask is not None else None
            ids = [digests[32 * j : 32 * j + 32].hex() for j in np.flatnonzero(chosen).tolist()]
            writer.write_many(ids, tokens, part.lengths[chosen], mask=mask)
        return stopped or self.done
