"""Reliability, round 4 (issue 42), the model's files: what a refused resume or `model.init_from` says
(item 10: the tokenizer a checkpoint was trained with, a scaled RoPE, integer weights), and the call
docs/checkpoints.md shows for scoring packed documents with an exported Llama (item 13)."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest
import torch
from helpers import REPO, TINY_RUN, module_cache_root
from helpers.tiny_models import gpt, llama
from helpers.trained_tokenizers import small_bpe

from pretrain.config import load_config
from pretrain.errors import CheckpointError, ConfigError
from pretrain.hf import gpt2 as hf_gpt2
from pretrain.hf import init_from
from pretrain.hf import llama as hf_llama
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
    config = {"model_type": "llama", **hf_llama.hf_config(model.config, eos_token_id=0), **edits}
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
    config = {"model_type": "gpt2", **hf_gpt2.hf_config(model.config)}
    (directory / "config.json").write_text(json.dumps(config))
    weights = hf_gpt2.to_hf_state_dict(model.state_dict())
    weights["transformer.h.0.mlp.c_fc.weight"] = weights["transformer.h.0.mlp.c_fc.weight"].to(dtype)
    safetensors_torch.save_file(weights, str(directory / "model.safetensors"))
    before = model.state_dict()["h.0.mlp.c_fc.weight"].clone()
    with pytest.raises(ConfigError) as error:
        init_from(model, directory)
    name = str(dtype).removeprefix("torch.")
    assert f"h.0.mlp.c_fc.weight holds {name}, not floating point weights" in str(error.value)
    assert torch.equal(model.state_dict()["h.0.mlp.c_fc.weight"], before)  # nothing copied


def test_init_from_llama_refuses_integer_weights(tmp_path):
    directory = _llama_directory(tmp_path / "hf")
    weights = safetensors_torch.load_file(str(directory / "model.safetensors"))
    weights["model.norm.weight"] = weights["model.norm.weight"].to(torch.int32)
    safetensors_torch.save_file(weights, str(directory / "model.safetensors"))
    with pytest.raises(ConfigError, match="norm.weight holds int32, not floating point weights"):
        init_from(llama(), directory)


# --- item 13: the documented call scores packed documents apart; a default call does not -----------


def _documented_call() -> str:
    """The python block of docs/checkpoints.md that scores a packed row with transformers."""
    text = (REPO / "docs" / "checkpoints.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "position_ids" in b]
    assert len(blocks) == 1, "docs/checkpoints.md shows one call with position_ids"
    return textwrap.dedent(blocks[0])  # the block sits in a list item


def test_the_documented_packed_call_isolates_documents_and_the_default_call_does_not(tmp_path):
    """The exported config.json says use_cache: true; with the cache on, transformers 5.x masks the row
    causally as one sequence (the docs said position_ids alone split it)."""
    transformers = pytest.importorskip("transformers")
    from test_hf_llama import ATOL, ours, packed_batch, theirs
    from test_hf_llama import config as llama_config

    ours_model = ours(llama_config())
    theirs(ours_model).save_pretrained(tmp_path / "my-llama")
    assert json.loads((tmp_path / "my-llama" / "config.json").read_text())["use_cache"] is True
    batch = packed_batch(seed=3)
    call = _documented_call()
    assert "use_cache=False" in call and "attention_mask" not in call
    scope = {
        "transformers": transformers,
        "torch": torch,
        "ids": batch.input_ids,
        "positions": batch.position_ids,
    }
    with torch.no_grad():
        exec(call.replace('"my-llama"', repr(str(tmp_path / "my-llama"))), scope)
        mine = ours_model(batch)
        default = scope["model"](
            input_ids=batch.input_ids[None], position_ids=batch.position_ids[None]
        ).logits
    torch.testing.assert_close(scope["logits"][0], mine, atol=ATOL, rtol=0)
    assert (default[0] - mine).abs().max() > 0.1  # documents attended to each other


def test_a_gpt_export_names_the_runs_eos_not_gpt2s():
    """Each architecture's hf_config takes the EOS id the run's cache recorded (a GPT trained on a
    tokenizer.json run exported bos/eos 50256 before 0.2, an id outside a small vocabulary)."""
    config = gpt().config
    assert hf_gpt2.hf_config(config)["eos_token_id"] == 50256  # GPT-2's, when none is recorded
    fields = hf_gpt2.hf_config(config, eos_token_id=7)
    assert (fields["bos_token_id"], fields["eos_token_id"]) == (7, 7)
    assert hf_llama.hf_config(llama().config, eos_token_id=7)["eos_token_id"] == 7
