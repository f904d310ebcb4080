"""data=vsl: the power-of-two decomposition, the curricula, whole updates of one bucket on every rank,
every pair once per epoch (or in the dropped tail), exact resume, the composition audit, and a short
training resumed through a checkpoint."""

from __future__ import annotations

import copy
import itertools
from collections import Counter

import numpy as np
import pytest
from helpers import SHARED_CACHE, TINY_RUN, module_cache_root, policy_cfg
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_composition import BASE, expected_pairs, numbered_split
from test_training import StopAfter, read_batches, read_metrics

from pretrain.config import load_config
from pretrain.data.batching.batch import IGNORE_INDEX
from pretrain.data.batching.chunking import chunk_table
from pretrain.data.batching.policies import Curriculum, decompose
from pretrain.data.batching.policies.curriculum import even_split, grow_p2_odds, proportional_split, schedule
from pretrain.data.batching.samplers import build_sampler
from pretrain.data.measures.audit import composition_audit
from pretrain.data.measures.stats import inspect_split
from pretrain.errors import ConfigError
from pretrain.training.datamodule import UpdateStream
from pretrain.training.run import train

# Documents of 13, 40, 1 and 16 prediction pairs (EOS included in the lengths), at file offsets
# 0, 14, 55 and 57.
HAND = [14, 41, 2, 17]


def vsl(*overrides: str):
    return policy_cfg("vsl", *overrides)


# --- the decomposition ---------------------------------------------------------------------------


def test_chunks_become_power_of_two_pieces_longest_first_bucket_by_bucket():
    split = numbered_split(HAND)
    pieces = decompose(chunk_table(split.offsets, split.lengths, 32))
    table = pieces.table
    # 13 = 8 + 4 + 1 (at 0, 8, 12); 40 = a chunk of 32 + 8; 1; 16. Bucket k holds the pieces of 2^k.
    assert pieces.first.tolist() == [0, 2, 2, 3, 5, 6, 7]
    assert table.length.tolist() == [1, 1, 4, 8, 8, 16, 32]
    assert table.start.tolist() == [12, 55, 8, 0, 46, 57, 14]
    assert table.doc.tolist() == [0, 2, 0, 0, 1, 3, 1]
    assert table.total_pairs == 13 + 40 + 1 + 16
    with pytest.raises(ValueError, match="power-of-two max_seq_len, got 24"):
        decompose(chunk_table(split.offsets, split.lengths, 24))


def test_truncate_decomposes_each_documents_first_chunk_only():
    split = numbered_split(HAND)
    table = chunk_table(split.offsets, split.lengths, 32)
    cfg = vsl("data.max_seq_len=32", "data.long_docs=truncate")
    pieces = cfg.data_policy.pieces(table)
    assert sorted(pieces.table.length.tolist()) == [1, 1, 4, 8, 16, 32]  # doc 1's tail of 8 is gone


# --- the curricula -------------------------------------------------------------------------------


def test_splits_add_up():
    assert even_split(10, 4).tolist() == [3, 3, 2, 2]
    assert even_split(2, 4).tolist() == [1, 1, 0, 0]
    assert proportional_split(15, np.array([4.0, 8, 2, 1])).tolist() == [4, 8, 2, 1]
    assert proportional_split(7, np.array([1.0, 1, 1])).tolist() == [2, 3, 2]


def test_grow_p2_odds_are_olmo_cores():
    """OLMo-core's VSLGrowP2Curriculum odds for 4 buckets, worked out by hand: the shortest bucket's
    halve sub-cycle after sub-cycle, the longest's double, the middle ones peak then fall."""
    assert [grow_p2_odds(b, 4).tolist() for b in range(4)] == [
        [8, 4, 2, 1],
        [4, 8, 2, 1],
        [2, 4, 8, 1],
        [1, 2, 4, 8],
    ]


@pytest.mark.parametrize("curriculum", list(Curriculum))
def test_every_curriculum_draws_each_bucket_exactly_its_updates(curriculum):
    blocks = np.array([0, 5, 9, 1, 30, 2])
    first = schedule(curriculum, blocks, np.random.default_rng(1), cycles=3)
    assert np.bincount(first, minlength=len(blocks)).tolist() == blocks.tolist()
    assert schedule(curriculum, blocks, np.random.default_rng(1), cycles=3).tolist() == first.tolist()
    assert schedule(curriculum, blocks, np.random.default_rng(2), cycles=3).tolist() != first.tolist()


