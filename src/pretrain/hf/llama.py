"""The Llama half of the Hugging Face round trip: our Llama <-> transformers' `LlamaForCausalLM`.

The layers are the same and named the same (model/llama.py); transformers nests the decoder under
`model.` and keeps the head as `lm_head` (absent from the file when tied). Here live the mapping, the
config and its checks; roundtrip.py reads and writes the files.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from ..errors import ConfigError
from ..model import Llama, LlamaConfig

MODEL_TYPE = "llama"
NAME = "Llama"
ARCHITECTURE = "LlamaForCausalLM"
CONFIG_CLASS = "LlamaConfig"
HEAD = "lm_head.weight"


def hf_config(model: LlamaConfig, eos_token_id: int, bos_token_id: int | None = None) -> dict:
    """transformers' LlamaConfig fields for `model` (default RoPE, no biases, SiLU)."""
    return {
        "vocab_size": model.vocab_size,
        "hidden_size": model.d_model,
        "intermediate_size": model.d_ff,
        "num_hidden_layers": model.n_layer,
        "num_attention_heads": model.n_head,
        "num_key_value_heads": model.n_kv_head,
        "head_dim": model.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": model.max_seq_len,
        "rms_norm_eps": model.norm_eps,
        "rope_parameters": {"rope_type": "default", "rope_theta": model.rope_theta},
        "tie_word_embeddings": model.tie_embeddings,
        "attention_bias": False,
        "mlp_bias": False,
        "attention_dropout": 0.0,  # the attention kernels have no dropout
        "bos_token_id": eos_token_id if bos_token_id is None else bos_token_id,
        "eos_token_id": eos_token_id,
    }


def to_hf_state_dict(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our Llama's state dict as LlamaForCausalLM's (a tied head is left to transformers)."""
    return {
        (key if key == HEAD else f"model.{key}"): value.detach().to("cpu").contiguous()
        for key, value in state.items()
    }


def from_hf_state_dict(state: Mapping[str, torch.Tensor], model: LlamaConfig) -> dict[str, torch.Tensor]:
    """LlamaForCausalLM's weights as our Llama's state dict. A tied model's head, when the file holds
    one, must equal its embedding."""
    tied = model.tie_embeddings
    out = {key.removeprefix("model."): value for key, value in state.items() if key != HEAD}
    out = {key: value for key, value in out.items() if not key.endswith("rotary_emb.inv_freq")}
    head = state.get(HEAD)
    if tied:
        if (
            head is not None
            and "embed_tokens.weight" in out
            and not torch.equal(head, out["embed_tokens.weight"])
        ):
            raise ConfigError(
                "the model's lm_head differs from its token embedding, but model.tie_embeddings=true: "
                "set model.tie_embeddings=false to load it"
            )
    elif head is not None:
        out[HEAD] = head
    return out


def rope_theta_of(config: Mapping) -> float:
    """The RoPE base of a transformers Llama config (v5 `rope_parameters`, or the older `rope_theta`)."""
    parameters = config.get("rope_parameters") or {}
    return float(parameters.get("rope_theta", config.get("rope_theta", 10000.0)))


def rope_scaling_of(config: Mapping) -> str | None:
    """How a transformers Llama config scales RoPE, in its own words (`rope_scaling linear`), or None
    for the default RoPE: v5's `rope_parameters.rope_type`, or the older `rope_scaling` dict."""
    for key in ("rope_parameters", "rope_scaling"):
        value = config.get(key)
        if isinstance(value, Mapping):
            kind = value.get("rope_type", value.get("type", "default" if key == "rope_parameters" else None))
            if kind != "default":
                return f"{key} {kind if kind is not None else dict(value)}"
        elif value is not None:  # not a dict: not a RoPE this code reads either
            return f"{key} {value!r}"
    return None


def check_directory(config: Mapping, model: LlamaConfig, where: str, extend_positions: bool) -> None:
    """Refuse a LlamaForCausalLM config whose shape or options differ from `model`, in one line
    (RoPE has no position table: `extend_positions` changes nothing)."""
    heads = config.get("num_attention_heads")
    theirs = {
        "vocab_size": config.get("vocab_size"),
        "n_layer": config.get("num_hidden_layers"),
        "n_head": heads,
        "n_kv_head": config.get("num_key_value_heads", heads),
        "d_model": config.get("hidden_size"),
        "d_ff": config.get("intermediate_size"),
        "tie_embeddings": bool(config.get("tie_word_embeddings", False)),
    }
    differ = {key: value for key, value in theirs.items() if value != getattr(model, key)}
    if differ:
        detail = ", ".join(
            f"{key}: {value} there, model.{key}={getattr(model, key)} here" for key, value in differ.items()
        )
        raise ConfigError(f"{where} has another shape ({detail}): pick the matching model= or override")
    head_dim = config.get("head_dim") or model.d_model // model.n_head
    if head_dim != model.head_dim:
        raise ConfigError(f"{where}: head_dim {head_dim}, this model has d_model / n_head = {model.head_dim}")
    if config.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"{where}: activation {config['hidden_act']}, this Llama uses silu (SwiGLU)")
    if config.get("attention_bias") or config.get("mlp_bias"):
        raise ConfigError(f"{where}: the model has attention or MLP biases; this Llama has none")
    scaling = rope_scaling_of(config)
    if scaling:
        raise ConfigError(
            f"{where}: {scaling} is not supported: only the default RoPE is (rope_type default, unscaled, "
            "with its rope_theta)"
        )
    theta = rope_theta_of(config)
    if not math.isclose(theta, model.rope_theta):
        raise ConfigError(f"{where}: rope_theta {theta:g} there, model.rope_theta={model.rope_theta:g} here")
    eps = float(config.get("rms_norm_eps", 1e-6))
    if not math.isclose(eps, model.norm_eps):
        raise ConfigError(f"{where}: rms_norm_eps {eps:g} there, model.norm_eps={model.norm_eps:g} here")


@torch.no_grad()
def copy_weights(model: Llama, weights: Mapping[str, torch.Tensor], where: str) -> str:
    """Copy the mapped weights into `model` (every tensor, same shapes). Returns what was loaded."""
    own = model.state_dict()
    for key, value in weights.items():
        if value.shape != own[key].shape:
            raise ConfigError(f"{where}: {key} is {tuple(value.shape)}, expected {tuple(own[key].shape)}")
        own[key].copy_(value)
    return "Llama"
