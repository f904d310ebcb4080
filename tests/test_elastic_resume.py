"""Elastic resume at sampler level: a state saved on W1 ranks with train.batch_size B1 and resumed on
W2 ranks with B2 continues the epoch's global order at the saved unit position, for every policy
case of test_samplers: nothing twice, nothing skipped but the documented tail (`epoch_accounting`),
and the next epoch is the one a fresh W2 run plans. vsl continues exactly when the new update size
divides the planned one and is refused in one line otherwise. (The gloo-rank version: test_elastic_ddp.)"""

from __future__ import annotations

import copy
import json

import pytest
from helpers import one_variant_per_policy, policies_where
from hypothesis import given, settings
from hypothesis import strategies as st
from test_samplers import CASES, case_cfg, random_split

from pretrain.data.batching.samplers import STATE_VERSION, build_sampler, check_resume
from pretrain.errors import ConfigError

# (world size, train.batch_size) before and after the resume.
SIZE_CHANGES = {
    "2x2-to-1x2": ((2, 2), (1, 2)),
    "2x2-to-3x2": ((2, 2), (3, 2)),
    "2x2-to-3x3": ((2, 2), (3, 3)),
    "1x3-to-2x1": ((1, 3), (2, 1)),
    "3x2-to-1x3": ((3, 2), (1, 3)),
}
ROUNDS = 2  # batches per rank before the save: a whole update of every case (accumulation <= 2)


def ranks(case: str, world: int, batch_size: int, packs_dir) -> list:
    cfg = case_cfg(case, f"train.batch_size={batch_size}")
    return [build_sampler(cfg, SPLIT, rank=r, world_size=world, packs_dir=packs_dir) for r in range(world)]


SPLIT = random_split(21, documents=90)


def serve(samplers: list, batches: int | None = None) -> dict[int, list[int]]:
    """Position in the epoch's order -> the batch's units, of every rank's next `batches` batches of
    its current epoch (None: the rest of the epoch)."""
    served: dict[int, list[int]] = {}
    for sampler in samplers:
        epoch = sampler.epoch
        for count, batch in enumerate(sampler, start=1):
            assert batch.meta["epoch"] == epoch and batch.meta["rank"] == sampler.rank
            served[batch.meta["position"]] = batch.meta["packs"].tolist()
            if count == batches:
                break
    return served


def in_order(served: dict[int, list[int]]) -> list[int]:
    """The units of `served` by position; each batch starts where the one before it ended."""
    positions = sorted(served)
    units: list[int] = []
    for position in positions:
        assert position == positions[0] + len(units), "a global batch is missing"
        units += served[position]
    return units


def saved_and_resumed(case: str, before, after, tmp_path, rounds: int = ROUNDS):
    """(units served before the save, the state, the resumed ranks, the epoch's order)."""
    old = ranks(case, *before, tmp_path)
    first = in_order(serve(old, rounds))
    state = json.loads(json.dumps(old[0].state_dict()))  # Lightning saves rank 0's; JSON types only
    new = ranks(case, *after, tmp_path)
    for sampler in new:
        sampler.load_state_dict(copy.deepcopy(state))
    return first, state, new, old[0].plan(0).ordered().tolist()


def refused_update_size(case: str, before, after) -> bool:
    """vsl, mid-epoch: an update size that does not divide the planned one is refused."""
    cfg = case_cfg(case)
    if not cfg.data_policy.whole_updates:
        return False
    return (before[0] * before[1]) % (after[0] * after[1]) != 0  # the accumulation is the same