def test_grow_p2_one_cycle_goes_from_short_to_long():
    """Four buckets of 15 updates, one cycle: sub-cycle s takes round(15 x odds / 15) of each."""
    order = schedule(Curriculum.grow_p2, np.full(4, 15), np.random.default_rng(0), cycles=1).tolist()
    sizes = [8 + 4 + 2 + 1, 4 + 8 + 4 + 2, 2 + 2 + 8 + 4, 1 + 1 + 1 + 8]
    bounds = np.cumsum([0, *sizes])
    subcycles = [Counter(order[a:b]) for a, b in itertools.pairwise(bounds)]
    assert subcycles == [
        Counter({0: 8, 1: 4, 2: 2, 3: 1}),
        Counter({0: 4, 1: 8, 2: 4, 3: 2}),
        Counter({0: 2, 1: 2, 2: 8, 3: 4}),
        Counter({0: 1, 1: 1, 2: 1, 3: 8}),
    ]


def test_grow_p2_spreads_each_bucket_over_the_cycles():
    order = np.array(schedule(Curriculum.grow_p2, np.array([4, 6]), np.random.default_rng(0), cycles=2))
    # bucket 0: 2 + 2 updates, bucket 1: 3 + 3: each cycle holds half of every bucket
    assert Counter(order[:5].tolist()) == Counter({0: 2, 1: 3})
    assert Counter(order[5:].tolist()) == Counter({0: 2, 1: 3})


def test_uniform_takes_every_bucket_once_per_round_until_it_is_empty():
    order = schedule(Curriculum.uniform, np.array([3, 0, 1, 2]), np.random.default_rng(5), cycles=1).tolist()
    assert sorted(order[:3]) == [0, 2, 3] and sorted(order[3:5]) == [0, 3] and order[5:] == [0]


# --- the sampler: whole updates of one bucket, every pair once --------------------------------------


