"""Attention backends on raw (T, H, D) tensors against a naive per-segment causal reference."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from pretrain.attention_backends import BACKENDS as CATALOG
from pretrain.errors import ConfigError
from pretrain.model.attention import (
    CHOICES,
    REGISTRY,
    AttentionBackend,
    bucket_widths,
    check_backend,
    document_block_mask,
    get_backend,
    plan_sdpa,
    prepare_attention,
    resolve_backend,
    varlen_attention,
)
from pretrain.model.attention.sdpa import SdpaBackend

ROOT = Path(__file__).resolve().parents[1]
HEADS, DIM = 2, 8
TIGHT = 1e-10  # float64: only summation order differs from the naive reference


def naive_attention(q, k, v, lengths):
    """Explicit softmax(QK^T / sqrt(D) + causal mask) V, one segment at a time (no SDPA, no flex)."""
    outs, start = [], 0
    for n in lengths:
        qs, ks, vs = (x[start : start + n] for x in (q, k, v))
        scores = torch.einsum("qhd,khd->hqk", qs, ks) / math.sqrt(q.shape[-1])
        future = torch.ones(n, n, dtype=torch.bool).triu(1)
        weights = scores.masked_fill(future, float("-inf")).softmax(-1)
        outs.append(torch.einsum("hqk,khd->qhd", weights, vs))
        start += n
    return torch.cat(outs) if outs else q.new_empty(q.shape)


def qkv(num_tokens, seed=0, requires_grad=False, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.randn(num_tokens, HEADS, DIM, generator=gen, dtype=dtype).requires_grad_(requires_grad)
        for _ in range(3)
    ]


def cu_of(lengths):
    return torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)


def runs_on_cpu(name: str, training: bool) -> bool:
    try:
        check_backend(name, "cpu", torch.float32, training=training)
    except ConfigError:
        return False
    return True


CPU_EVAL = [name for name in REGISTRY if runs_on_cpu(name, training=False)]


def run_backend(backend, q, k, v, lengths):
    meta = prepare_attention(backend, cu_of(lengths), np.asarray(lengths, dtype=np.int64), q.device)
    assert meta.backend is get_backend(backend)
    return meta.attend(q, k, v)


LAYOUTS = {
    "padded-rows": [16, 16, 16, 16],
    "mixed": [5, 33, 1, 17, 64, 2, 40],
    "with-empty-segments": [0, 7, 0, 0, 12, 3, 0],
    "one-segment": [50],
    "hundreds-of-tiny": list(np.random.default_rng(1).integers(1, 9, size=300)),
    "lognormal": list(np.clip(np.random.default_rng(2).lognormal(3, 1, size=40).astype(int), 1, 256)),
}


@pytest.mark.parametrize("layout", LAYOUTS, ids=list(LAYOUTS))
def test_sdpa_matches_naive_forward_and_backward(layout):
    lengths = LAYOUTS[layout]
    q, k, v = qkv(sum(lengths), requires_grad=True)
    cotangent = torch.randn(q.shape, dtype=q.dtype, generator=torch.Generator().manual_seed(9))
    out = run_backend("sdpa", q, k, v, lengths)
    grads = torch.autograd.grad((out * cotangent).sum(), (q, k, v))
    ref = naive_attention(q, k, v, lengths)
    ref_grads = torch.autograd.grad((ref * cotangent).sum(), (q, k, v))
    torch.testing.assert_close(out, ref, atol=TIGHT, rtol=0)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, atol=TIGHT, rtol=0)


@pytest.mark.parametrize("layout", ["padded-rows", "mixed", "with-empty-segments", "lognormal"])
def test_flex_forward_matches_naive(layout):
    lengths = LAYOUTS[layout]
    q, k, v = qkv(sum(lengths))
    with torch.no_grad():
        out = run_backend("flex", q, k, v, lengths)
    torch.testing.assert_close(out, naive_attention(q, k, v, lengths), atol=TIGHT, rtol=0)


@pytest.mark.parametrize("layout", ["padded-rows", "mixed", "with-empty-segments", "lognormal"])
@pytest.mark.parametrize("backend", CPU_EVAL)
def test_every_backend_that_runs_here_matches_naive_forward(backend, layout):
    lengths = LAYOUTS[layout]
    q, k, v = qkv(sum(lengths))
    with torch.no_grad():
        out = run_backend(backend, q, k, v, lengths)
    torch.testing.assert_close(out, naive_attention(q, k, v, lengths), atol=TIGHT, rtol=0)


@pytest.mark.parametrize(
    "lengths",
    [
        [300],
        [128, 128],
        [100, 7, 150, 43],
        [0, 5, 0, 130, 1, 256, 3],
        [1] * 5,
        [129, 127, 300, 1],
        list(np.random.default_rng(0).integers(1, 400, size=30)),
    ],
)
def test_block_mask_from_boundaries_equals_create_block_mask(lengths):
    """The direct O(blocks^2) construction must agree with torch's dense T x T evaluation."""
    from torch.nn.attention.flex_attention import create_block_mask

    doc = torch.repeat_interleave(torch.arange(len(lengths)), torch.as_tensor(lengths))
    total = len(doc)
    want = create_block_mask(
        lambda b, h, q, kv: (doc[q] == doc[kv]) & (q >= kv), None, None, total, total, "cpu"
    )
    got = document_block_mask(np.asarray(lengths), "cpu")
    assert torch.equal(got.to_dense(), want.to_dense())
    for counts, indices in [("kv_num_blocks", "kv_indices"), ("full_kv_num_blocks", "full_kv_indices")]:
        n = getattr(want, counts)
        assert torch.equal(getattr(got, counts), n)
        for row, k in enumerate(n[0, 0].tolist()):
            assert torch.equal(getattr(got, indices)[0, 0, row, :k], getattr(want, indices)[0, 0, row, :k])
    assert torch.equal(got.q_num_blocks, want.q_num_blocks) and torch.equal(
        got.full_q_num_blocks, want.full_q_num_blocks
    )


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=70), min_size=1, max_size=12).filter(lambda x: sum(x) > 0))
def test_sdpa_matches_naive_on_any_layout(lengths):
    q, k, v = qkv(sum(lengths), seed=len(lengths))
    torch.testing.assert_close(
        run_backend("sdpa", q, k, v, lengths), naive_attention(q, k, v, lengths), atol=TIGHT, rtol=0
    )