@pytest.mark.parametrize("change", list(SIZE_CHANGES))
@pytest.mark.parametrize("case", list(CASES))
def test_a_resume_on_other_sizes_continues_the_global_order(case, change, tmp_path):
    before, after = SIZE_CHANGES[change]
    if refused_update_size(case, before, after):
        with pytest.raises(ConfigError, match="does not divide it") as info:
            saved_and_resumed(case, before, after, tmp_path)
        assert "\n" not in str(info.value)
        return
    first, state, resumed, order = saved_and_resumed(case, before, after, tmp_path)
    position = ROUNDS * before[0] * before[1]
    assert state["version"] == STATE_VERSION and (state["epoch"], state["units"]) == (0, position)
    assert first == order[:position]  # the saved run served the order's head, batch for batch
    tail = resumed[0].epoch_accounting()["dropped_units"].tolist()  # of the resumed epoch, as cut now
    rest = in_order(serve(resumed))
    assert rest == order[position : position + len(rest)]  # ... and the resumed one its continuation
    # Only the tail is missing: what does not fill a whole round of the new world size.
    assert sorted(order[position + len(rest) :] + resumed[0].plan(0).unordered().tolist()) == sorted(tail)
    assert len(order) - position - len(rest) < after[0] * after[1]
    # Every rank moved to the next epoch, which is what a fresh run on the new sizes plans.
    assert all((s.epoch, s.state_dict()["units"]) == (1, 0) for s in resumed)
    fresh = ranks(case, *after, tmp_path)
    for sampler in fresh:
        sampler.load_state_dict({**fresh[0].state_dict(), "epoch": 1})
    assert serve(resumed) == serve(fresh)


@pytest.mark.parametrize("case", one_variant_per_policy())
def test_an_unchanged_resume_is_the_uninterrupted_run(case, tmp_path):
    """Same sizes: the position is a whole number of rounds, the resumed ranks' batches (their
    indices included) are the uninterrupted ranks' from that round on."""
    first, state, resumed, _ = saved_and_resumed(case, (2, 2), (2, 2), tmp_path)
    assert all((s.offset, s.cursor) == (0, ROUNDS) for s in resumed)
    uninterrupted = ranks(case, 2, 2, tmp_path)
    for mine, theirs in zip(resumed, uninterrupted, strict=True):
        want = [(b.meta["index"], b.meta["packs"].tolist()) for b in theirs][ROUNDS:]
        assert [(b.meta["index"], b.meta["packs"].tolist()) for b in mine] == want


def test_the_tail_of_a_resumed_epoch_is_what_no_whole_round_fills(tmp_path):
    """Worked example: 90 rows; 2 ranks x 2 rows served 8 (2 rounds). On 3 ranks x 2 the rest, 82
    rows, makes 41 global batches: 13 rounds of 3 (78 rows), and the last 2 batches (4 rows) are the
    dropped tail. Held as offset 8 % 6 = 2 plus 1 round, so the epoch counts 14 batches per rank."""
    first, state, resumed, order = saved_and_resumed("padded-max", (2, 2), (3, 2), tmp_path)
    assert len(order) == 90 and state["units"] == 8
    assert [(s.offset, s.cursor, len(s)) for s in resumed] == [(2, 1, 14)] * 3
    accounting = resumed[0].epoch_accounting()
    assert accounting["dropped_units"].tolist() == order[86:]
    assert accounting["batches_per_rank"] == 14
    assert [len(list(s)) for s in resumed] == [13] * 3


def test_a_version_2_cursor_is_a_global_position(tmp_path):
    """A state written before version 3 (rank cursor + world size) resumes exactly on another world
    size: its position is cursor x world_size x train.batch_size."""
    old = ranks("bfd", 2, 2, tmp_path)
    first = in_order(serve(old, 3))
    current = old[0].state_dict()
    legacy = {
        "version": 2,
        "epoch": 0,
        "cursor": 3,
        "rank": 0,
        "world_size": 2,
        "settings": {**current["settings"], "train.batch_size": 2},
    }
    resumed = ranks("bfd", 1, 3, tmp_path)[0]
    resumed.load_state_dict(legacy)
    assert resumed.state_dict()["units"] == 12 == len(first)
    order = old[0].plan(0).ordered().tolist()
    rest = in_order(serve([resumed]))
    assert first + rest == order[: len(first) + len(rest)]


