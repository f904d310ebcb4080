"""A sharded checkpoint (trainer=fsdp) read back whole, in the layout of a file checkpoint.

trainer=fsdp saves a directory (Lightning's ModelParallelStrategy): `torch.distributed.checkpoint`
(DCP) writes the weights and optimizer states, each rank its shards (`__<rank>_0.distcp`) plus one
`.metadata` index, and rank 0 writes everything else (step, LR schedule, sampler state, counters) to
`meta.pt`. A resume under trainer=fsdp reads the shards itself, on any number of ranks (DCP
reshards). Everything else that reads a checkpoint (`pretrain eval`, `pretrain export`, the start-up
checks, a resume on one device or under DDP) gets the dict a file checkpoint holds: `state_dict` with
full tensors and `optimizer_states` keyed by parameter position, as `optimizer.state_dict()` gives them.

DCP's `.metadata` is a plain pickle (unlike the shards, read with `weights_only=True`): a directory is
only ever read after its record (`<name>.sha256`, one line per file) has vouched for every file.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

METADATA = "meta.pt"  # Lightning's file of everything that is not a tensor of the model or optimizer
INDEX = ".metadata"  # DCP's index of the shards
OPTIMIZER_PREFIX = "optimizer_"  # Lightning's DCP keys: state_dict, optimizer_0, optimizer_1, ...


def is_sharded(path: str | Path) -> bool:
    """A directory written by torch.distributed.checkpoint."""
    return (Path(path) / INDEX).is_file()


def _read_tensors(path: Path, keys: set[str] | None) -> dict[str, Any]:
    """The top-level `keys` of the DCP checkpoint at `path` (all when None), shards joined into full
    tensors, in this process alone (no process group: also inside a run that has one)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    state: dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "assuming the intent is to load in a single process"
        _load_state_dict(
            state_dict=state,
            storage_reader=FileSystemReader(path),
            planner=_EmptyStateDictLoadPlanner(keys=keys),
            no_dist=True,
        )
    return state


def keyed_by_position(state: dict[str, Any]) -> dict[str, Any]:
    """An optimizer state keyed by parameter names (DCP's) -> keyed by position in its parameter groups,
    which is what `torch.optim.Optimizer.load_state_dict` expects."""
    positions: dict[str, int] = {}
    groups = []
    for group in state["param_groups"]:
        for name in group["params"]:
            positions.setdefault(name, len(positions))
        groups.append({**group, "params": [positions[name] for name in group["params"]]})
    return {
        "state": {positions[name]: value for name, value in state.get("state", {}).items()},
        "param_groups": groups,
    }


def load_sharded(path: str | Path, weights: bool = True, optimizer: bool = True) -> dict[str, Any]:
    """The checkpoint directory `path` as a file checkpoint's dict: `meta.pt`, plus the full
    `state_dict` when `weights`, plus `optimizer_states` when `optimizer` (a resume on one device or
    under DDP). The caller has verified `path` against its record."""
    path = Path(path)
    checkpoint = torch.load(path / METADATA, map_location="cpu", weights_only=True)
    if not (weights or optimizer):
        return checkpoint
    tensors = _read_tensors(path, None if optimizer else {"state_dict"})
    state_dict = tensors.pop("state_dict")
    if weights:
        checkpoint["state_dict"] = state_dict
    if optimizer:
        names = sorted(
            (k for k in tensors if k.startswith(OPTIMIZER_PREFIX)),
            key=lambda k: int(k[len(OPTIMIZER_PREFIX) :]),
        )
        checkpoint["optimizer_states"] = [keyed_by_position(tensors[name]) for name in names]
    return checkpoint
