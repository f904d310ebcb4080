"""The padded vocabulary and the fused loss kernel (train.loss_kernel, model.vocab_multiple).

liger-kernel's fused linear cross-entropy runs here through Triton's CPU interpreter (helpers/env.py
sets TRITON_INTERPRET=1): the same Python and Triton code a GPU runs, compared with the chunked fp32 path
the project has always used. The padded vocabulary must change nothing a user sees: the same random
initialisation of every real parameter, the same token losses and gradients, rows that stay 0.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pretrain.config import TrainConfig
from pretrain.config.schema import LOSS_KERNELS as SCHEMA_LOSS_KERNELS
from pretrain.data import TokenSplit, gather_packed
from pretrain.data.batching.batch import IGNORE_INDEX
from pretrain.errors import CheckpointError, ConfigError
from pretrain.model import build_model
from pretrain.model.config import GPTConfig
from pretrain.model.fused_loss import (
    CHUNKED,
    LIGER,
    LOSS_KERNELS,
    liger_cross_entropy_sum,
    liger_missing,
    resolve_loss_kernel,
    summed_cross_entropy,
)
from pretrain.model.llama import LlamaConfig
from pretrain.model.loss import token_cross_entropy
from pretrain.model.vocabulary import padded_vocab_rows, padded_vocab_size, real_vocab_rows
from pretrain.training.checks import _check_model
from pretrain.training.model_setup import set_up_model
from pretrain.training.module import adamw_kernel

TOL = 1e-5  # the bound for fp32 token losses; the sums below are compared relative to it


def small(cls=GPTConfig, multiple: int = 64, **extra):
    base = dict(vocab_size=1000, n_layer=2, n_head=2, d_model=32, max_seq_len=64, vocab_multiple=multiple)
    if cls is LlamaConfig:
        base.update(n_kv_head=1, d_ff=64, tie_embeddings=False)
    return cls(**{**base, **extra})


def batch_of(seed: int, vocab: int = 1000):
    rng = np.random.default_rng(seed)
    split = TokenSplit.from_lengths(rng.integers(3, 40, size=5), seed=seed, vocab=vocab)
    split.tokens[split.tokens >= vocab] = vocab - 1  # the EOS (GPT-2's id) within this small vocabulary
    lengths = [int(n) - 1 for n in split.lengths]
    return gather_packed(split.tokens, split.offsets, lengths, [len(lengths)], sum(lengths))


def test_liger_is_installed_and_runs_here():
    """make install brings liger-kernel (the [gpu] extra): its tests never skip silently."""
    assert liger_missing() is None


def test_the_schema_and_the_model_name_the_same_kernels():
    assert tuple(SCHEMA_LOSS_KERNELS) == LOSS_KERNELS


@settings(max_examples=12, deadline=None)
@given(
    rows=st.integers(1, 70),
    vocab=st.integers(2, 300),
    multiple=st.sampled_from([1, 8, 64]),
    ignored=st.floats(0.0, 0.5),
    seed=st.integers(0, 2**16),
)
def test_liger_equals_the_chunked_loss_and_its_gradients(rows, vocab, multiple, ignored, seed):
    """fp32: the summed loss and both gradients of liger's kernel equal the chunked path's; the padded
    rows get no gradient and no probability."""
    generator = torch.Generator().manual_seed(seed)
    width = padded_vocab_size(vocab, multiple)
    hidden = torch.randn(rows, 16, generator=generator)
    weight = torch.randn(width, 16, generator=generator) * 0.5
    targets = torch.randint(0, vocab, (rows,), generator=generator)
    targets[torch.rand(rows, generator=generator) < ignored] = IGNORE_INDEX
    results = []
    for fused in (True, False):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        if fused:
            loss = liger_cross_entropy_sum(h, w, targets, vocab)
        else:
            loss = token_cross_entropy(h, w, targets, real_vocab=vocab, workspace=False).sum()
        loss.backward()
        results.append((loss.detach(), h.grad, w.grad))
    (fused_loss, fused_dh, fused_dw), (loss, dh, dw) = results
    scale = max(1.0, float((targets != IGNORE_INDEX).sum()))
    assert abs(float(fused_loss) - float(loss)) <= TOL * scale
    torch.testing.assert_close(fused_dh, dh, atol=TOL, rtol=TOL)
    torch.testing.assert_close(fused_dw, dw, atol=TOL, rtol=TOL)
    assert torch.count_nonzero(fused_dw[vocab:]) == 0 and torch.count_nonzero(dw[vocab:]) == 0


def test_the_padded_columns_never_receive_probability():
    """A padded id whose row would dominate every logit still gets none of the softmax."""
    hidden = torch.ones(4, 8)
    weight = torch.zeros(16, 8)
    weight[12:] = 100.0  # the padded rows (real vocab 10): unmasked they would take all the mass
    targets = torch.tensor([0, 3, 9, 5])
    expected = torch.full((4,), float(np.log(10.0)))  # uniform over the 10 real ids
    got = token_cross_entropy(hidden, weight, targets, real_vocab=10)
    torch.testing.assert_close(got, expected)
    fused = liger_cross_entropy_sum(hidden.requires_grad_(), weight.requires_grad_(), targets, 10)
    assert abs(float(fused.detach()) - float(expected.sum())) < 1e-4


@pytest.mark.parametrize("cls", [GPTConfig, LlamaConfig])
def test_a_padded_model_is_the_unpadded_one(cls):
    """Same seed: every real parameter drawn alike, the padded rows 0; the same token losses and
    gradients bitwise (the chunked path runs on the real rows); after AdamW the padded rows stay 0."""
    models = []
    for multiple in (1, 64):
        torch.manual_seed(3)
        models.append(build_model(small(cls, multiple)))
    plain, padded = models
    assert padded.config.padded_vocab_size == 1024 and plain.config.padded_vocab_size == 1000
    assert plain.num_parameters() == padded.num_parameters()
    padded_state = padded.state_dict()
    assert real_vocab_rows(padded_state, 1000).keys() == plain.state_dict().keys()
    for key, value in real_vocab_rows(padded_state, 1000).items():
        assert torch.equal(value, plain.state_dict()[key]), key
    batch = batch_of(0)
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1) for m in models]
    for _ in range(2):
        for model, optimizer in zip(models, optimizers, strict=True):
            optimizer.zero_grad()
            model.loss(batch, batch.num_targets).backward()
        for (name, p), q in zip(plain.named_parameters(), padded.parameters(), strict=True):
            assert torch.equal(p.grad, q.grad[: p.shape[0]]), name
        for optimizer in optimizers:
            optimizer.step()
    for key, value in padded.state_dict().items():
        if value.shape[0] == 1024:
            assert torch.count_nonzero(value[1000:]) == 0, key
    with torch.no_grad():
        assert torch.equal(plain.token_losses(batch), padded.token_losses(batch))
        assert padded(batch).shape[-1] == 1000  # logits of the real ids only


@pytest.mark.parametrize("cls", [GPTConfig, LlamaConfig])
def test_the_liger_kernel_trains_the_model_as_the_chunked_path(cls):
    """train.loss_kernel=liger through set_up_model: the model's loss and every gradient equal the
    chunked path's (fp32, TOL)."""
    runs = []
    for kernel in ("liger", "chunked"):
        torch.manual_seed(5)
        model = build_model(small(cls))
        record = set_up_model(model, TrainConfig(loss_kernel=kernel, compile=False), torch.device("cpu"))
        assert record["loss_kernel"] == kernel and model.loss_kernel == kernel
        batch = batch_of(1)
        loss = model.loss(batch, batch.num_targets)
        loss.backward()
        runs.append((float(loss.detach()), {n: p.grad for n, p in model.named_parameters()}))
    (fused, fused_grads), (plain, grads) = runs
    assert abs(fused - plain) <= TOL
    for name, grad in grads.items():
        torch.testing.assert_close(fused_grads[name], grad, atol=TOL, rtol=TOL)


