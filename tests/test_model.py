"""GPT on packed batches: chunk independence, isolation, padded == packed, loss, configs, bad inputs."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import BACKEND_CHOICES, cpu_backends

from pretrain.config import load_config, to_config
from pretrain.data import IGNORE_INDEX, TokenSplit, collate_packed, gather_packed, gather_padded, split_tokens
from pretrain.model import GPT, GPTConfig
from pretrain.model.loss import token_cross_entropy

ROOT = Path(__file__).resolve().parents[1]
VOCAB, MAX_LEN = 101, 48
TIGHT = 1e-10  # float64: packing changes only summation order


def small_model(attn="sdpa", seed=0, dtype=torch.float64, **overrides):
    torch.manual_seed(seed)
    config = GPTConfig(vocab_size=VOCAB, n_layer=2, n_head=2, d_model=32, max_seq_len=MAX_LEN, **overrides)
    return GPT(config, attn=attn).to(dtype)


def documents(lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, VOCAB, size=n) for n in lengths]


def chunks_of(docs, max_seq_len=MAX_LEN):
    return [c for i, d in enumerate(docs) for c in split_tokens(f"doc{i}", d, max_seq_len)]


DOC_LENGTHS = [20, 110, 5, 49, 2, 33]  # 110 and 49 are cut into several chunks of <= 48 inputs


def packed(chunks, pack_size=3):
    return collate_packed(
        [chunks[i : i + pack_size] for i in range(0, len(chunks), pack_size)], capacity=3 * MAX_LEN
    )


def grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def test_packed_batch_equals_each_chunk_alone_forward_and_gradients():
    model = small_model()
    chunks = chunks_of(documents(DOC_LENGTHS))
    assert len(chunks) > len(DOC_LENGTHS)  # some documents were cut
    batch = packed(chunks)

    logits = model(batch)
    model.loss(batch, denominator=1.0).backward()
    packed_grads = grads(model)

    model.zero_grad()
    alone = []
    for chunk in chunks:
        single = collate_packed([chunk])
        alone.append(model(single).detach())
        model.loss(single, denominator=1.0).backward()  # gradients accumulate over chunks
    torch.testing.assert_close(logits.detach(), torch.cat(alone), atol=TIGHT, rtol=0)
    for name, grad in grads(model).items():
        torch.testing.assert_close(packed_grads[name], grad, atol=TIGHT, rtol=0, msg=name)


def test_flex_forward_equals_each_chunk_alone_and_sdpa():
    sdpa, flex = small_model("sdpa"), small_model("flex")
    chunks = chunks_of(documents(DOC_LENGTHS))
    batch = packed(chunks)
    with torch.no_grad():
        got = flex(batch)
        alone = torch.cat([flex(collate_packed([c])) for c in chunks])
        reference = sdpa(batch)
    torch.testing.assert_close(got, alone, atol=TIGHT, rtol=0)
    torch.testing.assert_close(got, reference, atol=TIGHT, rtol=0)


@pytest.mark.parametrize("attn", cpu_backends(training=False))
def test_changing_one_document_leaves_the_others_unchanged(attn):
    model = small_model(attn)
    docs = documents([30, 40, 25, 9])
    changed = [d.copy() for d in docs]
    changed[1] = (changed[1] + 1 + np.arange(len(changed[1]))) % VOCAB  # every token differs
    assert (changed[1] != docs[1]).all()
    with torch.no_grad():
        before = model(packed(chunks_of(docs), pack_size=4))
        after = model(packed(chunks_of(changed), pack_size=4))
    rows = np.cumsum([0] + [len(d) - 1 for d in docs])  # each doc is one chunk of len-1 inputs
    other = torch.ones(len(before), dtype=torch.bool)
    other[rows[1] : rows[2]] = False
    torch.testing.assert_close(before[other], after[other], atol=1e-12, rtol=0)
    assert not torch.allclose(before[~other], after[~other])


def test_model_computes_only_real_rows_and_positions_restart_per_chunk():
    model = small_model()
    chunks = chunks_of(documents(DOC_LENGTHS))
    batch = packed(chunks)
    seen = {}
    model.wte.register_forward_hook(lambda m, args, out: seen.__setitem__("tokens", args[0]))
    model.wpe.register_forward_hook(lambda m, args, out: seen.__setitem__("positions", args[0]))
    model.h[0].attn.c_attn.register_forward_hook(
        lambda m, args, out: seen.__setitem__("qkv_rows", out.shape[0])
    )
    model(batch)
    real = sum(len(c) for c in chunks)
    assert seen["tokens"].shape == (real,)
    assert batch.num_tokens == int(batch.pack_lengths.sum()) == real == seen["qkv_rows"]
    expected = np.concatenate([np.arange(len(c)) for c in chunks])
    assert np.array_equal(seen["positions"].numpy(), expected)


def padded_and_packed(doc_lengths, width, seed=0):
    """The same untruncated documents as padded rows (one per row) and as packs of real tokens."""
    split = TokenSplit.from_lengths(doc_lengths, seed=seed, vocab=VOCAB - 1)  # EOS=50256 is remapped below
    tokens = np.where(split.tokens == 50256, VOCAB - 1, split.tokens).astype(np.uint32)
    inputs = split.lengths - 1  # every pair of a document fits one row: nothing is truncated
    assert inputs.max() <= width
    padded = gather_padded(tokens, split.offsets, inputs, row_width=width)
    packs = gather_packed(tokens, split.offsets, inputs, pack_sizes=[2, 3, 1, 2], capacity=2 * width)
    padded = replace(padded, input_ids=padded.input_ids.clamp(max=VOCAB - 1))  # pad id 50256 -> in vocab
    return padded, packs, inputs


@pytest.mark.parametrize("attn", cpu_backends(training=False))
def test_padded_and_packed_batches_give_the_same_token_losses(attn):
    model = small_model(attn)
    padded, packs, inputs = padded_and_packed([12, 40, 7, 49, 30, 2, 19, 25], width=MAX_LEN)
    with torch.no_grad():
        padded_losses = model.token_losses(padded).view(len(inputs), MAX_LEN)
        packed_losses = model.token_losses(packs)
    real = torch.arange(MAX_LEN)[None, :] < torch.as_tensor(inputs)[:, None]
    torch.testing.assert_close(padded_losses[real], packed_losses, atol=TIGHT, rtol=0)
    assert torch.all(padded_losses[~real] == 0)  # pads carry IGNORE_INDEX targets
    assert padded.num_targets == packs.num_targets == int(inputs.sum())


def test_loss_is_summed_cross_entropy_over_the_callers_denominator():
    model = small_model()
    padded, _, _ = padded_and_packed([12, 40, 7, 49, 30, 2, 19, 25], width=MAX_LEN)
    denominator = 1000  # e.g. the real targets of a whole accumulated step, not this batch's
    loss = model.loss(padded, denominator)
    logits = model(padded)
    counted = padded.targets != IGNORE_INDEX
    log_probs = torch.log_softmax(logits[counted], dim=-1)
    manual = -log_probs.gather(1, padded.targets[counted, None]).sum() / denominator
    torch.testing.assert_close(loss, manual, atol=TIGHT, rtol=0)
    with pytest.raises(ValueError, match="denominator must be > 0"):
        model.loss(padded, 0)


def test_chunked_checkpointed_loss_matches_the_direct_one():
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(50, 16, dtype=torch.float64, generator=gen, requires_grad=True)
    weight = torch.randn(VOCAB, 16, dtype=torch.float64, generator=gen, requires_grad=True)
    targets = torch.randint(0, VOCAB, (50,), generator=gen)
    targets[::7] = IGNORE_INDEX
    direct = F.cross_entropy(hidden @ weight.T, targets, ignore_index=IGNORE_INDEX, reduction="none")
    chunked = token_cross_entropy(hidden, weight, targets, chunk_rows=8)
    torch.testing.assert_close(chunked, direct, atol=TIGHT, rtol=0)
    want = torch.autograd.grad(direct.sum(), (hidden, weight))
    got = torch.autograd.grad(chunked.sum(), (hidden, weight))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=TIGHT, rtol=0)


# --- the CPU head's workspace: bitwise the autograd head, buffers reused across steps ---------------


def _head_inputs(dtype, rows=90, width=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, width, dtype=dtype, generator=gen)
    weight = torch.randn(VOCAB, width, dtype=dtype, generator=gen)
    targets = torch.randint(0, VOCAB, (rows,), generator=gen)
    targets[::7] = IGNORE_INDEX
    return hidden, weight, targets


def _head_results(hidden, weight, targets, chunk_rows, workspace):
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    losses = token_cross_entropy(h, w, targets, chunk_rows=chunk_rows, workspace=workspace)
    (losses.sum() / 37.0).backward()
    with torch.no_grad():
        evaluated = token_cross_entropy(hidden, weight, targets, chunk_rows=chunk_rows, workspace=workspace)
    return losses.detach(), h.grad, w.grad, evaluated


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("chunk_rows", [None, 8, 89])  # one chunk (kept), 12 chunks, a 1-row tail
def test_workspace_head_is_bitwise_the_autograd_head(dtype, chunk_rows):
    from pretrain.model.loss import uses_workspace

    hidden, weight, targets = _head_inputs(dtype)
    assert uses_workspace(hidden, weight)
    got = _head_results(hidden, weight, targets, chunk_rows, workspace=True)
    want = _head_results(hidden, weight, targets, chunk_rows, workspace=False)
    for name, g, w in zip(["losses", "grad hidden", "grad weight", "no-grad losses"], got, want, strict=True):
        assert g.dtype == w.dtype == dtype and torch.equal(g, w), name
    assert (got[0][targets == IGNORE_INDEX] == 0).all() and (got[0][targets != IGNORE_INDEX] > 0).all()


@pytest.mark.parametrize("chunk_rows", [None, 40])
def test_gpt_gradients_with_the_workspace_head_are_bitwise_the_autograd_ones(monkeypatch, chunk_rows):
    """The tied weight sums the head's chunks and the embedding's gradient in the same order."""
    import functools

    from pretrain.model import gpt as gpt_module
    from pretrain.model import loss as loss_module

    if chunk_rows is not None:
        monkeypatch.setattr(loss_module, "LOSS_CHUNK_ROWS", chunk_rows)
    batch = packed(chunks_of(documents(DOC_LENGTHS)))
    results = []
    for workspace in (True, False):
        head = functools.partial(loss_module.token_cross_entropy, workspace=workspace)
        monkeypatch.setattr(gpt_module, "token_cross_entropy", head)
        model = small_model(dtype=torch.float32)
        loss = model.loss(batch, denominator=batch.num_targets)
        loss.backward()
        results.append((loss.detach(), grads(model)))
    (loss, got), (reference, want) = results
    assert torch.equal(loss, reference)
    assert got.keys() == want.keys() and all(torch.equal(got[n], want[n]) for n in want)


def test_workspace_buffers_are_reused_across_steps_and_bounded():
    from pretrain.model.loss import WORKSPACE, HeadWorkspace

    WORKSPACE.clear()
    hidden, weight, targets = _head_inputs(torch.float32)  # 90 rows
    hidden.requires_grad_()

    def step(rows):
        token_cross_entropy(hidden[:rows], weight, targets[:rows]).sum().backward()
        return sorted(f.data_ptr() for f in WORKSPACE._free[torch.float32])

    first = step(60)
    assert len(first) == HeadWorkspace.KEEP  # log-probabilities and their gradient
    assert WORKSPACE.kept_bytes() == HeadWorkspace.KEEP * 60 * VOCAB * 4
    assert step(60) == first and step(45) == first  # the same pages, also for a smaller batch
    step(75)  # a larger batch grows the buffers; never more than two are kept
    assert WORKSPACE.kept_bytes() == HeadWorkspace.KEEP * 75 * VOCAB * 4
    WORKSPACE.clear()
    assert WORKSPACE.kept_bytes() == 0


def test_autocast_takes_the_autograd_head():
    from pretrain.model.loss import uses_workspace

    hidden, weight, targets = _head_inputs(torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not uses_workspace(hidden, weight)
        losses = token_cross_entropy(hidden, weight, targets)
    assert losses.dtype == torch.float32  # bf16 logits, fp32 cross-entropy
    torch.testing.assert_close(losses, token_cross_entropy(hidden, weight, targets), atol=0.1, rtol=0.02)
    assert not uses_workspace(hidden.to(torch.bfloat16), weight.to(torch.bfloat16))


def good_batch():
    return packed(chunks_of(documents([10, 20, 15])))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda b: replace(b, cu_seqlens=b.cu_seqlens.long()), "must be an int32 tensor"),
        (lambda b: replace(b, cu_seqlens=torch.tensor([0, 20, 9, 42], dtype=torch.int32)), "monotonic"),
        (
            lambda b: replace(b, cu_seqlens=torch.tensor([0, 9, 28, 40], dtype=torch.int32)),
            "must end at T = 42",
        ),
        (lambda b: replace(b, cu_seqlens=torch.tensor([3, 9, 28, 42], dtype=torch.int32)), "must start at 0"),
        (lambda b: replace(b, position_ids=b.position_ids + MAX_LEN), "raise model.max_seq_len"),
        (lambda b: replace(b, max_seqlen=3), "longest segment"),
    ],
    ids=["int64", "not-monotonic", "not-ending-at-T", "not-starting-at-0", "positions", "max_seqlen"],
)
def test_bad_batches_fail_with_a_clear_error(change, message):
    model = small_model()
    batch = good_batch()
    assert batch.num_tokens == 42
    model(batch)  # the unchanged batch is fine
    with pytest.raises(ValueError, match=message):
        model(change(batch))


def test_flex_training_on_cpu_fails_at_start_naming_sdpa_but_evaluation_works():
    flex, sdpa = small_model("flex"), small_model("sdpa")
    batch = good_batch()
    with pytest.raises(ValueError, match="attn=sdpa"):
        flex.loss(batch, batch.num_targets)
    with torch.no_grad():
        torch.testing.assert_close(flex(batch), sdpa(batch), atol=TIGHT, rtol=0)
    with torch.inference_mode():
        torch.testing.assert_close(flex.token_losses(batch), sdpa.token_losses(batch), atol=TIGHT, rtol=0)


def test_varlen_on_cpu_fails_at_start_and_auto_runs_sdpa():
    batch = good_batch()
    with pytest.raises(ValueError, match=r"only on CUDA.*attn=sdpa"):
        small_model("varlen")(batch)
    auto, sdpa = small_model("auto"), small_model("sdpa")
    assert auto.backend() == "sdpa"
    torch.testing.assert_close(auto(batch), sdpa(batch), atol=0, rtol=0)
    with pytest.raises(ValueError, match="attn.backend must be one of"):
        small_model("flash")


# GPT-2's published shapes (n_layer, n_head, d_model), and the tiny demo model.
SIZES = {"tiny": (4, 4, 128), "gpt2-small": (12, 12, 768), "gpt2-medium": (24, 16, 1024)}


def composed_model(name, max_seq_len, attn="sdpa"):
    """GPTConfig and attn group exactly as `python train.py model=<name> attn=<attn>` builds them."""
    config = to_config(load_config([f"model={name}", f"attn={attn}", f"data.max_seq_len={max_seq_len}"]))
    return GPTConfig.from_settings(config.model), config.attn


def gpt2_parameters(vocab, positions, layers, width):
    """Independent count: embeddings + per block (2 LayerNorms, qkv, proj, MLP) + final LayerNorm."""
    block = 2 * 2 * width + (3 * width * width + 3 * width) + (width * width + width)
    block += (4 * width * width + 4 * width) + (4 * width * width + width)
    return vocab * width + positions * width + layers * block + 2 * width


@pytest.mark.parametrize(
    ("name", "published"), [("tiny", None), ("gpt2-small", 124_439_808), ("gpt2-medium", 354_823_168)]
)
def test_model_configs_build_the_named_sizes(name, published):
    gpt_config, attn = composed_model(name, 1024, attn="flex")
    with torch.device("meta"):  # no memory or init time for the big ones
        model = GPT(gpt_config, attn=attn.backend, attn_compile=attn.compile_mode)
    config = model.config
    assert config.max_seq_len == 1024 and config.vocab_size == 50257
    assert (config.n_layer, config.n_head, config.d_model) == SIZES[name]
    assert config.dropout == 0.0 and config.bias is True
    assert model.attn_backend == "flex" and model.attn_compile == "auto"
    expected = gpt2_parameters(50257, 1024, config.n_layer, config.d_model)
    assert model.num_parameters() == expected
    assert model.num_parameters(exclude_position_embeddings=True) == expected - 1024 * config.d_model
    if published:
        assert expected == published  # Hugging Face's GPT-2 counts, tied head counted once


def test_attn_configs_and_the_model_follow_data_max_seq_len():
    for name in BACKEND_CHOICES:
        assert to_config(load_config([f"attn={name}"])).attn.backend == name
    gpt_config, attn = composed_model("tiny", 64)
    model = GPT(gpt_config, attn=attn.backend)
    assert model.attn_backend == "sdpa" and model.config.max_seq_len == 64
    assert model.config == GPTConfig(
        vocab_size=50257, n_layer=4, n_head=4, d_model=128, max_seq_len=64, vocab_multiple=64
    )


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.n_head=3", "model.d_model=128 must be divisible by model.n_head=3"),
        ("model.n_layer=0", "model.n_layer=0 must be >= 1"),
        ("model.dropout=1.0", r"model.dropout=1.0 must be in \[0, 1\)"),
    ],
)
def test_model_range_errors_come_from_the_schema_and_the_model_asserts_them(override, message):
    from pretrain.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        to_config(load_config(["model=tiny", override]))
    key, value = override.removeprefix("model.").split("=")
    shapes = dict(vocab_size=VOCAB, n_layer=2, n_head=2, d_model=128, max_seq_len=MAX_LEN)
    shapes[key] = float(value) if key == "dropout" else int(value)
    with pytest.raises(ValueError, match="GPTConfig") as info:
        GPTConfig(**shapes)  # built in code: a programming error, not a user-facing one
    assert not isinstance(info.value, ConfigError)


def test_gpt2_initialisation():
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=5000, n_layer=8, n_head=4, d_model=128, max_seq_len=256)
    model = GPT(config)
    assert abs(model.wte.weight.std().item() - 0.02) < 1e-3
    assert abs(model.h[0].attn.c_attn.weight.std().item() - 0.02) < 1e-3
    scaled = 0.02 / math.sqrt(2 * config.n_layer)
    for block in model.h:
        assert abs(block.attn.c_proj.weight.std().item() - scaled) < 0.1 * scaled
        assert abs(block.mlp.c_proj.weight.std().item() - scaled) < 0.1 * scaled
        assert torch.all(block.attn.c_attn.bias == 0)
    # Tied output embedding: the logits are hidden @ wte.T, one shared tensor.
    batch = collate_packed(chunks_of(documents([9, 12])))
    with torch.no_grad():
        torch.testing.assert_close(model(batch), model.hidden_states(batch) @ model.wte.weight.T)


# --- validation and eval: the chunked loss, memory independent of vocabulary x microbatch -----------


class _LargestLogits(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the most rows of any tensor an op produces whose last dimension is the vocabulary."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab, self.rows = vocab, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor) and t.dim() >= 2 and t.shape[-1] == self.vocab:
                self.rows = max(self.rows, t.numel() // self.vocab)
        return out


def gpt2_vocab_model(max_seq_len=1024):
    from pretrain.data.gpt2 import GPT2_VOCAB_SIZE

    torch.manual_seed(0)
    config = GPTConfig(vocab_size=GPT2_VOCAB_SIZE, n_layer=1, n_head=2, d_model=16, max_seq_len=max_seq_len)
    return GPT(config, attn="sdpa").eval()


def test_validation_loss_without_gradients_is_chunked_and_equals_the_unchunked_one(monkeypatch):
    from pretrain.model import loss as loss_module

    model = small_model(dtype=torch.float32).eval()
    batch = packed(chunks_of(documents(DOC_LENGTHS)))  # 213 rows
    monkeypatch.setattr(loss_module, "EVAL_CHUNK_ELEMENTS", 50 * VOCAB)
    assert loss_module.eval_chunk_rows(VOCAB) == 50 < batch.num_tokens < loss_module.LOSS_CHUNK_ROWS
    with torch.no_grad():
        logits = model(batch)  # the unchunked reference
        reference = F.cross_entropy(logits, batch.targets, ignore_index=IGNORE_INDEX, reduction="none")
        with _LargestLogits(VOCAB) as seen:
            whole = model.loss(batch, denominator=batch.num_targets)  # what validation_loss calls
            per_token = model.token_losses(batch)  # what pretrain eval sums
    assert seen.rows == 50  # five chunks of at most 50 rows (training would take one of 213)
    torch.testing.assert_close(per_token, reference, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(whole, reference.sum() / batch.num_targets, rtol=1e-6, atol=1e-6)


def test_largest_logits_of_an_8192_token_validation_batch_are_bounded_by_the_chunk():
    from helpers import policy_cfg

    from pretrain.data.batching.evaluation import evaluation_batches
    from pretrain.data.gpt2 import GPT2_VOCAB_SIZE
    from pretrain.model import loss as loss_module
    from pretrain.training.evaluate import evaluate

    model = gpt2_vocab_model()
    bound = loss_module.eval_chunk_rows(GPT2_VOCAB_SIZE)
    settings = policy_cfg("bestfit", "data.max_seq_len=1024", "train.eval_microbatch_tokens=8192")
    split = TokenSplit.from_lengths(np.full(8, 1025), name="validation", seed=1)  # 8 full packs
    (batch,) = list(evaluation_batches(settings, split))
    assert batch.num_tokens == 8192
    with torch.no_grad():
        rows = bound + 64  # the detector sees a head over more rows than a chunk
        with _LargestLogits(GPT2_VOCAB_SIZE) as seen:
            hidden = model.hidden_states(batch)[:rows]
            loss_module.token_cross_entropy(hidden, model.wte.weight, batch.targets[:rows], chunk_rows=rows)
        assert seen.rows == rows
        with _LargestLogits(GPT2_VOCAB_SIZE) as seen:
            loss = model.loss(batch, denominator=batch.num_targets)  # training's validation_loss
        assert 0 < seen.rows <= bound < 8192
    assert abs(float(loss) - math.log(GPT2_VOCAB_SIZE)) < 0.5  # an untrained model: near uniform
    # pretrain eval (evaluate.py) goes through the same chunked loss: 2048-token microbatches here.
    two = TokenSplit.from_lengths([1025, 1025], name="validation", seed=2)
    settings = policy_cfg("bestfit", "data.max_seq_len=1024", "train.eval_microbatch_tokens=2048")
    with _LargestLogits(GPT2_VOCAB_SIZE) as seen:
        result = evaluate(model, two, settings, np.ones(GPT2_VOCAB_SIZE, dtype=np.int64))
    assert 0 < seen.rows <= bound < 2048 and result.targets == 2048
