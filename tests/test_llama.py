"""The Llama-style model (model/llama.py): RoPE from the batch's positions, grouped-query attention on
every backend, document isolation in packs, the token-weighted loss, the model=llama-* configs, and the
varlen call contract under FakeTensorMode (no CUDA here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import compose

from pretrain.config import to_config
from pretrain.data import gather_packed
from pretrain.data.batching.batch import IGNORE_INDEX, one_segment_per_pack
from pretrain.errors import ConfigError
from pretrain.model import GPT, GPTConfig, Llama, LlamaConfig, build_model, config_from_dict
from pretrain.model.flops import parameter_count

REPO = Path(__file__).resolve().parents[1]
VOCAB = 512


def tiny(**changes) -> LlamaConfig:
    base = dict(vocab_size=VOCAB, n_layer=2, n_head=4, n_kv_head=2, d_model=64, d_ff=96, max_seq_len=256)
    return LlamaConfig(**{**base, **changes})


def model(config: LlamaConfig | None = None, attn: str = "sdpa", seed: int = 0) -> Llama:
    torch.manual_seed(seed)
    built = build_model(config or tiny(), attn=attn)
    assert isinstance(built, Llama)
    return built


def packed(lengths=(50, 7, 1, 90, 33), packs=(2, 3), seed: int = 0):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, VOCAB, size=4000).astype(np.uint32)
    lengths = np.array(lengths)
    starts = np.concatenate([[0], np.cumsum(lengths + 5)])[:-1]
    return gather_packed(tokens, starts, lengths, list(packs), capacity=int(lengths.sum()))


def test_llama_parameters_are_transformers_names_and_count():
    m = model(tiny(tie_embeddings=False))
    names = set(m.state_dict())
    assert {"embed_tokens.weight", "norm.weight", "lm_head.weight"} <= names
    assert "layers.1.self_attn.k_proj.weight" in names and "layers.0.mlp.gate_proj.weight" in names
    assert m.layers[0].self_attn.k_proj.weight.shape == (2 * 16, 64)  # 2 kv heads of 16 channels
    # The untied embedding is a lookup (as GPT-2's position table): every other parameter works.
    assert parameter_count(m.config) == m.num_parameters() - m.embed_tokens.weight.numel()
    tied = model()
    assert tied.head_weight is tied.embed_tokens.weight and "lm_head.weight" not in tied.state_dict()
    assert parameter_count(tied.config) == tied.num_parameters()


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_documents_in_a_pack_score_as_alone(kv_heads):
    """Each document of a pack gets the logits it gets alone (positions restart at 0): attention never
    crosses a boundary and RoPE rotates by the batch's own positions."""
    m = model(tiny(n_kv_head=kv_heads)).eval()
    batch = packed()
    with torch.no_grad():
        together = m(batch)
        bounds = batch.cu_seqlens.tolist()
        for start, end in zip(bounds, bounds[1:], strict=False):
            alone = replace(
                batch,
                input_ids=batch.input_ids[start:end],
                targets=batch.targets[start:end],
                position_ids=batch.position_ids[start:end],
                cu_seqlens=torch.tensor([0, end - start], dtype=torch.int32),
                max_seqlen=end - start,
                pack_lengths=torch.tensor([end - start]),
            )
            torch.testing.assert_close(together[start:end], m(alone), atol=2e-5, rtol=1e-5)


def test_rope_is_relative_and_positions_matter():
    """RoPE attention depends on position differences only: shifting every position by the same amount
    changes no logit; renumbering a segment otherwise does."""
    m = model().eval()
    batch = packed(lengths=(40, 60), packs=(1, 1))
    with torch.no_grad():
        base = m(batch)
        shifted = m(replace(batch, position_ids=batch.position_ids + 17))
        torch.testing.assert_close(base, shifted, atol=5e-5, rtol=1e-5)
        reversed_positions = batch.position_ids.flip(0)
        assert (m(replace(batch, position_ids=reversed_positions)) - base).abs().max() > 1e-3


