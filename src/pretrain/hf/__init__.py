"""Hugging Face interop: `pretrain export` and `model.init_from` (roundtrip.py), with one module per
architecture (gpt2.py, llama.py) for what differs.

`export`, `init_from`, `check_init_from` and `read_hf_config` are this package's API; they load on first
use, so importing `pretrain.hf.gpt2` alone stays light.
"""

from __future__ import annotations

import warnings
from importlib import import_module

_API = ("export", "init_from", "check_init_from", "read_hf_config")
_MOVED_NAMES = {
    **dict.fromkeys(
        ("model_weights", "check_weight_shapes", "check_export_output", "remove_stale_dirs", "eos_token_id"),
        "roundtrip.{}",
    ),
    **dict.fromkeys(
        (
            "to_hf_state_dict",
            "from_hf_state_dict",
            "CONV1D_WEIGHTS",
            "HF_BUFFERS",
            "LAYER_NORM_EPS",
            "ACTIVATIONS",
        ),
        "gpt2.{}",
    ),
    "gpt2_config": "gpt2.hf_config",
}
"""Names of the old single-module hf.py (before 0.2) -> where they live now."""

__all__ = list(_API)


def __getattr__(name: str):
    if name in _API:
        return getattr(import_module(f"{__name__}.roundtrip"), name)
    if name not in _MOVED_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = _MOVED_NAMES[name].format(name).split(".")
    warnings.warn(
        f"`pretrain.hf.{name}` moved to `pretrain.hf.{module}.{attribute}`; the old path stops working in "
        "the next release",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(import_module(f"{__name__}.{module}"), attribute)
