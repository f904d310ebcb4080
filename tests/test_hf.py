"""Hugging Face round trip: export to GPT2LMHeadModel, import with model.init_from, pretrain eval.

Everything offline: the exported directory is loaded with local files only, and the "public GPT-2"
is a randomly initialised GPT-2-shaped transformers model saved to disk here.
"""

from __future__ import annotations

import ast
import json
import math
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import REPO, SHARED_CACHE, cli_env, module_cache_root

from pretrain.checkpoints.files import load_checkpoint
from pretrain.config import load_config, to_config
from pretrain.data import TokenSplit, chunk_table, gather_packed
from pretrain.errors import ConfigError
from pretrain.hf import export, init_from
from pretrain.hf.roundtrip import model_weights
from pretrain.model import GPT, GPTConfig
from pretrain.training.evaluate import evaluate, evaluate_checkpoint
from pretrain.training.run import train

transformers = pytest.importorskip("transformers")
ATOL = 1e-5
# The smoke run with a small validation split (~3k tokens): evaluation scores all of it several times.
BASE = ["experiment=smoke", "budget.validation_tokens=3000"]


cache_root = module_cache_root(SHARED_CACHE)  # one cache for the whole module


@pytest.fixture(scope="module")
def trained(cache_root, tmp_path_factory) -> Path:
    """A tiny model trained for a few steps at max_seq_len 128 on the embedded corpus."""
    out = tmp_path_factory.mktemp("run")
    overrides = [*BASE, f"output_dir={out}", "progress_bar=false", "train.max_steps=4"]
    train(load_config([*overrides, "train.val_every_n_steps=2"]))
    return out / "checkpoints" / "last.ckpt"


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory) -> Path:
    return export(trained, tmp_path_factory.mktemp("export") / "gpt2-tiny")


def project_model(checkpoint: Path) -> GPT:
    saved = load_checkpoint(checkpoint)
    model = GPT(GPTConfig(**saved["hyper_parameters"]["model"]), attn="sdpa")
    model.load_state_dict(model_weights(saved))
    return model.eval()


def hf_model(directory: Path):
    return transformers.GPT2LMHeadModel.from_pretrained(directory, local_files_only=True).eval()


def documents(seed: int, count: int, high: int = 120) -> TokenSplit:
    rng = np.random.default_rng(seed)
    return TokenSplit.from_lengths(rng.integers(5, high, size=count), seed=seed)


def test_export_writes_a_directory_transformers_loads_offline(exported):
    names = {p.name for p in exported.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "vocab.json",
        "merges.txt",
        "tokenizer.json",
        "README.md",
    } <= names
    config = json.loads((exported / "config.json").read_text())
    assert config["n_positions"] == 128 and config["activation_function"] == "gelu_new"
    assert (config["n_layer"], config["n_head"], config["n_embd"], config["vocab_size"]) == (4, 4, 128, 50257)
    assert config["resid_pdrop"] == config["embd_pdrop"] == config["attn_pdrop"] == 0.0
    tokenizer = transformers.AutoTokenizer.from_pretrained(exported, local_files_only=True)
    assert tokenizer("Hello world")["input_ids"] == [15496, 995]
    assert tokenizer.eos_token_id == 50256 and tokenizer.model_max_length == 128
    card = (exported / "README.md").read_text()
    assert "bestfit" in card and "content_sha256" in card and "optimizer steps | 4" in card
    assert not [p for p in exported.parent.iterdir() if p.name.startswith(".")]  # no tmp left
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in exported.iterdir()}
    assert modes["model.safetensors"] == modes["config.json"] == 0o644  # not safetensors' 0600


