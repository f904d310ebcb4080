"""data.long_docs=truncate on conversations (task=sft): a conversation longer than the context keeps
its longest prefix of whole exchanges that fits, never a reply cut in the middle.

The cache marks, in each token's loss-mask byte, where whole exchanges end (the CUT bit, written by
data/ingest/chat.py after every assistant reply). A conversation of more than max_seq_len pairs keeps
the tokens before its last cut at or below max_seq_len + 1 (so at most max_seq_len pairs); one whose
first reply already ends beyond that is left out (nothing whole of it fits). The result is a view of
the split (the same token file, another index), which every policy then lays out as it would any
split: each conversation fits one chunk, so `truncate` has nothing further to cut.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..tokens import CUT, TokenSplit

BLOCK = 4096  # long conversations examined at once: BLOCK x (max_seq_len + 2) bytes


@dataclass(frozen=True)
class ExchangeCuts:
    """What cutting at whole exchanges did to a split (the audit reports it)."""

    cut: int  # conversations shortened to their whole exchanges
    dropped: int  # conversations left out: their first reply does not fit
    dropped_pairs: int  # prediction pairs no batch holds (the cut tails and the dropped conversations)


def whole_exchanges(split: TokenSplit, max_seq_len: int) -> tuple[TokenSplit, ExchangeCuts]:
    """The split with each conversation of more than `max_seq_len` pairs cut at its last whole
    exchange that fits (or left out), and what that cost."""
    if split.loss_mask is None:
        raise ValueError("whole_exchanges needs a split with a loss mask (a task=sft cache)")
    lengths = np.asarray(split.lengths, dtype=np.int64).copy()
    long = np.flatnonzero(lengths - 1 > max_seq_len)
    window = np.arange(max_seq_len + 2, dtype=np.int64)  # token positions 0 .. max_seq_len + 1
    for first in range(0, len(long), BLOCK):
        docs = long[first : first + BLOCK]
        bytes_ = np.asarray(split.loss_mask[split.offsets[docs][:, None] + window[None, :]])
        cuts = (bytes_ & CUT).astype(bool)
        cuts[:, :2] = False  # a cut before token 0 or 1 keeps no pair
        last = max_seq_len + 1 - np.argmax(cuts[:, ::-1], axis=1)
        lengths[docs] = np.where(cuts.any(axis=1), last, 0)
    keep = np.flatnonzero(lengths >= 2)
    dropped_pairs = int(split.num_pairs - (lengths[keep] - 1).sum())
    report = ExchangeCuts(
        cut=int((lengths[long] >= 2).sum()), dropped=len(lengths) - len(keep), dropped_pairs=dropped_pairs
    )
    return split.view(keep, lengths[keep]), report
