"""Data mixtures (data/batching/mixture.py): the epoch plan's shares, repeats and parts, the mixed split, the
sampler's resume key and per-component tokens, the config's one-line errors and normalisation,
`pretrain inspect-data` per component, and a tiny training run's train/tokens/<name> and val/loss/<name>."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch
from helpers import compose, policies_where, policy_cfg

from pretrain.config import to_config
from pretrain.data.batching.evaluation import (
    evaluation_batches,
    evaluation_chunks,
    evaluation_positions,
    evaluation_units,
    scored_documents,
    validation_pairs,
)
from pretrain.data.batching.mixture import MixturePlan, MixtureSpec, mix_splits, update_shares
from pretrain.data.batching.policies import split_chunks
from pretrain.data.batching.samplers import build_sampler
from pretrain.data.tokens import TokenSplit
from pretrain.errors import ConfigError, SourceError

MAX_SEQ_LEN = 32


def _splits(seed: int = 0) -> list[TokenSplit]:
    """A large component (300 documents) and a small one (40), random lengths, distinct tokens."""
    rng = np.random.default_rng(seed)
    big = TokenSplit.from_lengths(rng.integers(2, 120, 300), seed=1)
    small = TokenSplit.from_lengths(rng.integers(2, 60, 40), seed=2)
    return [big, small]


def _plan(weights=(0.75, 0.25), max_repeat=(1, 3), seed: int = 7, trained=None):
    split, mixture = mix_splits(_splits(), ("big", "small"), weights, max_repeat)
    table = split_chunks(split, MAX_SEQ_LEN)
    return split, mixture, table, MixturePlan(mixture, table, trained, seed)


def _epoch_tokens(plan: MixturePlan, epoch: int) -> np.ndarray:
    mixed = plan.epoch(epoch)
    return np.bincount(mixed.component, weights=mixed.table.length, minlength=2)


# --- the plan ---------------------------------------------------------------------------------------


def test_each_epoch_gives_every_component_its_weight_within_one_chunk():
    _, mixture, _, plan = _plan()
    # The small component limits: 3 uses of its tokens are 25 % of the epoch.
    assert plan.epoch_tokens == pytest.approx(3 * plan.available[1] / 0.25)
    for epoch in range(4):
        tokens = _epoch_tokens(plan, epoch)
        assert tokens[1] == 3 * plan.available[1]  # the limiting component: exactly max_repeat uses
        assert abs(tokens[0] - 0.75 * plan.epoch_tokens) < MAX_SEQ_LEN
        assert abs(tokens[0] / tokens.sum() - 0.75) < MAX_SEQ_LEN / tokens.sum()


def test_the_interleaved_order_tracks_the_weights_chunk_by_chunk():
    _, _, _, plan = _plan()
    mixed = plan.epoch(0)
    per_component = np.zeros((len(mixed.component), 2))
    per_component[np.arange(len(mixed.component)), mixed.component] = mixed.table.length
    cumulative = per_component.cumsum(axis=0)
    # After every chunk, each component's tokens are within two chunks of its weight's share.
    deficit = np.abs(cumulative - cumulative.sum(axis=1, keepdims=True) * np.array([0.75, 0.25]))
    assert deficit.max() <= 2 * MAX_SEQ_LEN
    assert mixed.table.planned


def test_no_chunk_is_used_more_than_max_repeat_times_in_an_epoch():
    _, mixture, table, plan = _plan(weights=(0.5, 0.5), max_repeat=(2, 3))
    bounds = np.searchsorted(table.doc, mixture.doc_bounds)
    for epoch in range(3):
        mixed = plan.epoch(epoch)
        picked = np.searchsorted(table.start, mixed.table.start)  # the rows of the split's table
        uses = np.bincount(picked, minlength=len(table))
        assert uses[bounds[0] : bounds[1]].max() <= 2
        assert uses[bounds[1] : bounds[2]].max() <= 3
        assert np.array_equal(table.length[picked], mixed.table.length)


def test_a_component_with_more_data_than_its_share_contributes_a_different_part_each_epoch():
    _, mixture, table, plan = _plan(weights=(0.5, 0.5), max_repeat=(1, 3))
    uses = plan.uses_per_epoch()
    assert uses[1] == 3.0 and 0.1 < uses[0] < 0.5  # big: less than half of it per epoch
    parts = []
    for epoch in range(int(np.ceil(1 / uses[0]))):
        mixed = plan.epoch(epoch)
        parts.append(set(mixed.table.start[mixed.component == 0].tolist()))
    assert not parts[0] & parts[1]  # consecutive epochs continue the permutation
    big_chunks = set(table.start[table.doc < mixture.doc_bounds[1]].tolist())
    assert set().union(*parts) == big_chunks  # then it wraps around: every chunk was used
    # The same (seed, epoch) plans the same epoch; another seed another one.
    again = MixturePlan(mixture, table, None, 7).epoch(1).table.start
    assert np.array_equal(again, plan.epoch(1).table.start)
    assert not np.array_equal(MixturePlan(mixture, table, None, 8).epoch(1).table.start, again)


def test_truncate_mixes_only_each_documents_first_chunk():
    from pretrain.data.batching.policies.layout import first_chunk_ids

    split, _, table, _ = _plan()
    first = first_chunk_ids(table)
    _, mixture, _, plan = _plan(trained=first)
    mixed = plan.epoch(0)
    assert set(mixed.table.start.tolist()) <= set(table.start[first].tolist())


def test_the_mixed_split_reads_each_components_tokens_without_a_copy():
    big, small = _splits()
    split, mixture = mix_splits([big, small], ("big", "small"), (0.5, 0.5))
    edge = len(big.tokens)
    index = np.array([[0, edge - 1], [edge, edge + 5]])
    expected = [[big.tokens[0], big.tokens[edge - 1]], [small.tokens[0], small.tokens[5]]]
    assert split.tokens[index].tolist() == expected
    assert split.tokens[edge - 2 : edge + 2].tolist() == [*big.tokens[-2:], *small.tokens[:2]]
    assert np.array_equal(split.document(len(big)), small.document(0))
    assert mixture.component_of(np.array([0, edge - 1, edge])).tolist() == [0, 0, 1]


# --- the sampler ------------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", policies_where(mixes=True))
def test_batches_count_each_components_tokens_and_an_epoch_serves_its_plan(policy):
    extra = ("train.microbatch_tokens=64", "train.batch_size=null") if policy == "vsl" else ()
    settings = policy_cfg(policy, f"data.max_seq_len={MAX_SEQ_LEN}", "train.batch_size=2", *extra)
    split, mixture = mix_splits(_splits(), ("big", "small"), (0.75, 0.25), (1, 3))
    sampler = build_sampler(settings, split, mixture=mixture)
    served = np.zeros(2, dtype=np.int64)
    for batch in sampler:
        assert batch.meta["component_tokens"].sum() == batch.real_tokens
        assert len(batch.meta["components"]) == len(batch.cu_seqlens) - 1 or policy != "bestfit"
        served += batch.meta["component_tokens"]
    dropped = sampler.epoch_accounting(0)["dropped_tokens"]
    planned = _epoch_tokens(sampler.mixture_plan, 0)
    assert served.sum() + dropped == planned.sum()
    assert abs(served[0] / served.sum() - 0.75) < 0.02  # the tail dropped to keep ranks equal is small


def _update_deviation(policy: str, *overrides: str) -> np.ndarray:
    """|share - weight| of the small component in each whole update of epoch 0 (8 packs of 32 tokens)."""
    sizing = (
        ("train.microbatch_tokens=256", "train.batch_size=null")
        if policy == "vsl"
        else ("train.batch_size=8",)
    )
    settings = policy_cfg(policy, f"data.max_seq_len={MAX_SEQ_LEN}", *sizing, *overrides)
    split, mixture = mix_splits(_splits(), ("big", "small"), (0.75, 0.25), (1, 3))
    sampler = build_sampler(settings, split, mixture=mixture)
    return np.abs(update_shares(mixture, sampler.plan(0), sampler.update_units)[:, 1] - 0.25)


def test_online_packers_keep_the_planned_order_so_updates_track_the_weights():
    """Measured per-update share deviation: packing in the planned order (bestfit with a buffer of one
    chunk) strays at most about a chunk from the weight in every update; a bigger buffer reorders a
    little; a policy that shuffles its units (padded) or groups them by length (vsl) keeps the share of
    the epoch only, and strays about twice as far per update."""
    in_order = _update_deviation("bestfit", "data.packing_buffer=1")
    assert in_order.max() <= 2 * MAX_SEQ_LEN / 256  # within two chunks of an update's 256 tokens
    buffered = _update_deviation("bestfit", "data.packing_buffer=4")
    shuffled = _update_deviation("padded")
    assert in_order.mean() < buffered.mean() < shuffled.mean()
    assert buffered.mean() < 0.6 * shuffled.mean()


def test_a_resume_with_another_mixture_or_none_is_refused_in_one_line():
    settings = policy_cfg("bestfit", f"data.max_seq_len={MAX_SEQ_LEN}", "train.batch_size=2")
    split, mixture = mix_splits(_splits(), ("big", "small"), (0.75, 0.25), key={"big": 0.75, "small": 0.25})
    state = build_sampler(settings, split, mixture=mixture).state_dict()
    _, other = mix_splits(_splits(), ("big", "small"), (0.5, 0.5), key={"big": 0.5, "small": 0.5})
    with pytest.raises(
        ConfigError, match=r"mixture: \{'big': 0.75, 'small': 0.25\} -> \{'big': 0.5"
    ) as error:
        build_sampler(settings, split, mixture=other).load_state_dict(state)
    assert "\n" not in str(error.value)
    with pytest.raises(ConfigError, match=r"mixture: \{'big': 0.75, 'small': 0.25\} -> None"):
        build_sampler(settings, split).load_state_dict(state)
    same = build_sampler(settings, split, mixture=mixture)
    same.load_state_dict(state)  # the same mixture resumes
    assert same.epoch == 0 and same.cursor == 0


def test_prepacked_refuses_a_mixture(tmp_path):
    cfg = compose("data=prepacked", "mixture=pydocs_repo")
    with pytest.raises(ConfigError, match="data=prepacked packs one fixed token stream"):
        MixtureSpec.from_config(to_config(cfg)).check_policy("prepacked")


# --- the config -------------------------------------------------------------------------------------


def _mixture_config(tmp_path, components: dict):
    from omegaconf import OmegaConf

    cfg = compose()
    OmegaConf.set_struct(cfg, False)  # as a conf/mixture/<name>.yaml option would add it
    return to_config(OmegaConf.merge(cfg, {"mixture": {"components": components}}))


def _corpus(tmp_path, count: int = 30):
    path = tmp_path / "second.jsonl"
    rows = [
        {"text": f"Document {i} of the second corpus talks about rivers and their stones. " * 5}
        for i in range(count)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_weights_that_do_not_sum_to_one_are_normalised_with_one_line(tmp_path, caplog):
    files = [str(_corpus(tmp_path))]
    config = _mixture_config(
        tmp_path,
        {
            "docs": {"weight": 3, "source": {"kind": "pydocs"}},
            "web": {"weight": 1, "source": {"kind": "local", "files": files}},
        },
    )
    with caplog.at_level(logging.WARNING, logger="pretrain.data.batching.mixture"):
        spec = MixtureSpec.from_config(config)
    assert spec is not None and [c.weight for c in spec.components] == [0.75, 0.25]
    lines = [r.getMessage() for r in caplog.records if r.name == "pretrain.data.batching.mixture"]
    assert lines == ["mixture weights sum to 4, not 1: normalised to docs=0.75, web=0.25"]
    # Each component is its own cache: the pydocs one is the single-source run's cache.
    plain = to_config(compose())
    from pretrain.data.ingest.cache import CacheSpec

    assert spec.components[0].cache.key == CacheSpec.from_config(plain).key
    assert spec.components[1].cache.key != spec.components[0].cache.key


@pytest.mark.parametrize(
    ("component", "message"),
    [
        ({"weight": 0, "source": {"kind": "pydocs"}}, "mixture.components.web.weight must be > 0, got 0"),
        ({"weight": -1, "source": {"kind": "pydocs"}}, "mixture.components.web.weight must be > 0, got -1"),
        (
            {"weight": 1, "max_repeat": 0, "source": {"kind": "pydocs"}},
            "mixture.components.web.max_repeat must be an integer >= 1, got 0",
        ),
    ],
)
def test_a_bad_component_fails_in_one_line_naming_it(tmp_path, component, message):
    with pytest.raises(ConfigError) as error:
        _mixture_config(tmp_path, {"docs": {"weight": 1, "source": {"kind": "pydocs"}}, "web": component})
    assert str(error.value) == message


def test_an_unknown_or_missing_source_names_the_component(tmp_path):
    from pretrain.errors import describe

    with pytest.raises(ConfigError) as unknown:
        _mixture_config(tmp_path, {"web": {"weight": 1, "source": {"kind": "local", "filez": ["a.jsonl"]}}})
    line = describe(unknown.value)  # what the command line prints after `error: `
    assert line == "mixture.components.web.source.filez: no such key; source=local has: kind, files"
    with pytest.raises(
        ConfigError,
        match=(
            r"source\.files: no such key; source=pydocs has: kind; read by source=local, source=chat: "
            "choose"
        ),
    ):
        _mixture_config(tmp_path, {"web": {"weight": 1, "source": {"kind": "pydocs", "files": ["a.jsonl"]}}})
    config = _mixture_config(
        tmp_path, {"web": {"weight": 1, "source": {"kind": "local", "files": [str(tmp_path / "none.jsonl")]}}}
    )
    with pytest.raises(
        SourceError, match=r"^mixture\.components\.web\.source: source\.files: .*none\.jsonl does not exist"
    ):
        MixtureSpec.from_config(config)


def test_no_mixture_is_the_default_and_keeps_the_cache_identity():
    config = to_config(compose())
    assert config.mixture is None and MixtureSpec.from_config(config) is None


# --- inspect-data and a tiny training run -----------------------------------------------------------


TINY = [
    "experiment=smoke",
    "model.n_layer=1",
    "model.d_model=32",
    "model.n_head=2",
    "data.max_seq_len=64",
    "train.batch_size=2",
    "train.val_batches=1",
    "train.max_steps=6",
    "train.val_every_n_steps=3",
    "train.checkpoint_every_n_steps=3",
    "logger=csv",
    "progress_bar=false",
    "budget.train_tokens=40000",
    "budget.validation_tokens=4000",
]


def _mixture_overrides(tmp_path) -> list[str]:
    """The preset (pydocs with this repository's docs) at other weights and repeats."""
    return [
        "mixture=pydocs_repo",
        "mixture.components.pydocs.weight=0.6",
        "mixture.components.repo.weight=0.4",
        "mixture.components.repo.max_repeat=2",
    ]


def test_inspect_data_reports_each_component(tmp_path):
    from pretrain.cli import main

    output = tmp_path / "stats.json"
    assert main(["inspect-data", *TINY, *_mixture_overrides(tmp_path), f"output={output}"]) == 0
    stats = json.loads(output.read_text())
    docs, web = stats["mixture"]["pydocs"], stats["mixture"]["repo"]
    assert docs["weight"] == 0.6 and web["weight"] == 0.4 and web["max_repeat"] == 2
    assert abs(docs["share"] - 0.6) < 64 / (docs["tokens"] + web["tokens"])
    assert web["uses_per_epoch"] <= 2 and docs["uses_per_epoch"] <= 1
    assert docs["uses_per_epoch"] == 1.0 or web["uses_per_epoch"] == 2.0  # one of them limits the epoch
    assert 0 < docs["documents_used_per_epoch"] <= 1 and 0 < web["documents_used_per_epoch"] <= 1
    assert web["tokens"] == round(web["uses_per_epoch"] * web["available_tokens"])
    # The mixed epoch's real tokens are the components' (a packing policy trains every planned chunk).
    assert stats["prediction_pairs"] >= docs["available_tokens"] + web["available_tokens"]
    # A training run's data module reports the same (what goes into the W&B config as data/...).
    from pretrain.data.batching.policies import PolicySettings
    from pretrain.training.datamodule import PretrainDataModule
    from pretrain.training.loggers import flat_statistics

    config = to_config(compose(*TINY, *_mixture_overrides(tmp_path)))
    spec = MixtureSpec.from_config(config)
    settings = PolicySettings.from_config(config.data, config.train, config.seed)
    datamodule = PretrainDataModule(spec.components[0].cache, settings, spec)
    datamodule.setup("fit")
    flat = flat_statistics(datamodule.statistics())
    assert flat["data/mixture/repo/uses_per_epoch"] == web["uses_per_epoch"]
    assert flat["data/mixture/pydocs/tokens"] == docs["tokens"]
    assert flat["data/validation/scored_pairs"] == stats["validation"]["scored_pairs"]
    # Floors: each component's, of its own cache, and over all their validation pairs at the top.
    from pretrain.data.measures.floors import spec_floors

    for component in spec.components:
        own = spec_floors(component.cache, datamodule.caches[component.name])
        assert stats["mixture"][component.name]["floors"] == own
    pairs = docs["floors"]["validation_pairs"] + web["floors"]["validation_pairs"]
    assert stats["floors"]["validation_pairs"] == pairs
    nats = sum(part["floors"]["bigram"]["nats"] * part["floors"]["validation_pairs"] for part in (docs, web))
    assert stats["floors"]["bigram"]["nats"] == pytest.approx(nats / pairs, rel=1e-12)


def test_training_logs_tokens_and_validation_loss_per_component(tmp_path):
    from pretrain.checkpoints.files import load_trainer_checkpoint
    from pretrain.config import load_config
    from pretrain.data.batching.policies import PolicySettings
    from pretrain.data.ingest.prepare import prepare_cache
    from pretrain.model import GPT, GPTConfig
    from pretrain.training.run import train
    from pretrain.training.scoring import score_batches

    out = tmp_path / "run"
    overrides = [*TINY, *_mixture_overrides(tmp_path), f"output_dir={out}"]
    summary = train(load_config(overrides))
    metrics = summary["metrics"]
    docs, web = metrics["train/tokens/pydocs"], metrics["train/tokens/repo"]
    assert docs + web == metrics["train/tokens"] == summary["tokens"]
    assert summary["mixture_tokens"] == {"pydocs": docs, "repo": web}
    # val/loss/<name>: the final model on that component's own validation pairs.
    checkpoint = load_trainer_checkpoint(out / "checkpoints" / "last.ckpt")
    assert checkpoint["pretrain"]["component_tokens"] == {"pydocs": docs, "repo": web}
    model = GPT(GPTConfig(**checkpoint["hyper_parameters"]["model"]), attn="sdpa")
    model.load_state_dict({k.removeprefix("model."): v for k, v in checkpoint["state_dict"].items()})
    config = to_config(load_config(overrides))
    settings = PolicySettings.from_config(config.data, config.train, config.seed)
    spec = MixtureSpec.from_config(config)
    nats, targets = 0.0, 0.0
    for component in spec.components:
        split = prepare_cache(component.cache).split("validation")
        chunks = evaluation_chunks(split, settings.max_seq_len, validation_pairs(settings))
        units = evaluation_units(settings, chunks)
        sums = score_batches(
            model,
            evaluation_batches(settings, split, chunks, units),
            torch.device("cpu"),
            positions=evaluation_positions(settings, split, chunks, units),
        )
        assert metrics[f"val/loss/{component.name}"] == pytest.approx(sums.loss, rel=1e-5)
        nats, targets = nats + float(sums.nats), targets + float(sums.targets)
    assert metrics["val/loss"] == pytest.approx(nats / targets, rel=1e-5)
    # `pretrain eval`: every validation pair of each component, and the overall loss over all of them.
    from pretrain.training.evaluate import evaluate_checkpoint

    result = evaluate_checkpoint(out / "checkpoints" / "last.ckpt")
    parts = result["components"]
    assert set(parts) == {"pydocs", "repo"}
    assert result["targets"] == parts["pydocs"]["targets"] + parts["repo"]["targets"]
    assert result["loss"] == pytest.approx(
        (parts["pydocs"]["nats"] + parts["repo"]["nats"]) / result["targets"]
    )
    # A mixture has no one cache directory: run.json names each component's; compare's plot still works.
    record = json.loads((out / "run.json").read_text())
    assert "cache_dir" not in record and set(record["cache_dirs"]) == {"pydocs", "repo"}
    # Its floors: each component's, pooled over their validation pairs as val/loss pools them.
    from pretrain.data.measures.floors import combined_floors, spec_floors

    def scored(cache):  # the validation documents val/loss scored (train.val_batches: the first ones)
        return scored_documents(cache.split("validation"), validation_pairs(settings))

    parts = {
        c.name: spec_floors(c.cache, cache, scored(cache))
        for c in spec.components
        for cache in (prepare_cache(c.cache),)
    }
    assert record["floors"] == combined_floors(parts) == summary["floors"]
    assert record["floors"]["validation_pairs"] == targets  # exactly the pairs val/loss scored
    assert set(record["floors"]["components"]) == {"pydocs", "repo"}
    from pretrain.report.compare import plot_run

    assert plot_run(out).is_file()
    # train/tokens/<name> is logged with the other train metrics, cumulative per step.
    header, *rows = (out / "metrics.csv").read_text().splitlines()
    columns = header.split(",")
    assert {"train/tokens/pydocs", "train/tokens/repo", "val/loss/pydocs", "val/loss/repo"} <= set(columns)


def test_component_tokens_survive_a_resume_and_another_mixture_is_refused(tmp_path):
    from pretrain.config import load_config
    from pretrain.errors import CheckpointError
    from pretrain.training.run import train

    base = [*TINY, *_mixture_overrides(tmp_path)]
    whole = train(load_config([*base, f"output_dir={tmp_path / 'whole'}"]))
    halfway = tmp_path / "whole" / "checkpoints" / "step000003.ckpt"
    resumed = train(load_config([*base, f"output_dir={tmp_path / 'resumed'}", f"ckpt_path={halfway}"]))
    for name in ("pydocs", "repo"):
        assert resumed["metrics"][f"train/tokens/{name}"] == whole["metrics"][f"train/tokens/{name}"]
        assert resumed["metrics"][f"val/loss/{name}"] == pytest.approx(whole["metrics"][f"val/loss/{name}"])
    other = [
        *base,
        "mixture.components.repo.weight=0.3",
        f"output_dir={tmp_path / 'other'}",
        f"ckpt_path={halfway}",
    ]
    with pytest.raises(
        CheckpointError, match=r"resume with the same mixture \(its components, weights"
    ) as error:
        train(load_config(other))
    assert "\n" not in str(error.value)


def _directories(out: str) -> list[str]:
    """The directories a command printed, one per line (the tables around them left out)."""
    from pathlib import Path

    return [line for line in out.splitlines() if line.startswith("/") and Path(line).is_dir()]


def test_prepare_and_verify_build_and_check_each_components_cache(tmp_path, capsys):
    from pretrain.cli import main

    overrides = [*TINY, *_mixture_overrides(tmp_path)]
    assert main(["prepare", *overrides]) == 0
    built = _directories(capsys.readouterr().out)
    spec = MixtureSpec.from_config(to_config(compose(*overrides)))
    assert built == [str(c.cache.directory) for c in spec.components]
    assert main(["verify", *overrides]) == 0
    verified = _directories(capsys.readouterr().out)
    assert verified == built


def test_two_ranks_count_every_ranks_component_tokens(tmp_path):
    """DDP on 2 CPU ranks (gloo): train/tokens/<name> adds both ranks' tokens, as train/tokens does."""
    import csv
    import os
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "ddp"
    command = [sys.executable, "train.py", *TINY, *_mixture_overrides(tmp_path), "train.max_steps=4"]
    command += ["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "trainer.precision=32-true"]
    command += ["train.log_every_n_steps=1", f"hydra.run.dir={out}"]
    repo = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        command, cwd=repo, env=dict(os.environ), capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out / "metrics.csv", newline="") as handle:
        rows = [row for row in csv.DictReader(handle) if row.get("train/tokens")]
    assert len(rows) == 4
    for row in rows:
        total = float(row["train/tokens"])
        assert float(row["train/tokens/pydocs"]) + float(row["train/tokens/repo"]) == total
    # Two ranks of 2 packs of at most 64 real tokens per update: more than one rank could hold.
    assert float(rows[0]["train/tokens"]) > 2 * 64
    assert float(rows[-1]["val/loss/pydocs"]) > 0 and float(rows[-1]["val/loss/repo"]) > 0
