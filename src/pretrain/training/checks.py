"""Start-up checks that need the machine or a checkpoint: they fail before any heavy work, with what
to change. (Types, ranges and unknown keys are the schema's: pretrain.config.)"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from ..checkpoints.files import load_checkpoint
from ..config import AttnConfig, TrainerConfig, upgrade_sampler_state
from ..data.batching.policies import PolicySettings
from ..data.batching.samplers import check_resume
from ..errors import CheckpointError, ConfigError
from ..hf.roundtrip import check_weight_shapes, model_weights
from ..model import ModelSettings, config_from_dict
from ..model.attention import check_backend, resolve_backend

PRECISION_DTYPES = {"bf16": torch.bfloat16, "16": torch.float16, "fp16": torch.float16}
DATAMODULE_STATE = "PretrainDataModule"  # Lightning saves a datamodule's state under its class name


AUTO = "auto"
MULTI_RANK = ("ddp", "fsdp")  # strategies that start one process per device
FLASH_CAPABILITY = (8, 0)  # the flash varlen kernel and native bf16: Ampere and later


def _cuda_capability() -> tuple[int, int]:
    major, minor = torch.cuda.get_device_capability(0)
    return int(major), int(minor)


def training_device(trainer: TrainerConfig) -> str:
    accelerator = str(trainer.accelerator)
    if accelerator == AUTO:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if accelerator in {"gpu", "cuda"}:
        if not torch.cuda.is_available():
            ranks = (
                f", or trainer.accelerator=cpu trainer.devices=2 for {trainer.strategy} on CPU ranks (gloo)"
                if str(trainer.strategy) in MULTI_RANK
                else ""
            )
            raise ConfigError(
                f"trainer.accelerator={accelerator} but this machine has no CUDA device; use trainer=auto "
                f"(the CPU here) or trainer=cpu{ranks}"
            )
        return "cuda"
    return "cpu"


def check_ranks(trainer: TrainerConfig) -> None:
    """What Lightning would refuse with a traceback: every-GPU devices on CPU ranks, and fp16 under
    trainer=fsdp (ModelParallelStrategy has no loss scaling over sharded gradients)."""
    devices = str(trainer.devices).strip()
    if str(trainer.accelerator) == "cpu" and devices == "-1":
        raise ConfigError(
            "trainer.devices=-1 means every GPU; CPU ranks need a number: set trainer.devices=2 (or more)"
        )
    if str(trainer.strategy) == "fsdp" and str(trainer.precision) in ("16", "16-mixed"):
        raise ConfigError(
            f"trainer=fsdp cannot train in trainer.precision={trainer.precision} (no fp16 loss scaling over "
            "sharded gradients): use trainer.precision=bf16-mixed (an Ampere or later GPU) or 32-true, or "
            "trainer=ddp for fp16"
        )


def resolve_trainer(trainer: TrainerConfig) -> TrainerConfig:
    """`trainer=auto` made concrete for this machine: accelerator gpu with bf16-mixed (16-mixed before
    Ampere) when CUDA is there, else cpu with 32-true; explicit values are kept (precision=auto alone
    follows the device). Lightning and every later check see only concrete values."""
    device = training_device(trainer)
    accelerator = str(trainer.accelerator)
    if accelerator == AUTO:
        accelerator = "gpu" if device == "cuda" else "cpu"
    precision = str(trainer.precision)
    if precision == AUTO:
        precision = (
            "32-true"
            if device == "cpu"
            else "bf16-mixed"
            if _cuda_capability() >= FLASH_CAPABILITY
            else "16-mixed"
        )
    resolved = replace(trainer, accelerator=accelerator, precision=precision)
    check_ranks(resolved)
    return resolved


def compute_dtype(trainer: TrainerConfig) -> torch.dtype:
    precision = str(trainer.precision)
    for prefix, dtype in PRECISION_DTYPES.items():
        if precision.startswith(prefix):
            return dtype
    return torch.float32


def attention_backend(attn: AttnConfig, trainer: TrainerConfig) -> str:
    """The backend the run will use; an explicit one that cannot run here is an error, never a swap.
    `attn=auto` picks varlen on an Ampere-or-later GPU (the flash kernel's floor), sdpa elsewhere."""
    trainer = resolve_trainer(trainer)
    device = training_device(trainer)
    requested = str(attn.backend)
    if requested == "varlen" and device != "cuda":
        if torch.cuda.is_available():  # a GPU is here, but the run was told to train on the CPU
            raise ConfigError(
                f"attn=varlen needs a CUDA GPU and trainer.accelerator={trainer.accelerator} trains on the "
                "CPU: use trainer=auto (or trainer=gpu), or attn=sdpa for a CPU run"
            )
        raise ConfigError(
            "attn=varlen needs a CUDA GPU (the flash varlen kernel) and this machine has none: "
            "run it on a GPU box, or use attn=auto (sdpa here)"
        )
    if requested == AUTO and device == "cuda" and _cuda_capability() < FLASH_CAPABILITY:
        requested = "sdpa"
    check_backend(requested, device, compute_dtype(trainer), training=True)
    return resolve_backend(requested, device)


def device_line(attn: AttnConfig, requested: TrainerConfig, backend: str) -> str:
    """What the run chose, in one line: device, precision and attention backend, `(auto)` where the
    config left the choice to this machine."""
    trainer = resolve_trainer(requested)
    if training_device(trainer) == "cuda":
        where = f"GPU {torch.cuda.get_device_name(0)} (devices={trainer.devices})"
    else:
        where = "CPU"

    def auto(value: str, asked: object) -> str:
        return f"{value} (auto)" if str(asked) == AUTO else value

    precision = auto(str(trainer.precision), requested.precision)
    backend = auto(backend, attn.backend)
    return f"device: {auto(where, requested.accelerator)}, precision {precision}, attention {backend}"


def check_checkpoint(
    path: str | None,
    max_seq_len: int,
    model: ModelSettings,
    cache_key: str,
    max_steps: int | None = None,
    verified: bool = False,
    policy: PolicySettings | None = None,
    world_size: int | None = None,
) -> None:
    """A checkpoint that is corrupt, from another model size, context length or cache, already at
    train.max_steps, or whose data order `policy` on `world_size` ranks cannot continue exactly
    (samplers.check_resume) cannot be resumed: refused before any heavy work or rank, naming the file."""
    if not path:
        return
    if not Path(path).exists():
        raise CheckpointError(f"ckpt_path={path} does not exist")
    # sha256 against its record before unpickling (ckpt_path=auto verified it already); a copy without
    # one loads with a warning
    checkpoint = load_checkpoint(path, verified=verified, optimizer=False)
    saved = checkpoint.get("hyper_parameters")
    if not isinstance(saved, dict) or "model" not in saved:
        raise CheckpointError(f"ckpt_path={path} is not a checkpoint of this trainer (no model settings)")
    if int(saved.get("max_seq_len", -1)) != max_seq_len:
        raise CheckpointError(
            f"ckpt_path={path} was trained with data.max_seq_len={saved.get('max_seq_len')}, "
            f"the config says {max_seq_len}: resume with data.max_seq_len={saved.get('max_seq_len')}"
        )
    _check_model(path, saved, model)
    state = checkpoint.get("state_dict")
    if not isinstance(state, dict):
        raise CheckpointError(f"ckpt_path={path} holds no model weights (state_dict)")
    check_weight_shapes(model_weights(checkpoint), model, f"ckpt_path={path}")
    if saved.get("cache_key") != cache_key:
        mixed = any(str(key).startswith("mixture-") for key in (saved.get("cache_key"), cache_key))
        same = "mixture (its components, weights and max_repeat)" if mixed else "source"
        raise CheckpointError(
            f"ckpt_path={path} was trained on cache {saved.get('cache_key')}, this config gives {cache_key}: "
            f"resume with the same {same}, tokenizer, split and budget settings"
        )
    step = int(checkpoint.get("global_step", 0))
    if max_steps is not None and step >= max_steps:
        raise ConfigError(
            f"ckpt_path={path} is at step {step} and train.max_steps={max_steps}: nothing left to train; "
            f"raise train.max_steps above {step} to continue"
        )
    sampler_state = (checkpoint.get(DATAMODULE_STATE) or {}).get("train_sampler")
    if policy is not None and sampler_state:
        try:
            check_resume(upgrade_sampler_state(sampler_state), policy, world_size)
        except ConfigError as error:
            raise CheckpointError(f"ckpt_path={path}: {error}") from None


def _check_model(path: str, saved: dict, model: ModelSettings) -> None:
    """The checkpoint's model is the config's; one that differs only in vocab_size was trained with
    another tokenizer (the vocabulary follows it): that line names the tokenizer it was trained with."""
    try:
        have_model = config_from_dict(saved.get("model", {}))
    except (TypeError, ValueError):
        have_model = None
    if have_model == model:
        return
    if have_model is not None and replace(have_model, vocab_multiple=model.vocab_multiple) == model:
        raise CheckpointError(
            f"ckpt_path={path} holds {have_model.padded_vocab_size} vocabulary rows "
            f"(model.vocab_multiple={have_model.vocab_multiple}), this config pads to "
            f"{model.padded_vocab_size} (model.vocab_multiple={model.vocab_multiple}): resume with "
            f"model.vocab_multiple={have_model.vocab_multiple}"
        )
    if type(have_model) is type(model) and replace(have_model, vocab_size=model.vocab_size) == model:
        raise CheckpointError(
            f"ckpt_path={path} was trained with another tokenizer: {trained_tokenizer(saved)} "
            f"({have_model.vocab_size} ids), this config's model has vocab_size {model.vocab_size}: "
            "resume with the tokenizer it was trained with (a new tokenizer is a new run)"
        )
    raise CheckpointError(
        f"ckpt_path={path} holds a model {have_model}, the config asks for {model}: "
        "pick the same model=... and data.max_seq_len as the run that saved it"
    )


def trained_tokenizer(saved: dict) -> str:
    """The tokenizer a checkpoint's run used, as its saved config names it (`tokenizer.file=...`)."""
    tokenizer = (saved.get("run_config") or {}).get("tokenizer") or {}
    source, hub = tokenizer.get("source"), f"{tokenizer.get('name')}@{tokenizer.get('revision')}"
    named = {
        "file": f"tokenizer.file={tokenizer.get('file')}",
        "files": f"tokenizer.vocab_file={tokenizer.get('vocab_file')} (+ {tokenizer.get('merges_file')})",
        "hub": f"the hub's {hub} (tokenizer.source=hub)",
        "hub_file": f"the hub's {hub} tokenizer.json (tokenizer.source=hub_file)",
        "bundled": "GPT-2's bundled tokenizer (tokenizer=gpt2)",
    }
    return named.get(str(source), "a tokenizer it does not record")


def launch_world_size(trainer: TrainerConfig) -> int | None:
    """Ranks the run will have, when the config says so before any device is counted (None for
    trainer.devices=-1 or auto: the sampler checks what needs it once the ranks exist)."""
    devices = trainer.devices
    if isinstance(devices, str) and devices.strip().isdigit():
        devices = int(devices)
    if isinstance(devices, list | tuple):
        devices = len(devices)
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        return None
    return devices * int(trainer.num_nodes)
