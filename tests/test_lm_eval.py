"""`pretrain lm-eval` end to end, offline: lm-evaluation-harness's Hugging Face model on a trained
tiny checkpoint's export, the project's tasks written from its cache. The bits per byte the harness
computes equals `pretrain eval`'s on the same documents; the metrics land in the JSON, the run's
run.json and `pretrain compare`."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, cli_env, local_overrides, module_cache_root
from helpers.sources import write_jsonl
from helpers.texts import make_texts

from pretrain.config import load_config
from pretrain.training.run import train

pytest.importorskip("lm_eval")

cache_root = module_cache_root()


@pytest.fixture(scope="module")
def trained(cache_root, tmp_path_factory) -> Path:
    """A tiny model trained 4 steps at max_seq_len 1024 on English-like documents (source=local): a
    validation split whose every document the harness can be given as text (none left out)."""
    folder = tmp_path_factory.mktemp("lm-eval")
    corpus = write_jsonl(folder / "corpus.jsonl", make_texts(300, seed=3, long_every=0))
    overrides = [
        *local_overrides([corpus]),
        "experiment=smoke",
        "data.max_seq_len=1024",
        "split.validation_fraction=0.3",
        "budget.validation_tokens=20000",
        f"output_dir={folder / 'run'}",
        "progress_bar=false",
        "train.max_steps=4",
        "train.val_every_n_steps=2",
    ]
    train(load_config(overrides))
    return folder / "run" / "checkpoints" / "last.ckpt"


def pretrain_cli(cache_root: Path, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "pretrain.cli", *args]
    return subprocess.run(
        command, cwd=REPO, env=cli_env(cache_root), capture_output=True, text=True, timeout=300
    )


def test_the_harness_bits_per_byte_equals_pretrain_eval(trained, cache_root, tmp_path):
    harness = pretrain_cli(
        cache_root, "lm-eval", str(trained), "--tasks", "pretrain_bpb", "--output", str(tmp_path / "h.json")
    )
    assert harness.returncode == 0, harness.stderr[-3000:]
    evaluated = pretrain_cli(cache_root, "eval", str(trained), f"output={tmp_path / 'e.json'}")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    bpb = json.loads((tmp_path / "h.json").read_text())["downstream"]["pretrain_bpb"]
    reference = json.loads((tmp_path / "e.json").read_text())
    # every validation document, every pair, the same bytes: the two scorings are of one thing
    assert bpb["documents_left_out"] == 0 and bpb["documents"] == reference["documents"]
    assert bpb["targets"] == reference["targets"] and bpb["bytes"] == reference["bytes"]
    assert bpb["bits_per_byte"] == pytest.approx(reference["bits_per_byte"], abs=1e-4)
    assert bpb["reference_bits_per_byte"] == pytest.approx(reference["bits_per_byte"], abs=1e-9)
    assert abs(bpb["difference"]) < 1e-4


def test_cloze_and_recall_run_offline_into_the_json_run_json_and_compare(trained, cache_root, tmp_path):
    out = tmp_path / "lm-eval.json"
    tasks = "pretrain_cloze,pretrain_recall"
    proc = pretrain_cli(
        cache_root, "lm-eval", str(trained), "--tasks", tasks, "--limit", "200", f"output={out}"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["checkpoint"]["step"] == 4 and result["checkpoint"]["policy"] == "bestfit"
    assert len(result["checkpoint"]["sha256"]) == 64 and result["limit"] == 200
    metrics = result["downstream"]
    assert set(metrics) == {
        "pretrain_cloze",
        "pretrain_recall_plain",
        "pretrain_recall_distractor",
        "pretrain_recall_cue_only",
        "pretrain_recall",
    }
    recall = metrics["pretrain_recall"]
    assert recall["examples"] == min(200, result["examples"]["pretrain_recall_plain"]) > 50
    assert (
        recall["loglikelihood_difference_low"]
        <= recall["loglikelihood_difference"]
        <= recall["loglikelihood_difference_high"]
    )
    gain = recall["loglikelihood"] - recall["loglikelihood_cue_only"]  # plain - cue only, paired
    assert recall["loglikelihood_passage_gain"] == pytest.approx(gain)
    assert recall["loglikelihood"] < 0 and 0 <= metrics["pretrain_cloze"]["acc"] <= 1
    assert metrics["pretrain_cloze"]["perplexity"] > 1
    run_json = json.loads((trained.parent.parent / "run.json").read_text())
    assert run_json["downstream"]["pretrain_recall"] == recall
    assert run_json["downstream_source"]["checkpoint"] == result["checkpoint"]
    assert f"recorded in {trained.parent.parent / 'run.json'}" in proc.stdout
    # compare shows them per arm
    report = pretrain_cli(
        cache_root, "compare", str(trained.parent.parent), "--output", str(tmp_path / "c.png")
    )
    assert report.returncode == 0, report.stderr[-3000:]
    assert re.search(r"downstream \(pretrain lm-eval\): \d+ score\(s\) per arm in compare.md", report.stdout)
    assert (
        f"recall, distractor - plain (log-lik.): bestfit {recall['loglikelihood_difference']:+.4f}"
        in report.stdout
    )
    table = json.loads((tmp_path / "c.json").read_text())
    (arm,) = table["arms"]
    means = arm["means"]
    assert means["downstream.pretrain_recall.loglikelihood_difference"] == pytest.approx(
        recall["loglikelihood_difference"]
    )
    assert means["downstream.pretrain_cloze.acc"] == pytest.approx(metrics["pretrain_cloze"]["acc"])
    assert not any(key.endswith(("_stderr", "_low", "_high")) for key in means)
    assert "downstream.pretrain_recall_plain.acc" not in means  # within pretrain_recall's contrast


def test_a_hub_task_offline_is_one_line(trained, cache_root):
    proc = pretrain_cli(cache_root, "lm-eval", str(trained), "--tasks", "lambada_openai", "--limit", "5")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "lm-eval could not load the data of lambada_openai" in proc.stderr
    assert "choose the offline pretrain_cloze, pretrain_recall, pretrain_bpb" in proc.stderr
    unknown = pretrain_cli(cache_root, "lm-eval", str(trained), "--tasks", "pretrain_bpb,no_such_task")
    assert unknown.returncode == 2 and "--tasks no_such_task: no such lm-eval task" in unknown.stderr


def train_py(cache_root: Path, *overrides: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "train.py", *overrides]
    return subprocess.run(
        command, cwd=REPO, env=cli_env(cache_root), capture_output=True, text=True, timeout=600
    )


def test_eval_downstream_scores_the_finished_run_into_its_run_json(cache_root, tmp_path):
    run = tmp_path / "run"
    tasks = "eval.downstream=[pretrain_cloze,pretrain_recall]"
    proc = train_py(
        cache_root,
        "experiment=try",
        "data=bestfit",
        tasks,
        "eval.downstream_limit=30",
        f"hydra.run.dir={run}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run / "run.json").read_text())
    assert summary["status"] == "completed"
    assert summary["downstream"]["pretrain_recall"]["examples"] == 30
    assert summary["downstream_source"]["checkpoint"]["path"] == str(run / "checkpoints" / "last.ckpt")
    assert summary["downstream_source"]["limit"] == 30
    assert "downstream: pretrain_recall: acc" in proc.stdout and "paired examples" in proc.stdout
    refused = train_py(
        cache_root, "experiment=try", "eval.downstream=[no_such_task]", f"hydra.run.dir={tmp_path / 'x'}"
    )
    assert (
        refused.returncode == 2
        and "eval.downstream entry no_such_task: no such lm-eval task" in refused.stderr
    )
    assert not (tmp_path / "x" / "checkpoints").exists()  # refused before training


def test_an_export_scores_the_same_examples_from_a_written_task_folder(trained, cache_root, tmp_path):
    """Any model (here the checkpoint's own export) scores a run's written tasks: the same scores."""
    tasks, limit = ("--tasks", "pretrain_cloze"), ("--limit", "40")
    folder = ("--tasks-dir", str(tmp_path / "tasks"))
    first = pretrain_cli(
        cache_root, "lm-eval", str(trained), *tasks, *limit, *folder, "--output", str(tmp_path / "a.json")
    )
    assert first.returncode == 0, first.stderr[-3000:]
    exported = pretrain_cli(cache_root, "export", str(trained), "--output", str(tmp_path / "hf"))
    assert exported.returncode == 0, exported.stderr[-3000:]
    again = pretrain_cli(
        cache_root,
        "lm-eval",
        str(tmp_path / "hf"),
        *tasks,
        *limit,
        *folder,
        "--output",
        str(tmp_path / "b.json"),
    )
    assert again.returncode == 0, again.stderr[-3000:]
    a, b = (json.loads((tmp_path / name).read_text()) for name in ("a.json", "b.json"))
    assert b["checkpoint"] == {"export": str((tmp_path / "hf").resolve())} and "run_json" not in b
    assert b["downstream"]["pretrain_cloze"]["perplexity"] == pytest.approx(
        a["downstream"]["pretrain_cloze"]["perplexity"], rel=1e-9
    )
    assert b["downstream"]["pretrain_cloze"]["acc"] == a["downstream"]["pretrain_cloze"]["acc"]
