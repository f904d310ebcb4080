"""Build a cache's files from its source: read, tokenize, dedup, split, write, in source order.

`prepare.prepare_cache` calls `build_cache` inside a private temporary directory and renames it into
place only when it is complete, so a kill at any moment leaves nothing that verifies.

Who does what:

* The per-token and per-document work (reading rows, the sha256 of each text, its split, tokenizing,
  the arrays) is `encode_documents`, run on one *part* of the source at a time (`sources.Part`: a
  slice of pydocs, a row range of a parquet file, a byte range of a JSON lines file). With
  `prepare.num_proc` > 1 it runs in that many worker processes (spawned, never forked after torch or
  threads), part k in worker k % num_proc; with 1 it runs in a thread of this process.
* This process consumes the encoded parts strictly in source order (`Collector`): exact dedup on the
  digests, the budgets (whole documents in source order until each split's budget is met) and the
  writes. So the cache is byte-identical for any num_proc, and for the multi-task path, where
  `prepare.tasks` tasks each encode every tasks-th part into a staging file (`prepare_task`) that the
  final step assembles in the same order (`build_cache` with `prepare.tasks` > 1).

Memory stays flat: every worker is at most `QUEUE_DEPTH` parts ahead, tokens go straight to disk, and
only the set of seen document digests grows (32 bytes a document, for exact dedup). A worker that dies
stops the build within a second with an error; workers die with this process (PR_SET_PDEATHSIG, and a
watchdog on their parent's pid).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import json
import multiprocessing
import os
import queue
import signal
import struct
import sys
import threading
import time
import traceback
import types
from collections.abc import Generator, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from .. import __version__
from ..errors import CacheError, ConfigError, PretrainError, TokenizerError
from . import sources
from .cache import SPLITS, CacheSpec, new_manifest, write_manifest
from .sources import Document, Part, iter_documents, read_part
from .split import document_split
from .tokenizer import ENCODERS, Encoder, TokenizerFiles, TokenizersEncoder, build_encoder
from .tokens import EOS_TOKEN_ID
from .writer import SplitWriter

BATCH_CHARS = 1 << 20  # in-process: texts encoded at once (~250k tokens)
QUEUE_DEPTH = 4  # encoded parts a worker may be ahead of the writer
SMALL_SOURCE_BYTES = 32 << 20  # prepare.num_proc=null: local sources below this are encoded in-process
CROSS_CHECK_DOCUMENTS = 100  # tiktoken builds: documents re-encoded with `tokenizers` (per build)
CROSS_CHECK_RATE = 16  # ... picked among every 16th document by digest, then 1 in 4096 thereafter
POLL_SECONDS = 0.2  # how often the writer looks at its workers while it waits


# --- settings -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PrepareSettings:
    """How a cache is built (never what is in it): the `prepare` config group."""

    num_proc: int | None = None
    encoder: str = "auto"
    tasks: int = 1
    task: int | None = None

    def __post_init__(self) -> None:
        if self.num_proc is not None and self.num_proc < 1:
            raise ConfigError(f"prepare.num_proc={self.num_proc} must be >= 1 (or null for the usable cores)")
        if self.encoder not in ENCODERS:
            raise ConfigError(f"prepare.encoder={self.encoder!r} is not one of {', '.join(ENCODERS)}")
        if self.tasks < 1:
            raise ConfigError(f"prepare.tasks={self.tasks} must be >= 1")
        if self.task is not None and not 0 <= self.task < self.tasks:
            raise ConfigError(
                f"prepare.task={self.task} must be in 0..{self.tasks - 1} (prepare.tasks={self.tasks}); "
                "leave it null to assemble the tasks' parts"
            )

    @classmethod
    def from_config(cls, prepare: Any) -> PrepareSettings:
        return cls(
            num_proc=None if prepare.num_proc is None else int(prepare.num_proc),
            encoder=str(prepare.encoder),
            tasks=int(prepare.tasks),
            task=None if prepare.task is None else int(prepare.task),
        )


_SETTINGS: contextvars.ContextVar[PrepareSettings | None] = contextvars.ContextVar(
    "pretrain_prepare_settings", default=None
)


@contextlib.contextmanager
def prepare_settings(settings: PrepareSettings) -> Iterator[PrepareSettings]:
    """Builds inside this block (`prepare_cache` -> `build_cache`) use `settings`."""
    token = _SETTINGS.set(settings)
    try:
        yield settings
    finally:
        _SETTINGS.reset(token)


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def resolve_num_proc(settings: PrepareSettings, source: Any) -> int:
    """prepare.num_proc, or for null the usable cores, except for small local sources (one process
    encodes them faster than workers start)."""
    if settings.num_proc is not None:
        return settings.num_proc
    cores = usable_cores()
    if cores > 1 and str(source.kind) == "local":
        try:
            size = sum(p.stat().st_size for p in sources._local_paths(source.files))
        except (OSError, PretrainError):
            size = 0  # the build reports it
        if size < SMALL_SOURCE_BYTES:
            return 1
    return cores


# --- encoding one part (in a worker) ------------------------------------------------------------


@dataclass
class Encoded:
    """One part (or batch) of documents, encoded: what the writer needs and nothing else."""

    rows: int  # rows read, blank ones included
    doc_rows: np.ndarray  # int64, per non-blank document: its row within the part
    digests: bytes  # 32 bytes per document: sha256 of its UTF-8 text
    validation: np.ndarray  # bool per document: its split is validation
    lengths: np.ndarray  # int64 per document: tokens, EOS included
    tokens: np.ndarray  # the documents' ids back to back, EOS after each (uint32, or uint16 if asked)


@functools.lru_cache(maxsize=2)
def _reference_encoder(files: TokenizerFiles) -> TokenizersEncoder:
    return TokenizersEncoder(files)


class CrossCheck:
    """Re-encodes a sample of the documents with `tokenizers` (the reference) and compares ids."""

    def __init__(self, files: TokenizerFiles, quota: int):
        self.files, self.quota, self.checked = files, quota, 0
        self._reference: TokenizersEncoder | None = None

    def wanted(self, digest: bytes) -> bool:
        if self.checked < self.quota:
            return digest[0] % CROSS_CHECK_RATE == 0
        return digest[0] == 0 and digest[1] % 16 == 0  # 1 in 4096: a thin check across the whole build

    def check(self, texts: list[str], origins: list[str], digests: list[bytes], ids, lengths) -> None:
        picked = [j for j, digest in enumerate(digests) if self.wanted(digest)]
        if not picked:
            return
        if self._reference is None:
            self._reference = _reference_encoder(self.files)
        expected, expected_lengths = self._reference.encode([texts[j] for j in picked])
        ends = np.cumsum(lengths)
        position = 0
        for j, n in zip(picked, expected_lengths.tolist(), strict=True):
            got = ids[ends[j] - lengths[j] : ends[j]]
            want = expected[position : position + n]
            position += n
            if len(got) != len(want) or not np.array_equal(got, want):
                raise TokenizerError(
                    f"tiktoken and tokenizers disagree on document {digests[j].hex()} ({origins[j]}): "
                    f"{len(got)} vs {len(want)} ids; rerun with prepare.encoder=tokenizers (and report it)"
                )
        self.checked += len(picked)


def encode_documents(
    documents: list[Document],
    encoder: Encoder,
    split: dict,
    checker: CrossCheck | None = None,
    dtype: str = "uint32",
) -> Encoded:
    """Digest, split and tokenize a list of documents (blank ones are counted, not encoded)."""
    texts, origins, doc_rows = [], [], []
    for row, doc in enumerate(documents):
        text = doc.text
        if text and not text.isspace():  # == bool(text.strip()), without the copy
            texts.append(text)
            origins.append(doc.origin)
            doc_rows.append(row)
    digests = []
    for text, origin in zip(texts, origins, strict=True):
        try:
            digests.append(hashlib.sha256(text.encode()).digest())
        except UnicodeEncodeError as error:
            raise sources.SourceError(f"{origin}: the text is not valid Unicode ({error})") from error
    seed, fraction = split["seed"], split["validation_fraction"]
    validation = np.fromiter(
        (document_split(d.hex(), seed, fraction) == "validation" for d in digests),
        dtype=bool,
        count=len(texts),
    )
    ids, lengths = encoder.encode(texts)
    if checker is not None:
        checker.check(texts, origins, digests, ids, lengths)
    tokens = np.insert(ids, np.cumsum(lengths), np.uint32(EOS_TOKEN_ID))
    if dtype == "uint16" and (tokens.size == 0 or int(tokens.max()) < 1 << 16):
        tokens = tokens.astype(np.uint16)  # else the writer names the id that does not fit
    return Encoded(
        rows=len(documents),
        doc_rows=np.asarray(doc_rows, dtype=np.int64),
        digests=b"".join(digests),
        validation=validation,
        lengths=lengths + 1,
        tokens=tokens,
    )


# --- consuming encoded parts in source order (the writer) ---------------------------------------


@dataclass
class BuildStats:
    read: int = 0
    duplicates: int = 0
    empty: int = 0
    over_budget: int = 0
    cross_checked: int = 0
    encoder: str = ""
    num_proc: int = 1
    tasks: int = 1
    worker_peak_rss_mib: float | None = None


class Collector:
    """Dedup, budgets and writes, document by document in source order (cheap work on arrays)."""

    def __init__(self, writers: dict[str, SplitWriter], stats: BuildStats):
        self.writers, self.stats = writers, stats
        self.seen: set[bytes] = set()

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
        for s, writer in enumerate(writers):
            chosen = keep & (part.validation == bool(s))
            count = int(chosen.sum())
            if not count:
                continue
            if count == n:
                tokens = part.tokens
            else:
                tokens = part.tokens[np.repeat(chosen, part.lengths)]
            ids = [digests[32 * j : 32 * j + 32].hex() for j in np.flatnonzero(chosen).tolist()]
            writer.write_many(ids, tokens, part.lengths[chosen])
        return stopped or self.done


# --- producers: encoded parts in source order ---------------------------------------------------


def _batches(documents: Iterable[Document], max_chars: int = BATCH_CHARS) -> Iterator[list[Document]]:
    batch, chars = [], 0
    for doc in documents:
        batch.append(doc)
        chars += len(doc.text)
        if chars >= max_chars:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def _prefetch(iterator: Iterator, depth: int = 2) -> Generator:
    """Read the source in a thread so that reading overlaps tokenizing (the encoders drop the GIL).

    When the consumer stops early (budgets met, an error), the reader stops too: it never blocks on
    a full queue forever, and it closes the source so that files and streams are released.
    """
    items: queue.Queue = queue.Queue(maxsize=depth)
    done = object()
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                items.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def produce():
        try:
            for item in iterator:
                if not put(item):
                    return
            put(done)
        except BaseException as error:  # re-raised in the consumer, with its traceback
            put(error)
        finally:
            close = getattr(iterator, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=produce, daemon=True, name="pretrain-source-reader")
    thread.start()
    try:
        while True:
            item = items.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()


@dataclass(frozen=True)
class Job:
    """What a worker needs to encode its parts (picklable: sent to spawned processes)."""

    source: Any
    tokenizer_files: TokenizerFiles
    split: dict
    dtype: str
    encoder: str
    tasks: int = 1
    task: int = 0
    workers: int = 1
    parent_pid: int = 0
    partition: dict | None = None  # the parent's part sizes (sources.*_PART_*), so that both agree


def _selected(parts: Iterable[Part], tasks: int, task: int, workers: int, worker: int) -> Iterator[Part]:
    """Part k belongs to task k % tasks; a task's j-th part to its worker j % workers."""
    j = 0
    for k, part in enumerate(parts):
        if k % tasks != task:
            continue
        if j % workers == worker:
            yield part
        j += 1


