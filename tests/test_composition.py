"""The composition axes on every policy: data.long_docs (chunk | truncate), data.document_mask for every
packing policy, data=firstfit. Every next-token pair is trained exactly once under chunk, only each
document's first chunk's under truncate; the same seed serves the same batches; validation does not
depend on the mask; and a sampler state remembers the axes it was saved with."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from helpers import packing_policies, policy_cfg
from hypothesis import given, settings
from hypothesis import strategies as st

from pretrain.data.batching.batch import IGNORE_INDEX
from pretrain.data.batching.evaluation import evaluation_batches
from pretrain.data.batching.samplers import build_sampler
from pretrain.data.tokens import EOS_TOKEN_ID, TokenSplit

ARMS = {
    "padded-truncate": ("padded",),
    "padded-chunk": ("padded", "data.long_docs=chunk"),
    "padded-longest-chunk": ("padded", "data.pad_to=longest", "data.long_docs=chunk"),
    "concat-chunk": ("prepacked", "data.strategy=concat"),
    "concat-truncate": ("prepacked", "data.strategy=concat", "data.long_docs=truncate"),
    "concat-open-truncate": (
        "prepacked",
        "data.strategy=concat",
        "data.long_docs=truncate",
        "data.document_mask=false",
    ),
    "bfd-chunk": ("prepacked", "data.strategy=bfd"),
    "bfd-truncate-open": (
        "prepacked",
        "data.strategy=bfd",
        "data.long_docs=truncate",
        "data.document_mask=false",
    ),
    "bestfit-chunk-open": ("bestfit", "data.packing_buffer=4", "data.document_mask=false"),
    "bestfit-truncate": ("bestfit", "data.packing_buffer=4", "data.long_docs=truncate"),
    "firstfit-chunk": ("firstfit", "data.open_bins=2"),
    "firstfit-truncate-open": ("firstfit", "data.long_docs=truncate", "data.document_mask=false"),
}
BASE = 60_000  # body token of file position p: BASE + p (above EOS), so an input names its position


def numbered_split(lengths: list[int]) -> TokenSplit:
    """Documents of the given lengths (EOS included) whose body tokens are their file positions + BASE."""
    sizes = np.array(lengths, dtype=np.int64)
    tokens = np.arange(int(sizes.sum()), dtype=np.uint32) + BASE
    tokens[np.cumsum(sizes) - 1] = EOS_TOKEN_ID
    return TokenSplit(tokens=tokens, offsets=np.cumsum(sizes) - sizes, lengths=sizes)


def expected_pairs(split: TokenSplit, capacity: int, truncate: bool) -> Counter:
    """(input position, target token) of each pair a policy must train once: every pair of every
    document, or with truncate the first `capacity` of each; written without the code under test."""
    tokens = np.asarray(split.tokens, dtype=np.int64)
    pairs: Counter = Counter()
    for offset, n in zip(split.offsets.tolist(), split.lengths.tolist(), strict=True):
        kept = min(n - 1, capacity) if truncate else n - 1
        pairs.update((p, int(tokens[p + 1])) for p in range(offset, offset + kept))
    return pairs


def trained_pairs(split: TokenSplit, cfg) -> Counter:
    """(input position, target) of every pair an epoch trains on one rank, one unit a batch (nothing
    dropped). An EOS input's pair (concat windows without the mask) crosses documents: left out."""
    served: Counter = Counter()
    for batch in build_sampler(cfg, split):
        inputs, targets = batch.input_ids.numpy(), batch.targets.numpy()
        real = (targets != IGNORE_INDEX) & (inputs != EOS_TOKEN_ID)
        served.update(zip((inputs[real] - BASE).tolist(), targets[real].tolist(), strict=True))
    return served


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(2, 40), min_size=1, max_size=25),
    capacity=st.integers(2, 12),
    arm=st.sampled_from(sorted(ARMS)),
)
def test_every_pair_once_under_chunk_and_the_first_chunks_under_truncate(lengths, capacity, arm):
    policy, *overrides = ARMS[arm]
    cfg = policy_cfg(policy, f"data.max_seq_len={capacity}", "train.batch_size=1", *overrides)
    split = numbered_split(lengths)
    assert trained_pairs(split, cfg) == expected_pairs(split, capacity, "truncate" in arm)


