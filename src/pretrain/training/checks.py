"""Bad configs fail here, before any heavy work, with what to change."""

from __future__ import annotations

from pathlib import Path

import torch

from ..data.policies import PolicySettings
from ..model import GPTConfig
from ..model.attention import check_backend, resolve_backend

PRECISION_DTYPES = {"bf16": torch.bfloat16, "16": torch.float16, "fp16": torch.float16}


def training_device(trainer_cfg) -> str:
    accelerator = str(trainer_cfg.get("accelerator", "cpu"))
    if accelerator == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if accelerator in {"gpu", "cuda"}:
        if not torch.cuda.is_available():
            raise ValueError(f"trainer.accelerator={accelerator} but this machine has no CUDA device; use trainer=cpu")
        return "cuda"
    return "cpu"


def compute_dtype(trainer_cfg) -> torch.dtype:
    precision = str(trainer_cfg.get("precision", "32-true"))
    for prefix, dtype in PRECISION_DTYPES.items():
        if precision.startswith(prefix):
            return dtype
    return torch.float32


def check_batching(cfg) -> None:
    """Data settings (max_seq_len, batch sizing, policy options) as the samplers will read them."""
    PolicySettings.from_cfg(cfg)
    for key in ("max_steps", "val_every_n_steps", "checkpoint_every_n_steps"):
        value = cfg.train.get(key)
        if value is not None and int(value) < 1:
            raise ValueError(f"train.{key} must be >= 1, got {value}")


def check_attention(cfg) -> str:
    """The backend the run will use; an explicit one that cannot run here is an error, never a swap."""
    device = training_device(cfg.trainer)
    requested = str(cfg.attn.backend)
    check_backend(requested, device, compute_dtype(cfg.trainer), training=True)
    return resolve_backend(requested, device)


def check_checkpoint(cfg, cache_key: str) -> None:
    """A checkpoint from another model size, context length or cache cannot be resumed."""
    path = cfg.get("ckpt_path")
    if not path:
        return
    if not Path(path).is_file():
        raise ValueError(f"ckpt_path={path} does not exist")
    checkpoint = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    saved = checkpoint.get("hyper_parameters", {})
    if int(saved.get("max_seq_len", -1)) != int(cfg.data.max_seq_len):
        raise ValueError(
            f"ckpt_path={path} was trained with data.max_seq_len={saved.get('max_seq_len')}, "
            f"the config says {cfg.data.max_seq_len}: resume with data.max_seq_len={saved.get('max_seq_len')}"
        )
    want_model = GPTConfig.from_mapping(cfg.model)
    have_model = GPTConfig.from_mapping(saved.get("model", {}))
    if have_model != want_model:
        raise ValueError(
            f"ckpt_path={path} holds a model {have_model}, the config asks for {want_model}: "
            "pick the same model=... and data.max_seq_len as the run that saved it"
        )
    if saved.get("cache_key") != cache_key:
        raise ValueError(
            f"ckpt_path={path} was trained on cache {saved.get('cache_key')}, this config gives {cache_key}: "
            "resume with the same source, tokenizer, split and budget settings"
        )


def check_config(cfg, cache_key: str) -> str:
    """All start-up checks; returns the resolved attention backend."""
    check_batching(cfg)
    backend = check_attention(cfg)
    check_checkpoint(cfg, cache_key)
    return backend
