"""Lightning's side of checkpoints/files.py: the CheckpointIO plugin through which Lightning writes and (on
`trainer.fit(ckpt_path=...)`) reads every checkpoint, and the ModelCheckpoint callback that makes a
failed write stop every rank."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint

from ..checkpoints.files import load_checkpoint, record_path, save_verified, write_record
from ..errors import CheckpointError


class VerifiedCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writer and reader, but every write is atomic, hashed, checked and
    recorded, a failure raises instead of being swallowed, and a read goes through our one loader
    (record first, then `weights_only=True`). With several ranks (only rank 0 writes) a failure is
    kept (`defer_errors`) until `raise_failed_save` makes every rank raise: rank 0 alone raising would
    leave the others waiting in the next collective."""

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

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict:
        # The run checked this file before training (check_checkpoint); it is verified again here
        # because the bytes Lightning reads are the ones that count.
        return load_checkpoint(path, map_location=map_location or "cpu")

    def remove_checkpoint(self, path: Any) -> None:
        super().remove_checkpoint(path)
        record_path(path).unlink(missing_ok=True)


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
