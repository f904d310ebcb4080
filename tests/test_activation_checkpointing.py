"""train.activation_checkpointing: each block recomputes in the backward (model/activation_checkpointing.py).
The same loss and gradients as without (fp32 on CPU), on GPT and Llama, with dropout too; what the
autograd graph keeps for the backward is each block's input alone; state dicts keep their names; the
setting reaches the model through set_up_model. (Peak memory: bench/bench_activation_checkpointing.py.)"""

from __future__ import annotations

import pytest
import torch
from helpers.tiny_models import batch, gpt, llama, loss_and_grads

from pretrain.config import TrainConfig
from pretrain.model.activation_checkpointing import apply_activation_checkpointing, checkpointed_blocks
from pretrain.training.model_setup import set_up_model

TOLERANCE = 1e-6


def saved_bytes(model) -> int:
    """Bytes of the tensors the autograd graph keeps for the backward of one loss."""
    total = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = model.loss(batch(), denominator=100.0)
    loss.backward()
    return total


@pytest.mark.parametrize("build", [gpt, llama, lambda: gpt(dropout=0.2)], ids=["gpt", "llama", "gpt-dropout"])
def test_recomputed_blocks_give_the_same_loss_and_gradients(build):
    model = build()
    loss, grads = loss_and_grads(model)
    assert apply_activation_checkpointing(model) == len(model.blocks) == 3
    assert checkpointed_blocks(model) == 3
    again, recomputed = loss_and_grads(model)
    assert again == pytest.approx(loss, abs=TOLERANCE)
    for name, grad in grads.items():
        torch.testing.assert_close(recomputed[name], grad, atol=TOLERANCE, rtol=0, msg=name)


def test_a_block_keeps_only_its_input_for_the_backward():
    plain = {n: saved_bytes(gpt(n_layer=n)) for n in (2, 4)}
    recomputed = {}
    for n in (2, 4):
        model = gpt(n_layer=n)
        apply_activation_checkpointing(model)
        recomputed[n] = saved_bytes(model)
    rows, width = batch().input_ids.numel(), 32
    per_block = (plain[4] - plain[2]) // 2  # without: every activation of a block
    kept = (recomputed[4] - recomputed[2]) // 2  # with: the block's input, one (T, d_model) fp32 tensor
    assert kept == rows * width * 4
    assert per_block > 10 * kept


def test_state_dict_names_and_a_second_call_are_unchanged():
    model = gpt()
    names = list(model.state_dict())
    apply_activation_checkpointing(model)
    assert apply_activation_checkpointing(model) == 0  # nothing wrapped twice
    assert list(model.state_dict()) == names
    with torch.no_grad():  # evaluation runs the blocks straight (nothing to recompute)
        assert torch.isfinite(model.token_losses(batch())).all()


def test_set_up_model_applies_the_setting():
    model = gpt()
    done = set_up_model(model, TrainConfig(activation_checkpointing=True, compile=False), torch.device("cpu"))
    assert done == {"loss_kernel": "chunked", "activation_checkpointing": 3}
    assert checkpointed_blocks(model) == 3
    untouched = gpt()
    assert set_up_model(untouched, TrainConfig(compile=False), torch.device("cpu")) == {
        "loss_kernel": "chunked"
    }
    assert checkpointed_blocks(untouched) == 0