@pytest.mark.parametrize("backend", CPU_EVAL)
def test_changing_one_segment_leaves_the_others_bitwise_unchanged(backend):
    lengths = [12, 30, 7, 25]
    q, k, v = qkv(sum(lengths))
    q2, k2, v2 = (x.clone() for x in (q, k, v))
    changed = slice(12, 42)  # the whole second segment
    for x in (q2, k2, v2):
        x[changed] = torch.randn(30, HEADS, DIM, dtype=x.dtype) * 5
    with torch.no_grad():
        before = run_backend(backend, q, k, v, lengths)
        after = run_backend(backend, q2, k2, v2, lengths)
    keep = torch.ones(sum(lengths), dtype=torch.bool)
    keep[changed] = False
    assert torch.equal(before[keep], after[keep])
    assert not torch.allclose(before[changed], after[changed])


def count_sdpa_calls(monkeypatch):
    calls = []
    original = F.scaled_dot_product_attention

    def counting(*args, **kwargs):
        calls.append(args[0].shape)
        return original(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", counting)
    return calls


def test_padded_rows_are_one_batched_sdpa_call(monkeypatch):
    calls = count_sdpa_calls(monkeypatch)
    lengths = [32] * 8
    q, k, v = qkv(sum(lengths))
    run_backend("sdpa", q, k, v, lengths)
    assert calls == [torch.Size([8, HEADS, 32, DIM])]


def test_hundreds_of_segments_need_few_sdpa_calls(monkeypatch):
    lengths = list(np.clip(np.random.default_rng(0).lognormal(4, 1, size=500).astype(int), 1, 512))
    calls = count_sdpa_calls(monkeypatch)
    q, k, v = qkv(sum(lengths))
    out = run_backend("sdpa", q, k, v, lengths)
    plan = plan_sdpa(np.asarray(lengths), "cpu")
    assert len(calls) == len(plan.buckets) <= 4 * math.log2(512 / 16) + 2
    assert sum(n for n, _ in plan.buckets) == len(lengths)
    computed = sum(n * w for n, w in plan.buckets)
    assert computed < 1.3 * sum(lengths)  # bucket padding stays small
    torch.testing.assert_close(out, naive_attention(q, k, v, lengths), atol=TIGHT, rtol=0)


@given(st.integers(min_value=1, max_value=8192))
def test_bucket_width_pads_less_than_a_quarter_beyond_the_minimum_step(length):
    width = int(bucket_widths(np.array([length]))[0])
    assert length <= width < length + max(16, length / 4)


def test_auto_resolves_to_sdpa_off_cuda_and_explicit_backends_stay():
    assert resolve_backend("auto", "cpu") == "sdpa"
    assert resolve_backend("auto", torch.device("cuda")) == "varlen"
    for name in REGISTRY:
        assert resolve_backend(name, "cpu") == name
    with pytest.raises(ValueError, match=", ".join(CHOICES)):
        resolve_backend("flash", "cpu")


def test_check_backend_explains_what_to_change():
    with pytest.raises(ValueError, match=r"only on CUDA.*attn=sdpa"):
        check_backend("varlen", "cpu", torch.bfloat16, training=False)
    with pytest.raises(ValueError, match=r"bf16 or fp16.*attn=sdpa"):
        check_backend("varlen", "cuda", torch.float32, training=True)
    with pytest.raises(ValueError, match=r"attn=auto picks varlen"):
        check_backend("auto", "cuda", torch.float32, training=True)
    with pytest.raises(ValueError, match=r"backward on CPU.*attn=sdpa"):
        check_backend("flex", "cpu", torch.float32, training=True)
    assert check_backend("flex", "cpu", torch.float32, training=False) == "flex"
    assert check_backend("varlen", "cuda", torch.bfloat16, training=True) == "varlen"
    assert check_backend("auto", "cpu", torch.float32, training=True) == "sdpa"


def test_varlen_on_cpu_fails_with_a_clear_error():
    q, k, v = qkv(10, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"only on CUDA.*attn=sdpa"):
        varlen_attention(q, k, v, cu_of([4, 6]), 6)


def test_flex_on_cpu_refuses_training_but_evaluates_inputs_that_require_grad():
    lengths = [9, 14]
    q, k, v = qkv(sum(lengths), requires_grad=True)
    with pytest.raises(ValueError, match="attn=sdpa"):
        run_backend("flex", q, k, v, lengths)
    with torch.no_grad():
        out = run_backend("flex", q, k, v, lengths)
    torch.testing.assert_close(out, naive_attention(q, k, v, lengths).detach(), atol=TIGHT, rtol=0)


def test_gpu_check_skips_without_cuda(tmp_path):
    output = tmp_path / "gpu_check.json"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--output", str(output)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "skipped: no CUDA" in result.stdout
    assert not output.exists()


# ----------------------------------------------------------------------------------------- registry


def test_schema_conf_and_registry_name_the_same_backends():
    """A backend is one module + one line of the torch-free catalog (which the schema's choices and
    this registry both read) + conf/attn/<name>.yaml."""
    assert CHOICES == tuple(CATALOG) and CHOICES[0] == "auto"
    assert {p.stem for p in (ROOT / "conf" / "attn").glob("*.yaml")} == set(CHOICES)
    assert set(REGISTRY) == {name for name, choice in CATALOG.items() if choice.implementation}
    for name, backend in REGISTRY.items():
        assert isinstance(backend, AttentionBackend) and backend.name == name


@pytest.mark.parametrize("name", list(REGISTRY))
def test_each_backend_prepares_its_own_batch_metadata(name):
    lengths = np.array([5, 0, 130, 7])
    meta = prepare_attention(name, cu_of(lengths).long(), lengths, "cpu")
    assert meta.backend is REGISTRY[name]
    assert meta.cu_seqlens.dtype == torch.int32 and meta.cu_seqlens.tolist() == [0, 5, 5, 135, 142]
    assert type(meta.max_seqlen) is int and meta.max_seqlen == 130


def test_the_backends_plans():
    lengths = np.array([5, 0, 130, 7])
    plans = {name: prepare_attention(name, cu_of(lengths), lengths, "cpu").plan for name in ("sdpa", "flex")}
    assert type(plans["sdpa"]).__name__ == "SdpaPlan" and type(plans["flex"]).__name__ == "FlexPlan"
    assert prepare_attention("varlen", cu_of(lengths), lengths, "cpu").plan is None
    assert plans["flex"].compiled is False  # attn.compile=auto compiles on CUDA only
    assert prepare_attention("flex", cu_of(lengths), lengths, "cpu", attn_compile=True).plan.compiled


def test_auto_and_unknown_names_are_not_backends():
    with pytest.raises(ValueError, match="resolve attn=auto first"):
        get_backend("auto")
    with pytest.raises(ValueError, match="no attention backend 'flash'"):
        prepare_attention("flash", cu_of([3]), np.array([3]), "cpu")


def test_a_registered_backend_plugs_into_the_model(monkeypatch):
    """Adding a backend needs no dispatch edit: the model asks the registry's object."""
    from pretrain.data import collate_packed, split_tokens
    from pretrain.model import GPT, GPTConfig

    calls = []

    class Recording(SdpaBackend):
        name = "recording"

        def attend(self, q, k, v, batch):
            calls.append((q.shape[0], batch.max_seqlen, batch.backend.name))
            return super().attend(q, k, v, batch)

    monkeypatch.setitem(REGISTRY, "recording", Recording())
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=50, n_layer=2, n_head=2, d_model=16, max_seq_len=16)
    model = GPT(config, attn="recording").double()
    reference = GPT(config, attn="sdpa").double()
    reference.load_state_dict(model.state_dict())
    chunks = [c for i, n in enumerate([9, 4]) for c in split_tokens(f"d{i}", np.arange(n) % 50, 16)]
    batch = collate_packed([chunks], capacity=32)
    assert model.backend() == "recording"
    assert torch.equal(model(batch), reference(batch))
    assert calls == [(11, 8, "recording")] * 2  # one call per layer, with the batch's metadata