def _encoder(files: TokenizerFiles, choice: str) -> tuple[Encoder, str | None]:
    """`build_encoder`, memoised per process on the files' stat (building tiktoken's ranks: ~0.5 s)."""
    stats = tuple((p.stat().st_size, p.stat().st_mtime_ns) for p in (files.vocab, files.merges))
    return _cached_encoder(files, choice, stats)


@functools.lru_cache(maxsize=4)
def _cached_encoder(files: TokenizerFiles, choice: str, stats: tuple) -> tuple[Encoder, str | None]:
    return build_encoder(files, choice)


def _in_process(job: Job, batches: Iterator[list[Document]], stats: BuildStats) -> Iterator[Encoded]:
    """One process: a reader thread, one batch encoded ahead in a thread (the encoders and sha256
    release the GIL), the writer in the caller."""
    encoder, notice = _encoder(job.tokenizer_files, job.encoder)
    if notice:
        print(notice, file=sys.stderr, flush=True)
    stats.encoder = encoder.name
    checker = CrossCheck(job.tokenizer_files, CROSS_CHECK_DOCUMENTS) if encoder.name == "tiktoken" else None
    reader = _prefetch(batches)
    try:
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="pretrain-tokenizer") as pool:
            pending = None
            for batch in reader:
                future = pool.submit(encode_documents, batch, encoder, job.split, checker, job.dtype)
                if pending is not None:
                    yield pending.result()
                pending = future
            if pending is not None:
                yield pending.result()
    finally:
        reader.close()
        stats.cross_checked += checker.checked if checker else 0


