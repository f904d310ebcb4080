"""Checkpoints that are checked when written and verified when resumed.

* Every write goes to a temporary file beside the target, hashed while it is written, flushed to disk,
  renamed into place and checked (the size written, a zip archive in torch's format); any failure is a
  `CheckpointError` naming the path. (Lightning's own atomic save swallows a PermissionError.)
* Next to each checkpoint `<name>.sha256` records its sha256 in `sha256sum` format (`cd checkpoints &&
  sha256sum -c last.ckpt.sha256` checks it by hand), written atomically after the checkpoint. A
  directory checkpoint (sharded FSDP) gets one line per file: a manifest.
* On resume the record is checked: a mismatch, an empty or unreadable file is a one-line
  `CheckpointError` naming the file; a checkpoint copied without its record loads with a warning.
* `ckpt_path=auto` takes the newest checkpoint of the run directory that passes these checks.
"""

from __future__ import annotations

import hashlib
import os
import re
import warnings
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint

from ..errors import CheckpointError

RECORD_SUFFIX = ".sha256"
AUTO = "auto"
_CHUNK = 1 << 22


class CheckpointWarning(UserWarning):
    """A checkpoint that loads but cannot be verified (no record)."""


def record_path(path: str | Path) -> Path:
    """`<checkpoint>.sha256` beside the checkpoint (file or directory)."""
    path = Path(path)
    return path.with_name(path.name + RECORD_SUFFIX)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


def _files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file())


def _write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(temporary, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def record_lines(path: Path) -> str:
    """The `sha256sum` lines of a checkpoint: one for a file, one per file of a directory."""
    if path.is_dir():
        return "".join(f"{_sha256(f)}  {path.name}/{f.relative_to(path).as_posix()}\n" for f in _files(path))
    return f"{_sha256(path)}  {path.name}\n"


def write_record(path: str | Path, digest: str | None = None) -> Path:
    """Record the checkpoint's sha256 (`digest` when it was hashed while written)."""
    path = Path(path)
    text = f"{digest}  {path.name}\n" if digest else record_lines(path)
    record = record_path(path)
    try:
        _write_atomically(record, text)
    except OSError as error:
        raise CheckpointError(
            f"could not write {record}: {error.strerror or error}; free disk space or make "
            f"{path.parent} writable"
        ) from None
    return record


class _HashingWriter:
    """A write-only file object that hashes what passes through it (torch.save streams to it)."""

    def __init__(self, handle: IO[bytes]):
        self.handle = handle
        self.digest = hashlib.sha256()
        self.written = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.digest.update(view)
        self.written += view.nbytes
        return self.handle.write(view)

    def flush(self) -> None:
        self.handle.flush()


def check_written(path: Path, expected_size: int | None = None) -> None:
    """A checkpoint file just written: it exists, has the bytes written, and is a torch zip archive."""
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} was not written; check that its directory is writable")
    size = path.stat().st_size
    if size == 0 or (expected_size is not None and size != expected_size):
        raise CheckpointError(
            f"checkpoint {path} has {size} bytes, {expected_size} were written: the disk may be full; "
            "free space and resume from the previous checkpoint"
        )
    _check_torch_archive(path)


def _check_torch_archive(path: Path) -> None:
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError) as error:
        raise CheckpointError(f"checkpoint {path} is not a readable torch checkpoint ({error})") from None
    if not any(name.endswith("/data.pkl") or name == "data.pkl" for name in names):
        raise CheckpointError(f"checkpoint {path} is a zip archive but not a torch checkpoint (no data.pkl)")


class VerifiedCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writer, but every write is atomic, hashed, checked and recorded, and a
    failure raises instead of being swallowed. With several ranks (only rank 0 writes) the failure is
    kept (`defer_errors`) until `raise_failed_save` makes every rank raise: rank 0 alone raising
    would leave the others waiting in the next collective."""

    def __init__(self) -> None:
        super().__init__()
        self.defer_errors = False
        self.failure: CheckpointError | None = None

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        if storage_options is not None:
            raise TypeError("VerifiedCheckpointIO takes no storage_options")
        try:
            save_verified(checkpoint, Path(path))
        except CheckpointError as error:
            if not self.defer_errors:
                raise
            self.failure = error

    def remove_checkpoint(self, path: Any) -> None:
        super().remove_checkpoint(path)
        record_path(path).unlink(missing_ok=True)


def save_verified(checkpoint: dict[str, Any], path: Path) -> str:
    """torch.save `checkpoint` to `path` atomically; returns its sha256 (also in `<path>.sha256`)."""
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(temporary, "wb") as handle:
            writer = _HashingWriter(handle)
            torch.save(checkpoint, writer)  # type: ignore[arg-type]
            handle.flush()
            os.fsync(handle.fileno())
        # The old record must not vouch for the new file, even for a moment.
        record_path(path).unlink(missing_ok=True)
        os.replace(temporary, path)
    except OSError as error:
        if temporary.parent.is_dir():
            temporary.unlink(missing_ok=True)
        raise CheckpointError(
            f"could not write checkpoint {path}: {error.strerror or error}; free disk space or make "
            f"{path.parent} writable (or run elsewhere: hydra.run.dir=...)"
        ) from None
    _fsync_directory(path.parent)
    check_written(path, writer.written)
    digest = writer.digest.hexdigest()
    write_record(path, digest)
    return digest


def _fsync_directory(directory: Path) -> None:
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


def raise_failed_save(trainer, filepath: str | Path) -> None:
    """After `trainer.save_checkpoint` on every rank: all of them raise if rank 0's write failed."""
    io = trainer.strategy.checkpoint_io
    failure = io.failure if isinstance(io, VerifiedCheckpointIO) else None
    if isinstance(io, VerifiedCheckpointIO):
        io.failure = None
    failed = failure is not None
    if trainer.world_size > 1:
        failed = trainer.strategy.reduce_boolean_decision(failed, all=False)
    if failure is not None:
        raise failure
    if failed:
        raise CheckpointError(
            f"rank 0 could not write checkpoint {filepath} (its error says why); every rank stops"
        )


