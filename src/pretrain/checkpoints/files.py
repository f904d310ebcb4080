"""Checkpoint files: written atomically and recorded, verified before anything unpickles them, loaded
without running code. The one loader of a checkpoint (`load_checkpoint`): training's resume, `ckpt_path`
checks, `pretrain eval` and `pretrain export` all go through it. Nothing here imports Lightning.

* A write goes through `fileio.atomic_write` (temporary beside the target, fsync, rename), is hashed while
  it streams and checked (the size written, a zip archive in torch's format); any failure, a full disk
  included, is a one-line `CheckpointError` naming the path, and no temporary is left.
* Next to each checkpoint `<name>.sha256` records its sha256 in `sha256sum` format (`cd checkpoints &&
  sha256sum -c last.ckpt.sha256` checks it by hand). A directory checkpoint (sharded FSDP) gets one line
  per file: a manifest, without which it is never read (DCP's index is a plain pickle).
* Loading compares the record first, then unpickles with `weights_only=True`: a checkpoint holds only
  tensors, numbers, strings and containers, so a crafted pickle is refused instead of run. A checkpoint
  copied without its record loads with a warning (`ckpt_path=FILE`), or is refused (`require_record`).
* `ckpt_path=auto` resumes from the newest checkpoint of the run directory, and refuses to touch a
  directory holding checkpoints it cannot verify (it would overwrite them with a new run).
"""

from __future__ import annotations

import hashlib
import pickle
import re
import warnings
import zipfile
from pathlib import Path
from typing import IO, Any

import torch

from ..errors import CheckpointError
from ..fileio import atomic_write, process_alive, remove_stale_temporaries, sha256_file, write_text_atomic
from .sharded import load_sharded

RECORD_SUFFIX = ".sha256"
AUTO = "auto"


class CheckpointWarning(UserWarning):
    """A checkpoint that loads but cannot be verified (no record)."""


def record_path(path: str | Path) -> Path:
    """`<checkpoint>.sha256` beside the checkpoint (file or directory)."""
    path = Path(path)
    return path.with_name(path.name + RECORD_SUFFIX)


def _files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file())


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:200] if text else type(error).__name__


def _disk_hint(path: Path) -> str:
    return f"free disk space or make {path.parent} writable (or run elsewhere: hydra.run.dir=...)"


# --- writing ------------------------------------------------------------------------------------


def record_lines(path: Path) -> str:
    """The `sha256sum` lines of a checkpoint: one for a file, one per file of a directory."""
    if path.is_dir():
        return "".join(
            f"{sha256_file(f)}  {path.name}/{f.relative_to(path).as_posix()}\n" for f in _files(path)
        )
    return f"{sha256_file(path)}  {path.name}\n"


def write_record(path: str | Path, digest: str | None = None) -> Path:
    """Record the checkpoint's sha256 (`digest` when it was hashed while written)."""
    path = Path(path)
    text = f"{digest}  {path.name}\n" if digest else record_lines(path)
    record = record_path(path)
    try:
        write_text_atomic(record, text)
    except OSError as error:
        raise CheckpointError(
            f"could not write {record}: {error.strerror or error}; {_disk_hint(path)}"
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
    """A zip archive with a data.pkl: read from the archive's directory only, nothing unpickled."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError) as error:
        raise CheckpointError(f"checkpoint {path} is not a readable torch checkpoint ({error})") from None
    if not any(name.endswith("/data.pkl") or name == "data.pkl" for name in names):
        raise CheckpointError(f"checkpoint {path} is a zip archive but not a torch checkpoint (no data.pkl)")


_LEGACY_TEMP = re.compile(r"^\..+\.tmp-(?P<pid>\d+)$")  # `.step000004.ckpt.tmp-PID` of earlier versions


def remove_killed_writes(folder: Path) -> list[Path]:
    """The temporaries of writers killed mid-write (a full disk, kill -9) in `folder`: fileio's, and
    the `.<name>.tmp-<pid>` files earlier versions wrote. A live process's are kept."""
    removed = remove_stale_temporaries(folder)
    for entry in folder.glob(".*.tmp-*") if folder.is_dir() else ():
        match = _LEGACY_TEMP.match(entry.name)
        if match and not process_alive(int(match["pid"])) and entry.is_file():
            entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed


def save_verified(checkpoint: dict[str, Any], path: Path) -> str:
    """torch.save `checkpoint` to `path` atomically; returns its sha256 (also in `<path>.sha256`)."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_killed_writes(path.parent)  # what a writer killed mid-write left behind
        with atomic_write(path, "wb") as handle:
            writer = _HashingWriter(handle)
            torch.save(checkpoint, writer)  # type: ignore[arg-type]
            # The old record must not vouch for the new file, even for a moment.
            record_path(path).unlink(missing_ok=True)
    except OSError as error:
        raise CheckpointError(
            f"could not write checkpoint {path}: {error.strerror or error}; {_disk_hint(path)}"
        ) from None
    except RuntimeError as error:  # torch's zip writer reports a full disk as "file write failed"
        raise CheckpointError(
            f"could not write checkpoint {path} ({_first_line(error)}); {_disk_hint(path)}"
        ) from None
    check_written(path, writer.written)
    digest = writer.digest.hexdigest()
    write_record(path, digest)
    return digest


# --- verifying and loading ----------------------------------------------------------------------


def recorded_sha256(path: str | Path) -> str | None:
    """The sha256 the checkpoint file's record holds for it (None without a record or for a sharded
    checkpoint directory)."""
    path, record = Path(path), record_path(path)
    return _read_record(record).get(path.name) if record.is_file() and path.is_file() else None


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


def verify_checkpoint(path: str | Path, require_record: bool = False) -> bool:
    """Check a checkpoint against its record, reading bytes only (nothing is unpickled): True when
    verified, False (with a warning) when it has no record; a missing, empty, unreadable or altered
    checkpoint, or one without a record when `require_record`, is a CheckpointError naming it."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist; check the path")
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
        if path.is_dir():  # its DCP index is a plain pickle: never read unverified
            raise CheckpointError(
                f"checkpoint directory {path} has no {record.name} record, so it cannot be verified (a "
                "sharded checkpoint's .metadata is a plain pickle): refusing it; if you trust it, record it "
                f"with `find {path.name} -type f | LC_ALL=C sort | xargs sha256sum > {record.name}` in its "
                "folder"
            )
        if require_record:
            raise CheckpointError(
                f"checkpoint {path} has no {record.name} record, so it cannot be verified: refusing it; "
                f"if you trust the file, record it with `sha256sum {path.name} > {record.name}` in its folder"
            )
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
            actual = sha256_file(file)
        except OSError as error:
            raise CheckpointError(f"checkpoint {file} cannot be read: {error.strerror or error}") from None
        if actual != expected[name]:
            raise CheckpointError(
                f"checkpoint {file} is corrupt: its sha256 {actual[:12]}... differs from the one recorded "
                f"when it was saved ({expected[name][:12]}...); resume from another checkpoint"
            )
    return True


