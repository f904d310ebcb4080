"""task=sft: conversations rendered by the chat template into tokens and a loss mask (data/ingest/chat.py),
the mask carried by every policy into the targets, whole exchanges under data.long_docs=truncate
(data/batching/exchanges.py), and the audit's trained targets. The references: transformers'
apply_chat_template(return_assistant_tokens_mask=True) for the ids and the mask, and its
DataCollatorWithFlattening for a padding-free batch's ids, labels and position ids."""

from __future__ import annotations

import dataclasses
import itertools
import json

import numpy as np
import pytest
from helpers.configs import cache_spec, compose, policy_cfg, prepare
from helpers.plugins import POLICY_VARIANTS
from hypothesis import given, settings
from hypothesis import strategies as st

from pretrain.config import to_config
from pretrain.data.batching.batch import IGNORE_INDEX
from pretrain.data.batching.exchanges import whole_exchanges
from pretrain.data.batching.samplers import build_sampler
from pretrain.data.ingest.cache import CacheSpec
from pretrain.data.ingest.chat import CUT, TRAINED, ChatEncoder, chat_settings
from pretrain.data.ingest.prepare import prepare_cache
from pretrain.data.ingest.prepare_settings import PrepareSettings
from pretrain.data.ingest.tokenizer import build_tokenizer, bundled_files
from pretrain.data.ingest.verify import verify_cache
from pretrain.data.sources import ChatdocsSource, PartSizes, documents
from pretrain.data.sources.conversations import conversation_messages, conversation_text
from pretrain.data.tokens import TokenSplit
from pretrain.errors import CacheError, ConfigError, SourceError

ANSWER = {"role": "assistant", "content": "a"}
HANDMADE = [
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}],
    [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "Colour of the sky?"},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "And grass?"},
        {"role": "assistant", "content": "Green."},
        {"role": "user", "content": "Snow?"},
        {"role": "assistant", "content": "White."},
    ],
    [{"role": "user", "content": "Say nothing."}, {"role": "assistant", "content": ""}],
    [{"role": "user", "content": "Unicode: é, 漢字, 🙂"}, {"role": "assistant", "content": "Übersetzt: ✓"}],
]


def conversations(count: int = 60) -> list[list[dict]]:
    """The first conversations of the offline chat corpus, then the handmade ones."""
    chat = [conversation_messages(d.text) for d in itertools.islice(documents(ChatdocsSource()), count)]
    return chat + HANDMADE


@pytest.fixture(scope="module")
def chat_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("chat") / "chats.jsonl"
    rows = [{"messages": messages, "id": i} for i, messages in enumerate(conversations())]
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    return path


def sft_config(chat_file, tmp_path, *overrides: str):
    return compose(
        "task=sft",
        "source=chat",
        f"source.files=[{chat_file}]",
        f"cache_root={tmp_path / 'cache'}",
        "split.validation_fraction=0.1",
        *overrides,
    )


@pytest.fixture(scope="module")
def hf_tokenizer(tmp_path_factory):
    """GPT-2's tokenizer as transformers loads an export of it (pretrain export writes these files)."""
    from transformers import PreTrainedTokenizerFast

    directory = tmp_path_factory.mktemp("tokenizer")
    build_tokenizer(bundled_files()).save(str(directory / "tokenizer.json"))
    return PreTrainedTokenizerFast(
        tokenizer_file=str(directory / "tokenizer.json"), eos_token="<|endoftext|>"
    )


