"""`record_batches=true`: what each rank trained on, one JSON line per update (audits and tests)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import lightning as L
import numpy as np


def batch_digest(update) -> str:
    digest = hashlib.sha256()
    for mb in update.microbatches:
        digest.update(mb.input_ids.cpu().numpy().tobytes())
        digest.update(mb.cu_seqlens.cpu().numpy().tobytes())
    return digest.hexdigest()


class BatchRecorder(L.Callback):
    def __init__(self, output_dir: Path):
        self.output_dir = Path(output_dir)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        chunks = [np.asarray(mb.meta.get("chunks", [])).tolist() for mb in batch.microbatches]
        record = {
            "step": int(trainer.global_step),
            "rank": int(trainer.global_rank),
            "digest": batch_digest(batch),
            "chunks": chunks,
            "num_targets": [int(mb.num_targets) for mb in batch.microbatches],
        }
        path = self.output_dir / f"batches.rank{trainer.global_rank}.jsonl"
        with open(path, "a") as handle:
            handle.write(json.dumps(record) + "\n")