def test_a_vsl_version_2_state_keeps_its_planned_update_size(tmp_path):
    """Its saved train.accumulation and world size make the planned update size (here 2 x 1 x 2)."""
    old = ranks("vsl", 2, 1, tmp_path)
    first = in_order(serve(old, 2))
    settings_key = old[0].state_dict()["settings"]
    legacy = {
        "version": 2,
        "epoch": 0,
        "cursor": 2,
        "rank": 0,
        "world_size": 2,
        "settings": {**settings_key, "train.batch_size": 1, "train.accumulation": 1, "world_size": 2},
    }
    resumed = ranks("vsl", 1, 1, tmp_path)[0]
    resumed.load_state_dict(legacy)
    assert resumed.state_dict()["update_units"] == 2
    rest = in_order(serve([resumed]))
    assert first + rest == old[0].plan(0).ordered().tolist()[: len(first) + len(rest)]


def test_a_resumed_vsl_epoch_keeps_its_update_size_across_another_save(tmp_path):
    """2 ranks -> 1 rank -> 1 rank: the second state still names the epoch's planned update size."""
    first, state, (resumed,), order = saved_and_resumed("vsl", (2, 2), (1, 2), tmp_path)
    assert resumed.state_dict()["update_units"] == 4 and resumed.update_units == 2
    more = in_order(serve([resumed], 2))
    again = ranks("vsl", 1, 2, tmp_path)[0]
    again.load_state_dict(json.loads(json.dumps(resumed.state_dict())))
    rest = in_order(serve([again]))
    assert first + more + rest == order[: len(first) + len(more) + len(rest)]
    assert again.state_dict()["update_units"] == 2  # the next epoch is planned for the new size


@pytest.mark.parametrize(
    ("other", "named"),
    [
        (("seed=7",), r"seed: 1234 -> 7"),
        (("data.packing_buffer=3",), r"data\.packing_buffer: 6 -> 3"),
        (("data.max_seq_len=32",), r"data\.max_seq_len: 16 -> 32"),
    ],
)
def test_a_resume_that_cannot_be_exact_is_refused_in_one_line(other, named, tmp_path):
    state = ranks("bestfit", 2, 2, tmp_path)[0]
    next(iter(state))
    saved = state.state_dict()
    resumed = build_sampler(case_cfg("bestfit", *other), SPLIT, world_size=3)
    with pytest.raises(ConfigError, match=named) as info:
        resumed.load_state_dict(saved)
    assert "\n" not in str(info.value) and "resume with the same ones" in str(info.value)
    policy = build_sampler(case_cfg("firstfit"), SPLIT)
    with pytest.raises(ConfigError, match=r"data\.policy: 'bestfit' -> 'firstfit'"):
        policy.load_state_dict(saved)


@settings(max_examples=25, deadline=None)
@given(
    case=st.sampled_from(
        sorted(c for c, (p, *_) in CASES.items() if p in policies_where(whole_updates=False))
    ),
    before=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    after=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    rounds=st.integers(0, 6),
)
def test_any_sizes_and_position_continue_exactly(case, before, after, rounds, tmp_path_factory):
    packs_dir = tmp_path_factory.mktemp("packs")
    old = ranks(case, *before, packs_dir)
    rounds = min(rounds, len(old[0]) - 1)
    first = in_order(serve(old, rounds)) if rounds else []
    state = old[0].state_dict()
    order = old[0].plan(0).ordered().tolist()
    new = ranks(case, *after, packs_dir)
    for sampler in new:
        sampler.load_state_dict(copy.deepcopy(state))
    resumed_mid_epoch = new[0].epoch == 0
    dropped = (
        new[0].epoch_accounting()["dropped_units"].tolist() if resumed_mid_epoch else order[len(first) :]
    )
    rest = in_order(serve(new)) if resumed_mid_epoch else []
    assert first + rest == order[: len(first) + len(rest)]
    assert sorted(dropped) == sorted(order[len(first) + len(rest) :])
    assert len(dropped) < after[0] * after[1]
    assert len(set(first + rest + dropped)) == len(order) == len(first) + len(rest) + len(dropped)