def test_ids_and_assistant_mask_equal_apply_chat_template(hf_tokenizer):
    """On 64 conversations: the ids and the TRAINED bits are apply_chat_template's ids and assistant
    mask exactly (the template closes each reply with EOS, so no EOS is added); the first token never
    trains; CUT marks the token after every reply but the last."""
    files = bundled_files()
    settings = chat_settings("assistant", None, files)
    encoder = ChatEncoder(files, settings)
    checked = 0
    for messages in conversations():
        ids, mask = encoder.encode_conversation(conversation_text(messages, "test"), "test")
        reference = hf_tokenizer.apply_chat_template(
            messages,
            chat_template=settings.template,
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
        )
        assert ids.tolist() == reference["input_ids"]
        expected = np.array(reference["assistant_masks"], dtype=np.uint8)
        expected[0] = 0
        assert ((mask & TRAINED) > 0).astype(np.uint8).tolist() == expected.tolist()
        replies = sum(m["role"] == "assistant" for m in messages)
        assert int(((mask & CUT) > 0).sum()) == replies - 1
        checked += 1
    assert checked >= 50


@pytest.mark.parametrize("mode", ["completion", "all"])
def test_completion_and_all_masks(mode):
    files = bundled_files()
    encoder = ChatEncoder(files, chat_settings(mode, None, files))
    reference = ChatEncoder(files, chat_settings("assistant", None, files))
    for messages in conversations(10):
        text = conversation_text(messages, "test")
        ids, mask = encoder.encode_conversation(text, "test")
        same_ids, replies = reference.encode_conversation(text, "test")
        assert ids.tolist() == same_ids.tolist() and (mask & CUT).tolist() == (replies & CUT).tolist()
        trained = (mask & TRAINED) > 0
        assert not trained[0]
        if mode == "all":
            assert trained[1:].all()
        else:  # every token from the first reply's first on
            first = int(np.flatnonzero(replies & TRAINED)[0])
            assert not trained[:first].any() and trained[first:].all()


