"""Multi-task prepare (`prepare.tasks=N`): each task encodes every N-th part of the source into its
part file, in a staging directory beside the cache; the assembly reads the part files in source order
(part k is the (k // N)-th record of task k % N) and builds the same cache one process would have.

A part file is written atomically (pretrain.fileio) with its sha256 beside it (`<part>.sha256`, the
format of `sha256sum`); the assembly checks every part file against it before reading any, so a
damaged or unfinished one names its task and how to rerun it, and nothing is assembled from it.

Part file: one JSON header line (format, key, tasks, task, part sizes, dtype), then per part
`PPRT` + rows, documents, tokens (int64) + doc_rows (int64) + digests (32 bytes each) + validation
(uint8) + lengths (int64) + tokens (the cache's dtype), then `PEND` + the number of parts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import numpy as np

from ...errors import CacheError
from ...fileio import atomic_write, remove_stale_temporaries, sha256_file, write_text_atomic
from ..sources import source_from_config
from .cache import CacheSpec
from .collect import BuildStats
from .encode import Encoded
from .executors import Job, encoded_parts
from .prepare_settings import resolve_num_proc
from .progress import progress_bar

PART_FILE_FORMAT = 1
_RECORD = b"PPRT"
_END = b"PEND"
_COUNTS = struct.Struct("<qqq")  # rows, documents, tokens


def staging_dir(spec: CacheSpec, tasks: int) -> Path:
    """Where the tasks of `prepare.tasks=N` put their part files: beside the cache, hidden."""
    return spec.root / f".{spec.key}.parts-{tasks}"


def part_file(spec: CacheSpec, tasks: int, task: int) -> Path:
    return staging_dir(spec, tasks) / f"part-{task:05d}-of-{tasks:05d}.bin"


def checksum_file(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _header(spec: CacheSpec, tasks: int, task: int) -> dict:
    return {
        "format": PART_FILE_FORMAT,
        "key": spec.key,
        "tasks": tasks,
        "task": task,
        # How the source is cut into parts: tasks of another partition cannot be assembled together.
        "partition": dataclasses.asdict(spec.prepare.part_sizes),
        "dtype": str(spec.identity["dtype"]),
    }


def _rerun(tasks: int, task: int) -> str:
    return (
        f"rerun that task: `pretrain prepare prepare.tasks={tasks} prepare.task={task}` with the same "
        "overrides, then assemble again"
    )


class _HashingWriter:
    """Writes to a handle and hashes what it wrote (the part file is not read back to hash it)."""

    def __init__(self, handle: IO[bytes]):
        self.handle, self.digest = handle, hashlib.sha256()

    def write(self, data: bytes) -> None:
        self.handle.write(data)
        self.digest.update(data)


def _write_record(out: _HashingWriter, part: Encoded) -> None:
    out.write(_RECORD + _COUNTS.pack(part.rows, len(part.lengths), len(part.tokens)))
    out.write(part.doc_rows.astype("<i8").tobytes())
    out.write(part.digests)
    out.write(part.validation.astype(np.uint8).tobytes())
    out.write(part.lengths.astype("<i8").tobytes())
    out.write(np.ascontiguousarray(part.tokens).tobytes())


def prepare_task(spec: CacheSpec, *, progress: bool = True) -> Path:
    """Encode task `spec.prepare.task`'s parts (every tasks-th part of the source) into its part file,
    atomically, then its sha256 beside it. Returns the part file."""
    settings = spec.prepare
    assert settings.task is not None
    path = part_file(spec, settings.tasks, settings.task)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path.parent)  # of tasks killed mid-write (their pid is gone)
    checksum_file(path).unlink(missing_ok=True)  # a part file without its sha256 is never assembled
    source = source_from_config(spec.source, settings.part_sizes)
    job = Job(
        source=source,
        tokenizer_files=spec.tokenizer_files,
        split=spec.identity["split"],
        dtype=str(spec.identity["dtype"]),
        encoder=settings.encoder,
        tasks=settings.tasks,
        task=settings.task,
        workers=resolve_num_proc(settings, source),
        parent_pid=os.getpid(),
    )
    stats = BuildStats(tasks=settings.tasks)
    count = tokens = 0
    started = time.perf_counter()
    with atomic_write(path) as handle, progress_bar(progress) as bar:
        out = _HashingWriter(handle)
        line = bar.add_task("prepare", total=None, docs=0, rate=0.0)
        out.write(json.dumps(_header(spec, settings.tasks, settings.task), sort_keys=True).encode() + b"\n")
        parts = encoded_parts(job, stats, per_part=True)
        try:
            for part in parts:
                _write_record(out, part)
                count += 1
                tokens += len(part.tokens)
                rate = tokens / max(time.perf_counter() - started, 1e-9)
                bar.update(line, completed=tokens, docs=count, rate=rate)
        finally:
            close = getattr(parts, "close", None)
            if close is not None:
                close()  # stops the workers (or the reader thread) now
        out.write(_END + struct.pack("<q", count))
    write_text_atomic(checksum_file(path), f"{out.digest.hexdigest()}  {path.name}\n")
    return path


def _check_part_file(path: Path, tasks: int, task: int) -> None:
    """The part file matches the sha256 its task wrote beside it, or the error says which task to rerun."""
    sidecar = checksum_file(path)
    try:
        recorded = sidecar.read_text().split()[0]
    except (OSError, IndexError):
        raise CacheError(
            f"the part file of task {task} ({path}) has no {sidecar.name} (its task did not finish); "
            + _rerun(tasks, task)
        ) from None
    actual = sha256_file(path)
    if actual != recorded:
        raise CacheError(
            f"the part file of task {task} ({path}) is damaged: its sha256 {actual[:16]}... is not the "
            f"{recorded[:16]}... its task wrote; delete it and " + _rerun(tasks, task)
        )


class _PartReader:
    def __init__(self, path: Path, expected: dict):
        self.path, self.task, self.tasks = path, expected["task"], expected["tasks"]
        self.dtype = np.dtype(expected["dtype"])
        self.handle = open(path, "rb")
        try:
            header = json.loads(self.handle.readline())
        except ValueError:
            header = {}
        for key, value in expected.items():
            if header.get(key) != value:
                self.handle.close()
                raise CacheError(
                    f"{path} was written for {key}={header.get(key)!r}, this prepare has {value!r}; "
                    f"delete it and rerun that task (prepare.task={expected['task']})"
                )
        self.count = 0

    def _exact(self, size: int) -> bytes:
        data = self.handle.read(size)
        if len(data) != size:
            raise CacheError(f"{self.path} is truncated; delete it and " + _rerun(self.tasks, self.task))
        return data

    def next(self) -> Encoded | None:
        magic = self._exact(4)
        if magic == _END:
            (count,) = struct.unpack("<q", self._exact(8))
            if count != self.count:
                raise CacheError(
                    f"{self.path} holds {self.count} parts, its end says {count}; delete it and "
                    + _rerun(self.tasks, self.task)
                )
            return None
        if magic != _RECORD:
            raise CacheError(
                f"{self.path} is corrupt (record {self.count}); delete it and "
                + _rerun(self.tasks, self.task)
            )
        rows, n, ntokens = _COUNTS.unpack(self._exact(_COUNTS.size))
        part = Encoded(
            rows=rows,
            doc_rows=np.frombuffer(self._exact(8 * n), dtype="<i8"),
            digests=self._exact(32 * n),
            validation=np.frombuffer(self._exact(n), dtype=np.uint8).astype(bool),
            lengths=np.frombuffer(self._exact(8 * n), dtype="<i8"),
            tokens=np.frombuffer(self._exact(self.dtype.itemsize * ntokens), dtype=self.dtype),
        )
        self.count += 1
        return part


def staged_parts(spec: CacheSpec, stats: BuildStats) -> Iterator[Encoded]:
    """The tasks' encoded parts in source order: part k is the (k // tasks)-th record of task k % tasks.
    Every part file is checked against its sha256 before the first part is yielded."""
    tasks = spec.prepare.tasks
    paths = [part_file(spec, tasks, t) for t in range(tasks)]
    missing = [t for t, p in enumerate(paths) if not p.is_file()]
    if missing:
        listed = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
        raise CacheError(
            f"prepare.tasks={tasks}: no part file of task(s) {listed} in {staging_dir(spec, tasks)}; run "
            f"`pretrain prepare prepare.tasks={tasks} prepare.task=<i>` for each (or the multirun), "
            "then this command again"
        )
    for task, path in enumerate(paths):
        _check_part_file(path, tasks, task)
    readers: list[_PartReader] = []
    try:
        for task, path in enumerate(paths):
            readers.append(_PartReader(path, _header(spec, tasks, task)))
        stats.encoder, stats.num_proc = "staged", 0
        k = 0
        while True:
            part = readers[k % tasks].next()
            if part is None:
                for reader in readers:
                    if reader is not readers[k % tasks] and reader.next() is not None:
                        raise CacheError(f"{reader.path} holds more parts than the source order allows")
                return
            yield part
            k += 1
    finally:
        for reader in readers:
            reader.handle.close()
