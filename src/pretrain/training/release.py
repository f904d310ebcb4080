"""What a finished run lets go of before its comparison plot: the training state.

By then last.ckpt, run.json and the summary hold everything the run produced, and what is left of it
in the process is only memory: the model's weights and gradients, the optimizer's moments, the
sampler's plans, the validation pairs and the mapped cache. Released first, the plot (matplotlib, a
figure) allocates below the run's peak instead of adding to it, and a multirun's next job in this
process starts from what the last one gave back.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc

import lightning as L
import torch


def release_training_state(trainer: L.Trainer) -> None:
    """Free the model's tensors (moved to the meta device: shapes without storage), the optimizers'
    state and the data module's samplers, validation sets and caches. The trainer's loggers and
    the summary's plain values stay: the W&B run still gets its summary row and plot."""
    for optimizer in trainer.optimizers:
        optimizer.state.clear()
    module = trainer.lightning_module
    if module is not None and trainer.world_size == 1:  # a sharded model's tensors are its strategy's
        module.zero_grad(set_to_none=True)
        module.to(torch.device("meta"))
    datamodule = getattr(trainer, "datamodule", None)  # set by fit(); not in Trainer's stubs
    if datamodule is not None:
        for name in ("train_sampler", "validation_sets", "cache"):
            if hasattr(datamodule, name):
                setattr(datamodule, name, None)
        if isinstance(getattr(datamodule, "caches", None), dict):
            datamodule.caches = {}
    gc.collect()
    _return_free_memory()


def _return_free_memory() -> None:
    """glibc keeps freed heap memory for reuse (the backward's buffers, hundreds of MB): handed back
    to the system here, so that what follows allocates below the run's peak. A no-op elsewhere."""
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        trim = None
    if trim is not None:
        trim(0)
