"""The Hugging Face round trip, for every architecture: `pretrain export` writes a checkpoint as a
transformers directory (safetensors, config.json, the tokenizer files, a model card); `model.init_from`
starts training from one.

What differs by architecture (names, layouts, config fields, checks) is gpt2.py's and llama.py's; this
module picks one by the model's settings and never goes back. Export writes with transformers; import
reads with `safetensors` and `json` alone: training never imports transformers.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path
from types import ModuleType

import torch

from ..data.gpt2 import EOS_TOKEN_ID
from ..errors import CheckpointError, ConfigError, WriteError
from ..fileio import process_alive
from ..model import Decoder, LlamaConfig, ModelSettings, build_model, config_from_dict
from ..model.vocabulary import padded_vocab_rows, real_vocab_rows
from . import gpt2, llama


def _missing_extra(error: ImportError) -> ConfigError:
    return ConfigError(f"{error.name} is missing: pip install -e '.[hf]' (transformers and safetensors)")


# --- export -------------------------------------------------------------------------------------


def model_weights(checkpoint: dict) -> dict[str, torch.Tensor]:
    return {
        k.removeprefix("model."): v for k, v in checkpoint["state_dict"].items() if k.startswith("model.")
    }


def check_weight_shapes(weights: dict[str, torch.Tensor], model: ModelSettings, where: str) -> None:
    """The checkpoint's weights fit `model` tensor by tensor (a file whose settings match can still hold
    another shape): refused in one line naming the tensor and both shapes, not a load_state_dict
    traceback. The model is built on the meta device (no memory)."""
    with torch.device("meta"):
        expected = build_model(model, attn="sdpa").state_dict()
    for name, tensor in expected.items():
        have = weights.get(name)
        if have is None:
            raise CheckpointError(
                f"{where} has no tensor {name}, which the model needs: it is not this model's"
            )
        if tuple(have.shape) != tuple(tensor.shape):
            raise CheckpointError(
                f"{where}: tensor {name} has shape {tuple(have.shape)}, the model needs "
                f"{tuple(tensor.shape)}: the file does not fit its own model settings (altered, or saved by "
                "another model)"
            )


def architecture(model: ModelSettings) -> ModuleType:
    """The module that maps `model`'s architecture (gpt2.py or llama.py)."""
    return llama if isinstance(model, LlamaConfig) else gpt2


def _model_card(checkpoint: dict, hparams: dict, architecture: str = "GPT2LMHeadModel") -> str:
    extra = checkpoint.get("pretrain", {})
    config = hparams.get("run_config") or {}
    identity = hparams.get("cache_identity")
    val_loss = extra.get("val_loss")
    rows = [
        ("policy", config.get("data", {}).get("policy", "?")),
        ("max_seq_len", hparams.get("max_seq_len")),
        ("optimizer steps", checkpoint.get("global_step")),
        ("real tokens trained", f"{extra.get('tokens_seen', 0):,}"),
        ("validation loss (nats/token)", "n/a" if val_loss is None else f"{val_loss:.4f}"),
        ("cache key", hparams.get("cache_key")),
    ]
    table = "\n".join(f"| {name} | {value} |" for name, value in rows)
    tag, title = ("gpt2", "GPT-2") if architecture == "GPT2LMHeadModel" else ("llama", "A Llama-style model")
    return (
        f"---\nlibrary_name: transformers\npipeline_tag: text-generation\ntags: [{tag}, pretrain]\n---\n\n"
        f"# {title} trained with pretrain\n\n"
        f"Exported by `pretrain export`: load it with `transformers.{architecture}.from_pretrained` and\n"
        "`AutoTokenizer.from_pretrained` (the tokenizer files its cache was built with).\n\n"
        "| what | value |\n|---|---|\n"
        f"{table}\n\n"
        "## Cache identity\n\n```json\n"
        f"{json.dumps(identity, indent=2, sort_keys=True)}\n```\n"
    )