class RecordedModelCheckpoint(ModelCheckpoint):
    """ModelCheckpoint whose failed writes stop every rank, and whose directory checkpoints (sharded
    FSDP) also get their manifest; file checkpoints are recorded by VerifiedCheckpointIO."""

    def setup(self, trainer, pl_module, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        io = trainer.strategy.checkpoint_io
        if isinstance(io, VerifiedCheckpointIO) and trainer.world_size > 1:
            io.defer_errors = True

    def _save_checkpoint(self, trainer, filepath: str) -> None:
        super()._save_checkpoint(trainer, filepath)
        raise_failed_save(trainer, filepath)
        if trainer.is_global_zero and Path(filepath).is_dir():
            write_record(filepath)


# --- verification on resume -------------------------------------------------------------------


def _read_record(record: Path) -> dict[str, str]:
    expected = {}
    try:
        text = record.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise CheckpointError(f"cannot read the checkpoint record {record}: {error}") from None
    for line in text.splitlines():
        match = re.fullmatch(r"([0-9a-f]{64}) [ *](.+)", line.strip())
        if not match:
            raise CheckpointError(
                f"the checkpoint record {record} is malformed; delete it to load the checkpoint unverified"
            )
        expected[match.group(2)] = match.group(1)
    return expected


def verify_checkpoint(path: str | Path) -> bool:
    """Check a checkpoint against its record: True when verified, False (with a warning) when it has
    no record; a missing, empty, unreadable or altered checkpoint is a CheckpointError naming it."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist; check ckpt_path")
    files = _files(path) if path.is_dir() else [path]
    if not files:
        raise CheckpointError(f"checkpoint directory {path} is empty; resume from another checkpoint")
    for file in files:
        if file.stat().st_size == 0:
            raise CheckpointError(f"checkpoint {file} is empty (0 bytes): resume from another checkpoint")
    if path.is_file():
        _check_torch_archive(path)
    record = record_path(path)
    if not record.is_file():
        warnings.warn(
            f"checkpoint {path} has no {record.name} record: it is loaded without verifying its sha256",
            CheckpointWarning,
            stacklevel=2,
        )
        return False
    expected = _read_record(record)
    names = {
        f"{path.name}/{f.relative_to(path).as_posix()}" if path.is_dir() else path.name: f for f in files
    }
    if set(expected) != set(names):
        raise CheckpointError(
            f"checkpoint {path} does not match its record {record.name} (files differ): it is "
            "incomplete or altered; resume from another checkpoint"
        )
    for name, file in names.items():
        try:
            actual = _sha256(file)
        except OSError as error:
            raise CheckpointError(f"checkpoint {file} cannot be read: {error.strerror or error}") from None
        if actual != expected[name]:
            raise CheckpointError(
                f"checkpoint {file} is corrupt: its sha256 {actual[:12]}... differs from the one recorded "
                f"when it was saved ({expected[name][:12]}...); resume from another checkpoint"
            )
    return True


def load_checkpoint(path: str | Path) -> dict:
    """The checkpoint's contents (tensors memory-mapped), or a CheckpointError naming the file."""
    path = Path(path)
    try:
        if path.is_dir():  # sharded: the metadata file Lightning writes beside the shards
            return torch.load(path / "meta.pt", map_location="cpu", weights_only=False)
        return torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    except Exception as error:  # torch raises RuntimeError, pickle errors, EOFError, ...
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise CheckpointError(f"checkpoint {path} cannot be loaded ({first[:160]})") from None


def checkpoint_step(path: Path) -> int | None:
    """The optimizer step a checkpoint holds (None when it cannot be read)."""
    try:
        return int(load_checkpoint(path).get("global_step", -1))
    except (CheckpointError, TypeError, ValueError):
        return None


def _candidates(directory: Path) -> Iterator[Path]:
    if not directory.is_dir():
        return
    for entry in directory.iterdir():
        if entry.name.startswith(".") or entry.name.endswith(RECORD_SUFFIX):
            continue
        if entry.suffix == ".ckpt":
            yield entry


def newest_valid_checkpoint(run_dir: Path, say=print) -> Path | None:
    """`ckpt_path=auto`: the verified checkpoint of `run_dir/checkpoints` with the highest step (the
    newer file on a tie); checkpoints without a record or that fail verification are skipped, saying so."""
    ranked = []
    for candidate in _candidates(run_dir / "checkpoints"):
        if not record_path(candidate).is_file():
            say(f"ckpt_path=auto: skipping {candidate} (no {candidate.name}{RECORD_SUFFIX} record)")
            continue
        step = checkpoint_step(candidate)
        if step is None:
            say(f"ckpt_path=auto: skipping {candidate} (unreadable)")
            continue
        ranked.append((step, candidate.stat().st_mtime, candidate))
    for _, _, candidate in sorted(ranked, key=lambda item: (item[0], item[1]), reverse=True):
        try:
            verify_checkpoint(candidate)
        except CheckpointError as error:
            say(f"ckpt_path=auto: skipping {candidate}: {error}")
            continue
        return candidate
    return None