def test_exported_logits_equal_the_project_model(trained, exported):
    """The run's model pads its vocabulary (model.vocab_multiple=64: 50,304 rows in the checkpoint);
    the export has the 50,257 real rows and scores as the project model does."""
    from safetensors.torch import load_file

    assert model_weights(load_checkpoint(trained))["wte.weight"].shape[0] == 50304
    assert load_file(str(exported / "model.safetensors"))["transformer.wte.weight"].shape[0] == 50257
    ours, theirs = project_model(trained), hf_model(exported)
    split = documents(seed=1, count=6)
    with torch.no_grad():
        for i in range(len(split)):  # one document at a time, batch of one in transformers
            ids = torch.from_numpy(split.document(i)[:-1].astype(np.int64))
            batch = gather_packed(split.tokens, split.offsets[i : i + 1], [len(ids)], [1], 128)
            torch.testing.assert_close(ours(batch), theirs(ids[None]).logits[0], atol=ATOL, rtol=0)
        # A packed batch: each chunk (max_seq_len 32 here, so long documents are cut) must equal the
        # chunk run alone in transformers, last token of every chunk included.
        table = chunk_table(split.offsets, split.lengths, 32)
        packed = gather_packed(split.tokens, table.start, table.length, [len(table)], 32 * len(table))
        logits = ours(packed)
        starts = np.concatenate([[0], np.cumsum(table.length)])
        for c in range(len(table)):
            ids = torch.from_numpy(
                np.asarray(split.tokens[table.start[c] : table.start[c] + table.length[c]], np.int64)
            )
            expected = theirs(ids[None]).logits[0]
            got = logits[starts[c] : starts[c + 1]]
            torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)
            torch.testing.assert_close(got[-1], expected[-1], atol=ATOL, rtol=0)


def greedy(model: GPT, prompt: list[int], steps: int) -> list[int]:
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            tokens = np.asarray([*ids, 0], dtype=np.int64)
            batch = gather_packed(tokens, [0], [len(ids)], [1], 128)
            ids.append(int(model(batch)[-1].argmax()))
    return ids[len(prompt) :]


def test_cached_generation_in_transformers_matches_the_project_model(trained, exported):
    prompt = [464, 3290, 286, 262, 1917, 318]  # "The history of the world is"
    theirs = hf_model(exported).generate(
        torch.tensor([prompt]), max_new_tokens=12, do_sample=False, use_cache=True, pad_token_id=50256
    )
    assert theirs[0, len(prompt) :].tolist() == greedy(project_model(trained), prompt, 12)


def test_init_from_an_export_reproduces_the_logits(trained, exported):
    ours = project_model(trained)
    fresh = GPT(ours.config, attn="sdpa").eval()
    init_from(fresh, exported)
    split = documents(seed=2, count=3)
    batch = gather_packed(split.tokens, split.offsets, split.lengths - 1, [1, 1, 1], 128)
    with torch.no_grad():
        torch.testing.assert_close(fresh(batch), ours(batch), atol=0, rtol=0)


