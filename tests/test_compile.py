"""train.compile (model/compile.py): the blocks' halves compiled around attention, T dynamic.

Unit tier: dynamo with the `aot_eager` backend (the graphs, guards and recompiles of inductor, without
its C++ build): losses and gradients equal eager on batches of changing structure and size, no
recompile after the first step, attention never traced, parameter names unchanged. End-to-end
(inductor): a 50-update bestfit run's recompiles and its losses against the eager run.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import SHARED_CACHE, module_cache_root

from pretrain.config import TrainConfig, load_config
from pretrain.data import gather_packed
from pretrain.errors import ConfigError
from pretrain.model import GPTConfig, LlamaConfig, build_model
from pretrain.model.attention import base as attention_base
from pretrain.model.attention import varlen as varlen_module
from pretrain.model.compile import (
    BLOCKS,
    MODEL,
    compile_blocks,
    compile_enabled,
    compile_model,
    compiled,
    resolve_compile_scope,
)
from pretrain.training.run import train

VOCAB = 300
cache_root = module_cache_root(SHARED_CACHE)

CONFIGS = {
    "gpt": GPTConfig(vocab_size=VOCAB, max_seq_len=128, n_layer=2, n_head=4, d_model=32, dropout=0.0),
    "llama": LlamaConfig(
        vocab_size=VOCAB, n_layer=2, n_head=4, n_kv_head=2, d_model=32, d_ff=48, max_seq_len=128
    ),
}


def packed_batches(count: int, seed: int = 0):
    """Bestfit-like batches: every one a new document structure and (mostly) a new token count."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, VOCAB, size=20_000).astype(np.uint32)
    batches = []
    for _ in range(count):
        lengths = rng.integers(1, 128, size=int(rng.integers(3, 9)))
        starts = rng.integers(0, len(tokens) - 200, size=len(lengths))
        split = int(rng.integers(1, len(lengths)))
        batches.append(gather_packed(tokens, starts, lengths, [split, len(lengths) - split], capacity=256))
    return batches


def pair(kind: str, backend: str = "aot_eager"):
    torch.manual_seed(0)
    eager = build_model(CONFIGS[kind], attn="sdpa")
    other = build_model(CONFIGS[kind], attn="sdpa")
    other.load_state_dict(eager.state_dict())
    return eager, other, compile_blocks(other, backend=backend)


def loss_and_grads(model, batch):
    model.zero_grad(set_to_none=True)
    loss = model.loss(batch, batch.num_targets)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_compiled_blocks_equal_eager_with_no_recompile_after_the_first_step(kind):
    eager, model, stats = pair(kind)
    batches = packed_batches(8)
    assert len({b.input_ids.shape[0] for b in batches}) >= 5  # the token count really changes
    for step, batch in enumerate(batches):
        expected, expected_grads = loss_and_grads(eager, batch)
        got, grads = loss_and_grads(model, batch)
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
        for g, e in zip(grads, expected_grads, strict=True):
            torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)
        if step == 0:
            stats.first_step_done()
    assert stats.graphs_at_first_step == 2  # one graph per half serves every block
    assert stats.recompiles == 0
    with torch.no_grad():  # evaluation: one more graph per half (grad mode is guarded), then none
        for batch in batches[:3]:
            torch.testing.assert_close(model.token_losses(batch), eager.token_losses(batch))
    assert stats.recompiles == 2
    assert stats.as_dict()["recompiles"] == 2 and stats.seconds > 0


def test_attention_is_never_traced(monkeypatch):
    """The per-batch metadata never enters a graph: every attention call runs eagerly, once per
    layer, between the compiled halves (what lets varlen's contract hold unchanged under compile)."""
    calls = []
    real = attention_base.AttentionBatch.attend

    def spy(self, q, k, v):
        calls.append(torch.compiler.is_compiling())
        return real(self, q, k, v)

    monkeypatch.setattr(attention_base.AttentionBatch, "attend", spy)
    _, model, _ = pair("gpt")
    for batch in packed_batches(3):
        model.loss(batch, batch.num_targets).backward()
    assert calls == [False] * (3 * CONFIGS["gpt"].n_layer)


def test_compiled_model_keeps_its_parameter_names_and_state_dict():
    eager, model, _ = pair("llama")
    assert compiled(model) and not compiled(eager)
    assert list(model.state_dict()) == list(eager.state_dict())
    assert all("_orig_mod" not in name for name, _ in model.named_parameters())


def document_attention(q, k, v, cu_seqlens, max_seqlen):
    """A CPU stand-in for the flash varlen kernel, made of tensor ops alone (so the graph holds it as
    it holds varlen's op): causal attention within each segment of `cu_seqlens`."""
    rows = torch.arange(q.shape[0], device=q.device)
    segment = torch.searchsorted(cu_seqlens[1:].long(), rows, right=True)
    allowed = (segment[:, None] == segment[None, :]) & (rows[:, None] >= rows[None, :])
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=allowed
    )
    return out.transpose(0, 1)