def test_validation_never_takes_the_fused_kernel():
    """Without a gradient the loss is the chunked path's exactly (liger only fuses training)."""
    torch.manual_seed(0)
    model = build_model(small())
    model.loss_kernel = LIGER
    batch = batch_of(2)
    with torch.no_grad():
        summed = summed_cross_entropy(
            model.hidden_states(batch), model.wte.weight, batch.targets, 1000, LIGER
        )
        assert torch.equal(summed, model.token_losses(batch).sum())


def test_the_kernel_setting_resolves_per_device(monkeypatch):
    assert resolve_loss_kernel("chunked", "cpu") == (CHUNKED, None)
    assert resolve_loss_kernel("liger", "cpu") == (LIGER, None)  # the interpreter is on in the suite
    assert resolve_loss_kernel("auto", "cpu") == (CHUNKED, None)  # never the interpreter unasked
    monkeypatch.delenv("TRITON_INTERPRET")
    assert resolve_loss_kernel("auto", "cpu") == (CHUNKED, None)
    with pytest.raises(ConfigError, match="runs on CUDA, not on cpu; use train.loss_kernel=auto"):
        resolve_loss_kernel("liger", "cpu")
    assert resolve_loss_kernel("auto", "cuda") == (LIGER, None)
    monkeypatch.setattr("pretrain.model.fused_loss.liger_missing", lambda: "liger-kernel is not installed")
    kernel, why = resolve_loss_kernel("auto", "cuda")
    assert kernel == CHUNKED and why == "liger-kernel is not installed"
    with pytest.raises(ConfigError, match="liger-kernel is not installed; or use train.loss_kernel=chunked"):
        resolve_loss_kernel("liger", "cuda")
    with pytest.raises(ConfigError, match="use one of auto, liger, chunked"):
        TrainConfig(loss_kernel="fast")


