"""Run directories (`hydra.run.dir: ${pretrain.run_dir:outputs,<date>/<time>}` in conf/train.yaml).

Under SLURM a run's directory is its job's own id (`outputs/slurm-<SLURM_ARRAY_JOB_ID>_<SLURM_ARRAY_TASK_ID>`
or `outputs/slurm-<SLURM_JOB_ID>`): every rank resolves the same one, and a requeued job (same id) lands
in it again, where `ckpt_path=auto` finds its checkpoints. Elsewhere `outputs/<date>/<time>` is claimed
atomically with `os.mkdir` (`-1`, `-2`, ... when a run started in the same second already has it).
Light on purpose: train.py registers the resolver before Hydra starts.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO


def slurm_job_id(environ: dict[str, str] | None = None) -> str | None:
    """`<array job>_<task>` for an array task, else the job id; None outside SLURM."""
    env = os.environ if environ is None else environ
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env.get("SLURM_JOB_ID") or None


_CLAIMED: dict[tuple[str, str], str] = {}


def claim_directory(path: Path) -> Path:
    """Create `path`, or `path-1`, `path-2`, ... whichever does not exist yet (atomic: os.mkdir)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    candidate, suffix = path, 0
    while True:
        try:
            os.mkdir(candidate)
            return candidate
        except FileExistsError:
            suffix += 1
            candidate = path.with_name(f"{path.name}-{suffix}")


def run_dir(base: str, stamp: str) -> str:
    """The `pretrain.run_dir` resolver: `<base>/slurm-<job id>` under SLURM (the same directory for
    every rank and after a requeue), else a new `<base>/<stamp>` claimed for this run. The answer is
    remembered for the process, so resolving it again gives the same directory."""
    job = slurm_job_id()
    if job is not None:
        return str(Path(base) / f"slurm-{job}")
    key = (base, stamp)
    if key not in _CLAIMED:
        _CLAIMED[key] = str(claim_directory(Path(base) / stamp))
    return _CLAIMED[key]


def register_run_dir_resolver() -> None:
    """`${pretrain.run_dir:BASE,STAMP}` for conf/train.yaml's hydra.run.dir and hydra.sweep.dir."""
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver("pretrain.run_dir", run_dir, use_cache=True, replace=True)


def claimed_here(path: Path) -> bool:
    """True when this process created `path`: with the resolver (a new run directory of its own) or
    by taking its lock (`RunLock` made the directory)."""
    resolved = Path(path).resolve()
    claimed = (Path(c).resolve() for c in _CLAIMED.values())
    return resolved in _MADE or any(c == resolved for c in claimed)


LOCK_NAME = ".run.lock"
START_OVER = "start_over"
"""The root key that lets a fresh run replace another run's checkpoints in its directory."""

_HELD: dict[Path, RunLock] = {}  # train.py's locks, held to the process's end (flock is per open file)
_MADE: set[Path] = set()  # run directories this process created to lock them