def test_a_gpt2_shaped_hf_model_imports_with_identical_logits(tmp_path):
    config = transformers.GPT2Config(
        vocab_size=50257,
        n_positions=64,
        n_embd=32,
        n_layer=2,
        n_head=2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    torch.manual_seed(0)
    reference = transformers.GPT2LMHeadModel(config).eval()
    reference.save_pretrained(tmp_path / "gpt2-random")
    ours = GPT(
        GPTConfig(vocab_size=50257, n_layer=2, n_head=2, d_model=32, max_seq_len=64), attn="sdpa"
    ).eval()
    init_from(ours, tmp_path / "gpt2-random")
    split = documents(seed=3, count=4, high=60)
    with torch.no_grad():
        for i in range(len(split)):
            ids = torch.from_numpy(split.document(i)[:-1].astype(np.int64))
            batch = gather_packed(split.tokens, split.offsets[i : i + 1], [len(ids)], [1], 64)
            torch.testing.assert_close(ours(batch), reference(ids[None]).logits[0], atol=ATOL, rtol=0)


def test_init_from_refuses_what_does_not_fit(tmp_path):
    config = transformers.GPT2Config(vocab_size=50257, n_positions=32, n_embd=32, n_layer=2, n_head=2)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "short")
    longer = GPT(GPTConfig(vocab_size=50257, n_layer=2, n_head=2, d_model=32, max_seq_len=64))
    with pytest.raises(ConfigError, match=r"32 positions.*data\.max_seq_len<=32"):
        init_from(longer, tmp_path / "short")
    before = longer.wpe.weight.detach().clone()
    init_from(longer, tmp_path / "short", extend_positions=True)  # explicit: rows past 32 keep their init
    assert torch.equal(longer.wpe.weight[32:], before[32:])
    assert not torch.equal(longer.wpe.weight[:32], before[:32])
    wider = GPT(GPTConfig(vocab_size=50257, n_layer=2, n_head=2, d_model=64, max_seq_len=32))
    with pytest.raises(ConfigError, match=r"d_model: 32 there, model\.d_model=64 here"):
        init_from(wider, tmp_path / "short")
    other_vocab = GPT(GPTConfig(vocab_size=1000, n_layer=2, n_head=2, d_model=32, max_seq_len=32))
    with pytest.raises(ConfigError, match="vocab_size"):
        init_from(other_vocab, tmp_path / "short")
    with pytest.raises(ConfigError, match="no config.json"):
        init_from(longer, tmp_path)