def _write_tokenizer(directory: Path, hparams: dict, max_length: int) -> None:
    from ..config import TokenizerConfig
    from ..data.ingest.chat import trained_template
    from ..data.ingest.tokenizer import EOS_TEXT, build_tokenizer
    from ..data.ingest.tokenizer_json import TokenizerJson, resolve_tokenizer

    saved = (hparams.get("run_config") or {}).get("tokenizer")
    if not saved:
        raise CheckpointError("the checkpoint does not record its tokenizer (written by an older pretrain)")
    files = resolve_tokenizer(TokenizerConfig(**saved))
    recorded = (hparams.get("cache_identity") or {}).get("tokenizer", {}).get("content_sha256")
    if recorded and files.content_sha256() != recorded:
        named = str(files.vocab) if isinstance(files, TokenizerJson) else f"{files.vocab}, {files.merges}"
        raise CheckpointError(
            f"the tokenizer files {named} are not those the cache was built with "
            "(their content differs): give the original files with tokenizer.* overrides"
        )
    chat = trained_template(hparams, files)
    if isinstance(files, TokenizerJson):
        _write_tokenizer_json(directory, files, max_length, chat)
        return
    shutil.copyfile(files.vocab, directory / "vocab.json")
    shutil.copyfile(files.merges, directory / "merges.txt")
    build_tokenizer(files).save(str(directory / "tokenizer.json"))
    special = {"bos_token": EOS_TEXT, "eos_token": EOS_TEXT, "unk_token": EOS_TEXT}
    settings = {"tokenizer_class": "GPT2Tokenizer", "model_max_length": max_length, "add_prefix_space": False}
    settings.update(chat)
    (directory / "tokenizer_config.json").write_text(json.dumps({**settings, **special}, indent=2) + "\n")
    (directory / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")


def _write_tokenizer_json(directory: Path, files, max_length: int, chat: dict) -> None:
    """A tokenizer.json run: the file itself, and the settings AutoTokenizer reads (its EOS)."""
    shutil.copyfile(files.path, directory / "tokenizer.json")
    special = {"eos_token": files.eos_text}
    settings = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_length, **chat}
    (directory / "tokenizer_config.json").write_text(json.dumps({**settings, **special}, indent=2) + "\n")
    (directory / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")


def check_export_output(output: Path | str) -> Path:
    """`--output` must be a new (or empty) directory with a writable parent: checked before loading."""
    output = Path(output).resolve()
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise ConfigError(f"--output {output} exists and is not an empty directory: pick a new one")
    parent = output.parent
    if not parent.is_dir():
        raise ConfigError(f"--output {output}: its folder {parent} does not exist; create it or pick another")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"--output {output}: {parent} is not writable; pick a folder you can write")
    return output


def _io_reason(error: BaseException) -> str:
    """An OSError's strerror, or the OS's words inside safetensors' `... I/O error: X (os error N) ...`."""
    if isinstance(error, OSError):
        return str(error.strerror or error)
    found = re.search(r"I/O error: (.+?) \(os error \d+\)", str(error))
    return found.group(1) if found else str(error).splitlines()[0]


def export(checkpoint_path: Path | str, output: Path | str) -> Path:
    """Write `output` as a Hugging Face GPT-2 directory; built beside it and renamed into place, so a
    failure (a full disk, a permission) leaves nothing behind."""
    from ..checkpoints.files import load_trainer_checkpoint

    output = check_export_output(output)
    try:
        import transformers
        from safetensors import SafetensorError
        from safetensors.torch import save_file
    except ImportError as error:
        raise _missing_extra(error) from error
    checkpoint = load_trainer_checkpoint(checkpoint_path)
    hparams = checkpoint["hyper_parameters"]
    model = config_from_dict(hparams["model"])
    arch = architecture(model)
    config_class = getattr(transformers, arch.CONFIG_CLASS)
    hf_config = config_class(
        **arch.hf_config(model, eos_token_id(hparams)), architectures=[arch.ARCHITECTURE]
    )
    # The padded vocabulary's extra rows stay behind: an export has the real vocab_size rows.
    weights = arch.to_hf_state_dict(real_vocab_rows(model_weights(checkpoint), model.vocab_size))
    remove_stale_dirs(output.parent)
    tmp = output.with_name(f".{output.name}.{os.getpid()}.export")
    try:
        tmp.mkdir()
        hf_config.save_pretrained(tmp)
        save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        os.chmod(tmp / "model.safetensors", 0o644)  # safetensors creates it 0600; the others are 0644
        _write_tokenizer(tmp, hparams, model.max_seq_len)
        (tmp / "README.md").write_text(_model_card(checkpoint, hparams, arch.ARCHITECTURE))
        if output.exists():
            output.rmdir()
        os.rename(tmp, output)
    except (OSError, SafetensorError) as error:  # safetensors' I/O errors are not OSErrors
        shutil.rmtree(tmp, ignore_errors=True)
        raise WriteError(
            f"could not write the export to {output}: {_io_reason(error)}; free disk space or pick "
            "another --output (nothing was left behind)"
        ) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return output


def remove_stale_dirs(folder: Path) -> None:
    """Delete the staging directories of exports killed mid-write (their process is gone)."""
    for entry in folder.glob(".*.export"):
        pid = entry.name.rsplit(".", 2)[-2]
        if pid.isdigit() and int(pid) != os.getpid() and not process_alive(int(pid)):
            shutil.rmtree(entry, ignore_errors=True)