def _follow_parent(parent_pid: int) -> None:
    """A worker dies with the process that started it: PR_SET_PDEATHSIG (Linux), and a watchdog
    thread on os.getppid() (any POSIX), so that no orphan keeps encoding or holds files."""
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:
        os._exit(3)

    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent_pid:
                os._exit(3)

    threading.Thread(target=watch, daemon=True, name="pretrain-parent-watch").start()


def _portable(error: BaseException) -> BaseException:
    """The error itself if it survives pickling, else a RuntimeError with its message."""
    import pickle

    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")


def _worker(job: Job, worker: int, out) -> None:
    """A worker process: encode this worker's parts in order, one message per part, then "end"."""
    _follow_parent(job.parent_pid)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core per worker
    if job.partition:
        sources.PARQUET_PART_ROWS = job.partition["parquet_rows"]
        sources.JSONL_PART_BYTES = job.partition["jsonl_bytes"]
        sources.PYDOCS_PART_MODULES = job.partition["pydocs_modules"]
    try:
        encoder, notice = build_encoder(job.tokenizer_files, job.encoder)
        out.put(("start", {"encoder": encoder.name, "notice": notice if worker == 0 else None}))
        # Worker 0 cross-checks (its parts are every workers-th part: spread over the whole build); the
        # others skip building the reference tokenizer.
        check = encoder.name == "tiktoken" and worker == 0
        checker = CrossCheck(job.tokenizer_files, CROSS_CHECK_DOCUMENTS) if check else None
        parts = _selected(sources.iter_parts(job.source), job.tasks, job.task, job.workers, worker)
        for part in parts:
            documents = list(read_part(part))
            out.put(("part", encode_documents(documents, encoder, job.split, checker, job.dtype)))
        checked = checker.checked if checker else 0
        out.put(("end", {"encoder": encoder.name, "cross_checked": checked, "peak_rss_mib": _peak_rss_mib()}))
    except BaseException as error:
        out.put(("error", _portable(error), traceback.format_exc()))
    finally:
        out.close()
        out.join_thread()