def test_export_refuses_a_model_without_biases(trained, tmp_path):
    checkpoint = torch.load(trained, map_location="cpu", weights_only=False)
    checkpoint["hyper_parameters"]["model"]["bias"] = False
    torch.save(checkpoint, tmp_path / "nobias.ckpt")
    with pytest.raises(ConfigError, match="model.bias=false has no GPT-2 equivalent"):
        export(tmp_path / "nobias.ckpt", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_eval_is_the_same_for_every_policy_and_counts_every_pair(trained):
    results = {policy: evaluate_checkpoint(trained, [f"data={policy}"]) for policy in ("padded", "bestfit")}
    results["prepacked"] = evaluate_checkpoint(trained, ["data=prepacked", "data.document_mask=false"])
    padded = results["padded"]
    config = to_config(load_config(BASE))
    assert padded["step"] == 4 and padded["documents"] > 0
    for result in results.values():
        assert result["targets"] == padded["targets"]  # every validation pair, nothing truncated
        assert result["loss"] == pytest.approx(padded["loss"], abs=1e-5)
        assert result["perplexity"] == pytest.approx(math.exp(result["loss"]))
        assert result["bits_per_byte"] == pytest.approx(result["nats"] / math.log(2) / result["bytes"])
        # Split by the pair's position in its document: the same pairs whatever the policy.
        assert result["targets_by_position"] == padded["targets_by_position"]
        assert sum(result["targets_by_position"].values()) == result["targets"]
        weighted = sum(
            loss * result["targets_by_position"][bucket]
            for bucket, loss in result["loss_by_position"].items()
        )
        assert weighted / result["targets"] == pytest.approx(result["loss"], rel=1e-6)
    assert config.data.max_seq_len == 128


def test_a_reimported_model_starts_at_the_eval_loss(trained, exported):
    result = evaluate_checkpoint(trained, ["data=bestfit"])
    from pretrain.data.batching.policies import PolicySettings
    from pretrain.data.ingest.cache import CacheSpec
    from pretrain.data.ingest.prepare import prepare_cache
    from pretrain.data.ingest.tokenizer import token_byte_lengths

    config = to_config(load_config([*BASE, f"model.init_from={exported}"]))
    model = GPT(GPTConfig.from_settings(config.model), attn="sdpa")
    init_from(model, config.model.init_from)
    spec = CacheSpec.from_config(config)
    settings = PolicySettings.from_config(config.data, config.train, config.seed)
    mine = evaluate(
        model,
        prepare_cache(spec).split("validation"),
        settings,
        token_byte_lengths(spec.tokenizer_files, 50257),
    )
    assert mine.loss == pytest.approx(result["loss"], abs=1e-6) and mine.targets == result["targets"]


def pretrain_cli(cache_root: Path, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "pretrain.cli", *args]
    return subprocess.run(
        command, cwd=REPO, env=cli_env(cache_root), capture_output=True, text=True, timeout=300
    )


def test_cli_export_and_eval(trained, tmp_path, cache_root):
    out = tmp_path / "eval.json"
    proc = pretrain_cli(cache_root, "eval", str(trained), "data=padded", f"output={out}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    keys = {"loss", "perplexity", "bits_per_byte", "targets", "documents", "step", "nats", "bytes", "policy"}
    assert keys | {"loss_by_position", "targets_by_position"} <= set(result)
    assert set(result["targets_by_position"]) == {"0-63", "64-255", "256-1023", "1024-4095", "4096+"}
    assert proc.stdout.strip().splitlines()[-1] == str(out.resolve())
    proc = pretrain_cli(cache_root, "export", str(trained), "--output", str(tmp_path / "hf"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "hf" / "model.safetensors").is_file()
    again = pretrain_cli(cache_root, "export", str(trained), "--output", str(tmp_path / "hf"))
    assert again.returncode == 2 and "not an empty directory" in again.stderr
    assert "Traceback" not in again.stderr
    missing = pretrain_cli(cache_root, "eval", str(tmp_path / "nope.ckpt"))
    assert missing.returncode == 2 and "nope.ckpt does not exist" in missing.stderr


def test_training_starts_from_init_from(cache_root, exported, tmp_path, capfd):
    out = tmp_path / "run"
    overrides = [
        *BASE,
        f"output_dir={out}",
        "progress_bar=false",
        "train.max_steps=1",
        "train.warmup_steps=0",
    ]
    summary = train(
        load_config([*overrides, f"model.init_from={exported}", "train.lr=1e-9", "train.warmup_steps=0"])
    )
    said = [line for line in capfd.readouterr().err.splitlines() if line.startswith("model.init_from:")]
    assert len(said) == 1  # one line saying what it loaded: 4 x 12 block tensors + 2 embeddings + ln_f
    assert (
        said[0] == f"model.init_from: loaded 52 tensors of {exported} (4 layers, d_model 128, 128 positions)"
    )
    fresh = train(load_config([*BASE, f"output_dir={tmp_path / 'fresh'}", *overrides[3:]]))
    # Starting from the trained weights, the first loss is already far below a fresh init's.
    assert summary["metrics"]["train/loss"] < fresh["metrics"]["train/loss"] - 0.5
    with pytest.raises(ConfigError, match="data.max_seq_len<=128"):
        train(load_config([*overrides, f"model.init_from={exported}", "data.max_seq_len=256"]))


def test_only_export_imports_transformers():
    """Pretraining never needs transformers: the package imports it inside `export`, inside the
    downstream harness's run (`pretrain lm-eval`) and inside task=sft's chat-template rendering only.
    (Lightning's torchmetrics imports it by itself when it is installed; that is not ours.)"""
    importers = []
    for path in sorted((REPO / "src" / "pretrain").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(name.split(".")[0] == "transformers" for name in names):
                importers.append((path.relative_to(REPO / "src" / "pretrain").as_posix(), node.col_offset))
    assert importers == [
        ("data/ingest/chat.py", 8),
        ("downstream/harness.py", 4),
        ("hf/roundtrip.py", 8),
    ]  # inside functions


def _validation_tokens() -> list[np.ndarray]:
    """Each validation document's tokens (its EOS last), straight from the cache."""
    from pretrain.data.ingest.cache import CacheSpec
    from pretrain.data.ingest.prepare import prepare_cache

    split = prepare_cache(CacheSpec.from_config(to_config(load_config(BASE)))).split("validation")
    return [
        np.asarray(split.tokens[o : o + n], dtype=np.int64)
        for o, n in zip(split.offsets, split.lengths, strict=True)
    ]


def test_context_one_is_every_target_predicted_from_its_previous_token_alone_in_transformers(
    trained, exported
):
    """`pretrain eval`'s loss_by_context/1 against an independent computation: the exported model in
    transformers, every (token, next token) pair of every validation document as its own one-token
    sequence at position 0; and loss_by_context/16 against blocks of 16 pairs cut from each document."""
    result = evaluate_checkpoint(trained)  # eval.context defaults to 1, 16, 128; max_seq_len is 128
    assert set(result["loss_by_context"]) == {"1", "16", "full"}  # 128 is the whole chunk
    hf = hf_model(exported)
    documents = _validation_tokens()
    inputs = torch.from_numpy(np.concatenate([d[:-1] for d in documents]))
    targets = torch.from_numpy(np.concatenate([d[1:] for d in documents]))
    assert len(targets) == result["targets"]
    with torch.no_grad():
        logits = hf(input_ids=inputs[:, None], position_ids=torch.zeros_like(inputs)[:, None]).logits[:, 0]
    one = float(torch.nn.functional.cross_entropy(logits.double(), targets, reduction="mean"))
    assert result["loss_by_context"]["1"] == pytest.approx(one, abs=1e-4)
    nats = 0.0
    with torch.no_grad():
        for tokens in documents:  # blocks of 16 pairs from each document's start (128 = 8 x 16)
            for start in range(0, len(tokens) - 1, 16):
                block = torch.from_numpy(tokens[start : start + 17])
                out = hf(input_ids=block[None, :-1]).logits[0].double()
                nats += float(torch.nn.functional.cross_entropy(out, block[1:], reduction="sum"))
    assert result["loss_by_context"]["16"] == pytest.approx(nats / len(targets), abs=1e-4)
    assert result["loss_by_context"]["full"] == result["loss"]
    assert result["context_gain"] == pytest.approx(result["loss_by_context"]["1"] - result["loss"], abs=1e-12)


def test_context_use_is_off_with_an_empty_list_and_skips_lengths_of_the_whole_chunk(trained):
    assert evaluate_checkpoint(trained, ["eval.context=[]"])["loss_by_context"] == {}
    whole = evaluate_checkpoint(trained, ["eval.context=[128,4096]"])
    assert whole["loss_by_context"] == {} and whole["context_gain"] is None
    with pytest.raises(
        ConfigError, match=r"eval.context=\[0\]: every context length must be an integer >= 1"
    ):
        evaluate_checkpoint(trained, ["eval.context=[0]"])


def test_training_scores_context_use_at_its_last_validation_as_eval_does(cache_root, tmp_path):
    out = tmp_path / "run"
    overrides = [*BASE, f"output_dir={out}", "progress_bar=false", "train.max_steps=4"]
    train(load_config([*overrides, "train.val_every_n_steps=2", "train.val_batches=null"]))
    report = json.loads((out / "run.json").read_text())["metrics"]
    evaluated = evaluate_checkpoint(out / "checkpoints" / "last.ckpt")  # the whole split, as validation
    for key in ("1", "16"):
        assert report[f"val/loss_by_context/{key}"] == pytest.approx(
            evaluated["loss_by_context"][key], abs=1e-6
        )
    assert report["val/loss_by_context/full"] == report["val/loss"]
    assert report["val/context_gain"] == pytest.approx(evaluated["context_gain"], abs=1e-6)
    import csv

    rows = [r for r in csv.DictReader((out / "metrics.csv").open()) if r.get("val/loss")]
    assert [r["step"] for r in rows] == ["2", "4"]  # validated twice, context use at the last only
    assert rows[0]["val/context_gain"] == "" and float(rows[1]["val/context_gain"]) > 0
