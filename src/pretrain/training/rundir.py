"""Run directories (`hydra.run.dir: ${pretrain.run_dir:outputs,<date>/<time>}` in conf/train.yaml).

Under SLURM a run's directory is its job's own id (`outputs/slurm-<SLURM_ARRAY_JOB_ID>_<SLURM_ARRAY_TASK_ID>`
or `outputs/slurm-<SLURM_JOB_ID>`): every rank resolves the same one, and a requeued job (same id) lands
in it again, where `ckpt_path=auto` finds its checkpoints. Elsewhere `outputs/<date>/<time>` is claimed
atomically with `os.mkdir` (`-1`, `-2`, ... when a run started in the same second already has it).
Light on purpose: train.py registers the resolver before Hydra starts.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
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


LOCK_NAME = ".run.lock"
START_OVER = "start_over"
"""The root key that lets a fresh run replace another run's checkpoints in its directory."""

_HELD: dict[Path, RunLock] = {}  # train.py's locks, held to the process's end (flock is per open file)
_BEFORE: dict[Path, frozenset[str] | None] = {}  # what a run directory held when this process locked
# it (None: the lock made it), for `remove_refused_run`


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
    `ckpt_path=auto` could resume the other run's newer step), nor replace its `metrics.csv`. Refused
    unless the user resumes or starts over explicitly (`start_over` checked: `check_start_over`)."""
    from ..errors import ConfigError

    if start_over:
        check_start_over(directory)
        return
    if ckpt_path is not None:
        return
    found = run_checkpoints(directory)
    if found:
        names = ", ".join(p.name for p in found[:3]) + (", ..." if len(found) > 3 else "")
        raise ConfigError(
            f"{Path(directory) / 'checkpoints'} holds another run's checkpoints ({names}): a new run would "
            f"overwrite them; resume it with ckpt_path=auto, replace it with {START_OVER}=true (deletes "
            "them), or run elsewhere (hydra.run.dir=... or output_dir=...)"
        )
    metrics = Path(directory) / "metrics.csv"
    if os.path.lexists(metrics):  # without checkpoints too: the earlier run's curve is data
        raise ConfigError(
            f"{metrics} holds another run's metrics (and no checkpoint): a new run would replace them; "
            f"replace them with {START_OVER}=true, resume from a checkpoint with ckpt_path=PATH, or run "
            "elsewhere (hydra.run.dir=... or output_dir=...)"
        )


def check_start_over(directory: Path) -> None:
    """`start_over=true` deletes only regular files that resolve inside the run directory (a sharded
    checkpoint: a directory of them). A `checkpoints/` that is a symbolic link (to another run's
    folder), or a checkpoint or record that is a link or not a regular file, is refused before
    anything is deleted."""
    from ..errors import ConfigError

    found = _not_deletable(Path(directory))
    if found is not None:
        path, what = found
        raise ConfigError(
            f"{START_OVER}=true deletes only regular files inside {directory}, and {path} {what}: nothing "
            "was deleted; remove it yourself or run elsewhere (hydra.run.dir=... or output_dir=...)"
        )


def _not_deletable(directory: Path) -> tuple[Path, str] | None:
    """The first path `remove_checkpoints` would delete that is not a regular file (or a sharded
    checkpoint's folder) resolving inside the run directory, and what it is; None when there is none."""
    import stat

    folder = directory / "checkpoints"
    if folder.is_symlink():
        return folder, f"is a symbolic link (to {os.readlink(folder)})"
    inside = directory.resolve()
    for path, may_be_folder in _deleted_paths(directory):
        try:
            mode = path.lstat().st_mode
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(mode):
            return path, f"is a symbolic link (to {os.readlink(path)})"
        if not (stat.S_ISREG(mode) or (may_be_folder and stat.S_ISDIR(mode))):
            return path, "is not a regular file"
        if not path.resolve().is_relative_to(inside):
            return path, f"resolves outside it (to {path.resolve()})"
    return None


def _deleted_paths(directory: Path) -> Iterator[tuple[Path, bool]]:
    """Every path `remove_checkpoints` deletes, and whether it may be a folder (a sharded checkpoint
    and the folders in it; os.walk lists a linked folder without entering it)."""
    for path in run_checkpoints(directory):
        yield path, True
        record = path.with_name(path.name + ".sha256")
        if os.path.lexists(record):
            yield record, False
        if path.is_dir() and not path.is_symlink():
            for root, folders, files in os.walk(path):
                yield from ((Path(root, name), True) for name in folders)
                yield from ((Path(root, name), False) for name in files)


def remove_checkpoints(directory: Path) -> list[Path]:
    """`start_over=true`: delete the checkpoints (and their records) an earlier run left there."""
    import shutil

    removed = run_checkpoints(directory)
    for path in removed:
        if path.is_dir() and not path.is_symlink():
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
            # Before the lock file and Hydra's .hydra/: what a refused run leaves there.
            before = frozenset(os.listdir(directory)) if directory.is_dir() else None
            directory.mkdir(parents=True, exist_ok=True)
            _BEFORE[directory.resolve()] = before
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


def this_run_dir() -> Path | None:
    """The single run directory this process locked or claimed (train.py), else None."""
    found = {*_HELD, *(Path(c).resolve() for c in _CLAIMED.values())}
    return found.pop() if len(found) == 1 else None


def remove_refused_run(directory: Path) -> None:
    """A run refused after its directory was made leaves it as it was: removed when this process made
    it (the `pretrain.run_dir` resolver, or its lock), else only the entries added since this process
    locked it (the lock file, Hydra's `.hydra/`); untouched when this process did not lock it."""
    import shutil

    resolved = Path(directory).resolve()
    claimed = any(Path(c).resolve() == resolved for c in _CLAIMED.values())
    if not resolved.is_dir() or not (claimed or resolved in _BEFORE):
        return
    before = None if claimed else _BEFORE[resolved]
    if before is None:
        shutil.rmtree(resolved, ignore_errors=True)
        return
    for name in sorted(set(os.listdir(resolved)) - before):
        path = resolved / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def hydra_mode() -> str | None:
    """RUN or MULTIRUN under @hydra.main, else None (tests, notebooks)."""
    from hydra.core.hydra_config import HydraConfig

    mode = HydraConfig.get().mode if HydraConfig.initialized() else None
    return None if mode is None else mode.name
