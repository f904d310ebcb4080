"""`data.positions=restart|continue` on every packing policy, mask on and off: restart is the batch
as before (each attention segment numbered from 0), continue numbers across the whole pack and changes
nothing else; a RoPE model with the mask on scores the two alike (rotations are relative), GPT's learned
position table does not; the resume key, the audit and the experiment=positions preset."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import compose, policy_cfg

from pretrain.arrays import run_positions
from pretrain.config import to_config
from pretrain.data.batching.samplers import build_sampler
from pretrain.data.measures.audit import composition_audit
from pretrain.data.tokens import TokenSplit
from pretrain.errors import ConfigError

PACKING_CASES = {
    "bestfit": ("bestfit", "data.packing_buffer=8"),
    "firstfit": ("firstfit", "data.open_bins=3"),
    "concat": ("prepacked", "data.strategy=concat"),
    "bfd": ("prepacked", "data.strategy=bfd"),
}


def split(seed: int = 0) -> TokenSplit:
    rng = np.random.default_rng(seed)
    return TokenSplit.from_lengths(rng.integers(2, 70, size=50), seed=seed)


def batches(case: str, mask: bool, positions: str | None, tmp_path):
    policy, *overrides = PACKING_CASES[case]
    extra = [] if positions is None else [f"data.positions={positions}"]
    cfg = policy_cfg(
        policy, "data.max_seq_len=32", "train.batch_size=3", f"data.document_mask={mask}", *overrides, *extra
    )
    return list(build_sampler(cfg, split(), packs_dir=tmp_path / f"{case}-{mask}-{positions}"))


@pytest.mark.parametrize("case", list(PACKING_CASES))
@pytest.mark.parametrize("mask", [True, False])
def test_restart_is_the_default_and_continue_numbers_across_the_pack(case, mask, tmp_path):
    default = batches(case, mask, None, tmp_path)
    restart = batches(case, mask, "restart", tmp_path)
    continued = batches(case, mask, "continue", tmp_path)
    assert len(default) == len(restart) == len(continued) > 0
    for before, again, cont in zip(default, restart, continued, strict=True):
        for name in ("input_ids", "targets", "position_ids", "cu_seqlens"):
            assert torch.equal(getattr(before, name), getattr(again, name))  # restart: as before
        for name in ("input_ids", "targets", "cu_seqlens", "pack_lengths"):
            assert torch.equal(getattr(before, name), getattr(cont, name))  # continue: only positions
        assert cont.max_seqlen == before.max_seqlen and cont.num_targets == before.num_targets
        packs = cont.pack_lengths.numpy()
        np.testing.assert_array_equal(cont.position_ids.numpy(), run_positions(packs))
        segments = np.diff(before.cu_seqlens.numpy())
        np.testing.assert_array_equal(before.position_ids.numpy(), run_positions(segments))
        assert int(cont.position_ids.max()) < 32  # within the pack's capacity
        if mask and len(segments) > len(packs):  # several documents in a pack: the two numberings differ
            assert not torch.equal(before.position_ids, cont.position_ids)
        if not mask:  # one segment per pack: the numberings coincide
            assert torch.equal(before.position_ids, cont.position_ids)


def logits_under(model_name: str, positions: str, tmp_path) -> torch.Tensor:
    """The logits of the model=<model_name> preset (seeded init) on best-fit packs, mask on, numbered
    by `positions`: the same packs either way, only position_ids differ (the first 3 batches, 9 packs of
    several documents each: a (50257-wide) head costs a second a batch on CPU)."""
    from pretrain.model import build_model, config_from_settings

    torch.manual_seed(0)
    model = build_model(config_from_settings(to_config(compose(f"model={model_name}")).model)).eval()
    with torch.no_grad():
        return torch.cat([model(batch) for batch in batches("bestfit", True, positions, tmp_path)[:3]])


@pytest.mark.parametrize(("model_name", "coincide"), [("llama-tiny", True), ("tiny", False)])
def test_restart_and_continue_coincide_for_rope_not_for_learned_positions(model_name, coincide, tmp_path):
    """With the document mask on, continue shifts each document's positions by its offset in the pack:
    RoPE's attention depends on position differences only, so llama-tiny's logits agree to float error
    (the contrast is void there); GPT's learned position table looks the shifted ids up, so model=tiny's
    differ (experiment=positions contrasts the two there)."""
    renumbered = zip(
        batches("bestfit", True, "restart", tmp_path)[:3],
        batches("bestfit", True, "continue", tmp_path)[:3],
        strict=True,
    )
    assert any(not torch.equal(a.position_ids, b.position_ids) for a, b in renumbered)  # packs of several
    restart = logits_under(model_name, "restart", tmp_path)
    continued = logits_under(model_name, "continue", tmp_path)
    assert restart.shape == continued.shape and restart.shape[0] > 0
    gap = float((restart - continued).abs().max())
    if coincide:
        assert gap < 1e-5
    else:
        assert gap > 1e-2


def test_the_choice_is_in_the_resume_key_and_the_audit(tmp_path):
    cfg = policy_cfg("bestfit", "data.max_seq_len=32", "train.batch_size=3", "data.positions=continue")
    assert cfg.data_policy.resume_key()["data.positions"] == "continue"
    default = policy_cfg("bestfit", "data.max_seq_len=32", "train.batch_size=3")
    assert "data.positions" not in default.data_policy.resume_key()  # old states still resume
    assert composition_audit(cfg, split())["positions"] == "continue"
    assert composition_audit(default, split())["positions"] == "restart"
    padded = policy_cfg("padded", "data.max_seq_len=32", "train.batch_size=3")
    assert composition_audit(padded, split())["positions"] == "restart"


def test_policies_that_do_not_pack_have_no_positions_option():
    for policy in ("padded", "vsl"):
        with pytest.raises(ConfigError, match="positions"):
            to_config(compose(f"data={policy}", "data.positions=continue"))
    with pytest.raises(Exception, match="data.positions=across"):
        to_config(compose("data=bestfit", "data.positions=across"))


def test_experiment_positions_contrasts_the_two():
    from omegaconf import OmegaConf

    cfg = compose("experiment=positions")
    config = to_config(cfg)
    # GPT's learned positions: with RoPE (llama-*) and the mask on, the two numberings give the same logits.
    assert config.model.arch == "gpt2" and config.model.name == "tiny"
    assert config.data.policy == "bestfit" and config.data.document_mask
    sweep = OmegaConf.to_container(cfg.hydra.sweeper.params) if "hydra" in cfg else None
    if sweep is None:  # composed without Hydra's own config: read the preset file
        import yaml
        from helpers import REPO

        sweep = yaml.safe_load((REPO / "conf" / "experiment" / "positions.yaml").read_text())["hydra"][
            "sweeper"
        ]["params"]
    assert sweep == {"data.positions": "restart,continue"}