def _peak_rss_mib() -> float:
    """This process's peak resident memory (VmHWM), 0 where /proc is not there."""
    with contextlib.suppress(OSError, IndexError, ValueError):
        status = Path("/proc/self/status").read_text()
        return round(int(status.split("VmHWM:")[1].split()[0]) / 1024, 1)
    return 0.0


def _exit_reason(code: int | None) -> str:
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
    return f"exited with status {code}"


def _raise_worker_error(worker: int, message: tuple) -> None:
    """A worker's error: ours (a bad source row, a tokenizer mismatch) as it is, anything else with the
    worker's traceback."""
    _, error, *rest = message
    if isinstance(error, PretrainError):
        raise error
    raise RuntimeError(f"prepare worker {worker} failed:\n{rest[0] if rest else error}")


def _parallel(job: Job, stats: BuildStats) -> Iterator[Encoded]:
    """`job.workers` spawned processes; their parts are taken strictly in turn (= source order)."""
    context = multiprocessing.get_context("spawn")
    queues = [context.Queue(maxsize=QUEUE_DEPTH) for _ in range(job.workers)]
    processes = [
        context.Process(target=_worker, args=(job, w, queues[w]), name=f"pretrain-prepare-{w}", daemon=True)
        for w in range(job.workers)
    ]
    ended: dict[int, dict] = {}
    try:
        with _MAIN_LOCK:
            main = sys.modules.get("__main__")
            # Workers need this package only: they must not re-run the parent's __main__ (a script
            # without a main guard, a notebook, pytest), which spawn would otherwise import first.
            sys.modules["__main__"] = types.ModuleType("__main__")
            try:
                for process in processes:
                    process.start()
            finally:
                if main is not None:
                    sys.modules["__main__"] = main
        k = 0
        while True:
            w = k % job.workers
            kind, payload, *rest = _receive(queues[w], processes, w)
            if kind == "start":
                stats.encoder = payload["encoder"]
                if payload["notice"]:
                    print(payload["notice"], file=sys.stderr, flush=True)
                continue
            if kind == "error":
                _raise_worker_error(w, (kind, payload, *rest))
            if kind == "end":
                ended[w] = payload
                stats.encoder = payload["encoder"]
                # The others are done too (the same parts list): collect what they checked.
                for other in range(job.workers):
                    if other not in ended:
                        message = _receive(queues[other], processes, other)
                        while message[0] == "start":  # a worker without any part
                            message = _receive(queues[other], processes, other)
                        if message[0] == "error":  # e.g. the source's listing failed there
                            _raise_worker_error(other, message)
                        if message[0] == "end":
                            ended[other] = message[1]
                stats.cross_checked += sum(e["cross_checked"] for e in ended.values())
                stats.worker_peak_rss_mib = max(e["peak_rss_mib"] for e in ended.values())
                return
            yield payload
            k += 1
    finally:
        started = [p for p in processes if p.pid is not None]
        for process in started:
            if process.is_alive():
                process.terminate()
        for process in started:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join(timeout=5)
        for q in queues:
            q.cancel_join_thread()
            q.close()