def test_grouped_query_attention_equals_repeated_heads():
    """n_kv_head=1 is multi-query attention: the same model with its one k/v head copied into every
    head (n_kv_head=n_head) gives the same logits."""
    gqa = model(tiny(n_kv_head=1)).eval()
    full = model(tiny(n_kv_head=4)).eval()
    state = gqa.state_dict()
    for key, value in list(state.items()):
        if key.endswith(("k_proj.weight", "v_proj.weight")):
            state[key] = value.repeat(4, 1)  # 4 copies of the single (16, 64) head
    full.load_state_dict(state)
    batch = packed()
    with torch.no_grad():
        torch.testing.assert_close(gqa(batch), full(batch), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mask", [True, False])
def test_flex_equals_sdpa(mask):
    """The two CPU backends agree on a packed batch (flex evaluates only on CPU), with the document
    mask on and off (one segment per pack, positions running on)."""
    batch = packed() if mask else one_segment_per_pack(packed())
    sdpa, flex = model(attn="sdpa").eval(), model(attn="flex").eval()
    with torch.no_grad():
        torch.testing.assert_close(flex(batch), sdpa(batch), atol=2e-5, rtol=1e-5)


def test_token_weighted_loss_and_gradients():
    """loss = sum of per-token cross-entropy over counted targets / the caller's denominator, and its
    gradient equals the plain F.cross_entropy reference's (untied head too)."""
    m = model(tiny(tie_embeddings=False))
    batch = packed()
    targets = batch.targets.clone()
    targets[::3] = IGNORE_INDEX
    batch = replace(batch, targets=targets)
    counted = int((targets != IGNORE_INDEX).sum())
    loss = m.loss(batch, counted * 2)
    loss.backward()
    ours = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    reference = F.cross_entropy(m(batch), targets, ignore_index=IGNORE_INDEX, reduction="sum") / (counted * 2)
    reference.backward()
    torch.testing.assert_close(loss, reference, atol=1e-6, rtol=1e-6)
    for mine, theirs in zip(ours, (p.grad for p in m.parameters()), strict=True):
        torch.testing.assert_close(mine, theirs, atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="denominator"):
        m.loss(batch, 0)


def test_positions_past_max_seq_len_refused():
    m = model(tiny(max_seq_len=64))
    batch = packed(lengths=(80,), packs=(1,))
    with pytest.raises(ValueError, match="position_ids reach 79"):
        m(batch)


def test_config_round_trips_through_a_checkpoint_dict():
    from dataclasses import asdict

    config = tiny(rope_theta=500000.0, tie_embeddings=False)
    assert asdict(config)["arch"] == "llama"
    assert config_from_dict(asdict(config)) == config
    gpt = GPTConfig(vocab_size=VOCAB, n_layer=1, n_head=2, d_model=32, max_seq_len=64)
    assert "arch" not in asdict(gpt)  # GPT-2 checkpoints keep their exact hyper-parameters
    assert config_from_dict(asdict(gpt)) == gpt
    assert isinstance(build_model(gpt), GPT)


@pytest.mark.parametrize(
    "size, low, high", [("llama-tiny", 6e6, 9e6), ("llama-60m", 55e6, 65e6), ("llama-150m", 140e6, 160e6)]
)
def test_named_sizes(size, low, high):
    from pretrain.model import config_from_settings
    from pretrain.training.startup import with_tokenizer_vocab

    config = config_from_settings(with_tokenizer_vocab(to_config(compose(f"model={size}"))).model)
    assert isinstance(config, LlamaConfig)
    assert low < parameter_count(config) < high
    assert config.n_kv_head < config.n_head  # grouped-query attention


@pytest.mark.parametrize(
    "override, words",
    [
        ("model.n_kv_head=3", "multiple of model.n_kv_head=3"),
        ("model.bias=true", "no biases"),
        ("model.rope_theta=0", "rope_theta=0"),
        ("model.arch=mamba", "not an architecture"),
    ],
)
def test_bad_llama_options_refused(override, words):
    with pytest.raises(ConfigError, match=words):
        to_config(compose("model=llama-tiny", override))


def test_llama_options_refused_on_gpt2():
    with pytest.raises(ConfigError, match="model.n_kv_head is a llama option"):
        to_config(compose("model=tiny", "model.n_kv_head=2"))
    with pytest.raises(ConfigError, match="GPT-2 ties its head"):
        to_config(compose("model=tiny", "model.tie_embeddings=false"))


# --------------------------------------------------------------------- varlen under FakeTensorMode

VARLEN_CHILD = r"""
import json
import numpy as np
import torch
import torch.nn.attention.varlen as varlen_module
from torch._subclasses.fake_tensor import FakeTensorMode

from pretrain.data import gather_packed
from pretrain.model import LlamaConfig, build_model
from pretrain.model import llama as llama_module

REAL = varlen_module.varlen_attn
calls = []

def spy(q, k, v, cu_q, cu_k, max_q, max_k, window_size=None):
    for x in (q, k, v):
        assert x.dtype == torch.bfloat16 and x.device.type == "cuda" and x.is_contiguous(), x
    assert q.shape == k.shape == v.shape and q.dim() == 3, (q.shape, k.shape, v.shape)
    for cu in (cu_q, cu_k):
        assert cu.dtype == torch.int32 and cu.device == q.device, cu
    assert type(max_q) is int and type(max_k) is int and window_size == (-1, 0)
    calls.append([list(q.shape), max_q, list(cu_q.shape)])
    return REAL(q, k, v, cu_q, cu_k, max_q, max_k, window_size=window_size)

varlen_module.varlen_attn = spy
tokens = np.random.default_rng(0).integers(0, 512, size=1000).astype(np.uint32)
batch = gather_packed(tokens, np.array([0, 100, 300]), np.array([50, 7, 90]), [2, 1], capacity=147)
config = LlamaConfig(vocab_size=512, n_layer=2, n_head=4, n_kv_head=2, d_model=64, d_ff=96, max_seq_len=256)
model = build_model(config, attn="varlen").to(torch.bfloat16)
# The host-side batch check runs on real tensors before fake mode (numpy cannot read fake ones); its
# result is what the model's own call returns inside.
lengths = llama_module.check_batch(batch, config.max_seq_len)
llama_module.check_batch = lambda batch, max_seq_len: lengths
torch.__future__.set_overwrite_module_params_on_conversion(True)  # fake parameters cannot be swapped in
with FakeTensorMode(allow_non_fake_inputs=True), torch.no_grad():
    model = model.to("cuda:0")
    hidden = model.hidden_states(batch)
    shape = list(hidden.shape)
print(json.dumps({"calls": calls, "hidden": shape}))
"""


def test_varlen_call_contract_under_fake_cuda():
    """Llama's q/k/v reach the flash varlen kernel as it needs them (bf16, dense (T, H, D) with the kv
    heads repeated, int32 boundaries on q's device, Python-int maxima, the causal window), once per
    layer. In a child process: fake CUDA on a CPU build can abort the process."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run(
        [sys.executable, "-c", VARLEN_CHILD], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["hidden"] == [147, 64]
    assert result["calls"] == [[[147, 4, 16], 90, [4]]] * 2