# --- import (model.init_from) -------------------------------------------------------------------


def read_hf_config(directory: Path | str, model_type: str = gpt2.MODEL_TYPE) -> dict:
    name = gpt2.NAME if model_type == gpt2.MODEL_TYPE else llama.NAME
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise ConfigError(
            f"model.init_from={directory}: no config.json there (give a Hugging Face {name} directory)"
        )
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ConfigError(
            f"model.init_from={directory}: config.json cannot be read ({error}); give a Hugging Face "
            f"{name} directory"
        ) from None
    if not isinstance(config, dict):
        raise ConfigError(f"model.init_from={directory}: config.json is not a JSON object")
    if config.get("model_type", "gpt2") != model_type:
        sizes = "llama-*" if config.get("model_type") == "llama" else "tiny, gpt2-*"
        raise ConfigError(
            f"model.init_from={directory} holds a {config.get('model_type')} model, not {name}: pick a "
            f"model= of its architecture ({sizes})"
        )
    return config


def check_init_from(directory: Path | str, model: ModelSettings, extend_positions: bool) -> dict:
    """Refuse, before any heavy work, a directory whose architecture, shape or options differ from
    `model`; returns its config.json."""
    arch = architecture(model)
    config = read_hf_config(directory, arch.MODEL_TYPE)
    arch.check_directory(config, model, f"model.init_from={directory}", extend_positions)
    return config


def _read_weights(directory: Path) -> dict[str, torch.Tensor]:
    try:
        from safetensors.torch import load_file
    except ImportError as error:
        raise _missing_extra(error) from error
    shards = sorted(directory.glob("model*.safetensors"))
    if shards:
        weights: dict[str, torch.Tensor] = {}
        for shard in shards:
            try:
                weights.update(load_file(str(shard)))
            except Exception as error:  # safetensors raises its own SafetensorError for a bad header
                first = (
                    str(error).strip().splitlines()[0][:160] if str(error).strip() else type(error).__name__
                )
                raise ConfigError(
                    f"model.init_from={directory}: {shard.name} cannot be read ({first}); "
                    "re-export or re-download it"
                ) from None
        return weights
    legacy = directory / "pytorch_model.bin"
    if legacy.is_file():
        try:
            return torch.load(legacy, map_location="cpu", weights_only=True)
        except Exception as error:
            raise ConfigError(
                f"model.init_from={directory}: pytorch_model.bin cannot be read ({type(error).__name__}); "
                "re-export or re-download it"
            ) from None
    raise ConfigError(f"model.init_from={directory}: no model.safetensors or pytorch_model.bin there")


@torch.no_grad()
def init_from(model: Decoder, directory: Path | str, extend_positions: bool = False) -> Decoder:
    """Copy a Hugging Face directory's weights into `model` (GPT-2: positions past the directory's
    table, with `extend_positions`, keep the model's own initialisation)."""
    directory = Path(directory)
    check_init_from(directory, model.config, extend_positions)
    arch = architecture(model.config)
    weights = arch.from_hf_state_dict(_read_weights(directory), model.config)
    weights = padded_vocab_rows(weights, model.config.padded_vocab_size)  # zero rows: the padded ids
    _check_layout(directory, model.state_dict(), weights, f"the {arch.NAME} layout")
    loaded = arch.copy_weights(model, weights, f"model.init_from={directory}")
    print(
        f"model.init_from: loaded {len(weights)} tensors of {directory} "
        f"({model.config.n_layer} layers, d_model {model.config.d_model}, {loaded})",
        file=sys.stderr,
        flush=True,
    )
    return model


def _check_layout(directory: Path, own: dict, weights: dict, layout: str) -> None:
    """The directory's tensor names are the model's, no more and no fewer, each floating point."""
    missing, unexpected = sorted(set(own) - set(weights)), sorted(set(weights) - set(own))
    if missing or unexpected:
        raise ConfigError(
            f"model.init_from={directory}: weights do not match {layout} "
            f"(missing {missing[:4]}, unexpected {unexpected[:4]})"
        )
    for key, value in weights.items():  # copy_ would cast integers of the right shape silently
        if not value.is_floating_point():
            kind = str(value.dtype).removeprefix("torch.")
            raise ConfigError(f"model.init_from={directory}: {key} holds {kind}, not floating point weights")


def eos_token_id(hparams: dict) -> int:
    """The EOS id of the run's tokenizer, as its cache identity records it (GPT-2's when absent)."""
    recorded = (hparams.get("cache_identity") or {}).get("eos_token_id")
    return int(recorded) if recorded is not None else EOS_TOKEN_ID
