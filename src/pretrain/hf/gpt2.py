"""The GPT-2 half of the Hugging Face round trip: our GPT <-> transformers' `GPT2LMHeadModel`.

The model is GPT-2 exactly (tanh GELU = `gelu_new`, LayerNorm eps 1e-5, tied head); only the layout
differs. GPT-2's Conv1D stores linear weights as (in, out) where `nn.Linear` has (out, in). Its keys
carry a `transformer.` prefix. Here live the mapping, the config and its checks; roundtrip.py reads and
writes the files.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from ..data.gpt2 import EOS_TOKEN_ID
from ..errors import ConfigError
from ..model import GPT, GPTConfig

MODEL_TYPE = "gpt2"
NAME = "GPT-2"
ARCHITECTURE = "GPT2LMHeadModel"
CONFIG_CLASS = "GPT2Config"
CONV1D_WEIGHTS = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
HF_BUFFERS = (".attn.bias", ".attn.masked_bias")  # causal-mask buffers older transformers saved
LAYER_NORM_EPS = 1e-5
ACTIVATIONS = ("gelu_new", "gelu_pytorch_tanh")  # GPT-2's tanh GELU, two names


def hf_config(model: GPTConfig, eos_token_id: int = EOS_TOKEN_ID) -> dict:
    """transformers' GPT2Config fields for `model`; options GPT-2 has no equivalent for are refused."""
    if not model.bias:
        raise ConfigError(
            "model.bias=false has no GPT-2 equivalent (GPT-2 has biases in every linear layer and "
            "LayerNorm); only models trained with model.bias=true can be exported"
        )
    return {
        "vocab_size": model.vocab_size,
        "n_positions": model.max_seq_len,
        "n_embd": model.d_model,
        "n_layer": model.n_layer,
        "n_head": model.n_head,
        "n_inner": None,  # 4 x n_embd, as ours
        "activation_function": "gelu_new",
        "resid_pdrop": model.dropout,
        "embd_pdrop": model.dropout,
        "attn_pdrop": 0.0,  # the attention kernels have no dropout
        "layer_norm_epsilon": LAYER_NORM_EPS,
        "bos_token_id": eos_token_id,
        "eos_token_id": eos_token_id,
        "tie_word_embeddings": True,
    }


def to_hf_state_dict(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our GPT's state dict as GPT2LMHeadModel's (the tied lm_head is left to transformers)."""
    out = {}
    for key, value in state.items():
        value = value.detach().to("cpu")
        out[f"transformer.{key}"] = (
            value.t().contiguous() if key.endswith(CONV1D_WEIGHTS) else value.contiguous()
        )
    return out


def from_hf_state_dict(
    state: Mapping[str, torch.Tensor], model: GPTConfig | None = None
) -> dict[str, torch.Tensor]:
    """GPT2LMHeadModel's (or GPT2Model's) weights as our GPT's state dict; refuses an untied head."""
    out = {}
    for key, value in state.items():
        name = key.removeprefix("transformer.")
        if name.endswith(HF_BUFFERS):
            continue
        if name == "lm_head.weight":
            continue  # checked against the embedding below
        out[name] = value.t().contiguous() if name.endswith(CONV1D_WEIGHTS) else value
    head = state.get("lm_head.weight")
    if head is not None and "wte.weight" in out and not torch.equal(head, out["wte.weight"]):
        raise ConfigError(
            "the model's lm_head is not tied to its token embedding: GPT-2 ties them, this GPT too"
        )
    return out


def check_directory(config: Mapping, model: GPTConfig, where: str, extend_positions: bool) -> None:
    """Refuse a GPT-2 config whose shape or options differ from `model`, in one line."""
    theirs = {
        "vocab_size": config.get("vocab_size"),
        "n_layer": config.get("n_layer"),
        "n_head": config.get("n_head"),
        "d_model": config.get("n_embd"),
    }
    differ = {
        key: (value, getattr(model, key)) for key, value in theirs.items() if value != getattr(model, key)
    }
    if differ:
        detail = ", ".join(
            f"{key}: {have} there, model.{key}={want} here" for key, (have, want) in differ.items()
        )
        raise ConfigError(f"{where} has another shape ({detail}): pick the matching model=")
    if config.get("n_inner") not in (None, 4 * model.d_model):
        raise ConfigError(f"{where}: n_inner={config['n_inner']}, this GPT has 4 x d_model")
    if config.get("activation_function", "gelu_new") not in ACTIVATIONS:
        raise ConfigError(f"{where}: activation {config['activation_function']}, GPT-2 uses gelu_new")
    if not math.isclose(float(config.get("layer_norm_epsilon", LAYER_NORM_EPS)), LAYER_NORM_EPS):
        raise ConfigError(f"{where}: layer_norm_epsilon {config['layer_norm_epsilon']}, not 1e-5")
    if not model.bias:
        raise ConfigError("model.init_from needs model.bias=true: GPT-2 has biases everywhere")
    positions = int(config.get("n_positions", 1024))
    if positions < model.max_seq_len and not extend_positions:
        raise ConfigError(
            f"{where} has {positions} positions, data.max_seq_len={model.max_seq_len} "
            f"needs more: use data.max_seq_len<={positions}, or model.extend_positions=true to start the "
            "extra positions from a fresh initialisation"
        )


@torch.no_grad()
def copy_weights(model: GPT, weights: Mapping[str, torch.Tensor], where: str) -> str:
    """Copy the mapped weights into `model`; positions past the file's table keep the model's own
    initialisation (model.extend_positions). Returns what was loaded, for the log line."""
    own = model.state_dict()
    for key, value in weights.items():
        target = own[key]
        if key == "wpe.weight" and value.shape[0] != target.shape[0]:
            rows = min(value.shape[0], target.shape[0])
            target[:rows].copy_(value[:rows])
            continue
        if value.shape != target.shape:
            raise ConfigError(f"{where}: {key} is {tuple(value.shape)}, expected {tuple(target.shape)}")
        target.copy_(value)
    positions = min(weights["wpe.weight"].shape[0], model.config.max_seq_len)
    return f"{positions} positions"
