"""Checkpoint files as training sees them: pretrain.checkpoint_files (below hf, which loads them for
`pretrain export`) owns writing, records, verification and the one loader; re-exported here."""

from ..checkpoint_files import (
    AUTO,
    RECORD_SUFFIX,
    CheckpointWarning,
    check_written,
    load_checkpoint,
    load_trainer_checkpoint,
    newest_valid_checkpoint,
    record_lines,
    record_path,
    remove_killed_writes,
    save_verified,
    verify_checkpoint,
    write_record,
)

__all__ = [
    "AUTO",
    "RECORD_SUFFIX",
    "CheckpointWarning",
    "check_written",
    "load_checkpoint",
    "load_trainer_checkpoint",
    "newest_valid_checkpoint",
    "record_lines",
    "record_path",
    "remove_killed_writes",
    "save_verified",
    "verify_checkpoint",
    "write_record",
]
