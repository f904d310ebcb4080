"""trainer=fsdp: fully sharded data parallel with FSDP2 (`torch.distributed.fsdp.fully_shard`), through
Lightning's ModelParallelStrategy.

Every rank is data parallel (a 1-D mesh of all ranks; no tensor parallelism), each transformer block is
one FSDP unit and the root (embeddings, final norm, the tied head) another: a block's parameters are
gathered just before it runs and freed after it, in the forward and again in the backward. Gradients
are reduce-scattered as averages over ranks, as DDP's all-reduce averages them, so the two train the
same updates. The same code runs on CPU ranks (gloo) and on GPUs (NCCL).

Checkpoints are directories of shards (checkpoints/sharded.py), written afresh at each save and
recorded file by file; a resume under trainer=fsdp reshards them to its own number of ranks.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.strategies import ModelParallelStrategy

from ..checkpoints.files import record_path
from ..model.architectures import blocks_of

# What training and scoring call on the root model instead of forward (update.py: loss, scoring.py:
# token_losses): FSDP gathers the root's parameters around these calls too.
ENTRY_POINTS = ("loss", "token_losses")


def shard_model(model: torch.nn.Module, mesh) -> dict:
    """fully_shard each of `model.blocks`, then the root, on the data-parallel dimension of `mesh`;
    returns what was done, for run.json."""
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    ranks = mesh["data_parallel"] if mesh.mesh_dim_names and "data_parallel" in mesh.mesh_dim_names else mesh
    blocks = list(blocks_of(model))
    for index, block in enumerate(blocks):
        # The last block's backward runs right after the forward: keeping it gathered saves a gather.
        fully_shard(block, mesh=ranks, reshard_after_forward=index < len(blocks) - 1)
    fully_shard(model, mesh=ranks)
    for name in ENTRY_POINTS:
        register_fsdp_forward_method(model, name)
    return {"kind": "fsdp2", "ranks": ranks.size(), "units": len(blocks) + 1}


class FSDP2Strategy(ModelParallelStrategy):
    """ModelParallelStrategy with all ranks data parallel (its `auto` would make the GPUs of a node a
    tensor-parallel group), which saves each checkpoint directory afresh: a directory left by an
    earlier save (more ranks, an interrupted write) would otherwise keep stale shards, and its record
    must not vouch for the new files."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(save_distributed_checkpoint=True, **kwargs)

    def setup_environment(self) -> None:
        self._data_parallel_size = self.num_nodes * self.num_processes
        self._tensor_parallel_size = 1
        super().setup_environment()

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        path = Path(self.broadcast(filepath))
        if self.is_global_zero:
            record_path(path).unlink(missing_ok=True)
            if path.is_dir():
                shutil.rmtree(path)
        self.barrier("fsdp-save")
        super().save_checkpoint(checkpoint, path, storage_options)


def lightning_strategy(name: str) -> str | FSDP2Strategy:
    """`trainer.strategy` as Lightning takes it: `fsdp` is FSDP2 here (Lightning's own `fsdp` is the
    older FullyShardedDataParallel wrapper, which refuses CPU ranks); other names pass through."""
    return FSDP2Strategy() if name == "fsdp" else name
