"""The Llama half of the Hugging Face round trip against transformers' LlamaForCausalLM (offline: the
models are random and built here): logits equal within 1e-5 in fp32 on packed documents (transformers
isolates them from `position_ids` with no attention mask, only with use_cache=False), the weights map
both ways, and model.init_from's checks."""

from __future__ import annotations

import json
from dataclasses import asdict, replace

import numpy as np
import pytest
import torch

from pretrain.data import gather_packed
from pretrain.data.batching.batch import one_segment_per_pack
from pretrain.errors import ConfigError
from pretrain.hf import check_init_from, init_from
from pretrain.hf import llama as hf_llama  # the Llama mapping
from pretrain.model import Llama, LlamaConfig, build_model

transformers = pytest.importorskip("transformers")
ATOL = 1e-5
VOCAB = 300


def config(**changes) -> LlamaConfig:
    base = dict(vocab_size=VOCAB, n_layer=2, n_head=4, n_kv_head=2, d_model=64, d_ff=96, max_seq_len=256)
    return LlamaConfig(**{**base, **changes})


def ours(cfg: LlamaConfig, seed: int = 0) -> Llama:
    torch.manual_seed(seed)
    model = build_model(cfg, attn="sdpa")
    assert isinstance(model, Llama)
    with torch.no_grad():  # norms away from 1, so that a wrong norm weight mapping would show
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.uniform_(0.5, 1.5)
    return model.eval()


def theirs(model: Llama):
    hf_config = transformers.LlamaConfig(**hf_llama.hf_config(model.config, eos_token_id=VOCAB - 1))
    hf = transformers.LlamaForCausalLM(hf_config).eval()
    missing, unexpected = hf.load_state_dict(hf_llama.to_hf_state_dict(model.state_dict()), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # tied: lm_head is the embedding
    if model.config.tie_embeddings:
        assert hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()
    return hf


def packed_batch(seed: int = 0):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, VOCAB, size=3000).astype(np.uint32)
    lengths = np.array([60, 1, 1, 17, 90, 40])
    starts = np.concatenate([[0], np.cumsum(lengths + 7)])[:-1]
    return gather_packed(tokens, starts, lengths, [3, 3], capacity=int(lengths.sum()))


def hf_logits(hf, batch) -> torch.Tensor:
    """One row, no attention mask, no cache: transformers splits the row into documents where the
    position ids do not step by one."""
    with torch.no_grad():
        out = hf(
            input_ids=batch.input_ids[None],
            position_ids=batch.position_ids[None],
            attention_mask=None,
            use_cache=False,
        )
    return out.logits[0]


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"tie_embeddings": False},
        {"n_kv_head": 1, "rope_theta": 500000.0},
        {"n_kv_head": 4, "norm_eps": 1e-6},
    ],
)
@pytest.mark.parametrize("positions", ["restart", "continue"])
def test_logits_equal_transformers_on_packed_documents(changes, positions):
    """restart: each document its own segment numbered from 0 (the document mask); continue: each
    pack one segment numbered across it (mask off). transformers gets the same position ids."""
    model = ours(config(**changes))
    hf = theirs(model)
    batch = packed_batch()
    if positions == "continue":
        batch = one_segment_per_pack(batch)
    with torch.no_grad():
        mine = model(batch)
    torch.testing.assert_close(mine, hf_logits(hf, batch), atol=ATOL, rtol=0)
    # The documents really are isolated: the same tokens as one numbered run score differently.
    joined = replace(batch, position_ids=torch.arange(batch.num_tokens))
    assert (hf_logits(hf, joined) - mine).abs().max() > 1e-3


def test_weights_map_both_ways():
    for tied in (True, False):
        model = ours(config(tie_embeddings=tied))
        exported = hf_llama.to_hf_state_dict(model.state_dict())
        assert all(key.startswith("model.") or key == "lm_head.weight" for key in exported)
        assert ("lm_head.weight" in exported) is not tied
        back = hf_llama.from_hf_state_dict(exported, model.config)
        assert back.keys() == model.state_dict().keys()
        assert all(torch.equal(back[k], v) for k, v in model.state_dict().items())


def test_a_tied_model_refuses_a_different_head():
    model = ours(config())
    exported = hf_llama.to_hf_state_dict(model.state_dict())
    exported["lm_head.weight"] = exported["model.embed_tokens.weight"] + 1
    with pytest.raises(ConfigError, match="tie_embeddings=false"):
        hf_llama.from_hf_state_dict(exported, model.config)


def test_init_from_loads_a_transformers_directory(tmp_path):
    """A LlamaForCausalLM saved by transformers (untied head) starts our model with its weights: the
    logits are transformers'."""
    source = ours(config(tie_embeddings=False), seed=1)
    hf = theirs(source)
    hf.save_pretrained(tmp_path / "hf")
    fresh = ours(config(tie_embeddings=False), seed=2)
    init_from(fresh, tmp_path / "hf")
    batch = packed_batch(seed=3)
    with torch.no_grad():
        torch.testing.assert_close(fresh.eval()(batch), hf_logits(hf, batch), atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    "edit, words",
    [
        ({"num_key_value_heads": 4}, "n_kv_head: 4 there, model.n_kv_head=2 here"),
        ({"intermediate_size": 128}, "d_ff: 128 there"),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}, "rope_theta 1e\\+06 there"),
        (
            {"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}},
            "only the default RoPE",
        ),
        ({"hidden_act": "gelu"}, "activation gelu"),
        ({"model_type": "gpt2"}, "holds a gpt2 model, not Llama"),
    ],
)
def test_init_from_refuses_another_model(tmp_path, edit, words):
    model = ours(config(tie_embeddings=False))
    theirs(model).save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **edit}))
    with pytest.raises(ConfigError, match=words):
        check_init_from(tmp_path, model.config, extend_positions=False)


def test_gpt2_directory_refused_for_llama_and_back(tmp_path):
    gpt2 = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=VOCAB)
    )
    gpt2.save_pretrained(tmp_path / "gpt2")
    with pytest.raises(ConfigError, match="holds a gpt2 model, not Llama: pick a model= of its architecture"):
        check_init_from(tmp_path / "gpt2", config(), extend_positions=False)
    assert asdict(config())["arch"] == "llama"
