"""Who encodes the parts: this process (a reader thread and a tokenizer thread) or `num_proc` spawned
worker processes, and the message protocol between those workers and the building process.

Part k of a task goes to worker k % num_proc; the building process takes the workers' parts strictly
in turn, so it sees them in source order whatever their speed. Every worker is at most `QUEUE_DEPTH`
parts ahead. Messages, one queue per worker:

    ("start", {"encoder", "notice"})  once, when its encoder is built
    ("part", Encoded)                 per part, in the worker's order
    ("end", {"encoder", "cross_checked", "peak_rss_mib"})
    ("error", exception, traceback)   instead of anything further

A worker that dies (killed, out of memory) stops the build within `POLL_SECONDS` with an error.
Workers leave SIGINT/SIGTERM to the building process (they ignore both): a Ctrl-C or a scheduler's
SIGTERM sent to the whole process group reaches the parent only, which stops them; and they die with
it (PR_SET_PDEATHSIG, and a watchdog on their parent's pid) if it is killed outright.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
import traceback
import types
from collections.abc import Generator, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ...errors import CacheError, PretrainError
from ..sources import Document, Part, Source, documents
from .chat import ChatEncoder, ChatSettings
from .collect import BuildStats
from .encode import CrossCheck, Encoded, cached_encoder, encode_documents
from .tokenizer import Encoder, TokenizerFiles, build_encoder

BATCH_CHARS = 1 << 20  # in-process: texts encoded at once (~250k tokens)
QUEUE_DEPTH = 4  # encoded parts a worker may be ahead of the writer
POLL_SECONDS = 0.2  # how often the writer looks at its workers while it waits
_LEFT_TO_PARENT = (signal.SIGINT, signal.SIGTERM)


@dataclass(frozen=True)
class Job:
    """What the encoding of a source (or of one task's share of it) needs; picklable: sent to workers."""

    source: Source
    tokenizer_files: TokenizerFiles
    split: dict
    dtype: str
    encoder: str
    tasks: int = 1
    task: int = 0
    workers: int = 1
    parent_pid: int = 0
    chat: ChatSettings | None = None  # task=sft: conversations encoded with their loss mask


def job_encoder(job: Job) -> tuple[Encoder, str | None]:
    """The job's encoder: conversations' (task=sft), else document bodies' (memoised per process)."""
    if job.chat is not None:
        return ChatEncoder(job.tokenizer_files, job.chat), None
    return cached_encoder(job.tokenizer_files, job.encoder)


def selected(parts: Iterable[Part], tasks: int, task: int, workers: int, worker: int) -> Iterator[Part]:
    """Part k belongs to task k % tasks; a task's j-th part to its worker j % workers."""
    j = 0
    for k, part in enumerate(parts):
        if k % tasks != task:
            continue
        if j % workers == worker:
            yield part
        j += 1


def encoded_parts(job: Job, stats: BuildStats, *, per_part: bool) -> Iterator[Encoded]:
    """The job's documents encoded, in source order: by `job.workers` processes or in this one.

    `per_part`: one Encoded per part (a task's part file interleaves with the other tasks' by part);
    else in-process batches of about BATCH_CHARS characters.
    """
    stats.num_proc = job.workers
    if job.workers > 1:
        # The source's first part here first: an unreadable source (an empty file, the hub offline)
        # is reported before any worker starts, and a source without parts starts none.
        if next(iter(job.source.parts()), None) is None:
            return iter(())
        return _parallel(job, stats)
    if per_part:
        parts = selected(job.source.parts(), job.tasks, job.task, 1, 0)
        batches: Iterator[list[Document]] = (list(job.source.read(part)) for part in parts)
    else:
        batches = _batches(documents(job.source))
    return _in_process(job, batches, stats)


# --- in this process ----------------------------------------------------------------------------


def _batches(items: Iterable[Document], max_chars: int = BATCH_CHARS) -> Iterator[list[Document]]:
    batch, chars = [], 0
    for doc in items:
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


def _in_process(job: Job, batches: Iterator[list[Document]], stats: BuildStats) -> Iterator[Encoded]:
    """One process: a reader thread, one batch encoded ahead in a thread (the encoders and sha256
    release the GIL), the writer in the caller."""
    encoder, notice = job_encoder(job)
    if notice:
        print(notice, file=sys.stderr, flush=True)
    stats.encoder = encoder.name
    checker = CrossCheck(job.tokenizer_files) if encoder.name == "tiktoken" else None
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


# --- in spawned worker processes ----------------------------------------------------------------


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


def _peak_rss_mib() -> float:
    """This process's peak resident memory (VmHWM), 0 where /proc is not there."""
    with contextlib.suppress(OSError, IndexError, ValueError):
        status = Path("/proc/self/status").read_text()
        return round(int(status.split("VmHWM:")[1].split()[0]) / 1024, 1)
    return 0.0


def _worker(job: Job, worker: int, out) -> None:
    """A worker process: encode this worker's parts in order, one message per part, then "end"."""
    # First: SIGINT/SIGTERM are the parent's to handle (it stops us). Born with them blocked (see
    # _start), so one sent to the process group while this process started up is discarded here.
    for number in _LEFT_TO_PARENT:
        signal.signal(number, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _LEFT_TO_PARENT)
    _follow_parent(job.parent_pid)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core per worker
    try:
        encoder, notice = job_encoder(job) if job.chat else build_encoder(job.tokenizer_files, job.encoder)
        out.put(("start", {"encoder": encoder.name, "notice": notice if worker == 0 else None}))
        # Worker 0 cross-checks (its parts are every workers-th part: spread over the whole build); the
        # others skip building the reference tokenizer.
        check = encoder.name == "tiktoken" and worker == 0
        checker = CrossCheck(job.tokenizer_files) if check else None
        for part in selected(job.source.parts(), job.tasks, job.task, job.workers, worker):
            batch = list(job.source.read(part))
            out.put(("part", encode_documents(batch, encoder, job.split, checker, job.dtype)))
        checked = checker.checked if checker else 0
        out.put(("end", {"encoder": encoder.name, "cross_checked": checked, "peak_rss_mib": _peak_rss_mib()}))
    except BaseException as error:
        out.put(("error", _portable(error), traceback.format_exc()))
    finally:
        out.close()
        out.join_thread()


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


_MAIN_LOCK = threading.Lock()


def _start(processes: list) -> None:
    """Start the workers with SIGINT/SIGTERM blocked (a signal arriving meanwhile stays pending here and
    is delivered when this returns), so that they are born blocking them and ignore them from their
    first instruction; and without the parent's __main__ (a script without a main guard, a notebook,
    pytest), which spawn would otherwise import first."""
    with _MAIN_LOCK:
        main = sys.modules.get("__main__")
        sys.modules["__main__"] = types.ModuleType("__main__")
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _LEFT_TO_PARENT)
        try:
            for process in processes:
                process.start()
        finally:
            if main is not None:
                sys.modules["__main__"] = main
            # Last: a pending signal's handler runs now, and may raise (the caller stops the workers).
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def _stop(processes: list, queues: list) -> None:
    """Kill and reap the workers (they ignore SIGTERM: they hold nothing that needs a clean exit)."""
    started = [p for p in processes if p.pid is not None]
    for process in started:
        if process.is_alive():
            process.kill()
    for process in started:
        process.join(timeout=10)
    for q in queues:
        q.cancel_join_thread()
        q.close()


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
        _start(processes)
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
        _stop(processes, queues)