_MAIN_LOCK = threading.Lock()


def _receive(channel, processes: list, worker: int) -> tuple:
    """Worker `worker`'s next message. Any worker that died (killed, out of memory) is an error within a
    poll interval, never a hang, whichever worker the writer is waiting for."""
    while True:
        try:
            return channel.get(timeout=POLL_SECONDS)
        except queue.Empty:
            pass
        for w, process in enumerate(processes):
            code = process.exitcode
            if code is None or (code == 0 and w != worker):
                continue  # alive, or finished all its parts
            try:  # the awaited worker exited: anything it sent before is already in the pipe
                if w == worker:
                    return channel.get(timeout=1.0)
            except queue.Empty:
                pass
            raise CacheError(
                f"prepare worker {w} (pid {process.pid}) {_exit_reason(code)} before it finished; "
                "nothing was kept: run the prepare again"
            )


def _plain(source: Any) -> types.SimpleNamespace:
    """The source settings as a plain namespace: a worker unpickles it without importing the config
    schema (omegaconf), ~0.2 s of start-up saved per worker."""
    names = ("kind", "files", "path", "config_name", "revision", "data_dir")
    values = {name: getattr(source, name, None) for name in names}
    values["kind"] = str(values["kind"])
    values["files"] = [str(f) for f in values["files"] or []]
    return types.SimpleNamespace(**values)


def _encoded_parts(spec: CacheSpec, settings: PrepareSettings, stats: BuildStats, task: int | None):
    """Encoded parts in source order: all of them (task None) or those of one task."""
    num_proc = resolve_num_proc(settings, spec.source)
    stats.num_proc = num_proc
    job = Job(
        source=_plain(spec.source),
        tokenizer_files=spec.tokenizer_files,
        split=spec.identity["split"],
        dtype=str(spec.identity["dtype"]),
        encoder=settings.encoder,
        tasks=settings.tasks if task is not None else 1,
        task=task or 0,
        workers=num_proc,
        parent_pid=os.getpid(),
        partition=_partition(),
    )
    if num_proc > 1:
        # The source's first part here first: an unreadable source (an empty file, the hub offline)
        # is reported before any worker starts, and a source without parts starts none.
        if next(iter(sources.iter_parts(spec.source)), None) is None:
            return iter(())
        return _parallel(job, stats)
    if task is None:
        batches = _batches(iter_documents(spec.source))
    else:  # a task's part file holds one record per part: the assembly interleaves the tasks by part
        parts = _selected(sources.iter_parts(spec.source), job.tasks, job.task, 1, 0)
        batches = (list(read_part(part)) for part in parts)
    return _in_process(job, batches, stats)