def is_rank_zero() -> bool:
    """Before the Trainer exists: rank 0 by the launchers' environment (Lightning, torchrun, SLURM)."""
    return all(os.environ.get(key, "0") == "0" for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID"))


def run_checkpoints(directory: Path) -> list[Path]:
    """The checkpoints in `<run dir>/checkpoints` (files or sharded directories named *.ckpt)."""
    folder = Path(directory) / "checkpoints"
    try:
        return sorted(p for p in folder.iterdir() if p.suffix == ".ckpt" and not p.name.startswith("."))
    except OSError:
        return []


def check_fresh_start(directory: Path, ckpt_path: str | None, start_over: bool) -> None:
    """A run that resumes nothing must not write over another run's checkpoints: `last.ckpt` and
    `step*.ckpt` would be replaced one by one and the directory would mix two runs (and a later
    `ckpt_path=auto` could resume the other run's newer step). Refused unless the user resumes or
    starts over explicitly."""
    from ..errors import ConfigError

    if ckpt_path is not None or start_over:
        return
    found = run_checkpoints(directory)
    if found:
        names = ", ".join(p.name for p in found[:3]) + (", ..." if len(found) > 3 else "")
        raise ConfigError(
            f"{Path(directory) / 'checkpoints'} holds another run's checkpoints ({names}): a new run would "
            f"overwrite them; resume it with ckpt_path=auto, replace it with {START_OVER}=true (deletes "
            "them), or run elsewhere (hydra.run.dir=... or output_dir=...)"
        )


def remove_checkpoints(directory: Path) -> list[Path]:
    """`start_over=true`: delete the checkpoints (and their records) an earlier run left there."""
    import shutil

    removed = run_checkpoints(directory)
    for path in removed:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
        path.with_name(path.name + ".sha256").unlink(missing_ok=True)
    return removed


class RunLock:
    """One training process per run directory: an exclusive `flock` on `<run dir>/.run.lock`, which
    also names its holder (pid, host). The kernel drops the lock when the holder dies, however it
    dies, so a stale lock file is simply taken over. With several ranks only rank 0 takes it (the
    other ranks are its own job's). train.py takes it before Hydra writes into the directory; the
    run's own acquire in the same process then shares that lock."""

    def __init__(self, directory: Path):
        self.path = Path(directory) / LOCK_NAME
        self._handle: IO[str] | None = None
        self._shared = False

    def acquire(self) -> RunLock:
        import fcntl
        import socket

        from ..errors import ConfigError, WriteError

        directory = self.path.parent
        held = _HELD.get(directory.resolve())
        if held is not None and held._handle is not None:
            self._shared = True
            return self
        try:
            made = not directory.exists()
            directory.mkdir(parents=True, exist_ok=True)
            if made:
                _MADE.add(directory.resolve())
            # O_NOFOLLOW: a symlink planted as the lock is refused, never truncated through.
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as error:
            if self.path.is_symlink():
                why = "is a symbolic link, not a lock file"
            elif self.path.is_dir():
                why = "is a directory, not a lock file"
            else:
                raise WriteError(
                    f"cannot write the run directory {directory}: {error.strerror or error}; make it "
                    "writable or run elsewhere (hydra.run.dir=... or output_dir=...)"
                ) from None
            raise ConfigError(
                f"the run lock {self.path} {why}: remove it, or run elsewhere (hydra.run.dir=... or "
                "output_dir=...)"
            ) from None
        handle = os.fdopen(fd, "r+")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise ConfigError(
                f"{directory} is in use by {holder}: two runs in one directory would overwrite "
                "each other's checkpoints and metrics; wait for it to end, or run elsewhere "
                "(hydra.run.dir=... or output_dir=...)"
            ) from None
        try:
            handle.seek(0)
            handle.truncate()
            handle.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
            handle.flush()
        except OSError as error:  # a full disk
            handle.close()
            raise WriteError(
                f"cannot write the run lock {self.path}: {error.strerror or error}; free disk space or "
                "run elsewhere (hydra.run.dir=... or output_dir=...)"
            ) from None
        self._handle = handle
        return self

    def release(self) -> None:
        if self._handle is not None:
            self._handle.close()  # closing drops the flock; the file stays (unlinking it would race)
            self._handle = None


def hold_run_dir(directory: Path) -> RunLock:
    """train.py: lock the run directory for the rest of the process, before Hydra writes its
    `.hydra/` files and train.log there (a refused run must not rewrite a live run's config)."""
    lock = RunLock(directory).acquire()
    _HELD[Path(directory).resolve()] = lock
    return lock


def hydra_mode() -> str | None:
    """RUN or MULTIRUN under @hydra.main, else None (tests, notebooks)."""
    from hydra.core.hydra_config import HydraConfig

    mode = HydraConfig.get().mode if HydraConfig.initialized() else None
    return None if mode is None else mode.name
