"""task=sft end to end on the offline chat corpus: `python train.py experiment=sft_smoke data=bestfit`
trains, its run records the loss-mask audit; a Hugging Face GPT-2 fine-tuned with model.init_from and
exported scores the validation conversations, in transformers with the mask as labels, exactly as
`pretrain eval` does, and its tokenizer's chat template renders the cached ids."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import module_cache_root

from pretrain.config import load_config, to_config
from pretrain.data.batching.chunking import chunk_table
from pretrain.data.ingest.cache import CacheSpec
from pretrain.data.ingest.chat import TRAINED, ChatEncoder
from pretrain.data.ingest.prepare import prepare_cache
from pretrain.data.sources import ChatdocsSource, documents
from pretrain.data.sources.conversations import conversation_messages
from pretrain.hf import export
from pretrain.training.evaluate import evaluate_checkpoint
from pretrain.training.run import train

transformers = pytest.importorskip("transformers")

cache_root = module_cache_root()  # the chat corpus's cache, built once for the module
L = 512


def sft(out: Path, *overrides: str):
    return load_config(
        ["experiment=sft_smoke", f"output_dir={out}", "progress_bar=false", "train.max_steps=6", *overrides]
    )


def test_sft_smoke_trains_offline_and_audits_the_mask(cache_root, tmp_path):
    train(sft(tmp_path, "data=bestfit"))
    summary = json.loads((tmp_path / "run.json").read_text())
    audit = summary["composition"]
    assert 0 < audit["trained_targets"] and 0 < audit["masked_targets"]
    assert audit["padding_waste_trained"] == pytest.approx(
        1 - audit["trained_targets"] / (audit["trained_targets"] + audit["masked_targets"])
    )
    rows = [line.split(",") for line in (tmp_path / "metrics.csv").read_text().splitlines()]
    header = rows[0]
    steps = [dict(zip(header, row, strict=True)) for row in rows[1:] if row[header.index("train/loss")]]
    assert len(steps) == 6
    seen = np.array([0.0] + [float(step["train/tokens"]) for step in steps])
    for step, real in zip(steps, np.diff(seen), strict=True):  # the mask leaves the prompts out
        assert 0 < float(step["train/num_targets"]) < real
        assert np.isfinite(float(step["train/loss"]))


def test_init_from_sft_export_reload_scores_the_same(cache_root, tmp_path):
    config = transformers.GPT2Config(
        n_positions=L, n_embd=128, n_layer=4, n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0
    )
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt2-random")
    out = tmp_path / "run"
    overrides = [f"model.init_from={tmp_path / 'gpt2-random'}", f"data.max_seq_len={L}", "data=padded"]
    train(sft(out, *overrides))
    checkpoint = out / "checkpoints" / "last.ckpt"
    ours = evaluate_checkpoint(checkpoint)
    exported = export(checkpoint, tmp_path / "export")
    model = transformers.GPT2LMHeadModel.from_pretrained(exported, local_files_only=True).eval()

    split = prepare_cache(CacheSpec.from_config(to_config(sft(out, *overrides)))).split("validation")
    table = chunk_table(split.offsets, split.lengths, L)
    nats, targets = 0.0, 0
    with torch.no_grad():
        for start, length in zip(table.start.tolist(), table.length.tolist(), strict=True):
            ids = torch.from_numpy(np.asarray(split.tokens[start : start + length + 1], dtype=np.int64))
            trained = torch.from_numpy(
                (np.asarray(split.loss_mask[start + 1 : start + length + 1]) & TRAINED) > 0
            )
            labels = torch.where(trained, ids[1:], -100)  # the chunk's targets, the mask's as labels
            logits = model(ids[None, :-1]).logits[0]
            nats += float(torch.nn.functional.cross_entropy(logits.double(), labels, reduction="sum"))
            targets += int(trained.sum())
    assert targets == ours["targets"] > 0
    assert nats / targets == pytest.approx(ours["loss"], abs=1e-5)

    tokenizer = transformers.AutoTokenizer.from_pretrained(exported, local_files_only=True)
    first = next(iter(documents(ChatdocsSource())))
    spec = CacheSpec.from_config(to_config(sft(out, *overrides)))
    assert spec.chat is not None
    ids, mask = ChatEncoder(spec.tokenizer_files, spec.chat).encode_conversation(first.text, first.origin)
    rendered = tokenizer.apply_chat_template(
        conversation_messages(first.text), tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    assert rendered["input_ids"] == ids.tolist()
    assert rendered["assistant_masks"][1:] == ((mask[1:] & TRAINED) > 0).astype(int).tolist()