# --- the build ----------------------------------------------------------------------------------


def _progress(enabled: bool):
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("[bold]prepare"),
        BarColumn(),
        TextColumn("{task.fields[docs]:,} docs"),
        TextColumn("{task.completed:,.0f} tokens"),
        TextColumn("{task.fields[rate]:,.0f} tok/s"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        disable=not enabled,
        transient=False,
    )


def build_cache(spec: CacheSpec, directory: Path, *, progress: bool = True) -> dict:
    """Tokenize the source into `directory` (which must be new) and write the manifest last.

    With `prepare.tasks` > 1 (and no `prepare.task`) the documents come from the tasks' part files
    in the staging directory instead of the source (see `prepare_task`).
    """
    settings = _SETTINGS.get() or PrepareSettings()
    identity = spec.identity
    budgets = identity["budget"]
    writers = {
        s: SplitWriter(directory, s, budgets[f"{s}_tokens"], token_dtype=spec.token_dtype) for s in SPLITS
    }
    stats = BuildStats(tasks=settings.tasks)
    collector = Collector(writers, stats)
    total = None if None in budgets.values() else sum(budgets.values())
    bar = _progress(progress)
    started = time.perf_counter()
    try:
        with bar:
            task = bar.add_task("prepare", total=total, docs=0, rate=0.0)
            if settings.tasks > 1:
                parts: Iterator[Encoded] = _staged_parts(spec, settings.tasks, stats)
            else:
                parts = _encoded_parts(spec, settings, stats, task=None)
            try:
                for part in parts:
                    stop = collector.add(part)
                    produced = sum(w.tokens for w in writers.values())
                    rate = produced / max(time.perf_counter() - started, 1e-9)
                    docs = sum(w.documents for w in writers.values())
                    bar.update(task, completed=produced, docs=docs, rate=rate)
                    if stop:
                        break  # stop reading the source: both budgets are met
            finally:
                close = getattr(parts, "close", None)
                if close is not None:
                    close()  # stops the workers (or the reader thread) now
    except BaseException:
        for writer in writers.values():
            writer.abort()
        raise
    splits = {s: w.close() for s, w in writers.items()}
    build = {
        "documents_read": stats.read,
        "duplicates_skipped": stats.duplicates,
        "empty_skipped": stats.empty,
        "over_budget_skipped": stats.over_budget,
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
    manifest = new_manifest(spec, splits, build)
    write_manifest(directory, manifest)
    return manifest


# --- multi-task: one task per shard, then one assembly ------------------------------------------

PART_FILE_FORMAT = 1
_RECORD = b"PPRT"
_END = b"PEND"
_COUNTS = struct.Struct("<qqq")  # rows, documents, tokens


def staging_dir(spec: CacheSpec, tasks: int) -> Path:
    """Where the tasks of `prepare.tasks=N` put their part files: beside the cache, hidden."""
    return spec.root / f".{spec.key}.parts-{tasks}"


def part_file(spec: CacheSpec, tasks: int, task: int) -> Path:
    return staging_dir(spec, tasks) / f"part-{task:05d}-of-{tasks:05d}.bin"


def _partition() -> dict:
    """How the source is cut into parts: tasks of another partition cannot be assembled together."""
    return {
        "parquet_rows": sources.PARQUET_PART_ROWS,
        "jsonl_bytes": sources.JSONL_PART_BYTES,
        "pydocs_modules": sources.PYDOCS_PART_MODULES,
    }


def _write_record(handle: IO[bytes], part: Encoded) -> None:
    handle.write(_RECORD + _COUNTS.pack(part.rows, len(part.lengths), len(part.tokens)))
    handle.write(part.doc_rows.astype("<i8").tobytes())
    handle.write(part.digests)
    handle.write(part.validation.astype(np.uint8).tobytes())
    handle.write(part.lengths.astype("<i8").tobytes())
    handle.write(np.ascontiguousarray(part.tokens).tobytes())


def prepare_task(spec: CacheSpec, settings: PrepareSettings, *, progress: bool = True) -> Path:
    """Encode task `settings.task`'s parts (every tasks-th part of the source) into its part file in
    the staging directory, atomically (a temporary file, fsync, rename). Returns the part file."""
    assert settings.task is not None
    path = part_file(spec, settings.tasks, settings.task)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    stats = BuildStats(tasks=settings.tasks)
    header = {
        "format": PART_FILE_FORMAT,
        "key": spec.key,
        "tasks": settings.tasks,
        "task": settings.task,
        "partition": _partition(),
        "dtype": str(spec.identity["dtype"]),
    }
    count = tokens = 0
    started = time.perf_counter()
    bar = _progress(progress)
    try:
        with open(tmp, "wb") as handle, bar:
            line = bar.add_task("prepare", total=None, docs=0, rate=0.0)
            handle.write(json.dumps(header, sort_keys=True).encode() + b"\n")
            parts = _encoded_parts(spec, settings, stats, task=settings.task)
            try:
                for part in parts:
                    _write_record(handle, part)
                    count += 1
                    tokens += len(part.tokens)
                    rate = tokens / max(time.perf_counter() - started, 1e-9)
                    bar.update(line, completed=tokens, docs=count, rate=rate)
            finally:
                close = getattr(parts, "close", None)
                if close is not None:
                    close()
            handle.write(_END + struct.pack("<q", count))
            handle.flush()
            os.fsync(handle.fileno())
        os.rename(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


class _PartReader:
    def __init__(self, path: Path, expected: dict):
        self.path = path
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
            raise CacheError(f"{self.path} is truncated; delete it and rerun its task")
        return data

    def next(self) -> Encoded | None:
        magic = self._exact(4)
        if magic == _END:
            (count,) = struct.unpack("<q", self._exact(8))
            if count != self.count:
                raise CacheError(
                    f"{self.path} holds {self.count} parts, its end says {count}; rerun its task"
                )
            return None
        if magic != _RECORD:
            raise CacheError(f"{self.path} is corrupt (record {self.count}); delete it and rerun its task")
        rows, n, ntokens = _COUNTS.unpack(self._exact(_COUNTS.size))
        dtype = np.dtype(self.dtype)
        part = Encoded(
            rows=rows,
            doc_rows=np.frombuffer(self._exact(8 * n), dtype="<i8"),
            digests=self._exact(32 * n),
            validation=np.frombuffer(self._exact(n), dtype=np.uint8).astype(bool),
            lengths=np.frombuffer(self._exact(8 * n), dtype="<i8"),
            tokens=np.frombuffer(self._exact(dtype.itemsize * ntokens), dtype=dtype),
        )
        self.count += 1
        return part

    dtype = "uint32"


def _staged_parts(spec: CacheSpec, tasks: int, stats: BuildStats) -> Iterator[Encoded]:
    """The tasks' encoded parts in source order: part k is the (k // tasks)-th record of task k % tasks."""
    paths = [part_file(spec, tasks, t) for t in range(tasks)]
    missing = [t for t, p in enumerate(paths) if not p.is_file()]
    if missing:
        listed = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
        raise CacheError(
            f"prepare.tasks={tasks}: no part file of task(s) {listed} in {staging_dir(spec, tasks)}; run "
            f"`pretrain prepare prepare.tasks={tasks} prepare.task=<i>` for each (or the multirun), "
            "then this command again"
        )
    dtype = str(spec.identity["dtype"])
    readers = []
    try:
        for t, path in enumerate(paths):
            expected = {
                "format": PART_FILE_FORMAT,
                "key": spec.key,
                "tasks": tasks,
                "task": t,
                "partition": _partition(),
                "dtype": dtype,
            }
            reader = _PartReader(path, expected)
            reader.dtype = dtype
            readers.append(reader)
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


__all__ = [
    "BATCH_CHARS",
    "Collector",
    "Encoded",
    "PrepareSettings",
    "build_cache",
    "encode_documents",
    "part_file",
    "prepare_settings",
    "prepare_task",
    "staging_dir",
]
