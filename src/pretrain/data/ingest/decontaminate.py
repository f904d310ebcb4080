"""`split.decontaminate=true`: the validation split without its verbatim leaks.

After both splits are written (builder.py, inside the build's private directory), every validation
document that shares a run of `split.leak_window` tokens with a train document (data/leaks.py, what
inspect-data counts as `verbatim_leaks`) is dropped, and the validation files are written again
without them. The validation budget was spent before the drop: the split ends that many tokens short
of it. The manifest's `build.decontamination` records the window and what was dropped.

Cost: the check hashes every train token once (64 multiply-adds per token in numpy) and sorts each
block's hashes; the validation hashes stay in memory (8 bytes per validation token). docs/data.md
has the measured rate and what it means at 10B tokens.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

from ...arrays import run_positions
from ..leaks import leaked_documents
from ..tokens import TokenSplit
from .cache import Cache
from .writer import SplitWriter, split_files

_WRITE_DOCUMENTS = 4096  # documents copied per write


def _split(directory: Path, splits: dict, identity: dict, name: str) -> TokenSplit:
    """A split of the build's directory, opened before its manifest exists."""
    provisional = {"splits": splits, "token_dtype": identity["dtype"], "identity": identity}
    return Cache(Path(directory), provisional).split(name)


def _rewrite(directory: Path, validation: TokenSplit, keep: np.ndarray, dtype: np.dtype) -> dict:
    """Write the `keep` documents of `validation` to fresh files and move them over the old ones."""
    staging = Path(directory) / ".decontaminated"
    staging.mkdir()
    writer = SplitWriter(staging, "validation", None, token_dtype=dtype)
    ids = list(validation.ids)
    try:
        for first in range(0, len(keep), _WRITE_DOCUMENTS):
            chosen = keep[first : first + _WRITE_DOCUMENTS]
            lengths = validation.lengths[chosen]
            where = np.repeat(validation.offsets[chosen], lengths) + run_positions(lengths)
            writer.write_many([ids[i] for i in chosen], np.asarray(validation.tokens[where]), lengths)
    except BaseException:
        writer.abort()
        raise
    entry = writer.close()
    for name in split_files("validation").values():
        os.replace(staging / name, Path(directory) / name)
    staging.rmdir()
    return entry


def decontaminate(directory: Path, splits: dict, identity: dict, window: int) -> tuple[dict, dict]:
    """(the splits' manifest entries after the drop, the `build.decontamination` record)."""
    started = time.perf_counter()
    train = _split(directory, splits, identity, "train")
    validation = _split(directory, splits, identity, "validation")
    leaked = leaked_documents(train, validation, window)
    record = {
        "leak_window": window,
        "dropped_documents": len(leaked),
        "dropped_tokens": int(validation.lengths[leaked].sum()),
        "dropped_ids": [validation.ids[i] for i in leaked],
        "train_tokens_checked": train.num_tokens,
    }
    if len(leaked):
        keep = np.setdiff1d(np.arange(len(validation)), leaked)
        del train  # its memory map: the files are replaced below
        dtype = np.dtype(identity["dtype"]).newbyteorder("<")
        splits = {**splits, "validation": _rewrite(directory, validation, keep, dtype)}
    record["seconds"] = round(time.perf_counter() - started, 3)
    print(
        f"split.decontaminate: dropped {len(leaked):,} of {len(validation):,} validation documents "
        f"({record['dropped_tokens']:,} tokens) sharing a {window}-token run with train "
        f"({record['train_tokens_checked']:,} train tokens checked in {record['seconds']:.1f} s)",
        file=sys.stderr,
        flush=True,
    )
    return splits, record