@pytest.fixture
def cpu_varlen(monkeypatch):
    """attn=varlen on the CPU through document_attention."""
    monkeypatch.setattr(varlen_module.VarlenBackend, "check", lambda *args, **kwargs: None)
    monkeypatch.setattr(varlen_module, "varlen_attention", document_attention)


def model_pair(kind: str):
    torch.manual_seed(0)
    eager = build_model(CONFIGS[kind], attn="varlen")
    other = build_model(CONFIGS[kind], attn="varlen")
    other.load_state_dict(eager.state_dict())
    return eager, other, compile_model(other, backend="aot_eager")


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_the_whole_compiled_trunk_equals_eager_with_one_graph_for_every_batch(kind, cpu_varlen):
    """train.compile_scope=model: one graph for the trunk serves batches of every token count and
    segment count (T and the boundaries dynamic, varlen's bound static), losses and gradients equal
    eager, no recompile after the first step."""
    eager, model, stats = model_pair(kind)
    batches = packed_batches(6, seed=1)
    assert len({b.input_ids.shape[0] for b in batches}) >= 4
    assert len({len(b.cu_seqlens) for b in batches}) >= 3  # the segment count changes too
    for step, batch in enumerate(batches):
        expected, expected_grads = loss_and_grads(eager, batch)
        got, grads = loss_and_grads(model, batch)
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
        for g, e in zip(grads, expected_grads, strict=True):
            torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)
        if step == 0:
            stats.first_step_done()
    assert stats.graphs_at_first_step == 1 and stats.recompiles == 0
    assert compiled(model) and list(model.state_dict()) == list(eager.state_dict())


def test_compile_scope_setting():
    assert resolve_compile_scope("auto", "varlen", "cuda", sharded=False) == MODEL
    assert resolve_compile_scope("auto", "auto", "cuda", sharded=False) == MODEL
    assert resolve_compile_scope("auto", "varlen", "cuda", sharded=True) == BLOCKS  # FSDP's hooks
    assert resolve_compile_scope("auto", "flex", "cuda", sharded=False) == BLOCKS
    assert resolve_compile_scope("auto", "auto", "cpu", sharded=False) == BLOCKS
    assert resolve_compile_scope("model", "varlen", "cpu", sharded=False) == MODEL
    with pytest.raises(ConfigError, match="train.compile_scope=model needs attn=varlen"):
        resolve_compile_scope("model", "flex", "cuda", sharded=False)
    assert TrainConfig(compile_scope="blocks").compile_scope == "blocks"
    with pytest.raises(ConfigError, match=r"train.compile_scope='graph': use one of auto, model, blocks"):
        TrainConfig(compile_scope="graph")


def test_compile_setting():
    assert compile_enabled("auto", "cuda") and not compile_enabled("auto", "cpu")
    assert compile_enabled(True, "cpu") and not compile_enabled(False, "cuda")
    assert TrainConfig(compile="true").compile is True
    with pytest.raises(ConfigError, match=r"train.compile='yes' must be auto, true or false"):
        TrainConfig(compile="yes")


# ------------------------------------------------------------------------- end to end (inductor)


def read_losses(run_dir: Path) -> dict[int, float]:
    with open(run_dir / "metrics.csv", newline="") as handle:
        return {int(r["step"]): float(r["train/loss"]) for r in csv.DictReader(handle) if r["train/loss"]}


def test_a_compiled_bestfit_run_recompiles_at_most_twice_and_matches_eager(tmp_path, cache_root):
    """50 updates of bestfit (a new structure and token count at every update) with inductor:
    run.json's compile record, and train/loss within 1e-4 of the eager run's over the first 10 updates.
    (Not all 50: from about update 20 on, this run is chaotic at fp32 rounding: eager on 1 thread
    against eager on 2 differs by 2e-3 at update 22 and 3e-2 by update 43, as compiled against eager
    does; before that both differ by at most 5e-6.)"""
    common = [
        "experiment=smoke",
        "data=bestfit",
        "train.max_steps=50",
        "train.log_every_n_steps=1",
        "train.checkpoint_every_n_steps=null",
        "progress_bar=false",
        "logger=csv",
    ]
    runs = {}
    for setting in ("true", "false"):
        out = tmp_path / setting
        train(load_config([*common, f"output_dir={out}", f"train.compile={setting}"]))
        runs[setting] = (read_losses(out), json.loads((out / "run.json").read_text()))
    (compiled_losses, record), (eager_losses, eager_record) = runs["true"], runs["false"]
    assert eager_record["compile"] is None
    assert record["compile"]["graphs_first_step"] == 2
    assert record["compile"]["recompiles"] <= 2  # the evaluation graphs
    assert record["compile"]["seconds"] > 0
    assert sorted(compiled_losses) == sorted(eager_losses) and len(eager_losses) == 50
    assert max(abs(compiled_losses[s] - eager_losses[s]) for s in range(1, 11)) < 1e-4