def test_adamw_is_fused_on_cuda_only():
    assert adamw_kernel(torch.device("cuda", 0)) == {"fused": True}
    assert adamw_kernel(torch.device("cpu")) == {}


def test_vocabulary_rows_cut_and_pad_back():
    state = {"wte.weight": torch.arange(12.0).view(6, 2), "wpe.weight": torch.ones(3, 2)}
    padded = padded_vocab_rows(state, 8)
    assert padded["wte.weight"].shape == (8, 2) and torch.count_nonzero(padded["wte.weight"][6:]) == 0
    assert padded["wpe.weight"] is state["wpe.weight"]
    assert torch.equal(real_vocab_rows(padded, 6)["wte.weight"], state["wte.weight"])
    assert [padded_vocab_size(v, 64) for v in (1, 64, 65, 50257)] == [64, 64, 128, 50304]


def test_a_checkpoint_of_the_old_shape_still_builds_its_model():
    """Checkpoints written before model.vocab_multiple have no such key: they build unpadded."""
    saved = dataclasses.asdict(small(multiple=1))
    del saved["vocab_multiple"]
    assert GPTConfig(**saved).padded_vocab_size == 1000


def test_liger_under_bf16_autocast_stays_within_bf16_rounding_of_fp32():
    """What a GPU run does (bf16-mixed): bf16 logits with the bf16 -inf mask; the loss within 1e-3
    relative and the gradients within 1e-2 relative norm of the fp32 chunked path, padded rows 0."""
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(64, 32, generator=generator)
    weight = torch.randn(128, 32, generator=generator) * 0.3
    targets = torch.randint(0, 100, (64,), generator=generator)
    results = []
    for fused in (True, False):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        if fused:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = liger_cross_entropy_sum(h, w, targets, 100)
        else:
            loss = token_cross_entropy(h, w, targets, real_vocab=100, workspace=False).sum()
        loss.backward()
        results.append((float(loss.detach()), h.grad, w.grad))
    (fused, dh_fused, dw_fused), (plain, dh, dw) = results
    assert abs(fused - plain) / plain < 1e-3
    assert (dh_fused - dh).norm() / dh.norm() < 1e-2 and (dw_fused - dw).norm() / dw.norm() < 1e-2
    assert torch.count_nonzero(dw_fused[100:]) == 0


def test_a_resume_across_vocabulary_padding_says_which_multiple_to_use(tmp_path):
    """A checkpoint saved before model.vocab_multiple (no such key: 1) resumed with today's default 64:
    one line naming the setting that resumes it, not two whole model configs."""
    saved = dataclasses.asdict(small(multiple=1))
    del saved["vocab_multiple"]
    with pytest.raises(CheckpointError) as error:
        _check_model("old.ckpt", {"model": saved}, small(multiple=64))
    line = str(error.value)
    assert line == (
        "ckpt_path=old.ckpt holds 1000 vocabulary rows (model.vocab_multiple=1), this config pads to "
        "1024 (model.vocab_multiple=64): resume with model.vocab_multiple=1"
    )
    _check_model("old.ckpt", {"model": saved}, small(multiple=1))  # the setting it names resumes it