def load_checkpoint(
    path: str | Path,
    *,
    require_record: bool = False,
    verified: bool = False,
    map_location: Any = "cpu",
    weights: bool = True,
    optimizer: bool = True,
) -> dict:
    """The checkpoint's contents (tensors memory-mapped): its record compared first (skipped when the
    caller `verified` it already), then unpickled with `weights_only=True`, so a pickle that would run
    code or build objects of other types is refused, not run. Every failure is a CheckpointError.
    A sharded checkpoint (a directory) comes back in the same layout, its tensors joined in memory
    (checkpoints/sharded.py): only those asked for (`weights`, `optimizer`), on the CPU."""
    path = Path(path)
    if not verified:
        verify_checkpoint(path, require_record=require_record)
    try:
        if path.is_dir():
            checkpoint = load_sharded(path, weights=weights, optimizer=optimizer)
        else:
            checkpoint = torch.load(path, map_location=map_location, weights_only=True, mmap=True)
    except pickle.UnpicklingError as error:
        detail = re.search(r"Unsupported global: GLOBAL (\S+)", str(error))
        what = f"references {detail.group(1)}" if detail else "holds objects a checkpoint never has"
        raise CheckpointError(
            f"checkpoint {path} {what}: refused without unpickling it (a checkpoint of python train.py "
            "holds only tensors, numbers and strings); do not load files from untrusted sources"
        ) from None
    except Exception as error:  # torch raises RuntimeError, EOFError, ... for damaged files
        raise CheckpointError(f"checkpoint {path} cannot be loaded ({_first_line(error)})") from None
    if not isinstance(checkpoint, dict):
        raise CheckpointError(f"checkpoint {path} is not a checkpoint of python train.py (not a dict)")
    return checkpoint


def load_trainer_checkpoint(path: str | Path) -> dict:
    """A checkpoint of python train.py (`pretrain eval`, `pretrain export`): loaded as above, refused
    in one line when it lacks the model settings or weights eval and export rebuild from."""
    checkpoint = load_checkpoint(path, optimizer=False)
    hparams = checkpoint.get("hyper_parameters")
    if not isinstance(hparams, dict) or "model" not in hparams or "state_dict" not in checkpoint:
        raise CheckpointError(f"{path} is not a checkpoint of python train.py (no model hyper-parameters)")
    return checkpoint


# --- ckpt_path=auto -----------------------------------------------------------------------------


def _candidates(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    return sorted(
        entry for entry in directory.iterdir() if entry.suffix == ".ckpt" and not entry.name.startswith(".")
    )


def _short_reason(candidate: Path, error: Exception) -> str:
    text = str(error)
    if not record_path(candidate).is_file():
        return "no record"
    if "is corrupt" in text or "does not match its record" in text:
        return "differs from its record"
    if "refused without unpickling" in text:
        return "holds objects a checkpoint never has"
    return text.removeprefix(f"checkpoint {candidate} ")[:80]


def newest_valid_checkpoint(run_dir: Path) -> Path | None:
    """`ckpt_path=auto`: the checkpoint of `run_dir/checkpoints` with the highest step (the newer file
    on a tie), None when there is none. Every candidate is verified before it is read; one that cannot
    be (no record, altered, unreadable) is a CheckpointError naming them all: a new run there would
    overwrite them, and resuming from an older one would silently drop the newer work."""
    candidates = _candidates(run_dir / "checkpoints")
    ranked, unverifiable = [], []
    for candidate in candidates:
        try:
            verify_checkpoint(candidate, require_record=True)
            saved = load_checkpoint(candidate, verified=True, weights=False, optimizer=False)
            step = int(saved.get("global_step", -1))
        except (CheckpointError, TypeError, ValueError) as error:
            unverifiable.append(f"{candidate.name} ({_short_reason(candidate, error)})")
            continue
        ranked.append((step, candidate.stat().st_mtime, candidate))
    if unverifiable:
        folder = run_dir / "checkpoints"
        raise CheckpointError(
            f"ckpt_path=auto: cannot verify {', '.join(unverifiable)} in {folder}: refusing to resume or "
            f"start over there; load one unverified with ckpt_path={folder}/<name>, move them away, or "
            "start elsewhere (hydra.run.dir=... or output_dir=...)"
        )
    if not ranked:
        return None
    return max(ranked, key=lambda item: (item[0], item[1]))[2]