def test_a_message_holding_special_text_is_left_out_and_counted(chat_file, tmp_path):
    rows = chat_file.read_text().splitlines()
    faked = {
        "messages": [{"role": "user", "content": "x<|endoftext|>y"}, {"role": "assistant", "content": "z"}]
    }
    path = tmp_path / "faked.jsonl"
    path.write_text("\n".join([*rows[:5], json.dumps(faked)]) + "\n")
    cache = prepare(sft_config(path, tmp_path))
    assert cache.manifest["build"]["special_text_skipped"] == 1
    assert cache.manifest["build"]["empty_skipped"] == 0
    assert sum(cache.counts()[s]["documents"] for s in ("train", "validation")) == 5


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"messages": []}, "non-empty list"),
        ({"messages": [{"role": "user", "content": "q"}]}, "no assistant message"),
        (
            {"messages": [{"role": "tool", "content": "q"}, {"role": "assistant", "content": "a"}]},
            "role 'tool'",
        ),
        (
            {"messages": [{"role": "user", "content": 3}, {"role": "assistant", "content": "a"}]},
            "not a string",
        ),
        ({"text": "a document"}, "no `messages` column"),
    ],
)
def test_a_malformed_conversation_is_refused_naming_its_row(tmp_path, row, message):
    path = tmp_path / "bad.jsonl"
    good = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    path.write_text(json.dumps(good) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(SourceError, match=rf"bad.jsonl: row 1.*{message}"):
        prepare(sft_config(path, tmp_path))


def test_the_task_and_the_source_must_agree(chat_file, tmp_path):
    with pytest.raises(ConfigError, match="task=sft trains on conversations, source=pydocs holds documents"):
        CacheSpec.from_config(to_config(compose("task=sft", "source=pydocs")))
    with pytest.raises(ConfigError, match="source=chat holds conversations: train them with task=sft"):
        CacheSpec.from_config(to_config(compose("source=chat", f"source.files=[{chat_file}]")))
    with pytest.raises(ConfigError, match="task=sft does not support split.decontaminate=true"):
        CacheSpec.from_config(to_config(sft_config(chat_file, tmp_path, "split.decontaminate=true")))
    with pytest.raises(ConfigError, match="no {% generation %}|marks no assistant reply"):
        template = tmp_path / "t.jinja"
        template.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
        CacheSpec.from_config(to_config(sft_config(chat_file, tmp_path, f"task.chat_template={template}")))


def test_the_mask_is_part_of_the_identity_and_verified(chat_file, tmp_path):
    """Each loss mask is its own cache; the mask file is hashed: a flipped byte fails a full verify;
    four workers write the same bytes as one process."""
    assistant = prepare(sft_config(chat_file, tmp_path))
    completion = prepare(sft_config(chat_file, tmp_path, "task.loss_mask=completion"))
    assert assistant.directory != completion.directory
    assert assistant.manifest["identity"]["chat"]["loss_mask"] == "assistant"
    spec = cache_spec(sft_config(chat_file, tmp_path, "prepare.num_proc=4", "cache.rebuild=true"))
    small_parts = PrepareSettings(num_proc=4, part_sizes=PartSizes(jsonl_bytes=2048))
    parallel = prepare_cache(dataclasses.replace(spec, prepare=small_parts, root=tmp_path / "p"))
    for split in ("train", "validation"):
        for kind in ("bin", "mask"):
            assert (
                parallel.manifest["splits"][split]["files"][kind]["sha256"]
                == assistant.manifest["splits"][split]["files"][kind]["sha256"]
            )
    mask = assistant.directory / "train.mask.bin"
    data = bytearray(mask.read_bytes())
    data[3] ^= TRAINED
    mask.write_bytes(bytes(data))
    with pytest.raises(CacheError, match="train.mask.bin does not match its sha256"):
        verify_cache(assistant.directory, mode="full")


def numbered(split: TokenSplit) -> TokenSplit:
    """The split with each token's id its own global index: a batch's targets name the tokens they are."""
    return TokenSplit(
        tokens=np.arange(len(split.tokens), dtype=np.int64),
        offsets=split.offsets,
        lengths=split.lengths,
        ids=split.ids,
        name=split.name,
        loss_mask=np.asarray(split.loss_mask),
    )


@pytest.fixture(scope="module")
def chat_split(chat_file, tmp_path_factory):
    cache = prepare(sft_config(chat_file, tmp_path_factory.mktemp("split")))
    return cache.split("train")


@pytest.mark.parametrize("case", list(POLICY_VARIANTS))
def test_every_policy_trains_exactly_the_masked_in_targets(chat_split, case):
    """Every policy variant, over a whole epoch's layout at max_seq_len 64: every counted target is a
    token its mask trains; with data.long_docs=chunk every trained token is a target exactly once,
    with truncate those inside each conversation's whole exchanges; num_targets counts them; and with
    the document mask no segment holds two conversations (attention never crosses one)."""
    policy, *overrides = POLICY_VARIANTS[case]
    settings = policy_cfg(policy, "data.max_seq_len=64", "train.batch_size=4", *overrides)
    split = numbered(chat_split)
    sampler = build_sampler(settings, split)
    layout = sampler.plan(0).layout
    items, counts = layout.items_of(np.arange(len(layout)))
    batch = sampler.policy.gather(sampler.split, layout, items, counts)
    targets = batch.targets.numpy()
    counted = targets[targets != IGNORE_INDEX]
    assert batch.num_targets == len(counted)
    assert (split.loss_mask[counted] & TRAINED).all()
    assert len(np.unique(counted)) == len(counted)
    expected = np.zeros(len(split.tokens), dtype=bool)
    for offset, length in zip(sampler.split.offsets, sampler.split.lengths, strict=True):
        expected[offset + 1 : offset + length] = True  # targets of the served (maybe cut) conversations
    expected &= (split.loss_mask & TRAINED) > 0
    assert np.array_equal(np.sort(counted), np.flatnonzero(expected))
    if getattr(settings.data, "document_mask", True):
        document = np.searchsorted(split.offsets, batch.input_ids.numpy(), side="right") - 1
        bounds = batch.cu_seqlens.numpy()
        for start, end in itertools.pairwise(bounds):
            real = batch.targets.numpy()[start:end] != IGNORE_INDEX
            if real.any():
                assert len(np.unique(document[start:end][: int(np.flatnonzero(real)[-1]) + 1])) == 1


def test_truncate_keeps_whole_exchanges(chat_split):
    """data.long_docs=truncate: a kept conversation ends right after a reply (at a CUT or its end),
    within max_seq_len pairs, and one whose first reply does not fit is left out."""
    cut, report = whole_exchanges(chat_split, 64)
    for offset, length in zip(cut.offsets, cut.lengths, strict=True):
        assert 2 <= length <= 65
        end = offset + length
        original = int(chat_split.lengths[np.searchsorted(chat_split.offsets, offset)])
        assert length == original or chat_split.loss_mask[end] & CUT
    assert report.dropped == len(chat_split) - len(cut)
    assert report.dropped_pairs == chat_split.num_pairs - int((cut.lengths - 1).sum())


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.booleans(), min_size=2, max_size=40), min_size=1, max_size=12),
    st.integers(2, 20),
)
def test_whole_exchanges_is_the_last_cut_that_fits(cut_lists, max_seq_len):
    """Against a direct reading: a conversation of more than max_seq_len pairs keeps the tokens before
    its last cut at 2..max_seq_len + 1, or is left out without one; shorter ones are kept whole."""
    lengths = np.array([len(c) for c in cut_lists], dtype=np.int64)
    mask = np.array([CUT if c else 0 for cuts in cut_lists for c in cuts], dtype=np.uint8)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    split = TokenSplit(
        tokens=np.zeros(len(mask), np.uint32), offsets=offsets, lengths=lengths, loss_mask=mask
    )
    view, report = whole_exchanges(split, max_seq_len)
    expected = []
    for cuts in cut_lists:
        if len(cuts) - 1 <= max_seq_len:
            expected.append(len(cuts))
            continue
        fitting = [p for p in range(2, max_seq_len + 2) if cuts[p]]
        if fitting:
            expected.append(fitting[-1])
    assert view.lengths.tolist() == expected
    assert report.dropped == len(cut_lists) - len(expected)