def served_updates(cfg, split, world: int) -> list[list]:
    """Per rank, the epoch-0 batches of that rank (a list per rank)."""
    return [list(build_sampler(cfg, split, rank=r, world_size=world)) for r in range(world)]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(
    lengths=st.lists(st.integers(2, 90), min_size=20, max_size=60),
    capacity=st.sampled_from([2, 4, 8, 16]),
    batch_size=st.integers(1, 2),
    accumulation=st.integers(1, 2),
    world=st.integers(1, 2),
    curriculum=st.sampled_from(list(Curriculum)),
    truncate=st.booleans(),
)
def test_every_pair_once_per_epoch_and_updates_of_one_length_on_every_rank(
    lengths, capacity, batch_size, accumulation, world, curriculum, truncate
):
    cfg = vsl(
        f"data.max_seq_len={capacity}",
        f"train.batch_size={batch_size}",
        f"train.accumulation={accumulation}",
        f"data.curriculum={curriculum}",
        "data.curriculum_cycles=2",
        f"data.long_docs={'truncate' if truncate else 'chunk'}",
    )
    split = numbered_split(lengths)
    try:
        ranks = served_updates(cfg, split, world)
    except ConfigError:  # too little data for one whole update on every rank
        assume(False)
    tokens = batch_size * capacity
    steps = len(ranks[0])
    assert steps % accumulation == 0 and all(len(batches) == steps for batches in ranks)
    served: Counter = Counter()
    for step in range(0, steps, accumulation):
        update = [b for batches in ranks for b in batches[step : step + accumulation]]
        lengths_of_update = {int(length) for b in update for length in np.diff(b.cu_seqlens.numpy())}
        assert len(lengths_of_update) == 1  # one bucket: every rank, every microbatch, every piece
        (piece,) = lengths_of_update
        for b in update:
            assert b.num_tokens == b.num_targets == tokens and len(b.cu_seqlens) == tokens // piece + 1
            assert b.position_ids.tolist() == list(range(piece)) * (tokens // piece)
            real = b.targets.numpy() != IGNORE_INDEX
            served.update(
                zip(
                    (b.input_ids.numpy()[real] - BASE).tolist(), b.targets.numpy()[real].tolist(), strict=True
                )
            )
    assert max(served.values(), default=1) == 1
    # The tail no rank receives (partial units, units that make no whole update) holds the rest.
    sampler = build_sampler(cfg, split, rank=0, world_size=world)
    dropped = sampler.epoch_accounting(0)
    table = sampler.plan(0).layout.table
    tokens_file = np.asarray(split.tokens, dtype=np.int64)
    for piece in dropped["dropped_items"].tolist():
        start, length = int(table.start[piece]), int(table.length[piece])
        served.update((p, int(tokens_file[p + 1])) for p in range(start, start + length))
    assert served == expected_pairs(split, capacity, truncate)
    assert dropped["dropped_tokens"] + steps * world * tokens == sum(
        expected_pairs(split, capacity, truncate).values()
    )


def signature(batch) -> tuple:
    return (
        batch.input_ids.numpy().tobytes(),
        batch.targets.numpy().tobytes(),
        batch.cu_seqlens.numpy().tobytes(),
        tuple(batch.meta["chunks"].tolist()),
    )


def updates(stream, count: int) -> list:
    out = []
    for update in itertools.islice(iter(stream), count):
        out.append(([signature(mb) for mb in update.microbatches], update.sampler_state))
    return out


@pytest.mark.parametrize("curriculum", list(Curriculum))
def test_a_resumed_stream_continues_with_exactly_the_next_update(curriculum):
    """Through the sampler state each update carries (what a checkpoint saves), across epoch ends."""
    cfg = vsl(
        "data.max_seq_len=8", "train.batch_size=2", "train.accumulation=2", f"data.curriculum={curriculum}"
    )
    split = numbered_split(np.random.default_rng(7).integers(2, 60, size=80).tolist())

    def stream() -> UpdateStream:
        return UpdateStream(build_sampler(cfg, split, rank=1, world_size=2), cfg.accumulation)

    per_epoch = len(build_sampler(cfg, split, rank=1, world_size=2)) // 2
    total = 2 * per_epoch + 3  # into a third epoch
    reference = updates(stream(), total)
    for cut in (1, per_epoch - 1, per_epoch, per_epoch + 2):
        resumed = stream()
        resumed.sampler.load_state_dict(copy.deepcopy(reference[cut - 1][1]))
        assert [u for u, _ in updates(resumed, total - cut)] == [u for u, _ in reference[cut:]]
    # Each update is of one piece length, and the epochs differ (pieces are grouped anew).
    assert all(len({mb[2] for mb in u}) == 1 for u, _ in reference)
    assert [u for u, _ in reference[:per_epoch]] != [u for u, _ in reference[per_epoch : 2 * per_epoch]]


@pytest.mark.parametrize(
    ("saved", "resumed", "message"),
    [
        ((2, ()), (3, ()), r"updates of 2 units, and this run's \(3: .* world size 3\) does not divide it"),
        (
            (1, ()),
            (1, ("train.accumulation=2",)),
            r"updates of 1 units, and this run's \(2: .*accumulation=2",
        ),
        ((1, ()), (1, ("data.curriculum=uniform",)), r"data\.curriculum: 'natural' -> 'uniform'"),
    ],
)
def test_a_state_of_other_updates_is_refused(saved, resumed, message):
    """Mid-epoch, an update size that does not divide the planned one would mix buckets in an update."""
    split = numbered_split(np.random.default_rng(3).integers(2, 60, size=80).tolist())
    base = ("data.max_seq_len=8", "train.batch_size=1")
    sampler = build_sampler(vsl(*base, *saved[1]), split, world_size=saved[0])
    next(iter(sampler))
    state = sampler.state_dict()
    with pytest.raises(ConfigError, match=message):
        build_sampler(vsl(*base, *resumed[1]), split, world_size=resumed[0]).load_state_dict(state)


def test_any_update_size_resumes_at_an_epoch_start():
    """Nothing of the epoch is consumed yet: it is planned for the new update size."""
    split = numbered_split(np.random.default_rng(3).integers(2, 60, size=80).tolist())
    base = ("data.max_seq_len=8", "train.batch_size=1")
    state = build_sampler(vsl(*base), split, world_size=2).state_dict()
    resumed = build_sampler(vsl(*base), split, world_size=3)
    resumed.load_state_dict(state)
    fresh = build_sampler(vsl(*base), split, world_size=3)
    assert [b.meta["chunks"].tolist() for b in resumed] == [b.meta["chunks"].tolist() for b in fresh]


# --- the composition audit and inspect-data ---------------------------------------------------------


def test_the_composition_audit_worked_out_by_hand():
    """Pieces 1, 1, 4, 8, 8, 16, 32 (70 pairs) in 5 units: bucket 1's two pieces, 4's one, 8's two,
    16's one, 32's one; documents 0 (1 + 4 + 8) and 1 (32 + 8) lie in several units."""
    split = numbered_split(HAND)
    audit = composition_audit(vsl("data.max_seq_len=32", "train.batch_size=1"), split)
    assert audit == {
        "truncated_documents": 0.0,
        "dropped_pairs": 0.0,
        "fragmented_documents": 2 / 4,
        "units_vs_concat": 5 / 3,  # 73 inputs make 3 windows of 32
        "attention_cost": (1 + 1 + 16 + 64 + 64 + 256 + 1024) / 70,
        "attention_cost_padded": 5 * 32**2 / 70,
        "cross_document_visible_fraction": 0.0,
        "positions": "restart",  # each piece its own sequence from 0
    }
    truncated = composition_audit(
        vsl("data.max_seq_len=32", "train.batch_size=1", "data.long_docs=truncate"), split
    )
    assert truncated["truncated_documents"] == 1 / 4 and truncated["dropped_pairs"] == 8 / 70
    assert truncated["fragmented_documents"] == 1 / 4  # document 1 is now one piece


def test_inspect_data_counts_whole_updates():
    """Every served update holds batch_size x max_seq_len x accumulation tokens, exactly."""
    rng = np.random.default_rng(11)
    train, validation = (numbered_split(rng.integers(2, 70, size=n).tolist()) for n in (200, 20))
    cfg = vsl("data.max_seq_len=16", "train.batch_size=2", "train.accumulation=2", "data.curriculum=grow_p2")
    stats = inspect_split(cfg, train, validation, audits=False)
    assert stats["policy"] == "vsl" and stats["tokens_per_step"] == 2 * 16 * 2
    assert stats["padding_waste"] == 0.0 and stats["cross_document_visible_fraction"] == 0.0
    assert stats["chunk_lengths"]["max"] == 16 and stats["chunk_lengths"]["min"] == 1
    assert stats["settings"]["curriculum"] == "grow_p2" and stats["settings"]["curriculum_cycles"] == 8
    assert stats["validation"]["scored_pairs"] > 0 and stats["validation"]["batches"] >= 1


# --- a short training, resumed through a checkpoint --------------------------------------------------

cache_root = module_cache_root(SHARED_CACHE)  # one cache for the training test of this module


def test_training_resumes_through_a_checkpoint_with_the_same_updates_and_losses(tmp_path, cache_root):
    """data=vsl trains end to end (every update of one length, the same tokens each), and a run stopped
    at a checkpoint and resumed serves bitwise the updates and losses of the uninterrupted one."""
    common = [
        *TINY_RUN,
        "data=vsl",
        "data.curriculum=grow_p2",
        "data.curriculum_cycles=2",
        "train.accumulation=2",
        "train.max_steps=6",
        "train.warmup_steps=1",
        "train.val_every_n_steps=3",
        "train.checkpoint_every_n_steps=3",
        "train.deterministic=true",
        "record_batches=true",
        "progress_bar=false",
    ]

    def compose(out, *extra):
        return load_config([f"output_dir={out}", *common, *extra])

    full, first, second = tmp_path / "full", tmp_path / "first", tmp_path / "second"
    train(compose(full))
    train(compose(first), callbacks=[StopAfter(3)])
    train(compose(second, f"ckpt_path={first / 'checkpoints' / 'last.ckpt'}"))

    want = read_batches(full)
    got = read_batches(first)[:3] + read_batches(second)
    assert [b["step"] for b in got] == list(range(6))
    assert [b["digest"] for b in got] == [b["digest"] for b in want]
    full_metrics, resumed = read_metrics(full), read_metrics(first)
    for key, values in read_metrics(second).items():
        resumed.setdefault(key, {}).update(values)
    assert resumed["train/loss"] == full_metrics["train/loss"]
    assert resumed["val/loss"] == full_metrics["val/loss"]
    # Every update holds batch_size x max_seq_len x accumulation real tokens, whatever its length.
    tokens = sorted(full_metrics["train/tokens"].items())
    assert np.diff([0.0, *(v for _, v in tokens)]).tolist() == [2 * 32 * 2.0] * len(tokens)
