"""Build a cache's files from its source: read, tokenize, dedup, split, write, in source order
(and, with split.decontaminate, drop validation's verbatim leaks: decontaminate.py).

`prepare.prepare_cache` calls `build_cache` inside a private temporary directory and renames it into
place only when it is complete, so a kill or an exception at any moment leaves nothing that verifies.
The encoding runs in this process or in `prepare.num_proc` workers (executors.py); this process
consumes the encoded parts in source order (collect.py); with `prepare.tasks` > 1 the parts come from
the tasks' part files instead (staging.py). Memory stays flat: tokens go straight to disk, and only
the set of seen document digests grows (32 bytes a document).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from ... import __version__
from ...errors import SourceError
from ..sources import source_from_config
from .cache import SPLITS, CacheSpec, new_manifest, write_manifest
from .collect import BuildStats, Collector
from .decontaminate import decontaminate
from .encode import Encoded
from .executors import Job, encoded_parts
from .prepare_settings import resolve_num_proc
from .progress import progress_bar
from .staging import staged_parts
from .writer import SplitWriter


def _encoded(spec: CacheSpec, source, stats: BuildStats) -> Iterator[Encoded]:
    """The encoded parts in source order: the tasks' staged part files (prepare.tasks > 1), else the
    source encoded here (in process or by spawned workers)."""
    settings = spec.prepare
    if settings.tasks > 1:
        return staged_parts(spec, stats)
    else:
        job = Job(
            source=source,
            tokenizer_files=spec.tokenizer_files,
            split=spec.identity["split"],
            dtype=str(spec.identity["dtype"]),
            encoder=settings.encoder,
            workers=resolve_num_proc(settings, source),
            parent_pid=os.getpid(),
            chat=spec.chat,
        )
        return encoded_parts(job, stats, per_part=False)


def build_cache(spec: CacheSpec, directory: Path, *, progress: bool = True) -> dict:
    """Tokenize the source into `directory` (which must be new) and write the manifest last.

    With `prepare.tasks` > 1 (and no `prepare.task`) the documents come from the tasks' part files
    in the staging directory instead of the source (see `staging.prepare_task`).
    """
    settings = spec.prepare
    source = source_from_config(spec.source, settings.part_sizes)
    budgets = spec.identity["budget"]
    writers = {
        s: SplitWriter(
            directory, s, budgets[f"{s}_tokens"], token_dtype=spec.token_dtype, masked=spec.chat is not None
        )
        for s in SPLITS
    }
    stats = BuildStats(tasks=settings.tasks)
    collector = Collector(writers, stats)
    total = None if None in budgets.values() else sum(budgets.values())
    started = time.perf_counter()
    try:
        with progress_bar(progress) as bar:
            line = bar.add_task("prepare", total=total, docs=0, rate=0.0)
            parts = _encoded(spec, source, stats)
            try:
                for part in parts:
                    stop = collector.add(part)
                    produced = sum(w.tokens for w in writers.values())
                    rate = produced / max(time.perf_counter() - started, 1e-9)
                    docs = sum(w.documents for w in writers.values())
                    bar.update(line, completed=produced, docs=docs, rate=rate)
                    if stop:
                        break  # stop reading the source: both budgets are met
            finally:
                close = getattr(parts, "close", None)
                if close is not None:
                    close()  # stops the workers (or the reader thread) now
        if not any(w.documents for w in writers.values()):
            raise SourceError(
                f"{source.describe()} has no usable document: {stats.read:,} read, {stats.empty:,} of "
                "them empty or blank; give it rows whose `text` is not blank"
            )
    except BaseException:
        for writer in writers.values():
            writer.abort()
        raise
    splits = {s: w.close() for s, w in writers.items()}
    build = _build_record(spec, stats, started)
    window = (spec.identity["split"].get("decontaminate") or {}).get("leak_window")
    if window is not None:
        splits, build["decontamination"] = decontaminate(directory, splits, spec.identity, int(window))
    manifest = new_manifest(spec, splits, build)
    write_manifest(directory, manifest)
    return manifest


def _build_record(spec: CacheSpec, stats: BuildStats, started: float) -> dict:
    """The manifest's `build` entry: what the build read, skipped and took, and with what."""
    return {
        "documents_read": stats.read,
        "duplicates_skipped": stats.duplicates,
        "empty_skipped": stats.empty,
        "over_budget_skipped": stats.over_budget,
        **({"special_text_skipped": stats.special_text} if spec.chat is not None else {}),
        "seconds": round(time.perf_counter() - started, 3),
        "encoder": stats.encoder,
        "cross_checked_documents": stats.cross_checked,
        "num_proc": stats.num_proc,
        "tasks": stats.tasks,
        "worker_peak_rss_mib": stats.worker_peak_rss_mib,
        "tokenizer_files": spec.tokenizer_files.fingerprint(),
        "pretrain_version": __version__,
        "python": sys.version.split()[0],
    }