# --- refused before any rank starts (training/checks.py calls check_resume with the checkpoint) ------


def test_check_resume_refuses_what_the_sampler_would_without_the_split(tmp_path):
    sampler = ranks("vsl", 2, 2, tmp_path)[0]
    next(iter(sampler))
    state = json.loads(json.dumps(sampler.state_dict()))
    check_resume(state, case_cfg("vsl"), world_size=1)  # 4-unit updates split into 2-unit ones
    check_resume(state, case_cfg("vsl"), world_size=None)  # ranks not known yet: the sampler checks
    with pytest.raises(ConfigError, match=r"planned for updates of 4 units, and this run's \(6: "):
        check_resume(state, case_cfg("vsl"), world_size=3)
    with pytest.raises(ConfigError, match=r"\(seed: 1234 -> 7\), which plan another data order"):
        check_resume(state, case_cfg("vsl", "seed=7"), world_size=2)
    with pytest.raises(ConfigError, match=r"data\.policy: 'vsl' -> 'bestfit'"):
        check_resume(state, case_cfg("bestfit"), world_size=2)
    epoch_start = ranks("vsl", 2, 2, tmp_path)[0].state_dict()
    check_resume(epoch_start, case_cfg("vsl"), world_size=3)  # nothing of the epoch planned yet


def test_the_run_finds_the_sampler_state_where_lightning_saves_it():
    from pretrain.config import TrainerConfig
    from pretrain.training.checks import DATAMODULE_STATE, launch_world_size
    from pretrain.training.datamodule import PretrainDataModule

    assert DATAMODULE_STATE == PretrainDataModule.__qualname__
    sizes = [(2, 1, 2), (3, 2, 6), ([0, 1], 2, 4), (-1, 1, None), ("auto", 1, None), ("4", 1, 4)]
    for devices, nodes, world in sizes:
        trainer = TrainerConfig("cpu", devices, nodes, strategy="ddp", precision="32-true")
        assert launch_world_size(trainer) == world


@settings(max_examples=20, deadline=None)
@given(
    before=st.tuples(st.integers(1, 4), st.integers(1, 3)),
    after=st.tuples(st.integers(1, 4), st.integers(1, 3)),
    accumulation=st.integers(1, 2),
    updates=st.integers(1, 3),
)
def test_vsl_continues_exactly_when_the_update_size_divides(before, after, accumulation, updates):
    """Saved after whole updates (as a checkpoint is): every new update lies in one planned one."""
    cfg = (f"train.accumulation={accumulation}", "data.curriculum=uniform")
    old = [
        build_sampler(
            case_cfg("vsl", f"train.batch_size={before[1]}", *cfg), SPLIT, rank=r, world_size=before[0]
        )
        for r in range(before[0])
    ]
    assert len(old[0]) > updates * accumulation  # the split holds more updates than are served first
    first = in_order(serve(old, updates * accumulation))
    state = old[0].state_dict()
    order = old[0].plan(0).ordered().tolist()
    new = [
        build_sampler(
            case_cfg("vsl", f"train.batch_size={after[1]}", *cfg), SPLIT, rank=r, world_size=after[0]
        )
        for r in range(after[0])
    ]
    planned, size = before[0] * before[1] * accumulation, after[0] * after[1] * accumulation
    if planned % size:
        with pytest.raises(ConfigError, match=f"planned for updates of {planned} units"):
            new[0].load_state_dict(state)
        return
    for sampler in new:
        sampler.load_state_dict(copy.deepcopy(state))
    rest = in_order(serve(new))
    assert first + rest == order  # the planned updates divide into whole new ones: no tail
    assert len(new[0]) % accumulation == 0
