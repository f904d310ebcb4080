"""Sampler interface: exact resume (chains of save/load), ranks, validation, sizing and errors."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import POLICIES, POLICY_VARIANTS, one_variant_per_policy, policy_cfg, settings_of

from pretrain.data.batching.evaluation import (
    evaluation_batch_count,
    evaluation_batches,
    evaluation_chunks,
    validation_pairs,
)
from pretrain.data.batching.samplers import build_sampler
from pretrain.data.tokens import TokenSplit

ROOT = Path(__file__).resolve().parents[1]

CASES = POLICY_VARIANTS  # every policy's test variants (the composition axes on the policies they change)


make_cfg = policy_cfg


def case_cfg(case: str, *extra: str):
    policy, *overrides = CASES[case]
    base = (
        "data.max_seq_len=16",
        "train.batch_size=2",
        "train.eval_microbatch_tokens=40",
        "train.val_batches=5",
    )
    return make_cfg(policy, *base, *overrides, *extra)


def random_split(seed: int, documents: int = 50, high: int = 60, name: str = "train") -> TokenSplit:
    rng = np.random.default_rng(seed)
    return TokenSplit.from_lengths(rng.integers(2, high, size=documents), seed=seed, name=name)


def signature(batch) -> tuple:
    return (
        batch.meta["epoch"],
        batch.meta["index"],
        tuple(np.asarray(batch.meta["chunks"]).tolist()),
        batch.input_ids.numpy().tobytes(),
        batch.targets.numpy().tobytes(),
        batch.position_ids.numpy().tobytes(),
        batch.cu_seqlens.numpy().tobytes(),
        batch.pack_lengths.numpy().tobytes(),
        batch.num_targets,
    )


def roundtrip(state: dict, how: str) -> dict:
    if how == "json":
        return json.loads(json.dumps(state))
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def take(sampler, count: int, out: list) -> None:
    """`count` batches, crossing epoch ends (a new iterator per epoch, as a training loop does)."""
    while count > 0:
        got = 0
        for batch in sampler:
            out.append(signature(batch))
            got += 1
            count -= 1
            if count == 0:
                return  # abandon the iterator mid-epoch
        assert got > 0, "an epoch yielded nothing"


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("world", [(1, 0), (2, 1)], ids=["single", "rank1of2"])
def test_resume_chains_match_uninterrupted(case, world, tmp_path):
    world_size, rank = world
    split = random_split(4)
    cfg = case_cfg(case)

    def make():
        return build_sampler(cfg, split, rank=rank, world_size=world_size, packs_dir=tmp_path)

    reference_sampler = make()
    reference: list = []
    per_epoch = []
    for _ in range(3):
        per_epoch.append(len(reference_sampler))
        before = len(reference)
        reference.extend(signature(b) for b in reference_sampler)
        assert len(reference) - before == per_epoch[-1]
    total = len(reference)
    rng = random.Random(f"{case}-{world}")
    for trial in range(4):
        out: list = []
        state = None
        while len(out) < total:
            sampler = make()
            if state is not None:
                sampler.load_state_dict(roundtrip(state, rng.choice(["json", "torch"])))
                if rng.random() < 0.3:  # save -> load -> save with nothing in between
                    again = make()
                    again.load_state_dict(roundtrip(sampler.state_dict(), "json"))
                    sampler = again
            take(sampler, min(rng.choice([0, 1, 2, 3, 5, per_epoch[0] + 1]), total - len(out)), out)
            state = sampler.state_dict()
        assert out == reference, f"trial {trial}: the resumed sequence differs"


@pytest.mark.parametrize("case", list(CASES))
def test_state_is_small_and_moves_to_next_epoch(case, tmp_path):
    split = random_split(5)
    sampler = build_sampler(case_cfg(case), split, packs_dir=tmp_path)
    assert (sampler.state_dict()["epoch"], sampler.state_dict()["units"]) == (0, 0)
    iterator = iter(sampler)
    next(iterator)
    state = sampler.state_dict()
    assert (state["epoch"], state["units"]) == (0, 2)  # one batch of train.batch_size=2 units
    assert len(json.dumps(state)) < 1000
    json.dumps(state)  # plain JSON types only
    count = len(sampler)
    rest = list(iterator)
    assert len(rest) == count - 1
    state = sampler.state_dict()
    assert (state["epoch"], state["units"]) == (1, 0)  # the epoch end moves to the next epoch


@pytest.mark.parametrize("case", list(CASES))
def test_load_state_stops_a_live_iterator(case, tmp_path):
    split = random_split(6)
    cfg = case_cfg(case)
    sampler = build_sampler(cfg, split, packs_dir=tmp_path)
    iterator = iter(sampler)
    next(iterator)
    saved = sampler.state_dict()
    expected = [signature(b) for b in build_sampler(cfg, split, packs_dir=tmp_path)][1:]
    next(iterator)
    sampler.load_state_dict(saved)
    assert list(iterator) == []  # the old iterator does not keep going from a stale position
    assert [signature(b) for b in sampler] == expected


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_are_disjoint_with_equal_counts(case, world_size, tmp_path):
    split = random_split(7, documents=70)
    cfg = case_cfg(case)
    samplers = [
        build_sampler(cfg, split, rank=r, world_size=world_size, packs_dir=tmp_path)
        for r in range(world_size)
    ]
    orders = []
    for epoch in range(3):
        count = len(samplers[0])
        assert count > 0 and all(len(s) == count for s in samplers)
        seen: list[int] = []
        for sampler in samplers:
            batches = list(sampler)
            assert len(batches) == count
            assert all(b.meta["epoch"] == epoch and b.meta["rank"] == sampler.rank for b in batches)
            seen.extend(c for b in batches for c in np.asarray(b.meta["chunks"]).tolist())
        assert len(seen) == len(set(seen))
        orders.append(seen)
    assert orders[0] != orders[1]  # a new shuffle every epoch


def test_rank_zero_state_resumes_every_rank(tmp_path):
    """Lightning saves rank 0's state; every rank loads it and continues with its own batches."""
    split = random_split(8, documents=80)
    cfg = case_cfg("bestfit")
    ranks = [build_sampler(cfg, split, rank=r, world_size=2) for r in range(2)]
    expected = {r: [signature(b) for b in build_sampler(cfg, split, rank=r, world_size=2)] for r in range(2)}
    take(ranks[0], 3, [])
    state = ranks[0].state_dict()
    for r in range(2):
        resumed = build_sampler(cfg, split, rank=r, world_size=2)
        resumed.load_state_dict(roundtrip(state, "json"))
        assert [signature(b) for b in resumed] == expected[r][3:]