def test_batches_equal_data_collator_with_flattening(chat_split, chat_file):
    """A padding-free batch of whole conversations (bestfit, max_seq_len 1024: nothing cut) against
    transformers' DataCollatorWithFlattening over the same conversations with apply_chat_template's
    ids and assistant mask as labels: the same ids, labels one token ahead (targets = labels shifted
    as the model shifts them) and position ids, conversation by conversation, for 50+."""
    from transformers import DataCollatorWithFlattening

    settings = policy_cfg("bestfit", "data.max_seq_len=1024", "train.batch_size=4")
    sampler = build_sampler(settings, chat_split)
    layout = sampler.plan(0).layout
    items, counts = layout.items_of(np.arange(len(layout)))
    batch = sampler.policy.gather(sampler.split, layout, items, counts)
    docs = layout.docs(items)
    assert len(docs) == len(chat_split) >= 50  # every conversation, each one segment
    features = []
    for doc in docs.tolist():
        ids = chat_split.document(doc).astype(np.int64)
        mask = chat_split.loss_mask[chat_split.offsets[doc] : chat_split.offsets[doc] + len(ids)] & TRAINED
        features.append({"input_ids": ids.tolist(), "labels": np.where(mask > 0, ids, -100).tolist()})
    reference = DataCollatorWithFlattening(return_tensors="np")(features)
    bounds = np.cumsum([0, *[len(f["input_ids"]) for f in features]])
    ours = np.cumsum([0, *(len(f["input_ids"]) - 1 for f in features)])
    ref_ids, ref_labels = reference["input_ids"][0], reference["labels"][0]
    ref_positions = reference["position_ids"][0]
    for k in range(len(features)):
        a, b, x, y = bounds[k], bounds[k + 1], ours[k], ours[k + 1]
        assert batch.input_ids.numpy()[x:y].tolist() == ref_ids[a : b - 1].tolist()
        assert batch.targets.numpy()[x:y].tolist() == ref_labels[a + 1 : b].tolist()
        assert batch.position_ids.numpy()[x:y].tolist() == ref_positions[a : b - 1].tolist()
    assert batch.num_targets == int((ref_labels != -100).sum())
