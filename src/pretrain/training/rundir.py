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
    """True when this process created `path` with the resolver (a new run directory of its own)."""
    return any(Path(claimed).resolve() == Path(path).resolve() for claimed in _CLAIMED.values())


LOCK_NAME = ".run.lock"


class RunLock:
    """One training process per run directory: an exclusive `flock` on `<run dir>/.run.lock`, which
    also names its holder (pid, host). The kernel drops the lock when the holder dies, however it
    dies, so a stale lock file is simply taken over. With several ranks only rank 0 takes it (the
    other ranks are its own job's)."""

    def __init__(self, directory: Path):
        self.path = Path(directory) / LOCK_NAME
        self._handle: IO[str] | None = None

    def acquire(self) -> RunLock:
        import fcntl
        import socket

        from ..errors import ConfigError, WriteError

        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            handle = open(self.path, "a+")
        except OSError as error:
            raise WriteError(
                f"cannot write the run directory {self.path.parent}: {error.strerror or error}; make it "
                "writable or run elsewhere (hydra.run.dir=... or output_dir=...)"
            ) from None
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise ConfigError(
                f"{self.path.parent} is in use by {holder}: two runs in one directory would overwrite "
                "each other's checkpoints and metrics; wait for it to end, or run elsewhere "
                "(hydra.run.dir=... or output_dir=...)"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        handle.flush()
        self._handle = handle
        return self

    def release(self) -> None:
        if self._handle is not None:
            self._handle.close()  # closing drops the flock; the file stays (unlinking it would race)
            self._handle = None
