"""Reliability, round 4 (issue 42), the model's files: what a refused resume or `model.init_from` says
(item 10: the tokenizer a checkpoint was trained with, a scaled RoPE, integer weights)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import TINY_RUN, module_cache_root
from helpers.tiny_models import gpt, llama
from helpers.trained_tokenizers import small_bpe

from pretrain import hf_llama
from pretrain.config import load_config
from pretrain.errors import CheckpointError, ConfigError
from pretrain.hf import gpt2_config, init_from, to_hf_state_dict
from pretrain.training.run import train
from pretrain.training.startup import RunSettings

cache_root = module_cache_root()
safetensors_torch = pytest.importorskip("safetensors.torch")


# --- item 10: a resume after a tokenizer change names the tokenizer ---------------------------------


def test_a_resume_with_another_tokenizer_names_the_one_it_was_trained_with(tmp_path, cache_root):
    """The line was the two whole model settings (a difference in vocab_size somewhere in them)."""
    trained, other = tmp_path / "a.json", tmp_path / "b.json"
    small_bpe(trained), small_bpe(other, vocab_size=760)  # 700 and 760 ids
    out = tmp_path / "run"
    run = [*TINY_RUN, "progress_bar=false", "tokenizer=json", f"output_dir={out}"]
    train(load_config([*run, f"tokenizer.file={trained}", "train.max_steps=1", "train.warmup_steps=0"]))
    ckpt = next((out / "checkpoints").glob("last*.ckpt"))
    with pytest.raises(CheckpointError) as error:
        RunSettings.from_config(load_config([*run, f"tokenizer.file={other}", f"ckpt_path={ckpt}"]))
    line = str(error.value)
    assert "\n" not in line and f"another tokenizer: tokenizer.file={trained} (700 ids)" in line, line
    assert "vocab_size 760" in line and "ModelSettings" not in line and "GPTConfig" not in line, line


# --- item 10: model.init_from says what it does not support ----------------------------------------


def _llama_directory(directory: Path, **edits) -> Path:
    """A LlamaForCausalLM directory of helpers.tiny_models.llama(), written without transformers."""
    model = llama()
    directory.mkdir(parents=True)
    config = {"model_type": "llama", **hf_llama.llama_config(model.config, eos_token_id=0), **edits}
    (directory / "config.json").write_text(json.dumps(config))
    safetensors_torch.save_file(
        hf_llama.to_hf_state_dict(model.state_dict()), str(directory / "model.safetensors")
    )
    return directory


@pytest.mark.parametrize(
    ("edits", "says"),
    [
        ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling linear is not supported"),
        ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "rope_scaling dynamic is not supported"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}}, "rope_parameters yarn is not supp"),
    ],
)
def test_init_from_a_scaled_rope_names_the_scaling_and_what_is_supported(tmp_path, edits, says):
    """`rope_scaling {rope_type: linear}` (transformers 4.x's spelling) was refused as RoPE type
    'default'."""
    directory = _llama_directory(tmp_path / "hf", **edits)
    with pytest.raises(ConfigError) as error:
        init_from(llama(), directory)
    line = str(error.value)
    assert says in line and "only the default RoPE is (rope_type default, unscaled" in line, line
    assert "'default' (scaled)" not in line


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool])
def test_init_from_refuses_weights_that_are_not_floating_point(tmp_path, dtype):
    """int32 tensors of the right shapes were cast into the weights silently."""
    model = gpt()
    directory = tmp_path / "hf"
    directory.mkdir()
    config = {"model_type": "gpt2", **gpt2_config(model.config)}
    (directory / "config.json").write_text(json.dumps(config))
    weights = to_hf_state_dict(model.state_dict())
    weights["transformer.h.0.mlp.c_fc.weight"] = weights["transformer.h.0.mlp.c_fc.weight"].to(dtype)
    safetensors_torch.save_file(weights, str(directory / "model.safetensors"))
    before = model.state_dict()["h.0.mlp.c_fc.weight"].clone()
    with pytest.raises(ConfigError) as error:
        init_from(model, directory)
    name = str(dtype).removeprefix("torch.")
    assert f"h.0.mlp.c_fc.weight holds {name} values, not floating point weights" in str(error.value)
    assert torch.equal(model.state_dict()["h.0.mlp.c_fc.weight"], before)  # nothing copied


def test_init_from_llama_refuses_integer_weights(tmp_path):
    directory = _llama_directory(tmp_path / "hf")
    weights = safetensors_torch.load_file(str(directory / "model.safetensors"))
    weights["model.norm.weight"] = weights["model.norm.weight"].to(torch.int32)
    safetensors_torch.save_file(weights, str(directory / "model.safetensors"))
    with pytest.raises(ConfigError, match="norm.weight holds int32 values, not floating point weights"):
        init_from(llama(), directory)