def test_deterministic_and_seeded(tmp_path):
    split = random_split(10)
    first = [signature(b) for b in build_sampler(case_cfg("bestfit"), split)]
    again = [signature(b) for b in build_sampler(case_cfg("bestfit"), split)]
    other = [signature(b) for b in build_sampler(case_cfg("bestfit", "seed=99"), split)]
    assert first == again
    assert first != other


def evaluation_signature(batch) -> tuple:
    """The pairs a batch scores, as (input, target) per counted position, in batch order."""
    counted = batch.targets != -100
    return tuple(zip(batch.input_ids[counted].tolist(), batch.targets[counted].tolist(), strict=True))


@pytest.mark.parametrize("case", list(CASES))
def test_validation_is_fixed_sized_repeatable_and_unseeded(case):
    split = random_split(11, documents=60, name="validation")
    settings = case_cfg(case)
    table = evaluation_chunks(split, 16, validation_pairs(settings))  # 5 x 40 pairs of whole documents
    passes = [[evaluation_signature(b) for b in evaluation_batches(settings, split, table)] for _ in range(3)]
    assert passes[0] == passes[1] == passes[2]
    assert len(passes[0]) == evaluation_batch_count(settings, table)
    reseeded = case_cfg(case, "seed=7")
    assert [evaluation_signature(b) for b in evaluation_batches(reseeded, split, table)] == passes[
        0
    ]  # no shuffle
    per_batch = max(1, 40 // 16)  # train.eval_microbatch_tokens // max_seq_len
    batches = list(evaluation_batches(settings, split, table))
    assert all(len(b.pack_lengths) == per_batch for b in batches[:-1])
    assert sum(b.num_targets for b in batches) == table.total_pairs <= 5 * 40


def test_validation_smaller_than_val_batches():
    split = random_split(12, documents=5, high=8, name="validation")
    settings = case_cfg("padded-max", "train.val_batches=100")
    table = evaluation_chunks(split, 16, validation_pairs(settings))
    assert len(table) == 5 and evaluation_batch_count(settings, table) == 3  # 5 rows, 2 per batch
    assert sum(len(b.pack_lengths) for b in evaluation_batches(settings, split, table)) == 5
    unlimited = case_cfg("padded-max", "train.val_batches=null")
    assert evaluation_batch_count(unlimited, evaluation_chunks(split, 16, validation_pairs(unlimited))) == 3


def test_microbatch_tokens_sizing():
    split = random_split(13)
    cfg = make_cfg("bestfit", "data.max_seq_len=16", "train.batch_size=null", "train.microbatch_tokens=100")
    batches = list(build_sampler(cfg, split))
    assert all(len(b.pack_lengths) == 100 // 16 for b in batches[:-1])
    tiny = make_cfg("bestfit", "data.max_seq_len=16", "train.batch_size=null", "train.microbatch_tokens=5")
    assert all(len(b.pack_lengths) == 1 for b in build_sampler(tiny, split))


def test_batch_size_errors():
    split = random_split(14)
    with pytest.raises(ValueError) as info:  # refused when the settings are built, before any sampler
        build_sampler(make_cfg("bestfit", "train.batch_size=4", "train.microbatch_tokens=4096"), split)
    assert str(info.value) == (
        "set only one of train.batch_size and train.microbatch_tokens (e.g. train.batch_size=null)"
    )
    with pytest.raises(ValueError, match="train.batch_size"):
        build_sampler(make_cfg("bestfit", "train.batch_size=null", "train.microbatch_tokens=null"), split)
    with pytest.raises(ValueError, match="train.batch_size must be a positive integer"):
        build_sampler(make_cfg("bestfit", "train.batch_size=0"), split)


def test_config_errors():
    split = random_split(15)
    with pytest.raises(ValueError, match=", ".join(POLICIES)):
        build_sampler(make_cfg("bestfit", "data.policy=greedy"), split)
    for bad in (1, 4097):
        with pytest.raises(ValueError, match=r"data\.max_seq_len must be an integer in 2\.\.4096"):
            build_sampler(make_cfg("bestfit", f"data.max_seq_len={bad}"), split)
    with pytest.raises(ValueError, match="max, longest"):
        build_sampler(make_cfg("padded", "data.pad_to=min"), split)
    with pytest.raises(ValueError, match="concat, bfd"):
        build_sampler(make_cfg("prepacked", "data.strategy=ffd"), split)
    with pytest.raises(ValueError, match=r"data\.packing_buffer must be a positive integer, got 0"):
        build_sampler(make_cfg("bestfit", "data.packing_buffer=0"), split)
    with pytest.raises(ValueError, match=r"train\.packing_buffer moved .* set data\.packing_buffer=8"):
        make_cfg("bestfit", "train.packing_buffer=8")  # the key moved to the data group
    with pytest.raises(ValueError, match="rank"):
        build_sampler(make_cfg("bestfit"), split, rank=2, world_size=2)


def test_too_small_train_split_is_a_clear_error():
    split = random_split(16, documents=3, high=6)
    cfg = make_cfg("padded", "train.batch_size=2")
    with pytest.raises(ValueError, match="fewer than world_size=4"):
        build_sampler(cfg, split, rank=0, world_size=4)


def test_mismatched_state_is_refused(tmp_path):
    split = random_split(17)
    sampler = build_sampler(case_cfg("bestfit"), split)
    take(sampler, 2, [])
    state = sampler.state_dict()
    other = build_sampler(case_cfg("bestfit", "seed=7"), split)
    with pytest.raises(ValueError, match=r"\(seed: 1234 -> 7\), which plan another data order"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="policy"):
        build_sampler(case_cfg("bfd"), split, packs_dir=tmp_path).load_state_dict(state)
    with pytest.raises(ValueError, match="split_fingerprint"):
        build_sampler(case_cfg("bestfit"), random_split(18)).load_state_dict(state)


def test_data_configs():
    from pretrain.config import load_config

    for policy in POLICIES:
        data = load_config([f"data={policy}"]).data
        assert data.policy == policy and data.max_seq_len == 512
    assert load_config(["data=padded"]).data.pad_to == "max"
    prepacked = load_config(["data=prepacked"]).data
    assert prepacked.strategy == "concat" and prepacked.document_mask is True
    vsl = load_config(["data=vsl"]).data
    assert vsl.curriculum == "natural" and vsl.curriculum_cycles == 8


@pytest.mark.parametrize("policy", POLICIES)
def test_composed_config_builds_samplers(policy, tmp_path):
    from pretrain.config import load_config

    cfg = settings_of(load_config([f"data={policy}", "data.max_seq_len=32"]))
    split = random_split(19, documents=120, high=200)
    train = build_sampler(cfg, split, packs_dir=tmp_path)
    assert len(train) > 0 and len(list(evaluation_batches(cfg, split))) > 0
    assert next(iter(train)).num_tokens > 0


@pytest.mark.parametrize("case", list(CASES))
def test_empty_validation_split_gives_no_batches(case, tmp_path):
    empty = TokenSplit.from_lengths([], name="validation")
    assert list(evaluation_batches(case_cfg(case), empty)) == []
    assert evaluation_batch_count(case_cfg(case), evaluation_chunks(empty, 16)) == 0
    with pytest.raises(ValueError, match="no documents"):
        build_sampler(case_cfg(case), TokenSplit.from_lengths([]), packs_dir=tmp_path)


@pytest.mark.parametrize("case", one_variant_per_policy())
def test_epoch_plans_are_flat_arrays_of_a_few_bytes_per_chunk(case, tmp_path):
    """No Python object per document or chunk: a plan is index arrays into the sampler's chunk
    table, and planning an epoch allocates a few numpy bytes per chunk (tracemalloc sees every numpy
    array; a list or tuple per chunk would cost >= 36 bytes each)."""
    import tracemalloc

    from synthetic import fineweb_like_lengths

    lengths = fineweb_like_lengths(150_000, seed=3)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    split = TokenSplit(tokens=np.zeros(1, dtype=np.uint16), offsets=offsets, lengths=lengths)  # never read
    cfg = case_cfg(case, "data.max_seq_len=1024", "train.batch_size=8")
    sampler = build_sampler(cfg, split, packs_dir=tmp_path)
    chunks = len(sampler.table)
    assert chunks > 150_000
    tracemalloc.start()
    try:
        plan = sampler.plan(1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    arrays = [plan.layout.ptr] + ([] if plan.layout.rows is None else [plan.layout.rows])
    arrays += [] if plan.order is None else [plan.order]
    assert all(isinstance(a, np.ndarray) and a.dtype.kind == "i" for a in arrays)
    # Per item of the epoch: a layout whose items are pieces it cut (concat windows, vsl's pieces) holds
    # their table, three int64 per piece; the rest is at most an int64 id, an int64 unit pointer and an
    # int32 order entry per item (a padded row holds one item).
    items, table = plan.layout.num_items, plan.layout.table
    pieces = 0 if table is sampler.table else table.doc.nbytes + table.start.nbytes + table.length.nbytes
    assert pieces / items <= 24
    assert (plan.nbytes - (pieces if plan.layout.rows is None else 0)) / items <= 20
    assert peak / items <= 24


@pytest.mark.parametrize("seed", [0, 7])
def test_concat_with_and_without_the_mask_serves_one_seed_the_same_windows_in_the_same_order(seed, tmp_path):
    """What makes experiment=masking_paired a paired design: the mask changes the attention segments
    (cu_seqlens), positions and the cross-document targets (an EOS predicting the next document's
    first token: trained without the mask, not with it), never which tokens a seed's updates carry,
    nor their order."""
    split = random_split(12)
    masked = list(build_sampler(case_cfg("concat-masked", f"seed={seed}"), split, packs_dir=tmp_path / "a"))
    open_ = list(build_sampler(case_cfg("concat-open", f"seed={seed}"), split, packs_dir=tmp_path / "b"))
    assert len(masked) == len(open_) > 3
    for a, b in zip(masked, open_, strict=True):
        assert torch.equal(a.input_ids, b.input_ids)
        kept = a.targets != -100
        assert torch.equal(a.targets[kept], b.targets[kept])
        dropped = ~kept & (b.targets != -100)  # the pairs only the open arm trains: after an EOS
        assert bool((a.input_ids[dropped] == 50256).all())
    # the mask is what differs: more segments (one per document piece) than one per window
    assert sum(len(a.cu_seqlens) for a in masked) > sum(len(b.cu_seqlens) for b in open_)