@pytest.mark.parametrize("arm", sorted(ARMS))
def test_the_same_seed_serves_the_same_batches(arm, tmp_path):
    policy, *overrides = ARMS[arm]
    split = TokenSplit.from_lengths(np.random.default_rng(3).integers(2, 50, size=60), seed=3)

    def served(seed: int) -> list[bytes]:
        cfg = policy_cfg(policy, "data.max_seq_len=16", "train.batch_size=2", f"seed={seed}", *overrides)
        sampler = build_sampler(cfg, split, packs_dir=tmp_path)
        return [
            b.input_ids.numpy().tobytes() + b.cu_seqlens.numpy().tobytes() for _ in range(2) for b in sampler
        ]

    first = served(1)
    assert served(1) == first
    assert served(2) != first  # another seed: another order


@pytest.mark.parametrize("policy", packing_policies())
def test_validation_does_not_depend_on_the_document_mask(policy):
    """val/loss compares models: with the mask off, validation chunks are still each their own segment."""
    split = TokenSplit.from_lengths(
        np.random.default_rng(4).integers(2, 70, size=40), seed=4, name="validation"
    )
    base = ("data.max_seq_len=16", "train.eval_microbatch_tokens=48")

    def batches(mask: str) -> list[tuple]:
        cfg = policy_cfg(policy, *base, f"data.document_mask={mask}")
        return [
            (b.input_ids.numpy().tobytes(), b.targets.numpy().tobytes(), b.cu_seqlens.numpy().tobytes())
            for b in evaluation_batches(cfg, split)
        ]

    masked = batches("true")
    assert len(masked) > 1 and batches("false") == masked


def test_a_mask_off_pack_is_one_segment_with_running_positions():
    split = numbered_split([5, 3, 9, 2, 4])
    cfg = policy_cfg("firstfit", "data.max_seq_len=8", "train.batch_size=1", "data.document_mask=false")
    for batch in build_sampler(cfg, split):
        (pack,) = batch.pack_lengths.tolist()
        assert batch.cu_seqlens.tolist() == [0, pack] and batch.max_seqlen == pack
        assert batch.position_ids.tolist() == list(range(pack))


@pytest.mark.parametrize(
    ("saved", "resumed", "changed"),
    [
        (("bestfit", "data.long_docs=truncate"), ("bestfit",), r"data\.long_docs: 'truncate' -> None"),
        (("firstfit",), ("firstfit", "data.open_bins=4"), r"data\.open_bins: 8 -> 4"),
        (("firstfit",), ("firstfit", "data.document_mask=false"), r"data\.document_mask: None -> False"),
        (("padded",), ("padded", "data.long_docs=chunk"), r"data\.long_docs: None -> 'chunk'"),
    ],
)
def test_a_state_saved_with_other_composition_options_is_refused(saved, resumed, changed):
    split = TokenSplit.from_lengths(np.random.default_rng(5).integers(2, 50, size=60), seed=5)
    base = ("data.max_seq_len=16", "train.batch_size=2")
    state = build_sampler(policy_cfg(saved[0], *base, *saved[1:]), split).state_dict()
    with pytest.raises(ValueError, match=changed):
        build_sampler(policy_cfg(resumed[0], *base, *resumed[1:]), split).load_state_dict(state)


def test_the_default_arms_keep_their_resume_keys():
    """The axes join a state's settings only when set: states saved before them resume unchanged."""
    keys = {
        policy: set(build_sampler(policy_cfg(policy), numbered_split([5] * 8)).state_dict()["settings"])
        for policy in ("padded", "bestfit", "firstfit")
    }
    common = {"data.policy", "split", "data.max_seq_len", "seed", "split_fingerprint"}
    assert keys == {
        "padded": common | {"data.pad_to"},
        "bestfit": common | {"data.packing_buffer"},
        "firstfit": common | {"data.open_bins"},
    }
